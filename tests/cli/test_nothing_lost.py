"""Issue 25 §2: nothing lost. A user's own RUN.old / DIR.old survives every train command byte for byte,
and a run folder is locked while a run writes it (a second run is refused in one line naming the holder;
the lock of a killed run is taken over, with a line saying so)."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from desktop_app.cli import EXIT_INPUT, main
from desktop_app.core import files
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.training import checkpoint_step
from tiny_models import save_tiny_model

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TINY = ["--task", "modadd", "--p", "7", "--layers", "1", "--heads", "2", "--d-model", "16", "--log-every", "1",
        "--eval-every", "100", "--schedule", "constant", "--warmup", "0", "--jsonl"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def train(capsys, *args) -> tuple[int, str, str]:
    code = main(["train", *TINY, *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _users_model(where: Path, notes: bool = True) -> dict[str, bytes]:
    """The user's own model, in a folder they happened to call RUN.old: the same file names the app
    writes (config.json, model.safetensors, tokenizer.json), but not written by the app (no manifest);
    with `notes` also a README.md of theirs."""
    save_tiny_model(where, "the user's own text", seed=7, d_model=8, n_layers=1, n_heads=2, d_ff=16, context_length=16)
    (where / files.MANIFEST).unlink()
    if notes:
        (where / "README.md").write_text("my model, trained for a week")
    return _snapshot(where)


# -- RUN.old and DIR.old are the user's ---------------------------------------------------------


@pytest.mark.parametrize("how", ["--resume", "--overwrite"])
def test_a_users_run_old_survives_resume_and_overwrite(tmp_path, capsys, how):
    run = tmp_path / "run"
    assert train(capsys, "--steps", "2", "--out", str(run))[0] == 0
    theirs = _users_model(tmp_path / "run.old", notes=False)  # only names the run writes too: were deleted
    code, _, err = train(capsys, "--steps", "3", "--out", str(run), how)
    line = _one_line(err)
    assert code == EXIT_INPUT and "run.old" in line and "nothing was changed" in line
    assert _snapshot(tmp_path / "run.old") == theirs
    assert checkpoint_step(run) == 2  # the run itself is untouched too


def test_a_users_export_old_survives_export_overwrite(tmp_path, capsys):
    run, export = tmp_path / "run", tmp_path / "export"
    assert train(capsys, "--steps", "2", "--out", str(run), "--export", str(export))[0] == 0
    theirs = _users_model(tmp_path / "export.old")
    code, _, err = train(capsys, "--steps", "3", "--out", str(run), "--resume", "--export", str(export),
                         "--overwrite")
    line = _one_line(err)
    assert code == EXIT_INPUT and "export.old" in line
    assert _snapshot(tmp_path / "export.old") == theirs
    assert checkpoint_step(run) == 2  # refused before any work


def test_a_users_run_old_is_not_taken_for_an_interrupted_run(tmp_path, capsys):
    theirs = _users_model(tmp_path / "run.old")  # and no run/ beside it
    for extra in ((), ("--resume",), ("--overwrite",)):
        code, _, err = train(capsys, "--steps", "2", "--out", str(tmp_path / "run"), *extra)
        assert code == EXIT_INPUT and "run.old" in _one_line(err)
    assert _snapshot(tmp_path / "run.old") == theirs and not (tmp_path / "run").exists()


def test_the_apps_own_old_copy_still_goes(tmp_path, capsys):
    run = tmp_path / "run"
    assert train(capsys, "--steps", "2", "--out", str(run))[0] == 0
    import shutil
    shutil.copytree(run, tmp_path / "run.old")  # killed between the two renames of a later checkpoint
    code, _, err = train(capsys, "--steps", "3", "--out", str(run), "--resume")
    assert code == 0, err
    assert not (tmp_path / "run.old").exists() and checkpoint_step(run) == 3


# -- one run at a time per folder ---------------------------------------------------------------


def _events_until(proc, kind: str, seen: list[dict]) -> dict:
    """Read the run's JSON lines until an event of `kind` (the test's timeout guards the wait)."""
    for line in proc.stdout:
        if line.startswith("{"):
            ev = json.loads(line)
            seen.append(ev)
            if ev["event"] == kind:
                return ev
    raise AssertionError(f"the run ended before a {kind!r} event: {seen}")


def test_a_second_run_on_the_same_folder_is_refused_naming_the_holder(tmp_path, spawn):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "desktop_app", "train", *TINY, "--out", str(run)]
    first = spawn(cmd + ["--steps", "6", "--checkpoint-every", "2", "--control-stdin"], cwd=ROOT, env=ENV,
                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # killed in teardown
    seen: list[dict] = []
    _events_until(first, "start", seen)  # it holds the lock from before this event
    first.stdin.write("pause\n")
    first.stdin.flush()
    _events_until(first, "paused", seen)
    for extra in ([], ["--resume"], ["--overwrite"]):
        second = subprocess.run(cmd + ["--steps", "9", *extra], cwd=ROOT, env=ENV, capture_output=True, text=True,
                                timeout=300)
        line = _one_line(second.stderr)
        assert second.returncode == EXIT_INPUT, second.stderr
        assert f"pid {first.pid} on {socket.gethostname()}, started " in line and str(run) in line, line
        assert "another run is writing" in line
    first.stdin.write("resume\n")
    first.stdin.flush()
    done = _events_until(first, "done", seen)
    first.stdin.close()
    assert first.wait(300) == 0, first.stderr.read()
    assert done["step"] == 6 == checkpoint_step(run)  # the first run finished intact
    assert load_model_folder(run).config.n_layers == 1
    assert not files.lock_file(run).exists()  # the run removes its lock


def test_the_lock_of_a_killed_run_is_taken_over_with_a_line(tmp_path, capsys, spawn):
    run = tmp_path / "run"
    holder = spawn([sys.executable, "-c",
                    "import sys, time\nfrom desktop_app.core.files import lock_folder\n"
                    f"with lock_folder({str(run)!r}):\n    print('locked', flush=True)\n    time.sleep(600)\n"],
                   cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)  # killed in teardown
    assert holder.stdout.readline().strip() == "locked"
    code, _, err = train(capsys, "--steps", "2", "--out", str(run))
    assert code == EXIT_INPUT and f"pid {holder.pid}" in _one_line(err)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(60)
    assert files.lock_file(run).exists()  # kill -9 left the file; the OS released the lock itself
    code = main(["train", *[a for a in TINY if a != "--jsonl"], "--steps", "2", "--out", str(run)])
    out = capsys.readouterr()
    assert code == 0, out.err
    took = [line for line in out.out.splitlines() if "took over the lock" in line]
    assert len(took) == 1 and re.search(rf"no longer running \(pid {holder.pid} on ", took[0]), out.out
    assert checkpoint_step(run) == 2 and not files.lock_file(run).exists()


@pytest.mark.parametrize("task", ["sort", "sae"])
def test_a_full_disk_while_saving_is_one_line_and_the_write_exit_code(tmp_path, capsys, monkeypatch, task):
    """Issue 41: safetensors' own error on a full disk (SafetensorError "No space left on device") ended
    `train` and `train --task sae` in a traceback with rc 1; now one line and the write failures' code."""
    import safetensors.torch
    from safetensors import SafetensorError

    from desktop_app.cli import EXIT_WRITE, main
    from desktop_app.paths import resources_dir

    def full(*a, **k):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                              '"No space left on device" })')

    from desktop_app.core import checkpoints

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    monkeypatch.setattr(checkpoints, "save_file", full)
    out = tmp_path / "run"
    if task == "sae":
        text = tmp_path / "t.txt"
        text.write_text("Alice was beginning to get very tired. " * 30, encoding="utf-8")
        argv = ["train", "--task", "sae", "--model", str(resources_dir() / "demo-model"), "--hook",
                "blocks.1.hook_mlp_out", "--text-file", str(text), "--steps", "2", "--out", str(out)]
    else:
        argv = ["train", "--task", "sort", "--layers", "1", "--heads", "2", "--d-model", "16", "--d-ff", "32",
                "--steps", "2", "--out", str(out)]
    assert main(argv) == EXIT_WRITE
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("error")]
    assert len(err) == 1 and "No space left on device" in err[0]
