"""widgets.after_first_paint: work asked for before a widget's first paint runs just after it, once."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QWidget

from desktop_app.ui.widgets.after_first_paint import AfterFirstPaint


class PaintWatch(QObject):
    """Notes each paint of the widget in the log the work writes to too."""

    def __init__(self, widget: QWidget, log: list) -> None:
        super().__init__(widget)
        self.log = log
        widget.installEventFilter(self)

    def eventFilter(self, obj, event) -> bool:  # noqa: N802
        if event.type() == QEvent.Type.Paint:
            self.log.append("painted")
        return False


def _held(qtbot, widget: QWidget | None = None) -> tuple[QWidget, AfterFirstPaint, list]:
    """A widget (not shown yet unless given) and one piece of work held for its first paint, noted in `ran`."""
    w = widget if widget is not None else QWidget()
    qtbot.addWidget(w)
    after = AfterFirstPaint(w)
    ran: list = []
    after.call(lambda: ran.append(1))
    return w, after, ran


def test_work_asked_for_before_the_first_paint_runs_after_it_once_in_order(qtbot):
    w = QWidget()
    qtbot.addWidget(w)
    log: list = []
    PaintWatch(w, log)
    after = AfterFirstPaint(w)
    after.call(lambda: log.append("first"))
    after.call(lambda: log.append("second"))
    assert log == [] and after.pending
    w.resize(200, 100)
    w.show()
    qtbot.waitUntil(lambda: "second" in log, timeout=5_000)
    assert log.index("painted") < log.index("first") < log.index("second")
    assert not after.pending and after.painted
    w.update()
    qtbot.waitUntil(lambda: log.count("painted") >= 2, timeout=5_000)
    qtbot.wait(20)  # (a turn of the event loop after that paint)
    assert log.count("first") == 1 and log.count("second") == 1  # run once, not at each paint


def test_once_painted_work_runs_at_once(qtbot):
    w = QWidget()
    qtbot.addWidget(w)
    after = AfterFirstPaint(w)
    w.show()
    qtbot.waitUntil(lambda: after.painted, timeout=5_000)
    ran: list = []
    after.call(lambda: ran.append(1))
    assert ran == [1] and not after.pending  # (in the call, not a turn later)


def test_a_hidden_widget_runs_its_work_at_the_next_turn_of_the_event_loop(qtbot):
    """No paint is coming (built on a hidden tab, alone in a test or the CLI): the work is not held for one."""
    w, after, ran = _held(qtbot)
    assert ran == [] and after.pending
    qtbot.waitUntil(lambda: ran == [1], timeout=5_000)
    assert not after.pending and not after.painted and not w.isVisible()
    after.call(lambda: ran.append(2))  # still not painted: again a turn later
    qtbot.waitUntil(lambda: ran == [1, 2], timeout=5_000)


def test_a_visible_widget_whose_paint_never_comes_runs_its_work_after_the_fallback(qtbot, monkeypatch):
    monkeypatch.setattr(AfterFirstPaint, "FALLBACK_MS", 50)
    shown = QWidget()
    shown.setUpdatesEnabled(False)  # (no paint event is sent)
    shown.show()
    _, after, ran = _held(qtbot, shown)
    qtbot.wait(10)
    assert ran == [] and after.pending  # visible: held for its paint
    qtbot.waitUntil(lambda: ran == [1], timeout=5_000)
    assert after.painted  # (from now on work runs at once)


def test_cancelled_work_never_runs(qtbot):
    w, after, ran = _held(qtbot)
    after.cancel()
    assert not after.pending
    w.show()
    qtbot.waitUntil(lambda: after.painted, timeout=5_000)
    qtbot.wait(20)
    assert ran == []
