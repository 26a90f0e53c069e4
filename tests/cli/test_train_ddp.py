"""Data parallel training: two gloo processes on CPU give the loss of one process on the same global batch."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ARGS = ["--task", "copy", "--layers", "1", "--heads", "2", "--d-model", "32", "--batch-size", "8",
        "--steps", "6", "--log-every", "1", "--eval-every", "6", "--lr", "3e-3", "--warmup", "0", "--jsonl",
        "--device", "cpu", "--precision", "float32"]  # the same device and precision in both runs


def _losses(stdout: str) -> list[float]:
    return [e["train_loss"] for e in map(json.loads, stdout.splitlines()) if e.get("event") == "step"]


@pytest.mark.slow  # three interpreter start-ups (~80 s on 2 busy cores); run with -m slow
def test_two_process_gloo_matches_one_process(tmp_path):
    pytest.importorskip("torch.distributed")
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch built without gloo")
    single = subprocess.run([sys.executable, "-m", "desktop_app", "train", *ARGS, "--out", str(tmp_path / "one")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, env=ENV)
    assert single.returncode == 0, single.stderr
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    ddp = subprocess.run([*torchrun, "-m", "desktop_app", "train", *ARGS, "--out", str(tmp_path / "two")],
                         cwd=ROOT, capture_output=True, text=True, timeout=180, env=ENV)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    events = [json.loads(line) for line in ddp.stdout.splitlines() if line.startswith("{")]
    assert events[0]["world_size"] == 2  # only rank 0 reports
    a, b = _losses(single.stdout), _losses(ddp.stdout)
    assert len(a) == len(b) == 6
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4, (a, b)
    assert a[-1] < a[0]  # and it trains
