"""Start the GUI: `transformer-explorer [MODEL_DIR] [--screenshot FILE.png] [--panel NAME]`.

With no model folder it reopens the last session (if any) or the embedded demo model. With
--screenshot it renders the main window offscreen once the model is loaded and the text traced (or
the panel on show has drawn the trace's blocks, its logits still coming: the Attention panel), saves
the PNG (atomically) and exits: 0 on success, non-zero with a message otherwise.
Only PySide6 is imported at module level; torch and the panels come in when needed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable

DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog. Attention is all you need."
SCREENSHOT_SIZE = (1280, 800)
WAIT_S = 30.0  # --screenshot's default wait for the model, then for the panel's demo (a panel may need more:
# its screenshot_wait_s, the Train panel's run)


def build_parser() -> argparse.ArgumentParser:
    from ..app.command_line import COMMANDS_HELP
    from ..app.arguments import OneLineParser, float_in, int_in

    # the CLI's parser: one line for a refusal, a value that starts with '-' as the CLI reads it (`--text=-x`)
    p = OneLineParser(prog="transformer-explorer",
                      description="Transformer Explorer: explore small transformer models offline.",
                      epilog=COMMANDS_HELP)
    p.add_argument("model_dir", nargs="?", metavar="MODEL_DIR",
                   help="model folder to open (config.json + model.safetensors [+ tokenizer.json]); "
                        "default: the last session's model, else the demo model")
    p.add_argument("--screenshot", metavar="FILE.png",
                   help="render the main window offscreen, save it as PNG and exit")
    p.add_argument("--panel", metavar="NAME", help="panel to show first (e.g. model, attention, layers)")
    p.add_argument("--text", help="text to tokenize and trace (default: the demo text)")
    p.add_argument("--size", default=f"{SCREENSHOT_SIZE[0]}x{SCREENSHOT_SIZE[1]}", metavar="WxH",
                   help="window size for --screenshot (default %(default)s)")
    p.add_argument("--timeout", type=float_in(0, 86400, lo_open=True), default=None,
                   help=f"seconds --screenshot waits for the model, then for the panel's demo (default {WAIT_S:g}; "
                        "the Train panel's run: 240)")
    entry = p.add_mutually_exclusive_group()
    entry.add_argument("--install-desktop-entry", action="store_true",
                       help="install a menu launcher (desktop entry) and icons for this user, launching this "
                            "program, and exit (Linux; ${XDG_DATA_HOME:-~/.local/share})")
    entry.add_argument("--uninstall-desktop-entry", action="store_true",
                       help="remove the launcher and icons --install-desktop-entry installed, and exit")
    p.add_argument("--settle-ms", type=int_in(0, 60_000), default=400, help=argparse.SUPPRESS)  # time for panels to repaint
    p.add_argument("--quit-when-ready", action="store_true", help=argparse.SUPPRESS)  # startup benchmark
    return p


def demo_text(max_chars: int = 160) -> str:
    """The first real paragraph of resources/demo-text.txt (not a title), cut at a word boundary."""
    from ..paths import demo_text_path

    try:
        text = demo_text_path().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return DEFAULT_TEXT
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
    para = next((p for p in paragraphs if len(p) >= 80), "")
    if len(para) > max_chars:
        para = para[: para.rfind(" ", 0, max_chars + 1)].rstrip(" ,;:")
    return para or DEFAULT_TEXT


def import_torch() -> None:
    """Import torch (and numpy with it) without PySide6's import hook. Once PySide6 is imported,
    builtins.__import__ is shiboken's __feature_import__, which reads the whole source of every module
    imported after it, looking for the word "PySide6" (for its opt-in `from __feature__ import ...`): for
    torch's ~1,100 modules that was ~0.5 s of CPU, most of start-up beyond the bare imports (bench startup;
    `import PySide6.QtWidgets, torch` costs that much more than `import torch, PySide6.QtWidgets`). torch
    calls no Qt, so its modules need no feature registration; the splash is on screen meanwhile.

    Also with garbage collection off and what the imports made frozen (imports.kept_for_good). Nothing
    done where torch is imported already (a test's process)."""
    import builtins

    from ..imports import kept_for_good
    from . import PYTHON_IMPORT

    if "torch" in sys.modules:
        return
    hooked = builtins.__import__
    builtins.__import__ = PYTHON_IMPORT
    try:
        with kept_for_good():
            import torch  # noqa: F401
    finally:
        builtins.__import__ = hooked


def leave_a_core_for_the_ui() -> None:
    """Run torch's intra-op threads on the cores free now but one, so the UI thread stays responsive while a
    model job runs (on a busy 2-core machine two spinning torch threads made every op ~50x slower;
    desktop_app.threads). An explicit OMP_NUM_THREADS wins."""
    from ..threads import fit_torch_threads

    fit_torch_threads(reserve=1)


def _needs_offscreen() -> bool:
    return sys.platform.startswith("linux") and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY")


# What Qt's xcb platform plugin (libqxcb.so -> libQt6XcbQpa.so.6) loads, and the Debian/Ubuntu package
# of each (from ldd on PySide6's plugin; Qt 6 no longer needs xinerama). A minimal install lacks some.
XCB_LIBRARIES = {
    "libxcb.so.1": "libxcb1", "libX11-xcb.so.1": "libx11-xcb1", "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4", "libxcb-image.so.0": "libxcb-image0",
    "libxcb-keysyms.so.1": "libxcb-keysyms1", "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render.so.0": "libxcb-render0", "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0", "libxcb-shm.so.0": "libxcb-shm0", "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-util.so.1": "libxcb-util1", "libxcb-xfixes.so.0": "libxcb-xfixes0", "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxkbcommon.so.0": "libxkbcommon0", "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libfontconfig.so.1": "libfontconfig1", "libGL.so.1": "libgl1", "libEGL.so.1": "libegl1",
    "libdbus-1.so.3": "libdbus-1-3",
}


def _will_use_xcb() -> bool:
    """Whether Qt is about to load its xcb plugin (Linux, an X display, no other platform asked for)."""
    if not sys.platform.startswith("linux"):
        return False
    platform = os.environ.get("QT_QPA_PLATFORM", "").split(":")[0].split(";")[0].strip()
    if platform:
        return platform == "xcb"
    return bool(os.environ.get("DISPLAY")) and not os.environ.get("WAYLAND_DISPLAY")


def display_problem() -> str | None:
    """The one line to say when there is no display to open the window on (Linux, DISPLAY and
    WAYLAND_DISPLAY unset, no Qt platform chosen): Qt would abort with a core dump."""
    if not _needs_offscreen() or os.environ.get("QT_QPA_PLATFORM", "").strip() not in ("", "xcb", "wayland"):
        return None
    return ("no display to open the window on (DISPLAY and WAYLAND_DISPLAY are unset): run it in a desktop "
            "session, or use --screenshot FILE.png, or the command line (python -m desktop_app --help)")


def missing_xcb_packages(load=None) -> list[tuple[str, str]]:
    """(library, package) for each library of the xcb plugin that cannot be loaded."""
    import ctypes

    load = load or ctypes.CDLL
    missing = []
    for library, package in XCB_LIBRARIES.items():
        try:
            load(library)
        except OSError:
            missing.append((library, package))
    return missing


def xcb_problem(load=None) -> str | None:
    """One line naming what to install, when Qt's xcb plugin would fail to load (Qt itself aborts the
    process with a generic message that names neither the library nor the package); else None."""
    if not _will_use_xcb():
        return None
    missing = missing_xcb_packages(load)
    if not missing:
        return None
    libraries = ", ".join(lib for lib, _ in missing)
    packages = " ".join(dict.fromkeys(pkg for _, pkg in missing))
    return (f"Qt's X11 (xcb) display plugin cannot load: {libraries} missing. "
            f"Install with: sudo apt-get install {packages}")


def _parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
        if w < 200 or h < 150:
            raise ValueError
        return w, h
    except ValueError:
        raise SystemExit(f"transformer-explorer: error: --size must look like 1280x800, got {text!r}") from None


def _fail(message: str, code: int = 1) -> int:
    print(f"transformer-explorer: error: {message}", file=sys.stderr)
    return code


def app_icon():
    from PySide6.QtGui import QIcon

    from ..paths import resources_dir

    icons = resources_dir() / "icons"
    icon = QIcon()
    svg = icons / "transformer-explorer.svg"
    if svg.is_file():
        icon.addFile(str(svg))
    for png in sorted(icons.glob("transformer-explorer-*.png")):
        icon.addFile(str(png))
    return icon


class StartupWatcher:
    """Knows when the window shows its model: loaded, and the text tokenized and traced, or the panel on show
    drawn from the trace's blocks while its logits are still coming (`drawn_early`, asked when the panel says it
    has drawn: AppState.drawing_done; the Attention panel's model view needs no logits)."""

    def __init__(self, state, expect_model: bool, drawn_early: Callable[[], bool] = lambda: False) -> None:
        self.expect_model = expect_model
        self.drawn_early = drawn_early
        self.state = state
        self.shot_pending = False  # --screenshot's render still to come (shot_taken)
        state.hold_logits(self._render_to_come)
        self.model_loaded = False
        self.traced = False
        self.failed: str | None = None
        self.on_change = lambda: None
        state.model_changed.connect(self._loaded)
        state.model_load_failed.connect(self._failed)
        # (a trace arriving in pieces puts its text on show before it is whole: AppState.tracing then)
        state.trace_changed.connect(lambda trace: self._traced() if trace is not None or state.tracing is None
                                    else None)
        state.error.connect(self._traced)  # text that cannot be traced: the window shows the message
        state.drawing_done.connect(lambda: self.on_change())  # (the panel drawn from the blocks: drawn_early)

    @property
    def ready(self) -> bool:
        return self.failed is not None or not self.expect_model or (
            self.model_loaded and (self.traced or self.drawn_early()))

    def _render_to_come(self) -> bool:
        """The window is drawn before the logits and --screenshot's render of it is still to come: the logits
        wait for it (AppState.hold_logits), as for any paint."""
        return self.shot_pending and self.drawn_early()

    def shot_taken(self) -> None:
        """--screenshot's render is done: the logits held for it start."""
        self.shot_pending = False
        self.state.drawing_ended()

    def _loaded(self, _loaded) -> None:
        self.model_loaded = True
        self.on_change()

    def _failed(self, message: str) -> None:
        self.failed = message
        self.on_change()

    def _traced(self, *_args) -> None:
        if self.model_loaded:
            self.traced = True
        self.on_change()

    def wait(self, timeout_s: float) -> bool:
        """Run the event loop until ready or the timeout; True when ready."""
        from PySide6.QtCore import QEventLoop, QTimer

        if self.ready:
            return True
        loop = QEventLoop()
        self.on_change = lambda: loop.quit() if self.ready else None
        timeout = QTimer(loop, singleShot=True, interval=int(timeout_s * 1000))
        timeout.timeout.connect(loop.quit)
        timeout.start()
        loop.exec()
        timeout.stop()  # ready before the timeout: no timer left running (--timeout 120: for 2 minutes)
        self.on_change = lambda: None
        return self.ready


def drawn_before_the_logits(window) -> bool:
    """Whether the panel on show has drawn the text's trace from its blocks, its logits still coming (a panel
    that can says so: the Attention panel's drawn_before_the_logits)."""
    slot = window.current_slot()
    drawn = getattr(slot.panel if slot is not None else None, "drawn_before_the_logits", None)
    return callable(drawn) and drawn()


def _settle(ms: int) -> None:
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(ms, loop, loop.quit)
    loop.exec()


def _show_splash(app):
    """The icon and the name, shown before the heavy imports (torch) so a double-click answers at once."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QColor, QFont, QPainter, QPixmap
    from PySide6.QtWidgets import QSplashScreen

    pixmap = QPixmap(440, 140)
    pixmap.fill(QColor(35, 64, 122))
    painter = QPainter(pixmap)
    painter.drawPixmap(20, 22, app_icon().pixmap(96, 96))
    painter.setPen(QColor(255, 255, 255))
    font = QFont(app.font())
    font.setPointSize(14)
    font.setBold(True)
    painter.setFont(font)
    painter.drawText(132, 30, 300, 40, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, "Transformer Explorer")
    font.setPointSize(9)
    font.setBold(False)
    painter.setFont(font)
    painter.drawText(132, 72, 300, 40, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, "Loading…")
    painter.end()
    splash = QSplashScreen(pixmap)
    splash.show()
    app.processEvents()
    return splash


def _close_on_terminal_signals(window):
    """Ctrl+C or SIGTERM in the terminal close the window normally (the session is saved).
    Returns a function that ends this: the previous handlers back and the wake-up timer stopped, so
    nothing is left pointing at the window after app.exec returns (main run in-process, as the
    tests do, would otherwise leave a handler and a 250 ms timer per window)."""
    import signal

    from PySide6.QtCore import QTimer

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, lambda *_: window.close())
    wake = QTimer(window, interval=250)  # Python runs signal handlers only between bytecodes
    wake.timeout.connect(lambda: None)
    wake.start()

    def end() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        wake.stop()

    return end


def _session_not_restored(path: Path, exc: BaseException) -> str:
    """One line for a last session that could not be restored; the file is moved aside (renamed, never
    deleted) so the next start is clean and the user can still look at it."""
    from .workspace import WorkspaceError, move_aside

    problem = exc.problem if isinstance(exc, WorkspaceError) else f"{type(exc).__name__}: {exc}"
    problem = " ".join(str(problem).split())[:300]  # one line, whatever the exception said
    try:
        moved = f"moved it to {move_aside(path).name}"
    except OSError as err:
        moved = f"could not move it aside ({err.strerror or err})"
    return f"Last session not restored: {path}: {problem}. Started with defaults; {moved}."


def _notify(window, title: str, message: str) -> None:
    """Say it in the window, without blocking the start: the status bar and a non-modal notice."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QMessageBox

    window.statusBar().showMessage(message)
    box = QMessageBox(QMessageBox.Icon.Warning, title, message, QMessageBox.StandardButton.Ok, window)
    box.setObjectName("startup-notice")
    box.setWindowModality(Qt.WindowModality.NonModal)
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    box.show()


def _run_panel_demo(window, deadline: float) -> bool:
    """Optional panel hooks for --screenshot: screenshot_demo() starts something worth showing (a
    short generation, a sweep); screenshot_ready() says when it (or the panel's own computation of the
    trace, e.g. the Layers panel's numbers) is done. False on timeout."""
    slot = window.current_slot()
    panel = slot.panel if slot is not None else None
    demo = getattr(panel, "screenshot_demo", None)
    if callable(demo):
        demo()
    ready = getattr(panel, "screenshot_ready", None)
    while callable(ready) and not ready():
        if time.time() > deadline:
            return False
        _settle(50)
    return True


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.install_desktop_entry or args.uninstall_desktop_entry:  # no window: before Qt
        from ..desktop_entry import run as desktop_entry

        return desktop_entry(uninstalling=args.uninstall_desktop_entry)
    headless = bool(args.screenshot or args.quit_when_ready)
    if args.screenshot and not args.screenshot.lower().endswith(".png"):
        return _fail(f"--screenshot needs a .png file name, got {args.screenshot!r}", 2)
    if args.screenshot and not Path(args.screenshot).resolve().parent.is_dir():
        return _fail(f"{args.screenshot}: the folder {Path(args.screenshot).resolve().parent} does not exist", 2)
    if headless and _needs_offscreen():
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication as _QApplication

    if _QApplication.instance() is None and (problem := display_problem() or xcb_problem()) is not None:
        return _fail(problem)  # before QApplication: Qt would abort the process with its generic message

    from PySide6.QtWidgets import QApplication

    from . import settings as app_settings

    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setOrganizationName(app_settings.ORGANIZATION)
    app.setApplicationName(app_settings.APPLICATION)
    app.setDesktopFileName("transformer-explorer")
    app.setWindowIcon(app_icon())
    splash = None if headless else _show_splash(app)  # something on screen while torch loads
    import_torch()

    from .errors import ExceptionHandler
    from .main_window import MainWindow
    from .state import AppState
    leave_a_core_for_the_ui()
    from .workers import collect_garbage_on_the_ui_thread

    collect_garbage_on_the_ui_thread(app)  # never in a worker: Qt objects must die on their own thread
    state = AppState()
    window = MainWindow(state)
    window.interactive = not headless
    if splash is not None:
        splash.finish(window)  # closes when the main window is shown
    handler = ExceptionHandler(window, show_dialog=not headless).install()
    try:
        return _run(app, args, state, window, started)
    finally:
        handler.uninstall()


def _run(app, args, state, window, started: float) -> int:
    import logging

    from ..paths import demo_model_dir
    from . import settings as app_settings
    from .workspace import last_session_path, load_workspace

    log = logging.getLogger("desktop_app")
    headless = bool(args.screenshot or args.quit_when_ready)
    workspace = None
    notices: list[tuple[str, str]] = []  # (title, line): what the restore could not do, said in the window
    if not headless:
        prefs = app_settings.Preferences.load()
        window.apply_preferences(prefs)
        window.restore_window_settings()
        window.session_path = last_session_path()
        if args.model_dir is None and prefs.restore_session and window.session_path.is_file():
            try:  # nothing in the last session may stop the app from starting (DESIGN.md)
                workspace = load_workspace(window.session_path)
                window.apply_workspace(workspace, open_model=False)
            except Exception as exc:  # noqa: BLE001 - a bad file, a wrong type anywhere, a bug: start with defaults
                workspace = None
                notices.append(("Last session not restored", _session_not_restored(window.session_path, exc)))
    else:
        window.resize(*_parse_size(args.size))

    model_path: str | None = args.model_dir
    if model_path is not None:  # the desktop entry's %f may hand over config.json or a weights file
        from .main_window import model_folder_of

        model_path = model_folder_of(model_path) or model_path
    if model_path is None and workspace is not None and workspace.model_path:
        from .main_window import model_folder_of

        if model_folder_of(workspace.model_path) == workspace.model_path:  # a folder or a GGUF file, still there
            model_path = workspace.model_path
        else:
            notices.append(("Model folder missing", f"The last session's model folder {workspace.model_path} is gone; "
                            + ("opened the demo model instead." if demo_model_dir().is_dir() else "no model opened.")))
    if model_path is None and demo_model_dir().is_dir():
        model_path = str(demo_model_dir())
    text = args.text if args.text is not None else (workspace.text if workspace is not None and workspace.text
                                                    else demo_text())
    state.set_text(text)
    if args.panel:
        try:
            window.slot(args.panel)
        except KeyError as exc:
            return _fail(exc.args[0], 2)

    watcher = StartupWatcher(state, expect_model=model_path is not None,
                             drawn_early=lambda: drawn_before_the_logits(window))
    watcher.shot_pending = bool(args.screenshot)
    if model_path is not None:  # loaded in a worker while the panel on show is built and the window shown
        window.open_model(model_path)
    if args.panel:
        window.show_panel(args.panel)
    window.show()
    for title, message in notices:
        log.warning("%s", message)
        _notify(window, title, message)
    if model_path is None:
        message = (f"No model open: the demo model is not installed ({demo_model_dir()}). "
                   "Open a model folder with File > Open Model Folder… (Ctrl+O) or drop one on the window.")
        window.statusBar().showMessage(message)
        if headless:
            print(f"transformer-explorer: warning: {message}", file=sys.stderr)

    if not headless:
        end_terminal_signals = _close_on_terminal_signals(window)
        try:
            return app.exec()  # the other panels are built when their tab is first shown
        finally:
            end_terminal_signals()

    wait_s = args.timeout or WAIT_S
    try:
        if not watcher.wait(wait_s):
            return _fail(f"the model did not finish loading within {wait_s:g} s ({model_path})")
        if watcher.failed is not None:
            return _fail(f"cannot open the model: {watcher.failed}")
        if args.panel and window.panel_refused:  # (the screenshot would be of another panel)
            return _fail(f"--panel {args.panel}: {window.panel_refused}", 2)
        if args.quit_when_ready:
            print(f'{{"ready_at": {time.time():.6f}, "started_at": {started:.6f}}}', flush=True)
            return 0
        slot = window.current_slot()
        demo_s = args.timeout or getattr(slot.panel if slot is not None else None, "screenshot_wait_s", WAIT_S)
        if not _run_panel_demo(window, deadline=time.time() + demo_s):
            return _fail(f"the {window.current_slot().title} panel's screenshot demo did not finish within {demo_s:g} s")
        _settle(args.settle_ms)
        from .widgets.export import save_widget_png

        try:
            save_widget_png(window, args.screenshot)
        except OSError as exc:
            return _fail(f"{args.screenshot}: cannot write the screenshot ({exc})")
        finally:
            watcher.shot_taken()
        size = Path(args.screenshot).stat().st_size
        if size == 0:
            return _fail(f"{args.screenshot}: the screenshot is empty")
        print(f"saved {args.screenshot} ({size:,} bytes)")
        # A panel drawn before the logits was saved while they were held for its render (AppState.hold_logits):
        # the trace ends before the window closes, as it did when they ran beside the render (a close cancels
        # a job that has not started; bench firstlook's exit and peak memory count them)
        watcher.drawn_early = lambda: False
        watcher.wait(wait_s)
        return 0
    finally:
        window.close()  # panels stop what a demo started (a training process...), also on failure


if __name__ == "__main__":
    sys.exit(main())
