"""The strip at the top of the main window listing the active what-if edits (AppState.interventions):
one chip per edit with a remove (x) button, and "Clear all". Hidden while there are none, so the
plain model's window looks as it always did; while shown, every panel shows the edited model."""
from __future__ import annotations

from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QWidget


def describe(iv) -> str:
    """'zero L1H2', 'mean L0 MLP'... what a chip says (the full target is its tooltip); an encoder-decoder's
    names its stack and a cross-attention head ('zero dec L1xH2', 'zero enc L0H1'); an edit with a name of
    its own (a steer) says that."""
    if iv.name:
        return iv.name
    what = iv.target
    stack = {"encoder": "enc ", "decoder": "dec "}.get(iv.target.split(".", 1)[0], "")  # an encoder-decoder's
    cross = ".cross_attn." in iv.target
    if iv.head is not None:  # a cross-attention head as What if names it: L1xH2
        what = f"{stack}L{iv.layer}{'x' if cross else ''}H{iv.head}"
    elif iv.target.endswith("attn.out"):
        what = f"{stack}L{iv.layer} {'cross-attention' if cross else 'attention'}"
    elif iv.target.endswith(".mlp.out"):
        what = f"{stack}L{iv.layer} MLP"
    how = "resample" if iv.source_ids else iv.how
    where = "" if iv.positions is None else " @" + ",".join(map(str, iv.positions))
    return f"{how} {what}{where}"


class InterventionStrip(QFrame):
    def __init__(self, state, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.setObjectName("interventionStrip")
        # dark text on the pale yellow whatever the palette (a dark desktop's white text was unreadable on it)
        self.setStyleSheet("#interventionStrip { background: #fff4d6; border-bottom: 1px solid #e0c070; }"
                           "#interventionStrip QLabel, #interventionStrip QToolButton { color: #222; }")
        self.row = QHBoxLayout(self)
        self.row.setContentsMargins(6, 2, 6, 2)
        self.chips: list[QWidget] = []
        self.remove_buttons: list[QToolButton] = []
        self.title = QLabel("<b>What if:</b> every panel shows the model with")
        self.clear_button = QToolButton()
        self.clear_button.setText("Clear all")
        self.clear_button.setToolTip("Remove every edit: back to the model as trained")
        self.clear_button.clicked.connect(lambda: self.state.edits.clear())
        state.interventions_changed.connect(self.show_interventions)
        self.show_interventions(list(state.interventions))

    def show_interventions(self, interventions: list) -> None:
        while self.row.count():
            item = self.row.takeAt(0)
            if item.widget() is not None and item.widget() not in (self.title, self.clear_button):
                item.widget().deleteLater()
        self.chips, self.remove_buttons = [], []
        self.row.addWidget(self.title)
        for i, iv in enumerate(interventions):
            chip = QFrame()
            chip.setStyleSheet("QFrame { background: #ffe3a0; border-radius: 4px; }")
            lay = QHBoxLayout(chip)
            lay.setContentsMargins(6, 0, 0, 0)
            label = QLabel(describe(iv))
            label.setToolTip(iv.label)
            remove = QToolButton()
            remove.setText("x")
            remove.setAutoRaise(True)
            remove.setToolTip(f"Remove '{describe(iv)}'")
            remove.clicked.connect(lambda _=False, i=i: self.remove(i))
            lay.addWidget(label)
            lay.addWidget(remove)
            self.row.addWidget(chip)
            self.chips.append(chip)
            self.remove_buttons.append(remove)
        self.row.addStretch(1)
        self.row.addWidget(self.clear_button)
        self.setVisible(bool(interventions))

    def remove(self, index: int) -> None:
        self.state.edits.remove_at(index)
