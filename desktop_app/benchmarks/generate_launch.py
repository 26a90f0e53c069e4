"""`generate` from launch against transformers: the whole process, start, load and tokens.

    python -m desktop_app bench generate_launch [--shape qwen2.5-0.5b|tiny|...] [--new 48] [--repeat 2]

A random bfloat16 checkpoint of the shape (bench firstlook's folder: bench scale's shapes, the demo
tokenizer), an 8-token prompt. Two fresh processes, alternating `--repeat` times, each timed from its
launch to its exit:

- ours: `python -m desktop_app generate FOLDER --prompt-ids ... --max-new N --json` as a person runs it
  (greedy; the auto dtype: bfloat16 for this checkpoint on a CPU with bfloat16 units);
- transformers: import it, load the checkpoint (bfloat16, its default attention), generate() greedy N
  tokens, print them.

Both must give the same ids. speedup = reference seconds / ours (above 1: ours faster), least of each
over the repeats, with every run's seconds listed (the spread). The last line printed is the JSON result.

Qwen2.5-0.5B shape, 48 tokens, load 6.7-7.5 on 2 cores, runs alternating (issue 38): ours 34.0 and 30.9 s against
transformers' 42.8 and 38.4 s (1.26x, 1.24x); before the prepacked products were made straight from the loaded
weights, 43.1 and 28.2 s (0.99x, 1.36x) and a peak of 2.70 GB against 2.31 GB after. 1 Dec, three runs at
load 1.5-2.2: 1.32x, 1.36x, 1.32x (ours 10.7-11.9 s, transformers' 14.1-15.8 s), the same ids in each; of ours'
~11 s, the 48 steps ~0.2 s each, torch's import ~1.8 s, the load ~0.6 s (cProfile).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import child_env
from ..commands.args import OneLineParser, int_in

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]

REFERENCE = """
import json, sys
import torch, transformers
folder, ids, new = sys.argv[1], [int(i) for i in sys.argv[2].split(",")], int(sys.argv[3])
model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
with torch.no_grad():
    out = model.generate(torch.tensor([ids]), max_new_tokens=new, min_new_tokens=new, do_sample=False, num_beams=1,
                         use_cache=True, pad_token_id=0)
print(json.dumps({"ids": out[0].tolist()}))
"""


def _run(argv: list[str], env: dict) -> tuple[float, list[int]]:
    """Seconds from launch to exit of `python argv...`, and the ids its last JSON line holds."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=3600)
    seconds = time.perf_counter() - start
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"bench generate_launch: a measured process failed (exit {done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return seconds, json.loads(lines[-1])["ids"]


def main(argv: list[str]) -> dict:
    from .firstlook import make_folder
    from .scale import SHAPES

    ap = OneLineParser(prog="bench generate_launch")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--new", type=int_in(1, 4096), default=48, help="tokens generated, greedy (default 48)")
    ap.add_argument("--repeat", type=int_in(1, 100), default=2, help="alternating runs of each side (default 2)")
    ap.add_argument("--folder", help="a folder to keep the checkpoint in (made there once; default: a temporary one)")
    args = ap.parse_args(argv)
    ours, ref = [], []
    with tempfile.TemporaryDirectory(prefix="bench-generate-launch-") as tmp:
        folder = Path(args.folder) if args.folder else Path(tmp) / args.shape
        if not (folder / "config.json").exists():
            make_folder(args.shape, folder)
        env = child_env(XDG_DATA_HOME=str(Path(tmp) / "data"), XDG_CONFIG_HOME=str(Path(tmp) / "config"))
        prompt = ",".join(map(str, PROMPT))
        ours_argv = ["-m", "desktop_app", "generate", str(folder), "--prompt-ids", prompt, "--max-new", str(args.new),
                     "--strategy", "greedy", "--json"]
        for _ in range(args.repeat):  # alternating: both sides see the same machine load
            ours.append(_run(ours_argv, env))
            ref.append(_run(["-c", REFERENCE, str(folder), prompt, str(args.new)], env))
    ours_s, ref_s = min(s for s, _ in ours), min(s for s, _ in ref)
    return {"name": "generate_launch", "shape": args.shape, "new_tokens": args.new, "repeats": args.repeat,
            "ours_s": round(ours_s, 3), "reference_s": round(ref_s, 3), "speedup": round(ref_s / ours_s, 3),
            "ours_runs_s": [round(s, 2) for s, _ in ours], "reference_runs_s": [round(s, 2) for s, _ in ref],
            "same_ids_as_reference": all(o == r for (_, o), (_, r) in zip(ours, ref)),
            "load_average": round(os.getloadavg()[0], 2)}
