"""Load time of a model folder: ours (memory-mapped safetensors) vs transformers' from_pretrained.

    python -m desktop_app bench load [MODEL_DIR] [--repeat N]

Without MODEL_DIR a randomly initialised GPT-2-small-sized model (124M parameters) is written by
transformers into a temporary folder first. Both sides load float32 on the CPU and run nothing.
"""
from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path
from ..commands.args import OneLineParser, int_in



def _reference_class(folder: Path):
    import transformers

    archs = json.loads((folder / "config.json").read_text()).get("architectures") or ["AutoModel"]
    return getattr(transformers, archs[0], transformers.AutoModel)


def main(argv: list[str]) -> dict:
    import torch

    from ..core.checkpoints import load_model_folder

    ap = OneLineParser(prog="bench load")
    ap.add_argument("model_dir", nargs="?")
    ap.add_argument("--repeat", type=int_in(1, 1000), default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model_dir is None:
            import transformers

            folder = Path(tmp) / "gpt2-small-random"
            torch.manual_seed(0)
            transformers.GPT2LMHeadModel(transformers.GPT2Config()).save_pretrained(folder)
        else:
            folder = Path(args.model_dir)
        ref_cls = _reference_class(folder)

        def timed(load) -> float:
            """Fastest of `repeat` loads; freeing the model is not part of the load."""
            best = float("inf")
            for _ in range(args.repeat + 1):  # the first run warms the page cache and imports
                t0 = time.perf_counter()
                m = load()
                best = min(best, time.perf_counter() - t0)
                del m
                gc.collect()
            return best

        ours_s = timed(lambda: load_model_folder(folder))
        reference_s = timed(lambda: ref_cls.from_pretrained(folder, dtype=torch.float32))
    return {"name": "load", "model": str(args.model_dir or "gpt2-small-random (124M)"),
            "ours_s": round(ours_s, 4), "reference_s": round(reference_s, 4),
            "speedup": round(reference_s / ours_s, 2)}
