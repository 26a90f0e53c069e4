"""Cold start to a visible window on the demo model, against a bare `import torch, PySide6.QtWidgets`.

    python -m desktop_app bench startup [MODEL_DIR] [--repeat N]

Both are fresh Python processes started the same way (offscreen Qt, empty settings); each time
is from just before the process is launched to the moment the child reports being ready: for the
reference, after its imports; for the app, once its main window is shown with the model loaded
and the start text tokenized and traced (the state a screenshot captures). Median of N runs,
interleaved so that a busy machine slows both alike (paired_ratio: the median of each app run over
the reference run just before it). Target: ratio <= 1.3. Also reported: the
CPU seconds of each child process (steadier than wall time when other work shares the cores).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from desktop_app.benchmarks import child_env
from desktop_app.commands.args import OneLineParser, int_in

REFERENCE_CODE = "import torch, PySide6.QtWidgets, time; print(time.time(), flush=True)"


def _env(home: Path) -> dict[str, str]:
    return child_env(QT_QPA_PLATFORM="offscreen", XDG_DATA_HOME=str(home / "data"), XDG_CONFIG_HOME=str(home / "config"))


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _time_reference(env: dict[str, str]) -> tuple[float, float]:
    """(seconds to ready, CPU seconds of the whole child process)."""
    cpu, start = _children_cpu(), time.time()
    r = subprocess.run([sys.executable, "-c", REFERENCE_CODE], env=env, capture_output=True, text=True, check=True)
    return float(r.stdout.strip().splitlines()[-1]) - start, _children_cpu() - cpu


def _time_app(env: dict[str, str], model_dir: str) -> tuple[float, float]:
    cpu, start = _children_cpu(), time.time()
    r = subprocess.run([sys.executable, "-m", "desktop_app", model_dir, "--quit-when-ready"], env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"the app did not start (exit {r.returncode}): {r.stderr.strip()[-2000:]}")
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line)["ready_at"] - start, _children_cpu() - cpu


def main(argv: list[str]) -> dict:
    p = OneLineParser(prog="python -m desktop_app bench startup")
    p.add_argument("model_dir", nargs="?", help="model folder (default: the demo model)")
    p.add_argument("--repeat", type=int_in(1, 1000), default=5)
    args = p.parse_args(argv)

    from ..paths import demo_model_dir

    with tempfile.TemporaryDirectory(prefix="te-startup-") as tmp:
        home = Path(tmp)
        model_dir = args.model_dir or str(demo_model_dir())
        model_note = "demo model"
        if args.model_dir:
            model_note = args.model_dir
        elif not demo_model_dir().is_dir():  # before the demo model is built: a model of the same size class
            from ..core.checkpoints import new_model, save_model_folder
            from ..core.config import ModelConfig

            model_dir = str(home / "stand-in-model")
            save_model_folder(new_model(ModelConfig.gpt2(vocab_size=96, d_model=128, n_layers=4, n_heads=4,
                                                         d_ff=512, context_length=256), seed=0), model_dir)
            model_note = "random stand-in (demo model not installed)"
        env = _env(home)
        _time_reference(env)  # warm the file cache for both: we measure start-up work, not the disk
        _time_app(env, model_dir)
        ours, ref = [], []
        for _ in range(max(1, args.repeat)):
            ref.append(_time_reference(env))
            ours.append(_time_app(env, model_dir))
    ours_s, reference_s = statistics.median(t for t, _ in ours), statistics.median(t for t, _ in ref)
    # CPU time (whole process, exit included) is steadier than wall time on a shared machine
    ours_cpu, reference_cpu = statistics.median(c for _, c in ours), statistics.median(c for _, c in ref)
    # each app run against the reference run just before it: a busy minute slows both of a pair alike
    paired = statistics.median(o / r for (o, _), (r, _) in zip(ours, ref))
    return {"name": "startup", "ours_s": round(ours_s, 3), "reference_s": round(reference_s, 3),
            "ratio": round(ours_s / reference_s, 3), "paired_ratio": round(paired, 3), "target_ratio": 1.3,
            "model": model_note,
            "repeat": len(ours), "ours_runs_s": [round(t, 3) for t, _ in ours],
            "reference_runs_s": [round(t, 3) for t, _ in ref],
            "ours_cpu_s": round(ours_cpu, 3), "reference_cpu_s": round(reference_cpu, 3),
            "cpu_ratio": round(ours_cpu / reference_cpu, 3), "cpu_count": os.cpu_count()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
