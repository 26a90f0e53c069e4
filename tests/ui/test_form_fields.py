"""The path rows the training forms share (ui.widgets.form_fields.path_row): clicking a row's "…" opens its
dialog and the chosen path lands in its field, in the Train panel's text and image-folder tasks and in the
dictionary form."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QPushButton

from desktop_app.ui.panels.training import TrainingPanel
from desktop_app.ui.state import AppState
from desktop_app.ui.widgets.form_fields import keyed_combo


def _browse(qtbot, row) -> None:
    (button,) = row.findChildren(QPushButton)
    assert button.text() == "…" and button.isVisible()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def test_each_rows_button_fills_its_own_field(qtbot, tmp_path, monkeypatch):
    text, folder = tmp_path / "book.txt", tmp_path / "images"
    asked: list[str] = []
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda parent, title, *a, **k: (asked.append(title), (str(text), ""))[1]))
    monkeypatch.setattr(QFileDialog, "getExistingDirectory",
                        staticmethod(lambda parent, title, *a, **k: (asked.append(title), str(folder))[1]))
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.show()

    panel.task.setCurrentText("text")
    assert panel.text_file.placeholderText() == "a UTF-8 text file"
    _browse(qtbot, panel.text_row)
    assert panel.text_file.text() == str(text) and asked == ["Text file"]

    panel.task.setCurrentText("image-folder")
    _browse(qtbot, panel.image_folder_row)
    assert panel.image_folder.text() == str(folder) and asked[-1] == "Image folder (one sub-folder per class)"
    assert panel.text_file.text() == str(text)  # the other row's field is left as it was

    panel.mode.setFocus()
    qtbot.keyClick(panel.mode, Qt.Key.Key_Down)  # a sparse dictionary
    form = panel.dictionary.form
    assert form.text_file.text() == ""
    _browse(qtbot, form.text_row)
    assert form.text_file.text() == str(text) and asked[-1] == "Text file"


def test_a_keyed_combo_shows_labels_and_gives_keys(qtbot):
    combo = keyed_combo([("Source (encoder)", "encoder"), ("Target (decoder)", "decoder")], "which stack")
    qtbot.addWidget(combo)
    assert [combo.itemText(i) for i in range(combo.count())] == ["Source (encoder)", "Target (decoder)"]
    assert combo.currentData() == "encoder" and combo.toolTip() == "which stack"
    combo.setCurrentIndex(1)
    assert combo.currentData() == "decoder"
