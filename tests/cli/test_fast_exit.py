"""A finished headless command ends with os._exit after running the atexit callbacks and flushing
(desktop_app.__main__.exit_when_done): its output files and its stdout, piped (block-buffered), are whole, a
temporary folder still held is removed and a log file gets its last line; the normal exit is kept where a
non-daemon thread still runs or for the GUI."""
from __future__ import annotations

import atexit
import csv
import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from desktop_app import __main__ as entry
from desktop_app.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_cli_run_in_its_own_process_leaves_whole_outputs(char_gpt2_dir, tmp_path, capsys):
    """The same lipschitz and trace commands in this process (normal return) and as `python -m desktop_app`
    (fast exit, stdout a pipe): the same stdout lines, CSV rows and trace arrays."""
    lip = ["lipschitz", str(char_gpt2_dir), "--layer", "1", "--text-file", str(char_gpt2_dir.parent / "text.txt"),
           "--lengths", "4,8", "--samples", "2", "--csv"]
    trace = ["trace", str(char_gpt2_dir), "--text", "the cat sat", "--out"]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", XDG_DATA_HOME=str(tmp_path / "data"))
    for name, command, out in (("lipschitz", lip, "l.csv"), ("trace", trace, "t.npz")):
        ref, fast = tmp_path / f"ref-{out}", tmp_path / f"fast-{out}"
        assert cli_main([*command, str(ref)]) == 0
        ref_stdout = capsys.readouterr().out.strip().splitlines()
        done = subprocess.run([sys.executable, "-m", "desktop_app", *command, str(fast)], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        fast_stdout = done.stdout.strip().splitlines()
        assert len(fast_stdout) == len(ref_stdout) and fast_stdout, (name, done.stdout)
        if name == "lipschitz":
            assert json.loads(fast_stdout[-1]).keys() == json.loads(ref_stdout[-1]).keys()
            got, want = _rows(fast), _rows(ref)
            assert len(got) == len(want) == 4 and list(got[0]) == list(want[0])
            np.testing.assert_allclose([float(r["lipschitz"]) for r in got], [float(r["lipschitz"]) for r in want],
                                       rtol=1e-4)
        else:
            with np.load(fast) as got, np.load(ref) as want:
                assert sorted(got.files) == sorted(want.files)
                for key in want.files:
                    np.testing.assert_array_equal(got[key], want[key])
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(f"fast-{out}") and p != fast]  # no temp left


class _Exited(Exception):
    pass


def _fake_exit(calls):
    def fake(rc):
        calls.append(("exit", rc))
        raise _Exited
    return fake


def test_it_flushes_then_exits_only_for_a_command_with_no_other_thread(monkeypatch):
    calls = []

    class Stream(io.StringIO):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def flush(self):
            calls.append(("flush", self.name))

    monkeypatch.setattr(os, "_exit", _fake_exit(calls))
    monkeypatch.setattr(atexit, "_run_exitfuncs", lambda: calls.append(("atexit",)))  # not pytest's own
    monkeypatch.setattr(sys, "stdout", Stream("stdout"))
    monkeypatch.setattr(sys, "stderr", Stream("stderr"))
    monkeypatch.delitem(sys.modules, "PySide6", raising=False)  # pytest-qt may have loaded it
    every_thread = threading.enumerate  # less pytest-timeout's watchdog, which a real command run lacks
    monkeypatch.setattr(threading, "enumerate", lambda: [t for t in every_thread()
                                                         if not t.name.startswith("pytest_timeout")])

    monkeypatch.setattr(sys, "argv", ["desktop_app", "lipschitz", "x"])
    with pytest.raises(_Exited):
        entry.exit_when_done(3)
    assert calls == [("atexit",), ("flush", "stdout"), ("flush", "stderr"), ("exit", 3)]

    calls.clear()
    release = threading.Event()
    worker = threading.Thread(target=release.wait)  # a non-daemon thread still running: the normal exit joins it
    worker.start()
    try:
        assert entry.exit_when_done(0) == 0 and calls == []
    finally:
        release.set()
        worker.join()

    monkeypatch.setattr(sys, "argv", ["desktop_app", "model-folder"])  # the GUI
    assert entry.exit_when_done(0) == 0 and calls == []


def test_the_fast_exit_still_runs_what_atexit_promises(tmp_path):
    """A command that leaves a TemporaryDirectory held, a log file handler open and an atexit callback of its
    own: after the fast exit the folder is gone, the log has its line, the callback ran, the exit code is kept."""
    script = (
        "import atexit, logging, sys, tempfile\n"
        "from desktop_app import __main__ as entry\n"
        "sys.argv = ['desktop_app', 'info']\n"
        f"held = tempfile.TemporaryDirectory(dir={str(tmp_path)!r})\n"
        "print(held.name)\n"
        "log = logging.getLogger('fast-exit-test')\n"
        f"log.addHandler(logging.FileHandler({str(tmp_path / 'run.log')!r}))\n"
        "log.warning('the last line')\n"
        f"atexit.register(lambda: open({str(tmp_path / 'callback')!r}, 'w').close())\n"
        "entry.exit_when_done(3)\n"
        "print('not reached')\n")
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]
    held = Path(done.stdout.splitlines()[0])
    assert done.stdout.splitlines() == [str(held)] and held.parent == tmp_path
    assert not held.exists()
    assert (tmp_path / "run.log").read_text() == "the last line\n"
    assert (tmp_path / "callback").exists()
