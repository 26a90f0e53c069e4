"""Form pieces several panels build the same way: a path field with its "…" button, a combo box whose
items carry keys, and the text-file dialog the training forms open."""
from __future__ import annotations

from typing import Callable, Iterable

from PySide6.QtWidgets import QComboBox, QFileDialog, QHBoxLayout, QLineEdit, QPushButton, QWidget


def path_row(field: QLineEdit, placeholder: str, browse: Callable[[], None]) -> QWidget:
    """`field` and a "…" button that calls `browse`, side by side as one form row."""
    field.setMinimumWidth(60)  # a long path scrolls inside the field, not the form's column
    field.setPlaceholderText(placeholder)
    button = QPushButton("…")
    button.setMaximumWidth(30)
    button.clicked.connect(browse)
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(field)
    layout.addWidget(button)
    return row


def ask_text_file(parent: QWidget) -> str:
    """The text file a person picks in the dialog ("" when they cancel)."""
    path, _ = QFileDialog.getOpenFileName(parent, "Text file", "", "Text (*.txt *.md);;All files (*)")
    return path


def keyed_combo(choices: Iterable[tuple[str, object]], tooltip: str = "") -> QComboBox:
    """A combo box of (label, key) choices: it shows the labels; currentData() is the chosen key."""
    combo = QComboBox()
    for label, key in choices:
        combo.addItem(label, key)
    if tooltip:
        combo.setToolTip(tooltip)
    return combo
