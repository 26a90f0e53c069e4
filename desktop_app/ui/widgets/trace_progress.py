"""The text's trace as it runs layer by layer: a bar ("layer 5 / 24") and Cancel, shown only while it runs;
and, when a whole trace was refused for memory, the choice of its first layers ("Trace the first 10 layers").

Follows AppState.trace_progress and trace_layers_offered; Cancel calls AppState.cancel_trace (the trace
stops at its next layer), the offer AppState.set_trace_layers.
"""
from __future__ import annotations

from PySide6.QtWidgets import QHBoxLayout, QPushButton, QToolButton, QWidget

from .job_progress import JobProgressBar


class TraceProgress(QWidget):
    def __init__(self, state, parent=None) -> None:
        super().__init__(parent)
        self.state = state
        self.bar = JobProgressBar("layer %v / %m")  # and the time left, once a layer is done
        self.bar.setToolTip("The text's trace: the panels paint each layer as it is ready")
        self.cancel_button = QToolButton()
        self.cancel_button.setText("Cancel")
        self.cancel_button.setToolTip("Stop tracing this text")
        self.layers_button = QPushButton()  # the memory refusal's choice
        self.layers_button.setToolTip("The whole trace would not fit in memory: trace this text's first layers")
        self._offered = 0
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        for w in (self.bar, self.cancel_button, self.layers_button):
            lay.addWidget(w)
            w.setVisible(False)
        self.cancel_button.clicked.connect(state.cancel_trace)
        self.layers_button.clicked.connect(lambda: state.set_trace_layers(self._offered))
        state.trace_progress.connect(self.show_progress)
        state.trace_layers_offered.connect(self.offer_layers)
        state.trace_changed.connect(lambda trace: trace is not None and self.offer_layers(0, 0))
        state.model_changed.connect(lambda _loaded: self.offer_layers(0, 0))

    def show_progress(self, done: int, total: int) -> None:
        """Layers `done` of `total`; total 0: no trace runs (hidden)."""
        running = total > 0
        if running:
            if self.bar.isHidden() or done < self.bar.value():  # a new trace: its own clock
                self.bar.begin(total)
            self.bar.show_progress(done, total)
            self.offer_layers(0, 0)
        self.bar.setVisible(running)
        self.cancel_button.setVisible(running)

    def offer_layers(self, layers: int, total: int) -> None:
        """Offer to trace the first `layers` of `total` layers (0: no offer)."""
        self._offered = layers
        if layers:
            self.layers_button.setText(f"Trace the first {layers} of {total} layers")
        self.layers_button.setVisible(bool(layers))
