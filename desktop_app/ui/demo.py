"""ScriptedDemo: a queue of user actions played on a panel, one whenever it is idle.

Panels use it for `--screenshot`'s optional hooks (screenshot_demo / screenshot_ready): each action is
what a button click would do (Step, Back, Start...), and the next one waits until the panel's workers
are done, exactly as a person would wait before clicking again.
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
