"""Issue 13, defect 11 (Model, Attention, Layers): names read as written ("head 0", not "head·0"),
"1 token" not "1 tokens", tiny probabilities never "0.000", one number of decimals per column, and
the dark theme darkens the plots too (pyqtgraph draws its own backgrounds)."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QDialog, QDialogButtonBox

from desktop_app.ui import settings as app_settings
from desktop_app.ui.widgets.heatmap import Heatmap
from desktop_app.ui.widgets.readable import format_prob

from .walkthrough import click_tab, open_window


def test_names_plurals_and_decimals(qtbot, model_dirs, isolated_user_files):
    window, state = open_window(qtbot, model_dirs["notok"], text="5", name="notok")  # one token
    click_tab(qtbot, window.tabs, "Layers")
    layers = window.slot("Layers").panel
    qtbot.waitUntil(lambda: layers.result is not None, timeout=30_000)
    assert layers.status.text().startswith("1 token, 2 layers")
    click_tab(qtbot, layers.tabs, "Component norms")
    assert layers.component_map.bottom_axis.labels[:2] == ["head 0", "head 1"]
    assert "head·0" not in " ".join(layers.component_map.bottom_axis.labels)
    click_tab(qtbot, layers.tabs, "Cosine similarity")  # one token: no pair, said, not a curve of NaNs
    qtbot.waitUntil(lambda: "needs two tokens" in layers.cosine_view.curve_plot.titleLabel.text, timeout=10_000)
    assert len(layers.cosine_view.curve.getData()[0] or []) == 0
    assert "no pair of tokens" in layers.cosine_view.heatmap.plot.titleLabel.text  # not "mean nan"
    click_tab(qtbot, window.tabs, "Attention")
    attention = window.slot("Attention").panel
    assert attention.status.text().startswith("1 token, 2 layers x 4 heads")
    assert window.slot("Model").panel.count_label.text().split(" ·")[0] == "1 token"


def test_tiny_probabilities_and_aligned_annotations(qtbot):
    assert format_prob(2.1e-5) == "2.1e-05" and format_prob(0.5) == "0.500" and format_prob(0.05) == "0.050"
    assert format_prob(3e-4, 2) == "3.0e-04" and format_prob(0.0) == "0.000"
    hm = Heatmap(annotate_max_cells=10)
    qtbot.addWidget(hm)
    hm.set_matrix(np.array([[0.5, 0.05], [0.123, 1e-6]]))
    texts = [t.text() for t in hm.annotations]
    assert texts == ["0.500", "0.050", "0.123", "1e-06"]


def test_annotations_read_on_their_cells_and_hide_when_they_do_not_fit(qtbot):
    """A diverging map's pale middle gets black numbers (white ones vanished there); numbers show only
    while a cell is wider than the widest of them, and come back when the map is widened."""
    hm = Heatmap(colormap="CET-D1", annotate_max_cells=200)
    qtbot.addWidget(hm)
    hm.resize(900, 300)
    hm.show()
    qtbot.waitExposed(hm)
    hm.set_matrix(np.array([[0.0, 1.0, -1.0]]), levels=(-1.0, 1.0))
    colours = [t.brush().color().name() for t in hm.annotations]
    assert colours[0] == "#000000" and colours[1] == "#ffffff" and colours[2] == "#ffffff", colours
    assert all(t.isVisible() for t in hm.annotations)
    hm.set_matrix(np.linspace(-1, 1, 60).reshape(1, 60), levels=(-1.0, 1.0))  # 60 cells in ~800 px
    assert not any(t.isVisible() for t in hm.annotations)
    hm.resize(6000, 300)
    qtbot.waitUntil(lambda: all(t.isVisible() for t in hm.annotations), timeout=5000)


def test_dark_theme_darkens_the_plots(qtbot, model_dirs, isolated_user_files, monkeypatch):
    app = QApplication.instance()
    saved_palette, saved_style = app.palette(), app.style().name()
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    click_tab(qtbot, window.tabs, "Attention")  # built before the theme changes
    attention = window.slot("Attention").panel

    def choose_dark():
        dialog = next(w for w in app.topLevelWidgets() if isinstance(w, QDialog) and w.isVisible())
        dialog.theme.setFocus()
        dialog.theme.setCurrentText("dark")
        ok = dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok)
        qtbot.mouseClick(ok, Qt.MouseButton.LeftButton)

    try:
        QTimer.singleShot(100, choose_dark)
        window.preferences_action.trigger()  # File > Preferences…, Theme: dark, OK
        assert app_settings.palette_is_dark()
        dark = app_settings.plot_background()
        assert attention.model_view.backgroundBrush().color() == dark
        assert attention.heatmap.backgroundBrush().color() == dark
        assert attention.heatmap.left_axis.textPen().color() == app_settings.plot_foreground()
        click_tab(qtbot, window.tabs, "Layers")  # built after the theme changed
        layers = window.slot("Layers").panel
        assert layers.pca_view.backgroundBrush().color() == dark
        assert layers.cosine_view.curve_widget.backgroundBrush().color() == dark
    finally:
        app_settings.apply_appearance(app, "system", 0)
        app.setPalette(saved_palette)
        app.setStyle(saved_style)
