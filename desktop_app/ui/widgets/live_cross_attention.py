"""The Train panel's live cross-attention: one held-out sentence of an encoder-decoder run, redrawn at every
evaluation from the run's "cross_attention" event (core.training.trainer.cross_attention_event: computed in
the training process, teacher-forced on the reference target).

Rows are the target tokens the decoder writes (ending with [END]), columns the source tokens; a cell is the
weight the last decoder layer's cross-attention puts on that source token when writing that target token,
averaged over heads or one head (the combo box). The line above says the step, the sentence and what the
model writes for it on its own (greedy).

    view = LiveCrossAttention()
    view.set_event(ev)     # a "cross_attention" event
    view.clear()           # a new run
"""
from __future__ import annotations

import numpy as np
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from .heatmap import Heatmap

MEAN = "mean over heads"


class LiveCrossAttention(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        v = QVBoxLayout(self)
        v.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        self.caption = QLabel("")
        self.caption.setWordWrap(True)
        row.addWidget(self.caption, 1)
        self.head = QComboBox()
        self.head.setToolTip("The last decoder layer's cross-attention averaged over its heads, or one head")
        self.head.currentIndexChanged.connect(self._draw)
        row.addWidget(self.head)
        v.addLayout(row)
        self.heatmap = Heatmap(row_name="writing", col_name="source", value_name="attention")
        self.heatmap.setMinimumHeight(170)
        v.addWidget(self.heatmap, 1)
        self.pattern = np.zeros((0, 0, 0), dtype=np.float32)  # [heads, target, source] of the last event
        self.event: dict | None = None
        self.clear()

    @property
    def has_data(self) -> bool:
        return self.event is not None

    def clear(self) -> None:
        """Nothing yet (a new run): the heatmap empty, the line saying when it comes."""
        self.event = None
        self.pattern = np.zeros((0, 0, 0), dtype=np.float32)
        self.head.blockSignals(True)
        self.head.clear()
        self.head.addItem(MEAN)
        self.head.blockSignals(False)
        self.caption.setText("Cross-attention of a held-out sentence: drawn at each evaluation.")
        self.heatmap.clear_matrix("")

    def set_event(self, ev: dict) -> None:
        """Draw a "cross_attention" event (the head choice is kept while the run's head count stays)."""
        pattern = np.asarray(ev["pattern"], dtype=np.float32)
        if pattern.ndim != 3 or pattern.shape[1:] != (len(ev["target"]), len(ev["source"])):
            return  # not a [heads, target, source] pattern with its labels: nothing sensible to draw
        self.event, self.pattern = ev, pattern
        heads = [MEAN] + [f"head {h}" for h in range(pattern.shape[0])]
        if [self.head.itemText(i) for i in range(self.head.count())] != heads:
            self.head.blockSignals(True)
            self.head.clear()
            self.head.addItems(heads)
            self.head.blockSignals(False)
        written = " ".join(ev.get("written", []))
        self.caption.setText(f"Step {ev['step']}, held out: \u201c{' '.join(ev['source'])}\u201d \u2192 the model "
                             f"writes \u201c{written}\u201d")
        self._draw()

    def shown(self) -> np.ndarray:
        """The matrix on screen [target, source]: the heads' mean or the chosen head."""
        i = self.head.currentIndex()
        return self.pattern.mean(0) if i <= 0 else self.pattern[i - 1]

    def _draw(self) -> None:
        if self.event is None:
            return
        ev = self.event
        head = self.head.currentText()
        self.heatmap.set_matrix(self.shown(), ev["target"], ev["source"], levels=(0.0, 1.0),
                                title=f"Cross-attention, decoder layer {ev['layer']} ({head})")
