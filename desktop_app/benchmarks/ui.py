"""What a person meets after the first look: the UI thread's stalls, panel by panel.

    python -m desktop_app bench ui [--shape qwen2.5-0.5b|tiny|...] [--tokens 1024] [--panels Layers,Model,...]
                                   [--settle-s 60]

A random bfloat16 checkpoint of the shape with the demo tokenizer and a text of `--tokens` tokens (bench
firstlook's folder and text), opened in a fresh process (offscreen, 1280x800) on the Attention panel. A
5 ms heartbeat timer on the UI thread measures its stalls: a gap between two beats longer than
`--stall-ms` (default 50 ms) is a stall a person feels (a click or a repaint waits that long). The phases:

- first look: the window shown until the text is traced, the panel drawn and every worker done;
- each panel's tab clicked (a real mouse click on the tab bar), until it is painted (first_show_ms: the
  click to the first beat after the panel's first paint, its build included) and settled (settled_s: its
  workers done, its screenshot_ready() true, no stall for 0.3 s);
- on panels with views of their own in tabs, each other view's tab clicked, then the first again;
- on panels with a layer or head control, the control stepped with the Up key (layer, then head), each
  until settled; then the mouse moved over the panel's centre line (hover).

Per phase: the longest gap (longest_stall_ms), the stalls' total (stalls_ms) and count. The phases are
printed as a table on stderr; the last line is the JSON result. The first look phase holds the Attention panel's
build (pyqtgraph's import) and the window's first paint, which the app does under its splash.

Qwen2.5-0.5B, 1,024 tokens, three runs alternating with the code before (issue 38, look9; load 1.3-1.8), longest
stall before -> after: the Model tab 463-561 -> 90-102 ms (1,410 in a run at load 2.8: the chips' log-softmax,
now in a worker), the Layers panel's result 715-918 -> 354-451 (each view drawn when shown), the Attention
panel's Head statistics tab 489-603 -> 86-94 (the heatmap's numbers plain text items); the stalls after the
first look 3.96-5.27 s -> 2.40-3.33 s in all. What is left is each panel's first build (100-450 ms).
Then (look10; four runs each, load 1.3-4.0): the Layers panel's first show 145-340 -> 104-229 ms (each view's
widget made when its tab is first shown), Dynamics 249-408 -> 195-427 (its plots' menus made at a right-click:
within this machine's noise).
Then (look11; three runs each alternating with the code before, load 2.8-4.3 on a shared machine): first show
before -> after, ms: What if 122-349 -> 85-161 (the patching maps made at their tab's first show), Generate
101-313 -> 95-106 (398 in a run at a load spike; two of its three plots made when first shown), the Attention
tab's return 108-134 -> 64-99 (its views made when first shown, as Layers'); the figures overlap at this load.
In one process, interleaved, each panel's build and first paint against everything made at once (load 2.0):
Attention 0.22x, Generate 0.66x, What if 0.62x. Dynamics makes nothing that is not on show (its seven plots
are); Graph only a tab of plain widgets. Every panel's screenshot_ready() is read here now (none needs its
--screenshot demo to have run). The Layers tab, the first clicked after the first look, showed 117-220 -> 254-790
ms (five runs each, two of them `--panels Layers,Attention`, load 2.3-4.3). Then (look12; `--panels Layers,Attention`,
two runs each alternating with that code, load 1.6-3.5): its first show 318, 255 -> 83, 78 ms. Not a first heatmap's
cost: with the analysis held, the UI thread's own CPU time for the click was the same as main d2bd6a5's (127 / 126 ms);
the layer analysis's worker, started in the click's build, took both cores from the first paint. It starts just
after the panel's first paint now (view_panel.START_AFTER_FIRST_PAINT).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import child_env
from ..commands.args import OneLineParser, int_in

DEFAULT_PANELS = ("Layers", "Model", "Generate", "Features", "What if", "Lipschitz", "Dynamics", "Graph", "Attention")
# the controls a person steps on a panel to look at another layer or head, in the order tried
STEPPED = ("layer_spin", "head_spin", "depth_slider", "layer", "head", "model_layer", "model_head", "routing_layer")
HEARTBEAT_MS = 5


class Heartbeat:
    """A timer beating every HEARTBEAT_MS on the UI thread; each gap between beats is charged to the phase on."""

    def __init__(self, stall_ms: float) -> None:
        from PySide6.QtCore import Qt, QTimer

        self.stall_s = stall_ms / 1000
        self.phases: list[dict] = []
        self.last = time.perf_counter()
        self.quiet_since = self.last
        self.timer = QTimer(timerType=Qt.TimerType.PreciseTimer, interval=HEARTBEAT_MS)
        self.timer.timeout.connect(self._beat)
        self.timer.start()

    def begin(self, name: str) -> dict:
        phase = {"phase": name, "started": time.perf_counter(), "longest_stall_ms": 0.0, "stalls_ms": 0.0,
                 "stalls": 0}
        self.phases.append(phase)
        return phase

    def _beat(self) -> None:
        now = time.perf_counter()
        gap = now - self.last
        self.last = now
        if self.phases:
            phase = self.phases[-1]
            phase["longest_stall_ms"] = max(phase["longest_stall_ms"], gap * 1000)
            if gap > self.stall_s:
                phase["stalls_ms"] += gap * 1000
                phase["stalls"] += 1
        if gap > self.stall_s:
            self.quiet_since = now

    def stop(self) -> None:
        self.timer.stop()


def _pump(ms: int = 5) -> None:
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def _settle(window, beat: Heartbeat, timeout_s: float, quiet_s: float = 0.3) -> bool:
    """Run the event loop until no worker runs, the panel on show says it is drawn, and no stall for quiet_s."""
    from PySide6.QtCore import QThreadPool

    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        _pump(20)
        slot = window.current_slot()
        panel = slot.panel if slot is not None else None
        ready = getattr(panel, "screenshot_ready", None)  # (what is on show is drawn)
        if (QThreadPool.globalInstance().activeThreadCount() == 0 and (not callable(ready) or ready())
                and window.state.tracing is None and time.perf_counter() - beat.quiet_since >= quiet_s):
            return True
    return False


class _PaintSeen:
    """Notes the first paint of any widget inside `page` (an application-wide event filter)."""

    def __init__(self, app, page) -> None:
        from PySide6.QtCore import QEvent, QObject

        seen = self

        class Filter(QObject):
            def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt's name
                if (not seen.painted and event.type() == QEvent.Type.Paint and obj.isWidgetType()
                        and (obj is page or page.isAncestorOf(obj))):
                    seen.painted = True
                return False

        self.painted = False
        self.filter = Filter()
        self.app = app
        app.installEventFilter(self.filter)

    def remove(self) -> None:
        self.app.removeEventFilter(self.filter)


def _stepped_controls(panel) -> list:
    from PySide6.QtWidgets import QAbstractSlider, QAbstractSpinBox, QComboBox

    found = []
    for name in STEPPED:
        w = getattr(panel, name, None)
        if (isinstance(w, (QAbstractSpinBox, QAbstractSlider, QComboBox)) and w.isVisible() and w.isEnabled()
                and (not isinstance(w, QComboBox) or w.count() > 1)):
            found.append((name, w))
    return found


def measure(folder: str, text: str, panels: list[str], stall_ms: float = 50.0, settle_s: float = 60.0) -> list[dict]:
    """The phases of a scripted look at `folder` (see the module's docstring), in this process; a QApplication
    must exist or is made. Each phase's dict: phase, longest_stall_ms, stalls_ms, stalls, settled_s, settled
    (False: it timed out), and first_show_ms for a panel's tab."""
    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication, QTabWidget

    from ..ui.main_window import MainWindow
    from ..ui.state import AppState

    app = QApplication.instance() or QApplication([sys.argv[0]])
    state = AppState()
    window = MainWindow(state)
    window.interactive = False
    window.resize(1280, 800)
    beat = Heartbeat(stall_ms)
    try:
        phase = beat.begin("first look")
        state.set_text(text)
        window.open_model(folder)
        window.show_panel("Attention")
        window.show()
        _finish(phase, _settle(window, beat, settle_s))
        for title in panels:
            slot = window.slot(title)
            bar = window.tabs.tabBar()
            paint = _PaintSeen(app, slot)
            paint.painted = window.tabs.currentWidget() is slot  # (a click on the tab on show paints nothing)
            phase = beat.begin(title)
            QTest.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(window.tabs.indexOf(slot)).center())
            deadline = time.perf_counter() + settle_s
            while not paint.painted and time.perf_counter() < deadline:
                _pump(1)
            _pump(1)  # the beat after the paint
            paint.remove()
            phase["first_show_ms"] = round((beat.last - phase["started"]) * 1000, 1)
            _finish(phase, _settle(window, beat, settle_s))
            if slot.panel is None:
                continue
            stepped: set[str] = set()

            def step_controls() -> None:  # each stepped control once, on the first view that shows it
                for name, control in _stepped_controls(slot.panel):
                    if name not in stepped:
                        stepped.add(name)
                        phase = beat.begin(f"{title}: {name} up")
                        QTest.keyClick(control, Qt.Key.Key_Up)
                        _finish(phase, _settle(window, beat, settle_s))
            views = getattr(slot.panel, "tabs", None)  # a panel's own views' tabs (Attention, Layers...)
            if isinstance(views, QTabWidget):
                bar = views.tabBar()
                for i in [*range(views.currentIndex() + 1, views.count()), views.currentIndex()]:
                    if not bar.isTabVisible(i) or not bar.isTabEnabled(i):
                        continue
                    phase = beat.begin(f"{title}: {views.tabText(i)} tab")
                    QTest.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(i).center())
                    _finish(phase, _settle(window, beat, settle_s))
                    step_controls()
            step_controls()
            phase = beat.begin(f"{title}: hover")
            page = slot.panel
            for i in range(1, 20):
                QTest.mouseMove(page, QPoint(page.width() * i // 20, page.height() // 2))
                _pump(10)
            _finish(phase, _settle(window, beat, settle_s))
    finally:
        beat.stop()
        window.close()
        window.deleteLater()
    return [{k: (round(v, 1) if isinstance(v, float) else v) for k, v in p.items() if k != "started"}
            for p in beat.phases]


def _finish(phase: dict, settled: bool) -> None:
    phase["settled_s"] = round(time.perf_counter() - phase["started"], 3)
    phase["settled"] = settled


CHILD = """
import json, sys
from desktop_app.benchmarks.ui import measure
args = json.loads(sys.argv[1])
print(json.dumps({"phases": measure(**args)}), flush=True)
"""


def table(phases: list[dict]) -> str:
    lines = [f"{'phase':32} {'first show ms':>13} {'settled s':>9} {'longest stall ms':>16} {'stalls ms':>9} {'n':>3}"]
    for p in phases:
        shown = f"{p['first_show_ms']:.0f}" if "first_show_ms" in p else ""
        lines.append(f"{p['phase'][:32]:32} {shown:>13} {p['settled_s']:>9.2f}{'' if p['settled'] else '!'} "
                     f"{p['longest_stall_ms']:>16.0f} {p['stalls_ms']:>9.0f} {p['stalls']:>3}")
    return "\n".join(lines)


def main(argv: list[str]) -> dict:
    from .firstlook import make_folder, text_of
    from .scale import SHAPES

    ap = OneLineParser(prog="bench ui")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--tokens", type=int_in(1, 32_768), default=1024, help="tokens of text (default 1024)")
    ap.add_argument("--panels", default=",".join(DEFAULT_PANELS),
                    help="the tabs clicked, in order, comma-separated (default: %(default)s)")
    ap.add_argument("--stall-ms", type=int_in(10, 10_000), default=50, help="a gap longer than this is a stall")
    ap.add_argument("--settle-s", type=int_in(1, 3600), default=120, help="the most each phase is waited for")
    args = ap.parse_args(argv)
    from ..ui.panels import PANELS

    titles = {t.lower(): t for t, _, _ in PANELS}
    panels = [p.strip() for p in args.panels.split(",") if p.strip()]
    unknown = [p for p in panels if p.lower() not in titles]
    if unknown or not panels:
        ap.error(f"--panels: no panel named {', '.join(map(repr, unknown)) or 'at all'} "
                 f"(panels: {', '.join(titles.values())})")
    panels = [titles[p.lower()] for p in panels]
    text, _ids = text_of(args.tokens)
    with tempfile.TemporaryDirectory(prefix="bench-ui-") as tmp:
        folder = Path(tmp) / args.shape
        params = make_folder(args.shape, folder)
        env = child_env(QT_QPA_PLATFORM="offscreen", XDG_DATA_HOME=str(Path(tmp) / "data"),
                        XDG_CONFIG_HOME=str(Path(tmp) / "config"))
        spec = {"folder": str(folder), "text": text, "panels": panels, "stall_ms": args.stall_ms,
                "settle_s": args.settle_s}
        done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True,
                              env=env, timeout=3600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith('{"phases"')]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"bench ui: the measured process failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    phases = json.loads(lines[-1])["phases"]
    print(table(phases), file=sys.stderr)
    after_first = [p for p in phases if p["phase"] != "first look"]
    return {"name": "ui", "shape": args.shape, "params": params, "tokens": args.tokens, "phases": phases,
            "longest_stall_ms": max((p["longest_stall_ms"] for p in after_first), default=0.0),
            "stalls_ms": round(sum(p["stalls_ms"] for p in after_first), 1),
            "load_average": round(os.getloadavg()[0], 2)}
