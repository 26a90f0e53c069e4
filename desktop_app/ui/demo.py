"""ScriptedDemo: a queue of user actions played on a panel, one whenever it is idle.

Panels use it for `--screenshot`'s optional hooks (screenshot_demo / screenshot_ready): each action is
what a button click would do (Step, Back, Start...), and the next one waits until the panel's workers
are done, exactly as a person would wait before clicking again. The scripts that are more than a
line or two live here too (generation_demo), out of the panels' own code.
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QObject, QTimer


class ScriptedDemo(QObject):
    def __init__(self, actions: list[Callable[[], object]], busy: Callable[[], bool],
                 parent: QObject | None = None, interval_ms: int = 30) -> None:
        super().__init__(parent)
        self._actions = list(actions)
        self._busy = busy
        self._settle = 0  # polls to wait after an action, so the job it started is seen as busy
        self._timer = QTimer(self, interval=interval_ms)
        self._timer.timeout.connect(self._tick)
        self._timer.start()

    @property
    def done(self) -> bool:
        return not self._actions and self._settle == 0 and not self._busy()

    def _tick(self) -> None:
        if self._settle:
            self._settle -= 1
            return
        if self._busy():
            return
        if not self._actions:
            self._timer.stop()
            return
        self._actions.pop(0)()
        self._settle = 2


def generation_demo(panel) -> ScriptedDemo:
    """The Generate panel mid-generation with a branch, as in the README: six steps, back two, force
    the runner-up candidate (a second branch), three more steps, then inspect the forced token. An
    encoder fills two of its masks."""
    if panel._is_encoder():
        return ScriptedDemo([panel.step, panel.step], lambda: panel.busy, panel)
    if not panel.prompt.text():
        panel.prompt.setText("So she was considering")
    forced = {}

    def force_runner_up() -> None:
        runner_up = next((t for t in panel.bars.token_ids if t != panel.bars.chosen), None)
        if panel.session is not None and runner_up is not None:
            forced["index"] = len(panel.session.prompt) + panel.session.current.depth
            panel.choose(runner_up)

    def inspect_forced() -> None:
        if "index" in forced:  # as a click on that token in the strip
            panel._strip_selected(forced["index"])

    return ScriptedDemo([panel.step] * 6 + [panel.back] * 2 + [force_runner_up] + [panel.step] * 3
                        + [inspect_forced], lambda: panel.busy, panel)


def training_demo(panel) -> None:
    """The Train panel with a run in progress, as in the README: the lectures' motif transformer (3
    blocks, 1 head, width 32, pre-LN), started in a temporary runs folder; the panel's screenshot_ready
    waits for a few evaluations."""
    for combo, value in ((panel.family, "bert"), (panel.norm_placement, "pre"), (panel.task, "motif")):
        combo.setCurrentText(value)
    for spin, value in ((panel.layers, 3), (panel.heads, 1), (panel.d_model, 32), (panel.d_ff, 128),
                        (panel.context, 20), (panel.length, 20), (panel.lr, 1e-3), (panel.warmup, 100),
                        (panel.batch_size, 64), (panel.steps, 3000), (panel.eval_every, 100),
                        (panel.checkpoint_every, 500)):
        spin.setValue(value)
    panel.out_edit.setText(temporary_runs_folder(panel.run))
    panel.start()


def temporary_runs_folder(run) -> str:
    """A new folder for the demo's run, removed (it and only it) when the app exits: at exit the window has closed,
    and its close stopped the `run` (TrainingRun: the process writes its checkpoint, then ends); one still running
    past that close's wait is ended first, so that it writes nothing into the folder once removed. Each
    --screenshot --panel train left one in the temporary folder."""
    import atexit
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="te-screenshot-runs-")

    def remove() -> None:
        try:
            if run.running:
                run.process.kill()
                run.process.waitForFinished(5000)
        except RuntimeError:  # the run's Qt object is gone, and its process with it (QProcess ends it)
            pass
        shutil.rmtree(path, ignore_errors=True)

    atexit.register(remove)
    return path
