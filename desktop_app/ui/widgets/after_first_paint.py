"""Work asked for before a widget's first paint, started just after that paint.

A panel built by a click on its tab that starts its workers at once lets their numpy and torch work take the
cores from the panel's first paint (bench ui: the Layers tab's first show 1.2-1.9x slower, the Dynamics tab's
195-430 ms). `AfterFirstPaint(widget)` holds what `call(fn)` is given until the widget's first paint has
reached the screen (the next turn of the event loop after it), then runs each held callable once, in order.
Once painted, `call` runs at once. A widget not about to be painted (neither it nor its parent visible: built on
a hidden tab, alone in a test or the CLI) runs what it holds at the next turn of the event loop; a visible one
whose paint never comes (FALLBACK_MS) runs it then.

    self._after_paint = AfterFirstPaint(self)
    self._after_paint.call(lambda: self.start_worker())
    self._after_paint.pending   # True while something waits
    self._after_paint.cancel()  # what waits never runs
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QWidget


class AfterFirstPaint(QObject):
    FALLBACK_MS = 1000  # a paint that never comes holds the work no longer

    def __init__(self, widget: QWidget) -> None:
        super().__init__(widget)  # (its timers die with the widget)
        self._widget = widget
        self._held: list[Callable[[], object]] = []
        self.painted = False  # the first paint done (or waited for FALLBACK_MS): from now on call runs at once
        self._fallback = QTimer(self, singleShot=True, interval=self.FALLBACK_MS)
        self._fallback.timeout.connect(self._waited_enough)
        widget.installEventFilter(self)  # (removed at the first paint)

    @property
    def pending(self) -> bool:
        return bool(self._held)

    def call(self, fn: Callable[[], object]) -> None:
        if self.painted and not self._held:
            fn()
            return
        self._held.append(fn)
        if not self.painted:
            QTimer.singleShot(0, self, self._unless_about_to_paint)

    def cancel(self) -> None:
        self._held = []

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 (Qt's name)
        if obj is self._widget and event.type() == QEvent.Type.Paint and not self.painted:
            self.painted = True
            self._widget.removeEventFilter(self)
            self._fallback.stop()
            QTimer.singleShot(0, self, self._run)  # (after this paint reaches the screen)
        return False

    def _unless_about_to_paint(self) -> None:
        if not self._held or self.painted:
            return
        parent = self._widget.parentWidget()
        if not (self._widget.isVisible() or (parent is not None and parent.isVisible())):
            self._run()  # no paint is coming
        elif not self._fallback.isActive():
            self._fallback.start()

    def _waited_enough(self) -> None:
        self.painted = True
        self._run()

    def _run(self) -> None:
        held, self._held = self._held, []
        for fn in held:
            fn()
