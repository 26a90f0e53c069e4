"""A long job's progress bar that says the time left, as the CLI's progress lines do: "40% · about 12 s left"
(core.jobs.TimeLeft: the rate since the job began). One widget for every panel's long job."""
from __future__ import annotations

from PySide6.QtWidgets import QProgressBar

from ...core.jobs import TimeLeft


class JobProgressBar(QProgressBar):
    def __init__(self, fmt: str = "%p%", parent=None) -> None:
        super().__init__(parent)
        self.fmt = fmt  # Qt's placeholders (%p %v %m); the time left is added after it
        self.time_left = TimeLeft()
        self.setFormat(fmt)
        # room for the longest text it says, so it never wraps or cuts the time left
        self.setMinimumWidth(self.fontMetrics().horizontalAdvance(self._longest()) + 30)

    def _longest(self) -> str:
        return (self.fmt.replace("%p", "100").replace("%v", "1000").replace("%m", "1000")
                + " · about 59.9 min left")

    def begin(self, total: int = 0) -> None:
        """A job starts: the clock restarts; total 0 shows a busy bar until its first progress."""
        self.setRange(0, total)
        self.setValue(0)
        self.setFormat(self.fmt)
        self.time_left = TimeLeft()

    def show_progress(self, done: int, total: int) -> str:
        """`done` of `total`, and the time left once there is a rate; returns that phrase ("" before)."""
        self.setRange(0, max(total, 1))
        self.setValue(done)
        left = self.time_left.phrase(done, total)
        self.setFormat(f"{self.fmt} · {left}" if left else self.fmt)
        return left
