"""Resident memory of opening a bfloat16 model, against the size of its weights file.

    python -m desktop_app bench memory [MODEL_DIR] [--float32]

Without MODEL_DIR a random Qwen2-0.5B-shaped model (hidden 896, 24 layers, 14 heads / 2 KV heads,
MLP 4864, vocabulary 151,936, tied embeddings: ~494M parameters, ~0.99 GB of bfloat16) is written
into a temporary folder, under the Hugging Face names of the qwen2 family when it is registered,
else of a LLaMA of the same shape (q/k/v biases off; the result says which). Its config.json is
the Hugging Face part only, so the folder is read as a downloaded checkpoint would be.

The folder is opened in a fresh Python process: it imports torch and the app, reads its resident
memory (the baseline), opens the model in its stored dtype, runs one forward pass over 16 tokens
(which touches every weight page), and reports its peak resident memory (VmHWM) minus the baseline.
Memory-mapped weights count once, as the file's pages; a float32 copy would add twice the file.
ratio = (peak - baseline) / file size; target <= 1.2. --float32 also opens it with dtype="float32"
(a copy the user asked for), for contrast.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from ..commands.args import OneLineParser

CHILD = r"""
import json, sys

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

import torch
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.model import Transformer  # noqa: F401 (imported before the baseline)

torch.set_num_threads(1)
baseline = status("VmRSS")
loaded = load_model_folder(sys.argv[1], dtype=None if sys.argv[2] == "stored" else sys.argv[2])
opened = status("VmRSS")
with torch.no_grad():
    logits = loaded.model(torch.arange(16)[None] % loaded.config.vocab_size).logits
print(json.dumps({"baseline": baseline, "after_open": opened - baseline, "peak": status("VmHWM") - baseline,
                  "dtype": str(loaded.model.dtype).replace("torch.", ""), "finite": bool(logits.isfinite().all()),
                  "params": loaded.model.num_parameters()}))
"""

QWEN2_05B = dict(vocab_size=151_936, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2, d_ff=4864,
                 context_length=32_768, rope_theta=1_000_000.0, tie_embeddings=True, dtype="bfloat16")


def write_random_model(folder: Path, seed: int = 0) -> str:
    """A random Qwen2-0.5B-shaped bfloat16 checkpoint in `folder`; returns the family used."""
    import torch
    from safetensors.torch import save_file

    from ..core import checkpoints
    from ..core.families import REGISTRY
    from ..core.model import Transformer

    family = "qwen2" if "qwen2" in REGISTRY else "llama"
    extra = {} if family == "qwen2" else {"attention_bias": False}
    cfg = REGISTRY[family].preset(**QWEN2_05B, **extra)
    assert checkpoints.hf_compatible(cfg), f"the {family} preset should keep Hugging Face names"
    with torch.device("meta"), checkpoints._MetaSkeleton():
        shapes = {name: t.shape for name, t in checkpoints.to_hf_state_dict(Transformer(cfg, init_weights=False)).items()}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in shapes.items():  # 0.02 * N(0, 1), drawn in float32 one tensor at a time
        ones = name.endswith("norm.weight")
        t = torch.ones(shape) if ones else torch.randn(shape, generator=gen).mul_(0.02)
        tensors[name] = t.to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / checkpoints.WEIGHTS), metadata={"format": "pt"})
    hf_config = {k: v for k, v in checkpoints.config_to_hf(cfg).items() if k != checkpoints.NATIVE_KEY}
    (folder / checkpoints.CONFIG).write_text(json.dumps(hf_config, indent=2), encoding="utf-8")
    return family


def open_in_child(folder: Path, dtype: str) -> dict:
    from ..paths import package_on_path

    env = package_on_path(dict(os.environ, OMP_NUM_THREADS="1"))
    out = subprocess.run([sys.executable, "-c", CHILD, str(folder), dtype], capture_output=True, text=True,
                         env=env, timeout=1800)
    if out.returncode:
        raise RuntimeError(f"the child process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> dict:
    ap = OneLineParser(prog="bench memory")
    ap.add_argument("model_dir", nargs="?")
    ap.add_argument("--float32", action="store_true", help="also open it as float32, for contrast")
    args = ap.parse_args(argv)
    if not Path("/proc/self/status").exists():
        raise SystemExit("bench memory reads VmRSS/VmHWM from /proc (Linux only)")
    with tempfile.TemporaryDirectory() as tmp:
        if args.model_dir is None:
            folder = Path(tmp) / "qwen2-0.5b-shaped-bf16"
            family = write_random_model(folder)
            model = f"random {family} (Qwen2-0.5B shape{'' if family == 'qwen2' else ', q/k/v biases off'}), bf16"
        else:
            folder, model = Path(args.model_dir), args.model_dir
        files = list(folder.glob("*.safetensors"))
        size = sum(f.stat().st_size for f in files)
        stored = open_in_child(folder, "stored")
        result = {"name": "memory", "model": model, "params": stored["params"], "dtype": stored["dtype"],
                  "file_mb": round(size / 2**20, 1), "baseline_mb": round(stored["baseline"] / 2**20, 1),
                  "after_open_mb": round(stored["after_open"] / 2**20, 1),
                  "peak_mb": round(stored["peak"] / 2**20, 1), "ratio": round(stored["peak"] / size, 3),
                  "target_ratio": 1.2, "finite_logits": stored["finite"]}
        if args.float32:
            f32 = open_in_child(folder, "float32")
            result.update(float32_peak_mb=round(f32["peak"] / 2**20, 1), float32_ratio=round(f32["peak"] / size, 3))
    return result
