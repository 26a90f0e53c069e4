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


def _distinct_colours(path) -> int:
    image = QImage(str(path))
    assert not image.isNull(), path
    step = max(1, image.width() // 64)
    return len({image.pixel(x, y) for x in range(0, image.width(), step) for y in range(0, image.height(), step)})


def test_image_panel_exports_are_disabled_on_a_text_model_and_say_why(qtbot, model_dirs, isolated_user_files,
                                                                      monkeypatch):
    """Issue 25: on a text model the Image panel's PNG and Data wrote a blank image and an empty .npz
    without a word; now its buttons are disabled and the tooltip says why (and the panel is no longer shown for a
    text model: look14)."""
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    assert not window.tabs.isTabVisible(window.tabs.indexOf(window.slot("Image")))  # (its tab only for a ViT)
    window.show_panel("Image")  # (what a workspace saved on a ViT asks for): not shown on a text model (look14)
    assert window.current_slot() is window.slot("Model")
    panel = window.panel("Image")  # (built all the same, as a test can)
    SaveDialog(monkeypatch)  # no answers: a dialog that opens fails the test
    for name, button in _buttons(panel.export_bar).items():
        assert not button.isEnabled(), name
        assert "vision transformers" in button.toolTip() and "\n" not in button.toolTip()


def test_image_panel_exports_on_a_vit_write_the_figure_and_say_where(qtbot, isolated_user_files, tmp_path,
                                                                      monkeypatch):
    from digit_vit import save_digit_vit, skip_without_digits

    skip_without_digits()
    window, state = open_window(qtbot, save_digit_vit(tmp_path / "vit"))
    panel = _show_tab(qtbot, window, "Image")
    qtbot.waitUntil(lambda: panel.result is not None and bool(panel.filters_view.mosaic.tiles), timeout=30_000)
    buttons = _buttons(panel.export_bar)
    assert all(b.isEnabled() for b in buttons.values())
    dialog = SaveDialog(monkeypatch)
    dialog.answers = [(str(tmp_path / "heads.png"), "PNG image (*.png)"),
                      (str(tmp_path / "heads.npz"), "NumPy arrays (*.npz)")]
    qtbot.mouseClick(buttons["PNG"], Qt.MouseButton.LeftButton)
    assert _distinct_colours(tmp_path / "heads.png") > 10  # the heads' heat maps, not a blank card
    assert window.statusBar().currentMessage() == f"Saved {tmp_path / 'heads.png'}"
    qtbot.mouseClick(buttons["Data"], Qt.MouseButton.LeftButton)
    import numpy as np

    with np.load(tmp_path / "heads.npz") as saved:
        assert saved["attention"].shape == (3, 4, 4) and saved["image"].size > 0
        assert np.allclose(saved["attention"], panel.query_weights())
    assert window.statusBar().currentMessage() == f"Saved {tmp_path / 'heads.npz'}"

    # another model (a text one): the ViT's figures are no longer what the panel shows, nothing exports
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(_demo_dir())
    assert not buttons["PNG"].isEnabled() and "vision transformers" in buttons["Data"].toolTip()


def _demo_dir():
    from desktop_app.paths import demo_model_dir

    return demo_model_dir()
