"""What the figure scripts (make_*_figures.py) share: the app's window or a panel shown offscreen, waiting on it
without blocking its event loop, a click as a person makes it, the grab written as the app's exports write, the
run a figure shows (one given, or trained now into a temporary folder), and a script's exit status."""
from __future__ import annotations

import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

SCREENSHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"  # the README's, the scripts' default


_SETTINGS = None  # the settings folder of a script's own QApplication, removed when the script ends


def application():
    """The QApplication; made now when there is none yet (a script's), with the app's settings in a temporary
    folder, so that a figure never depends on the user's preferences and the runs it opens are not added to
    their recent models."""
    global _SETTINGS
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is None:
        app = QApplication(sys.argv[:1])
        _SETTINGS = tempfile.TemporaryDirectory()
        QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, _SETTINGS.name)
    return app


@contextmanager
def shown_window(width: int = 1280, height: int = 800):
    """(state, window): a new AppState's MainWindow shown at width x height (offscreen), reporting to its status bar
    where it would open a dialog; closed at the end, also after an error (its running jobs cancelled and waited
    for)."""
    application()
    from desktop_app.ui.main_window import MainWindow
    from desktop_app.ui.state import AppState

    state = AppState()
    window = MainWindow(state)
    window.interactive = False  # a dialog would wait for a click no one makes
    window.resize(width, height)
    window.show()
    try:
        yield state, window
    finally:
        window.close()


@contextmanager
def shown_panel(panel_class, folder: str | None, width: int, height: int):
    """A `panel_class` panel alone on the model in `folder` (None: no model), shown at width x height
    (offscreen), given the model as the window gives it one it opens; closed and deleted at the end."""
    application()
    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.ui.offscreen import dispose
    from desktop_app.ui.state import AppState

    state = AppState()
    if folder is not None:
        state.loaded = load_model_folder(folder)
    panel = panel_class(state)
    if folder is not None:
        state.model_changed.emit(state.loaded)
    panel.resize(width, height)
    panel.show()
    try:
        yield panel
    finally:
        dispose(panel)


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


def open_model(app, window, folder, script: str, seconds: float = 120) -> None:
    """Open the model in `folder` in `window` (as File > Open does) and wait until it is loaded and its text traced;
    when the window cannot open it, at once an OSError naming the script, the folder and why (the window's line)."""
    state = window.state
    failed: list[str] = []

    def refused(message: str) -> None:
        failed.append(message)

    state.model_load_failed.connect(refused)
    try:
        window.open_model(folder)
        wait_until(app, lambda: failed or (state.loaded is not None
                                           and (state._trace_job is None or state._trace_job.done)),
                   seconds, f"opening {folder}", script)
    finally:
        state.model_load_failed.disconnect(refused)
    if failed:
        raise OSError(f"{script}: cannot open {folder}: {failed[0]}")


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


@contextmanager
def given_or_trained(run: str | None, train_args: list[str], name: str):
    """run_or_train's run folder (None if training failed), its temporary folder removed at the end."""
    run, tmp = run_or_train(run, train_args, name)
    try:
        yield run
    finally:
        if tmp is not None:
            tmp.cleanup()


def click(widget, pos=None) -> None:
    """A left click on `widget` (at `pos` in it, else its centre), as a person makes it."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    if pos is None:
        QTest.mouseClick(widget, Qt.MouseButton.LeftButton)
    else:
        QTest.mouseClick(widget, Qt.MouseButton.LeftButton, pos=pos)


def click_tab(tabs, title: str) -> int:
    """Click the tab titled `title` of the QTabWidget `tabs`; its index."""
    bar = tabs.tabBar()
    index = next(i for i in range(bar.count()) if bar.tabText(i) == title)
    click(bar, bar.tabRect(index).center())
    return index


def save_grab(widget, path: Path, script: str, note: str = "") -> None:
    """`widget` as drawn, to the PNG `path`, as the app's Export writes it: atomically, replacing the script's own
    earlier figure of that name, never through a link or over a folder (OSError or ValueError naming the script)."""
    from desktop_app.core.files import check_output_file
    from desktop_app.ui.widgets.export import save_widget_png

    try:
        check_output_file(path, overwrite=True)
        save_widget_png(widget, path)
    except OSError as exc:  # core.files.WriteError: "cannot write PATH: why"
        raise OSError(f"{script}: {exc}") from exc
    except ValueError as exc:  # core.files.OutputFileError: a link, never written through
        raise ValueError(f"{script}: {exc}") from exc
    print(f"wrote {path}" + (f": {note}" if note else ""))


def exit_status(work) -> int:
    """0 once work() has returned; 1, its one line on stderr, when it raised one of the errors the scripts raise
    (wait_until's TimeoutError, save_grab's OSError or ValueError)."""
    try:
        work()
    except (TimeoutError, OSError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0
