"""What a person sees walking through the Model, Layers and Lipschitz panels before and after opening a
model (walk1): rows that do not apply to the model on screen are not shown."""
from __future__ import annotations

from desktop_app.ui.main_window import MainWindow
from desktop_app.ui.state import AppState

from .walkthrough import click_panel_tab


def test_the_window_with_no_model_shows_no_mixture_of_experts_row(qtbot, isolated_user_files):
    window = MainWindow(AppState())
    qtbot.addWidget(window)
    window.resize(1024, 640)
    window.show()
    panel = click_panel_tab(qtbot, window, "Model")
    qtbot.waitUntil(panel.text_edit.isVisible)
    assert "No model open" in panel.empty_label.text() and panel.empty_label.isVisible()
    assert not any(w.isVisible() for w in panel.routing_widgets)  # "Experts chosen at layer" was shown
    layers = click_panel_tab(qtbot, window, "Layers")
    bar = layers.tabs.tabBar()
    hidden = [bar.tabText(i) for i in range(bar.count()) if not bar.isTabVisible(i)]
    assert hidden == ["Routing", "Expert norms", "Expert load"]  # a mixture of experts' views: none open
