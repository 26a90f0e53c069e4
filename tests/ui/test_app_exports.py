"""Issue 13, defect 10: exports clicked as a person does them. A name typed without an extension gets
the one the chosen filter implies (export bars, File > Export Current View, File > Save Workspace),
the next dialog opens in the folder used last, files get the user's umask; the Model panel has the
export bar the README promises (chips as PNG/SVG, per-token probabilities as CSV)."""
from __future__ import annotations

import csv
import json
import os
import stat

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QFileDialog, QToolButton

from .walkthrough import open_window


class SaveDialog:
    """Stands in for QFileDialog.getSaveFileName: answers (name typed, filter chosen), records the
    folder each dialog opened in."""

    def __init__(self, monkeypatch) -> None:
        self.answers: list[tuple[str, str]] = []
        self.opened_at: list[str] = []
        self.filters: list[str] = []

        def fake(parent, caption="", directory="", filter="", *args, **kwargs):
            self.opened_at.append(directory)
            self.filters.append(filter)
            return self.answers.pop(0)

        monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(fake))


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def _buttons(bar):
    return {b.text(): b for b in bar.findChildren(QToolButton)}


def _show_tab(qtbot, window, title):
    bar = window.tabs.tabBar()
    index = next(i for i in range(window.tabs.count()) if window.tabs.tabText(i) == title)
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(index).center())
    return window.slot(title).panel


def test_export_bar_adds_the_filters_extension_and_the_next_dialog_opens_there(
        qtbot, model_dirs, isolated_user_files, tmp_path, monkeypatch, umask_022):
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    attention = _show_tab(qtbot, window, "Attention")
    qtbot.waitUntil(lambda: attention.stats is not None, timeout=30_000)
    dialog = SaveDialog(monkeypatch)
    out = tmp_path / "figures"
    out.mkdir()
    dialog.answers = [(str(out / "heads"), "PNG image (*.png)"), (str(out / "heads-vector"), "SVG (*.svg)")]
    buttons = _buttons(attention.export_bar)
    qtbot.mouseClick(buttons["PNG"], Qt.MouseButton.LeftButton)
    assert not QImage(str(out / "heads.png")).isNull()
    assert stat.S_IMODE((out / "heads.png").stat().st_mode) == 0o644  # the umask's, not mkstemp's 0600
    qtbot.mouseClick(buttons["SVG"], Qt.MouseButton.LeftButton)
    assert (out / "heads-vector.svg").read_text().lstrip().startswith("<?xml")
    assert stat.S_IMODE((out / "heads-vector.svg").stat().st_mode) == 0o644
    assert os.path.dirname(dialog.opened_at[1]) == str(out)  # the second dialog opened where the first saved
    assert not (out / "heads").exists() and not (out / "heads-vector").exists()


def test_ctrl_e_and_save_workspace_add_the_extension(qtbot, model_dirs, isolated_user_files, tmp_path, monkeypatch,
                                                      umask_022):
    window, state = open_window(qtbot, model_dirs["llama"], name="llama")
    layers = _show_tab(qtbot, window, "Layers")
    qtbot.waitUntil(lambda: layers.result is not None, timeout=30_000)
    dialog = SaveDialog(monkeypatch)
    dialog.answers = [(str(tmp_path / "norms"), "CSV table (*.csv)")]
    window.export_action.trigger()  # File > Export Current View (Ctrl+E)
    assert "CSV table (*.csv)" in dialog.filters[0] and "PNG image (*.png)" in dialog.filters[0]
    rows = list(csv.reader((tmp_path / "norms.csv").open()))
    assert len(rows) == 1 + len(state.token_ids)
    assert stat.S_IMODE((tmp_path / "norms.csv").stat().st_mode) == 0o644

    dialog.answers = [(str(tmp_path / "session"), "Workspace (*.json)")]
    window.save_workspace_action.trigger()  # File > Save Workspace (Ctrl+S)
    saved = json.loads((tmp_path / "session.json").read_text())
    assert saved["text"] == state.text
    assert os.path.dirname(dialog.opened_at[1]) == str(tmp_path)


def test_model_panel_exports_its_chips_and_the_token_probabilities(qtbot, model_dirs, isolated_user_files, tmp_path,
                                                                   monkeypatch):
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    panel = window.panel("Model")
    qtbot.waitUntil(lambda: panel.probabilities is not None, timeout=30_000)
    dialog = SaveDialog(monkeypatch)
    dialog.answers = [(str(tmp_path / "chips"), "PNG image (*.png)"), (str(tmp_path / "chips"), "SVG (*.svg)"),
                      (str(tmp_path / "probs"), "CSV table (*.csv)")]
    buttons = _buttons(panel.export_bar)
    for name in ("PNG", "SVG", "Data"):
        qtbot.mouseClick(buttons[name], Qt.MouseButton.LeftButton)
    image = QImage(str(tmp_path / "chips.png"))
    assert image.width() == panel.token_strip.canvas.width() and image.height() == panel.token_strip.canvas.height()
    assert "<svg" in (tmp_path / "chips.svg").read_text()
    rows = list(csv.reader((tmp_path / "probs.csv").open()))
    assert rows[0] == ["position", "id", "token", "p(token | tokens before)"]
    assert [int(r[1]) for r in rows[1:]] == state.token_ids
    assert rows[1][3] == ""  # the first token has no prediction
    assert abs(float(rows[2][3]) - panel.probabilities[1]) < 1e-5
