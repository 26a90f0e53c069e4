"""Image panel on a small ViT: held-out digits, an image file, patch clicks and [CLS], the three figures,
their exports, a file that cannot be decoded, and a text model (the panel says it is for ViTs)."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage

from digit_vit import skip_without_digits  # noqa: E402

skip_without_digits()

from digit_vit import save_digit_vit  # noqa: E402
from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.ui.panels.image import ImagePanel  # noqa: E402
from desktop_app.ui.state import AppState  # noqa: E402
from desktop_app.ui.widgets.export import export_view  # noqa: E402


@pytest.fixture
def vit_dir(tmp_path):
    """A small untrained digit ViT folder (8 x 8, one channel, patch 2, ten classes, 2 layers x 3 heads)."""
    return save_digit_vit(tmp_path / "vit")


def _panel(qtbot, folder):
    state = AppState()
    panel = ImagePanel(state)
    qtbot.addWidget(panel)
    panel.resize(1100, 700)
    panel.show()
    state.loaded = load_model_folder(folder)
    state.model_changed.emit(state.loaded)
    qtbot.waitUntil(lambda: panel.result is not None and bool(panel.filters_view.mosaic.tiles), timeout=20_000)
    return state, panel


def test_digit_prediction_patch_click_and_cls(qtbot, vit_dir, tmp_path):
    state, panel = _panel(qtbot, vit_dir)
    assert "held-out digit #0" in panel.source_label.text()
    lines = panel.prediction.text().splitlines()
    assert len(lines) == 5 and "digit" in lines[0] and "%" in lines[0]
    assert len(panel.heads_view.mosaic.tiles) == 3  # one map per head of the chosen layer
    cls_weights = panel.query_weights()
    assert cls_weights.shape == (3, 4, 4)
    # click the patch in row 2, column 1 where the canvas draws it: its row of every head's pattern shows
    qtbot.mouseClick(panel.canvas, Qt.MouseButton.LeftButton, pos=panel.canvas.patch_center(2 * 4 + 1))
    assert panel.canvas.selected == 9
    expected = panel.result["patterns"][0, :, 10, 1:].reshape(3, 4, 4)
    assert np.allclose(panel.query_weights(), expected)
    assert "patch (2, 1)" in panel.heads_view.mosaic.caption
    qtbot.keyClick(panel.layer, Qt.Key.Key_Up)  # the spin box: layer 1
    assert panel.layer.value() == 1
    assert np.allclose(panel.query_weights(), panel.result["patterns"][1, :, 10, 1:].reshape(3, 4, 4))
    qtbot.mouseClick(panel.cls_button, Qt.MouseButton.LeftButton)
    assert panel.canvas.selected is None and "[CLS]" in panel.heads_view.mosaic.caption
    # another held-out digit: a new forward pass
    old = panel.result
    panel.digit.setValue(5)
    qtbot.waitUntil(lambda: panel.result is not old, timeout=10_000)
    assert "held-out digit #5" in panel.source_label.text()
    assert panel.distance_view.distance.shape == (2, 3)


def test_figures_export(qtbot, vit_dir, tmp_path):
    _, panel = _panel(qtbot, vit_dir)
    assert len(panel.filters_view.mosaic.tiles) == 4  # min(28, d_model, C P P = 4) principal components
    assert len(panel.similarity_view.mosaic.tiles) == 16  # one small map per patch of the 4 x 4 grid
    for i, (view, name) in enumerate(zip(panel.views, ("heads", "filters", "similarity", "distance"))):
        panel.tabs.setCurrentIndex(i)
        for suffix in (".png", ".svg", ".csv"):
            path = tmp_path / f"{name}{suffix}"
            export_view(view, path)
            assert path.stat().st_size > 100
    rows = (tmp_path / "distance.csv").read_text().splitlines()
    assert rows[0] == "layer,head,mean_attention_distance_px" and len(rows) == 1 + 2 * 3
    assert len((tmp_path / "similarity.csv").read_text().splitlines()) == 1 + 16 * 16


def test_image_file_and_a_file_that_is_not_an_image(qtbot, vit_dir, tmp_path):
    _, panel = _panel(qtbot, vit_dir)
    image = QImage(32, 32, QImage.Format.Format_Grayscale8)
    image.fill(0)
    for y in range(8, 24):
        image.setPixel(15, y, 0xFFFFFFFF)
    png = tmp_path / "one.png"
    assert image.save(str(png))
    old = panel.result
    panel.open_image(str(png))
    qtbot.waitUntil(lambda: panel.result is not old, timeout=10_000)
    assert panel.source_label.text() == "one.png" and panel.message.text() == ""
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not a png at all")
    panel.open_image(str(bad))
    qtbot.waitUntil(lambda: panel.message.text() != "", timeout=10_000)
    assert str(bad) in panel.message.text() and "\n" not in panel.message.text()


def test_text_model_is_told_the_panel_is_for_vits(qtbot, model_dirs):
    state = AppState()
    panel = ImagePanel(state)
    qtbot.addWidget(panel)
    state.loaded = load_model_folder(next(iter(model_dirs.values())))
    state.model_changed.emit(state.loaded)
    assert "vision transformers" in panel.message.text() and not panel.open_button.isEnabled()


def test_each_heads_map_says_the_weight_its_full_colour_stands_for(qtbot, vit_dir):
    """Each head's map is coloured over its own largest weight: a near-uniform head (all ~1/16) looked as
    bright as one on a single patch. Its title gives that weight, which the caption explains."""
    state, panel = _panel(qtbot, vit_dir)
    qtbot.mouseClick(panel.canvas, Qt.MouseButton.LeftButton, pos=panel.canvas.patch_center(5))
    weights = panel.query_weights()
    mosaic = panel.heads_view.mosaic
    assert [title for title, _ in mosaic.tiles] == [f"head {h}: {weights[h].max():.2f}" for h in range(3)]
    assert "full colour: the head's largest weight" in mosaic.caption
    assert all(mosaic.fontMetrics().horizontalAdvance(title) <= mosaic.cell for title, _ in mosaic.tiles)


def test_the_heads_caption_wraps_in_a_1024x640_window_instead_of_running_under_a_scroll_bar(qtbot, vit_dir):
    """The Heads caption was one line wider than the view at 1024x640: cut at the edge, a horizontal scroll bar
    under the maps. It wraps to the view's width now, the maps below it."""
    from .walkthrough import click_panel_tab, open_window

    window, state = open_window(qtbot, vit_dir)
    window.resize(1024, 640)
    panel = click_panel_tab(qtbot, window, "Image")
    qtbot.waitUntil(lambda: panel.result is not None and bool(panel.heads_view.mosaic.tiles), timeout=20_000)
    qtbot.wait(50)  # (laid out)
    from PySide6.QtWidgets import QScrollArea

    scroll, mosaic = panel.heads_view.findChild(QScrollArea), panel.heads_view.mosaic
    assert not scroll.horizontalScrollBar().isVisible()
    assert mosaic.width() <= scroll.viewport().width()
    caption = mosaic._caption_rect(mosaic.width())
    need = mosaic.fontMetrics().horizontalAdvance(mosaic.caption)
    assert need > caption.width() and caption.height() >= 2 * mosaic.fontMetrics().height()  # (two lines here)
    assert mosaic.height() >= caption.bottom() + len(mosaic.tiles) // mosaic.columns * mosaic.cell
