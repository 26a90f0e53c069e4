"""The Train panel's run controller: the training process and its run folders.

A run is a separate process (the `train` CLI with --jsonl --control-stdin) driven by QProcess: the
settings the form describes are written to a JSON file beside the run's folder and handed to the process
(`train --config FILE --out DIR`), so the form and the CLI share one contract. Its JSON-lines events are
parsed here and emitted one by one (`event`); Pause/Resume/Stop are lines written to its stdin; a crash
or out-of-memory ends that process only, and `ended` says so in one line (the last checkpoint stays on
disk). The run folder's lock and a resume's refusals come from the process itself, as `error` events.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, Signal

from ...core.files import atomic_write_text
from ...core.training import checkpoint_step
from ...core.training.trainer import run_sample_text
from ...paths import user_data_dir


def runs_root() -> Path:
    """Where the panel puts its runs by default: one new folder per run inside it."""
    return user_data_dir() / "runs"


def new_run_dir(root: Path, task: str, now: float | None = None) -> Path:
    """A folder for a new run, named by its start time and task, that does not exist yet: a run never
    writes into (or replaces) another run's folder, nor its launch file (launch_config_path) over a file."""
    base = f"{time.strftime('%Y-%m-%d_%H%M', time.localtime(now))}_{task}"
    path, n = root / base, 1
    while path.exists() or launch_config_path(path).exists():
        n += 1
        path = root / f"{base}-{n}"
    return path


def launch_config_path(run_dir: Path) -> Path:
    """Where the panel writes the settings it starts a run with: beside the run's folder, not in it (the
    train command takes only a new or empty folder, and each checkpoint replaces the folder's contents,
    where run_config.json then keeps the same settings)."""
    return run_dir.with_name(run_dir.name + ".train.json")


def free_launch_config_path(run_dir: Path, text: str) -> Path:
    """launch_config_path(run_dir), unless a different file is already there (a resumed run started
    elsewhere, e.g. by `train --config <run>.train.json`): then <run>.train-2.json, -3, ... - the panel
    never writes over a file it did not write with these very settings."""
    path, n = launch_config_path(run_dir), 1
    while path.exists():
        try:
            if path.read_text(encoding="utf-8") == text:
                return path  # the same settings: writing them again changes nothing
        except (OSError, UnicodeDecodeError):
            pass
        n += 1
        path = run_dir.with_name(f"{run_dir.name}.train-{n}.json")
    return path


def load_run_model(path: str, device: str):
    """(model, task name, sample of the task as text) of a run's checkpoint; the task and sample are
    None when the task cannot be rebuilt (e.g. its text file is gone)."""
    from ...core.checkpoints import load_model_folder

    loaded = load_model_folder(path, device)
    task, sample = run_sample_text(path, loaded) or (None, None)
    return loaded, task, sample


def train_command() -> list[str]:
    """How to start the train CLI from here (a frozen bundle runs itself with the subcommand). -P: Python puts
    no folder of its own on the process's import path (`-m` would put its working folder first, where a
    module or package named like one it imports would shadow it)."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "train"]
    return [sys.executable, "-P", "-m", "desktop_app", "train"]


def train_folder() -> str:
    """The process's working folder: the user's home, neutral (it was resources_dir().parent, which in an
    installed package is the package's own folder: with `-m`, app, core and ui importable as top-level
    modules). The run's paths are absolute (the form makes them so)."""
    home = Path.home()
    return str(home if home.is_dir() else Path(tempfile.gettempdir()))


def train_environment(env: dict[str, str]) -> dict[str, str]:
    """The process's environment: `env`, with the folder this package was imported from first on PYTHONPATH
    unless it is one of Python's site folders (found there anyway): a checkout started as `python -m
    desktop_app` from its own folder is found from the process's working folder too, and the process runs
    the same code as the window."""
    if getattr(sys, "frozen", False):
        return env
    from ...paths import package_on_path

    return package_on_path(env)


class TrainingRun(QObject):
    """One training process at a time, and what it said: its events, whether it wrote a checkpoint."""

    # each JSON-lines event of the process, as it is read: a Python object, not Signal(dict), which hands slots a
    # QVariantMap copy with its keys sorted (the gradient-norm legend would lose the layers' order)
    event = Signal(object)
    ended = Signal(str)  # the process ended: "" when it said why itself, else one line saying how
    failed_to_start = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.process: QProcess | None = None
        self._buffer = b""
        self._stderr = b""
        self.events: list[dict] = []
        self.paused = False
        self.out_dir: Path | None = None  # the checkpoint folder of the current (or last) run
        self.run_dir: Path | None = None  # the --out folder of the current (or last) run
        self.config_file: Path | None = None  # the --config file the current (or last) run was started with
        self.checkpoint_ready = False  # a checkpoint of THIS run exists: "Use this model" loads it

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.state() != QProcess.ProcessState.NotRunning

    def prepare(self, text: str, run_dir: Path, launch_args: list[str], *, baseline: bool,
                resuming: bool) -> list[str]:
        """Write the settings `text` (TrainConfig JSON) beside `run_dir` and make this the current run;
        returns the train arguments that start it (OSError, WriteError too, when the file cannot be written:
        then nothing changes)."""
        config_file = free_launch_config_path(run_dir, text)
        atomic_write_text(config_file, text)
        self.config_file = config_file
        self.run_dir = run_dir
        self.out_dir = None if baseline else run_dir  # the MLP baseline writes no checkpoint
        # a resumed run continues its own checkpoint; a new run has none until its first one
        self.checkpoint_ready = resuming and checkpoint_step(run_dir) is not None
        self.events.clear()
        self._buffer, self._stderr = b"", b""
        self.paused = False
        return ["--config", str(config_file), *launch_args]

    def start(self, args: list[str]) -> None:
        """Start the process with the arguments prepare() returned."""
        cmd = train_command() + args + ["--jsonl", "--control-stdin"]
        proc = QProcess(self.parent())
        proc.setProgram(cmd[0])
        proc.setArguments(cmd[1:])
        proc.setWorkingDirectory(train_folder())
        env = QProcessEnvironment()
        for name, value in train_environment(dict(os.environ)).items():
            env.insert(name, value)
        proc.setProcessEnvironment(env)
        proc.readyReadStandardOutput.connect(self._read_stdout)
        proc.readyReadStandardError.connect(lambda: self._read_stderr(proc))
        proc.finished.connect(self._on_finished)
        proc.errorOccurred.connect(self._on_process_error)
        self.process = proc
        proc.start()

    def record(self, ev: dict) -> None:
        """Keep an event of the current run (the panel calls it for each one it shows)."""
        self.events.append(ev)
        if ev["event"] == "checkpoint":
            self.checkpoint_ready = True

    def send(self, line: str) -> None:
        if self.running:
            self.process.write((line + "\n").encode())

    def toggle_pause(self) -> None:
        self.paused = not self.paused
        self.send("pause" if self.paused else "resume")

    def stop(self) -> None:
        self.paused = False
        self.send("stop")

    def close(self) -> None:
        """Ask a running process to stop (it writes its checkpoint) and wait for it a few seconds."""
        if self.running:
            self.send("stop")
            self.process.waitForFinished(5000)

    # -- process output --------------------------------------------------------------------
    def _read_stdout(self) -> None:
        proc = self.sender() if isinstance(self.sender(), QProcess) else self.process
        self._buffer += bytes(proc.readAllStandardOutput())
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            line = line.strip()
            if not line:
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(ev, dict) and "event" in ev:
                self.event.emit(ev)

    def _read_stderr(self, proc: QProcess) -> None:
        self._stderr = (self._stderr + bytes(proc.readAllStandardError()))[-20_000:]

    def _on_finished(self, code: int, status) -> None:
        self._read_stdout()
        crashed = status == QProcess.ExitStatus.CrashExit or code not in (0,)
        message = ""
        if crashed and not any(e["event"] == "error" for e in self.events):
            tail = self._stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
            kept = (f" The last checkpoint in {self.out_dir} is kept." if self.checkpoint_ready else "")
            message = f"The training process ended with code {code}: {' '.join(tail)}.{kept}"
        self.paused = False
        self.ended.emit(message)

    def _on_process_error(self, error) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self.failed_to_start.emit()
