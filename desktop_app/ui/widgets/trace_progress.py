"""The text's trace as it runs layer by layer: a bar ("layer 5 / 24") and Cancel, shown only while it runs.

Follows AppState.trace_progress; Cancel calls AppState.cancel_trace (the trace stops at its next layer).
"""
from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QProgressBar, QToolButton, QWidget


class TraceProgress(QWidget):
    def __init__(self, state, parent=None) -> None:
        super().__init__(parent)
        self.bar = QProgressBar()
        self.bar.setMaximumWidth(160)
        self.bar.setFormat("layer %v / %m")
        self.bar.setToolTip("The text's trace: the panels paint each layer as it is ready")
        self.cancel_button = QToolButton()
        self.cancel_button.setText("Cancel")
        self.cancel_button.setToolTip("Stop tracing this text (what was shown before stays)")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.bar)
        lay.addWidget(self.cancel_button)
        self.cancel_button.clicked.connect(state.cancel_trace)
        state.trace_progress.connect(self.show_progress)
        self.setVisible(False)

    def show_progress(self, done: int, total: int) -> None:
        """Layers `done` of `total`; total 0: no trace runs (hidden)."""
        if total <= 0:
            self.setVisible(False)
            return
        self.bar.setRange(0, total)
        self.bar.setValue(done)
        self.setVisible(True)
