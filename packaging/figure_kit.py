"""What the figure scripts (make_*_figures.py) share: waiting on the app offscreen without blocking its
event loop, and the run a figure shows (one given, or trained now into a temporary folder)."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path


def wait_until(app, done, seconds: float, what: str, script: str) -> None:
    """Process the app's events until done() is true, then let the layout settle before a grab; a
    TimeoutError naming the script and `what` after `seconds`."""
    deadline = time.time() + seconds
    while not done():
        if time.time() > deadline:
            raise TimeoutError(f"{script}: {what} did not finish within {seconds:.0f} s")
        app.processEvents()
        time.sleep(0.02)
    for _ in range(10):
        app.processEvents()
        time.sleep(0.01)


def run_or_train(run: str | None, train_args: list[str], name: str):
    """(the run folder, the temporary folder holding it or None): `run` when given, else a run trained
    now with `python -m desktop_app` + train_args into a temporary folder (None, None if it failed)."""
    if run is not None:
        return run, None
    from desktop_app.cli import main as cli

    tmp = tempfile.TemporaryDirectory()
    run = str(Path(tmp.name) / name)
    if cli(train_args + ["--out", run]) != 0:
        tmp.cleanup()
        return None, None
    return run, tmp


def click(widget, pos=None) -> None:
    """A left click on `widget` (at `pos` in it, else its centre), as a person makes it."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    if pos is None:
        QTest.mouseClick(widget, Qt.MouseButton.LeftButton)
    else:
        QTest.mouseClick(widget, Qt.MouseButton.LeftButton, pos=pos)


def save_grab(widget, path: Path, script: str, note: str = "") -> None:
    """`widget` as drawn, to the PNG `path` (an OSError naming the script if it cannot be written)."""
    if not widget.grab().save(str(path)):
        raise OSError(f"{script}: cannot write {path}")
    print(f"wrote {path}" + (f": {note}" if note else ""))
