"""What a person sees walking through the Model, Layers and Lipschitz panels before and after opening a
model (walk1): rows that do not apply to the model on screen are not shown."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from desktop_app.ui.main_window import MainWindow
from desktop_app.ui.state import AppState

from .walkthrough import TEXTS, choose_item, click_panel_tab, open_window, type_into


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


def test_the_lipschitz_table_shows_each_runs_whole_label_at_1280x800(qtbot, model_dirs, isolated_user_files):
    """The run column had an eighth of the table, like n's: 'demo-model L0 H1 real demo-...' on two lines."""
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    window.resize(1280, 800)
    panel = click_panel_tab(qtbot, window, "Lipschitz")
    qtbot.waitUntil(panel.run_button.isVisible)
    type_into(qtbot, panel.lengths, "4,8")
    type_into(qtbot, panel.samples, "1")
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.is_running(), timeout=60_000)
    table = panel.table
    assert table.rowCount() == 2
    label = table.item(0, 0).text()
    assert label == panel.runs[0].label and table.item(0, 0).toolTip() == label
    assert table.columnWidth(0) >= table.fontMetrics().horizontalAdvance(label) + 8, (label, table.columnWidth(0))
    for c in range(1, table.columnCount()):  # each number whole in its cell
        for r in range(table.rowCount()):
            assert table.columnWidth(c) >= table.fontMetrics().horizontalAdvance(table.item(r, c).text())


def test_the_train_panels_plot_titles_fit_their_plots_at_1024x640(qtbot, model_dirs, isolated_user_files):
    """Both modes' plots: 'Dead features (none fired in 200 steps)' was cut at the plot's right edge."""
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    window.resize(1024, 640)
    panel = click_panel_tab(qtbot, window, "Train")
    qtbot.waitUntil(panel.start_button.isVisible)
    for mode, plots in (("a model", panel.plots), ("a sparse dictionary", panel.dictionary.plots)):
        choose_item(qtbot, panel.mode, mode)
        qtbot.waitUntil(plots.isVisible)
        qtbot.wait(50)  # (laid out)
        widgets = [w for w in plots.findChildren(pg.PlotWidget) if w.isVisible()]
        assert len(widgets) == 4
        for w in widgets:
            title = w.getPlotItem().titleLabel
            drawn = title.item.mapRectToScene(title.item.boundingRect())  # (centred over the axes' box)
            assert drawn.left() >= 0 and drawn.right() <= w.width(), (mode, title.text, drawn, w.width())


def test_the_model_panels_export_waits_for_tokens(qtbot, model_dirs, isolated_user_files):
    """With no model (no tokens) PNG/SVG/Data/Copy were on and wrote an empty strip and a bare header."""
    window = MainWindow(AppState())
    qtbot.addWidget(window)
    window.show()
    panel = click_panel_tab(qtbot, window, "Model")
    buttons = panel.export_bar.buttons
    qtbot.waitUntil(buttons["PNG"].isVisible)
    assert not any(b.isEnabled() for b in buttons.values())
    assert buttons["Data"].toolTip() == "No tokens to export: open a model and type a text"
    window.state.text = TEXTS["demo"]
    with qtbot.waitSignal(window.state.model_changed, timeout=30_000):
        window.open_model(model_dirs["demo"])
    qtbot.waitUntil(lambda: all(b.isEnabled() for b in buttons.values()), timeout=30_000)
    header, rows = panel.tokens_view.csv_table()
    assert len(rows) == len(window.state.token_ids) > 0


def test_the_lipschitz_axis_reads_the_constants_as_the_table_does(qtbot, tmp_path, isolated_user_files):
    """A small ViT's constants (~0.01): the log axis read '10¹ (x0.001)' beside the table's 0.0112."""
    from digit_vit import save_digit_vit

    window, state = open_window(qtbot, save_digit_vit(tmp_path / "vit"))
    panel = click_panel_tab(qtbot, window, "Lipschitz")
    qtbot.waitUntil(panel.run_button.isVisible)
    assert panel.data.currentText() == "image patches" and not panel.masked.isChecked()
    choose_item(qtbot, panel.head, "head 1")  # (its constants have ten characters: 0.00721182)
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.is_running(), timeout=60_000)
    values = [float(panel.table.item(r, 3).text()) for r in range(panel.table.rowCount())]
    assert values and max(values) < 0.1  # (the case: constants well under 1)
    table = panel.table  # each number whole in its cell (0.0112182 was cut to 0.01121...)
    for c in range(1, table.columnCount()):
        for r in range(table.rowCount()):
            assert table.columnWidth(c) >= table.fontMetrics().horizontalAdvance(table.item(r, c).text()) + 8
    axis = panel.plot.getAxis("left")
    assert axis.autoSIPrefixScale == 1.0 and "x0.001" not in axis.labelString()
    ticks = axis.tickStrings([-2.0], 1.0, 1.0)  # log mode: the tick at 10^-2
    assert ticks == ["0.01"]
    # its exponent is ~0 (-0.001 here, an untrained ViT): the legend and the summary say 0.00, never -0.00
    assert abs(panel.runs[0].result.exponent) < 0.005
    assert "-0.00" not in panel.summary.text() and "n^0.00" in panel.summary.text()
    assert not any("-0.00" in label.text for _, label in panel.legend.items)


def test_ctrl_0_shows_the_tenth_panel(qtbot, isolated_user_files):
    """Ctrl+1..9 show the first nine tabs on the bar; the tenth had no key. (With no model the Image tab is
    hidden: the tenth tab on show is Graph.)"""
    from .walkthrough import shown_tab_titles

    window = MainWindow(AppState())
    qtbot.addWidget(window)
    window.show()
    window.activateWindow()
    qtbot.waitUntil(lambda: QGuiApplication.focusWindow() is window.windowHandle())  # (keys go to the window)
    qtbot.keyClick(window.tabs, Qt.Key.Key_0, Qt.KeyboardModifier.ControlModifier)
    assert window.current_slot().title == shown_tab_titles(window.tabs)[9] == "Graph"
    qtbot.keyClick(window.tabs, Qt.Key.Key_1, Qt.KeyboardModifier.ControlModifier)
    assert window.current_slot().title == "Model"


def test_the_model_panels_count_line_is_one_line_at_1280x800(qtbot, model_dirs, isolated_user_files):
    """'25 tokens · colour: p(token | tokens before) · perplexity 26.7' wrapped in ~200 px of a wide row."""
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    window.resize(1280, 800)
    panel = click_panel_tab(qtbot, window, "Model")
    label = panel.count_label
    qtbot.waitUntil(lambda: "perplexity" in label.text(), timeout=30_000)
    qtbot.wait(50)  # (laid out)
    assert label.width() >= label.fontMetrics().horizontalAdvance(label.text()), (label.width(), label.text())


def test_a_dictionary_detached_by_opening_another_model_is_said(qtbot, model_dirs, isolated_user_files, tmp_path,
                                                                  monkeypatch):
    """The notice was written to the status bar and at once replaced by 'Opened ...': the dictionary vanished
    from the Features panel with nothing said."""
    from .test_features_panel import _dictionary, _lens_shown, _open_from_menu

    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    _open_from_menu(qtbot, window, state, monkeypatch, _dictionary(tmp_path / "sae-l2"))  # d_in 128: the demo's
    _lens_shown(qtbot, window.slot("Features").panel)
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(model_dirs["llama"])  # d_model 32
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    message = window.statusBar().currentMessage()
    assert message.startswith(f"Opened {model_dirs['llama']}") and "Detached sae-l2:" in message, message
    assert state.dictionaries == []


def test_a_workspaces_routing_view_on_a_dense_model_gives_way_to_a_view_it_has(qtbot, model_dirs, isolated_user_files):
    from desktop_app.core.views import state_to_dict
    from desktop_app.core.views.layers import LayersViewState
    from desktop_app.ui.main_window import apply_view_state

    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    panel = click_panel_tab(qtbot, window, "Layers")
    qtbot.waitUntil(lambda: panel.data is not None, timeout=30_000)
    apply_view_state(panel, state_to_dict(LayersViewState(view="routing", depth=1)))  # a workspace saved on a Mixtral
    bar = panel.tabs.tabBar()
    assert bar.isTabVisible(panel.tabs.currentIndex()) and bar.tabText(panel.tabs.currentIndex()) == "Residual norms"
    assert panel.view_state.view == "residual-norms" and panel.view_state.depth == 1


def test_the_layers_panel_says_which_stage_of_its_analysis_it_is_at(qtbot, model_dirs, isolated_user_files,
                                                                    monkeypatch):
    """'computing…' alone for the ~27 s a GPT-2-small shape's 512 tokens took: now each stage (core's
    compute_layers reports them) is said in the panel's status line while it runs."""
    from desktop_app.core.views import layers as layers_views

    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    panel = click_panel_tab(qtbot, window, "Layers")
    qtbot.waitUntil(lambda: panel.data is not None, timeout=30_000)
    said = []
    monkeypatch.setattr(panel.status, "setText", lambda text, said=said, real=panel.status.setText: (
        said.append(text), real(text)))
    state.set_text("Alice and the rabbit hole.")
    qtbot.waitUntil(lambda: bool(said) and said[-1].endswith("layers"), timeout=30_000)  # "N tokens, 4 layers"
    stages = layers_views.LAYERS_STAGES
    expected = [f"computing {name} ({i + 1}/{len(stages)})\u2026" for i, name in enumerate(stages)]
    assert [t for t in said if t.startswith("computing ")] == expected, said
    assert panel.labels == window.state.token_strings(window.state.token_ids)  # the new text's analysis


def test_the_layers_analysis_can_be_cancelled_with_esc_and_run_again(qtbot, model_dirs, isolated_user_files,
                                                                     monkeypatch):
    """Layers had no Cancel for its analysis (~27 s at 512 tokens of a GPT-2-small shape): now Cancel (Esc) stops
    it, the panel says so and shows nothing of the previous text, and Run (Ctrl+Return) computes it again."""
    import threading

    from desktop_app.ui.panels import layers as layers_module

    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    window.activateWindow()
    qtbot.waitActive(window)
    panel = click_panel_tab(qtbot, window, "Layers")
    qtbot.waitUntil(lambda: panel.data is not None, timeout=30_000)
    assert not panel.cancel_button.isVisible() and not panel.run_button.isVisible()  # nothing running
    real = layers_module.compute_layers
    started = threading.Event()

    def slow(trace, model, tokenizer, job, stack):  # an analysis that runs until cancelled
        started.set()
        job.wait(threading.Event())

    monkeypatch.setattr(layers_module, "compute_layers", slow)
    state.set_text("Alice and the rabbit hole.")
    qtbot.waitUntil(panel.cancel_button.isVisible, timeout=30_000)
    assert started.wait(30)
    assert panel.cancel_button.toolTip().endswith("(Esc)")
    # while it runs, the tokens on show are those of the numbers on show: this text's tokens and none of the previous
    # text's numbers (look14; the strip had the new text's tokens over the previous text's rows, then both were the
    # previous text's under 'computing…')
    assert panel.data is None and panel.resid_map.values.size == 0 and panel.resid_map.row_labels == []
    assert panel.tokens._canvas.strings == state.token_strings(state.token_ids)
    qtbot.keyClick(window.focusWidget() or window, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: panel.status.text() == panel.CANCELLED, timeout=30_000)
    assert panel.data is None and panel.resid_map.values.size == 0  # the previous text's layers are gone
    assert not panel.cancel_button.isVisible() and panel.run_button.isVisible()
    monkeypatch.setattr(layers_module, "compute_layers", real)
    qtbot.keyClick(window.focusWidget() or window, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: panel.data is not None, timeout=30_000)
    assert panel.labels == state.token_strings(state.token_ids)  # this text's analysis
    assert panel.resid_map.values.shape[0] == len(state.token_ids)
    assert not panel.run_button.isVisible() and not panel.cancel_button.isVisible()


def test_the_image_tab_is_shown_only_for_a_model_that_takes_images_and_keys_follow_the_tabs(
        qtbot, model_dirs, isolated_user_files, tmp_path):
    """The Image tab was shown for text models (and with no model), its controls disabled: now only for a ViT, as
    Layers' Routing only for a mixture of experts; Ctrl+N shows the N-th tab on the bar whichever are hidden."""
    from digit_vit import save_digit_vit

    from .walkthrough import shown_tab_titles

    def press(key):
        qtbot.keyClick(window.tabs, key, Qt.KeyboardModifier.ControlModifier)
        return window.current_slot().title

    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    window.activateWindow()
    qtbot.waitUntil(lambda: QGuiApplication.focusWindow() is window.windowHandle())
    titles = shown_tab_titles(window.tabs)
    assert "Image" not in titles and len(titles) == 10
    assert [a.text() for a in window.panel_actions if a.isVisible()] == titles  # the View menu: the tabs on show
    assert press(Qt.Key.Key_5) == titles[4] == "What if" and press(Qt.Key.Key_0) == "Graph"
    assert ("Image", ) not in [(a.text(),) for a in window.shortcut_actions()]

    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(save_digit_vit(tmp_path / "vit"))
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    titles = shown_tab_titles(window.tabs)
    assert titles[4] == "Image" and press(Qt.Key.Key_5) == "Image"  # its place on the bar, its key
    assert window.slot("Image").panel.open_button.isEnabled()
    assert press(Qt.Key.Key_0) == titles[9] == "Train"  # (Graph, the eleventh, has no key)

    assert press(Qt.Key.Key_5) == "Image"
    with qtbot.waitSignal(state.model_changed, timeout=30_000):  # a text model while Image is on show
        window.open_model(model_dirs["demo"])
    assert not window.tabs.isTabVisible(window.tabs.indexOf(window.slot("Image")))
    assert window.current_slot().title == "Model" and press(Qt.Key.Key_5) == "What if"


def test_the_layers_heatmap_with_no_model_shows_no_colour_bar_and_says_what_to_do(qtbot, model_dirs,
                                                                                  isolated_user_files):
    """With no model the Residual norms map was an empty frame beside a 0-1 colour bar: it looked like data."""
    window = MainWindow(AppState())
    qtbot.addWidget(window)
    window.resize(1024, 640)
    window.show()
    panel = click_panel_tab(qtbot, window, "Layers")
    heatmap = panel.resid_map
    qtbot.waitUntil(heatmap.isVisible)
    assert not heatmap.colorbar.isVisible() and heatmap.colorbar.width() < 1
    assert not heatmap.plot.getAxis("left").isVisible() and not heatmap.plot.getAxis("bottom").isVisible()
    assert heatmap.plot.titleLabel.text == "Open a model and enter a text to see its layers."
    window.state.text = TEXTS["demo"]
    with qtbot.waitSignal(window.state.model_changed, timeout=30_000):
        window.open_model(model_dirs["demo"])
    qtbot.waitUntil(lambda: panel.data is not None, timeout=30_000)
    qtbot.wait(50)  # (laid out)
    assert heatmap.colorbar.isVisible() and heatmap.colorbar.width() > 10 and heatmap.plot.getAxis("left").isVisible()
    assert heatmap.plot.width() > 0.8 * heatmap.width()  # the map takes the room the bar leaves


def test_the_layers_depth_slider_is_shown_only_on_the_views_drawn_at_a_depth(qtbot, model_dirs, isolated_user_files):
    """The Depth slider sat over Residual norms, Component norms and the Logit lens (every depth at once): moving
    it changed nothing there."""
    from .walkthrough import click_tab

    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    panel = click_panel_tab(qtbot, window, "Layers")
    qtbot.waitUntil(lambda: panel.data is not None, timeout=30_000)
    for title, shown in (("Residual norms", False), ("PCA", True), ("Logit lens", False), ("Cosine similarity", True),
                         ("Component norms", False)):
        click_tab(qtbot, panel.tabs, title)
        assert panel.depth_slider.isVisible() == shown, title
        assert panel.depth_label.isVisible() == shown, title
    click_tab(qtbot, panel.tabs, "PCA")
    panel.depth_slider.setFocus()
    qtbot.keyClick(panel.depth_slider, Qt.Key.Key_Right)  # (the slider, where shown, moves the view's depth)
    assert panel.view_state.depth == 1 and panel.pca_view.depth == 1


def test_the_layers_export_waits_for_numbers_on_every_view(qtbot, model_dirs, isolated_user_files):
    """With no model PNG/SVG/Data/Copy were on over every Layers view and wrote an empty frame and a bare header."""
    from .walkthrough import click_tab, shown_tab_titles

    window = MainWindow(AppState())
    qtbot.addWidget(window)
    window.show()
    panel = click_panel_tab(qtbot, window, "Layers")
    buttons = panel.export_bar.buttons
    qtbot.waitUntil(buttons["PNG"].isVisible)
    titles = shown_tab_titles(panel.tabs)
    for title in titles:
        click_tab(qtbot, panel.tabs, title)
        assert not any(b.isEnabled() for b in buttons.values()), title
        assert buttons["Data"].toolTip().startswith("Nothing to export"), (title, buttons["Data"].toolTip())
    window.state.text = TEXTS["demo"]
    with qtbot.waitSignal(window.state.model_changed, timeout=30_000):
        window.open_model(model_dirs["demo"])
    qtbot.waitUntil(lambda: panel.data is not None, timeout=30_000)
    for title in titles:
        click_tab(qtbot, panel.tabs, title)
        qtbot.waitUntil(lambda: all(b.isEnabled() for b in buttons.values()), timeout=10_000)
    header, rows = panel.current_view().csv_table()
    assert len(rows) > 0
