"""A one-line label that never widens its window: a text longer than the room it has is cut with "…" (the
whole text is its tooltip), so a long status line cannot push the window past the screen."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QLabel, QSizePolicy


class ElidedLabel(QLabel):
    def __init__(self, text: str = "", parent=None) -> None:
        super().__init__(text, parent)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)  # asks for no width
        self.setMinimumWidth(1)
        self.setToolTip(text)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt name
        super().setText(text)
        self.setToolTip(text)

    def shown_text(self) -> str:
        """What fits: the text, or its start and "…"."""
        return self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, max(self.width(), 1))

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt name
        painter = QPainter(self)
        painter.drawText(self.rect(), int(self.alignment() | Qt.AlignmentFlag.AlignVCenter), self.shown_text())
