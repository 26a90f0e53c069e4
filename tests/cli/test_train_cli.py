"""`python -m desktop_app train` as a user runs it: output contract, bad input, kill -9 and resume."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.training import checkpoint_step

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--layers", "1", "--heads", "2", "--d-model", "32"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny models: one thread (several crawl on a busy machine)


def cli(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "desktop_app", "train", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=ENV, **kw)


def in_process(capsys, *args) -> tuple[int, str, str]:
    """The CLI's own main() in this process (no interpreter start-up); returns (code, stdout, stderr)."""
    from desktop_app.cli import main

    code = main(["train", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_last_line_is_the_json_summary_and_export_is_clean(tmp_path, capsys):
    code, stdout, stderr = in_process(capsys, "--task", "modadd", "--p", "11", *TINY, "--steps", "4",
                                      "--log-every", "2", "--eval-every", "4", "--jsonl", "--out",
                                      str(tmp_path / "run"), "--export", str(tmp_path / "clean"))
    assert code == 0, stderr
    events = [json.loads(line) for line in stdout.splitlines()]
    assert [e["event"] for e in events[:-1]] == ["start", "step", "step", "eval", "checkpoint", "done"]
    last = events[-1]
    assert set(last) == {"step", "train_loss", "train_accuracy", "val_loss", "val_accuracy"}
    assert last["step"] == 4 and 0.0 <= last["val_accuracy"] <= 1.0 and last["train_loss"] > 0
    assert last["val_loss"] == events[-4]["val_loss"]
    assert last["train_accuracy"] == events[-4]["train_accuracy"] and 0.0 <= last["train_accuracy"] <= 1.0
    assert events[0]["device"] == "cpu"  # the best device here (no GPU): the default
    assert (tmp_path / "run" / "optimizer.safetensors").is_file()
    assert not (tmp_path / "clean" / "optimizer.safetensors").exists()
    assert (tmp_path / "clean" / "metrics.csv").is_file()
    assert load_model_folder(tmp_path / "clean").tokenizer.decode([3, 11, 4, 12]) == "3 + 4 ="


def test_device_and_precision_default_to_the_best_present(monkeypatch):
    import torch

    from desktop_app.cli import build_parser
    from desktop_app.commands.train import config_from_args

    def cfg(*extra):
        return config_from_args(build_parser().parse_args(["train", "--task", "copy", "--steps", "1", "--out", "x",
                                                           *extra]))

    assert (cfg().device, cfg().precision) == ("cpu", "float32")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for bf16, precision in ((True, "bfloat16"), (False, "float16")):  # float16 trains with a GradScaler
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
        assert (cfg().device, cfg().precision) == ("cuda", precision)
    assert (cfg("--device", "cpu").device, cfg("--device", "cpu").precision) == ("cpu", "float32")
    assert cfg("--precision", "float32").precision == "float32"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun with more local processes than GPUs: CPU (gloo)
    assert cfg().device == "cpu"


def test_mlp_baseline_reports_events_and_the_summary(tmp_path, capsys):
    code, stdout, stderr = in_process(capsys, "--task", "motif", "--baseline", "mlp", "--train-size", "200",
                                      "--steps", "20", "--log-every", "5", "--eval-every", "10", "--jsonl",
                                      "--out", str(tmp_path / "mlp"))
    assert code == 0, stderr
    events = [json.loads(line) for line in stdout.splitlines()]
    assert [e["event"] for e in events[:-1]] == ["start", "step", "step", "eval", "step", "step", "eval", "done"]
    assert events[0]["parameters"] == 41_412 and events[0]["task"]["n_train"] == 200
    last = events[-1]
    assert set(last) == {"step", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "parameters"}
    assert last["step"] == 20 and last["val_accuracy"] == events[-2]["val_accuracy"] == events[-3]["val_accuracy"]
    assert last["train_accuracy"] == events[-3]["train_accuracy"] and 0.0 <= last["train_accuracy"] <= 1.0
    assert not (tmp_path / "mlp").exists()  # the baseline writes no checkpoint


def test_bad_text_file_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "notes.txt"
    bad.write_bytes(b"\xff\xfe\x00bad")
    code, _, stderr = in_process(capsys, "--task", "text", "--text-file", str(bad), "--steps", "5",
                                 "--out", str(tmp_path / "run"))
    assert code == 2
    assert "notes.txt" in stderr and "UTF-8" in stderr and "Traceback" not in stderr
    code, _, stderr = in_process(capsys, "--task", "text", "--steps", "5", "--out", str(tmp_path / "run"))
    assert code == 2 and "--text-file" in stderr


def test_kill_9_mid_run_then_resume_continues_from_the_last_checkpoint(tmp_path, spawn):
    out = tmp_path / "run"
    args = ["--task", "copy", *TINY, "--steps", "100000", "--checkpoint-every", "3", "--log-every", "1",
            "--eval-every", "100000", "--jsonl", "--out", str(out)]
    for round_ in range(2):  # kill at different moments, possibly mid-checkpoint, and after a resume
        proc = spawn([sys.executable, "-m", "desktop_app", "train", *args] + (["--resume"] if round_ else []),
                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)  # killed in teardown
        checkpoints = 0
        deadline = time.time() + 90
        for line in proc.stdout:
            if json.loads(line)["event"] == "checkpoint":
                checkpoints += 1
                if checkpoints == 2 + round_:
                    break
            assert time.time() < deadline
        time.sleep(0.01 * round_)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc.stdout.close()
        step = checkpoint_step(out)
        assert step is not None and step % 3 == 0
        loaded = load_model_folder(out)  # intact (or its .old twin): never a half-written folder
        assert loaded.config.n_layers == 1
    final = step + 2
    r = cli(*[a if a != "100000" or i != args.index("--steps") + 1 else str(final) for i, a in enumerate(args)],
            "--resume")
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert events[0]["event"] == "start" and events[0]["step"] == step
    assert [e["step"] for e in events if e.get("event") == "step"] == [step + 1, step + 2]
    assert checkpoint_step(out) == final
