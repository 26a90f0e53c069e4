"""What a person sees walking through the Generate, Attention, What if, Graph and Dynamics panels (walk2)."""
from __future__ import annotations

import threading

from PySide6.QtCore import Qt

from .walkthrough import click_panel_tab, open_window


def _generate_with_a_head_ablated(qtbot, model_dirs):
    """The window on a llama with one head ablated (a What if edit), its Generate panel on show."""
    from desktop_app.core.interventions import Intervention

    w, state = open_window(qtbot, model_dirs["llama"], name="llama")
    panel = click_panel_tab(qtbot, w, "Generate")
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        state.set_interventions([Intervention("blocks.1.attn.head.2")])
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=20_000)
    return w, state, panel


def test_generate_says_nothing_is_computing_once_another_model_drops_the_plain_models_job(
        qtbot, model_dirs, isolated_user_files, monkeypatch):
    """With edits, the bars' 'model as trained' column is computed in a job; opening another model while it
    ran dropped its result and left 'computing the model as trained…' on screen for good (and
    screenshot_ready, which read that label, False for good)."""
    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.ui.panels import generation

    release, started = threading.Event(), threading.Event()
    plain_logits_at = generation.plain_logits_at

    def held(*args):
        started.set()
        release.wait(30)
        return plain_logits_at(*args)

    monkeypatch.setattr(generation, "plain_logits_at", held)
    w, state, panel = _generate_with_a_head_ablated(qtbot, model_dirs)
    qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: started.is_set() and panel.session is not None and not panel.busy, timeout=20_000)
    assert panel.plain_box.isVisible() and panel.plain_label.text() == generation.PLAIN_COMPUTING
    assert not panel.screenshot_ready()
    state.set_model(load_model_folder(model_dirs["demo"]))  # (the job holds the one worker thread meanwhile)
    release.set()
    qtbot.waitUntil(panel.screenshot_ready, timeout=20_000)
    assert not panel.plain_box.isVisible() and panel.session is None


def _whole_in_sight(widget) -> bool:
    """The widget's whole rectangle is on screen: not cut by a scroll area's viewport or the window."""
    return widget.isVisible() and widget.visibleRegion().boundingRect() == widget.rect()


def test_dynamics_reset_play_and_step_are_in_sight_at_1024x640(qtbot, model_dirs, isolated_user_files):
    """The form is taller than a 1024x640 window: Reset, Play and Step were under its fold (scroll to find them)."""
    w, state = open_window(qtbot, model_dirs["demo"], name="demo")
    w.resize(1024, 640)
    panel = click_panel_tab(qtbot, w, "Dynamics")
    qtbot.waitUntil(lambda: panel.sim is not None, timeout=30_000)
    qtbot.wait(50)  # (laid out)
    assert panel.form_scroll.verticalScrollBar().maximum() > 0  # (the case: the form scrolls)
    for button in (panel.reset_button, panel.play_button, panel.step_button):
        assert _whole_in_sight(button), button.text()
    assert _whole_in_sight(panel.status)
    frames = len(panel._frames)
    qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(panel._frames) == frames + 1, timeout=30_000)
    qtbot.mouseClick(panel.play_button, Qt.MouseButton.LeftButton)
    assert panel.play_button.text() == "Pause" and panel.timer.isActive()
    qtbot.waitUntil(lambda: len(panel._frames) >= frames + 3, timeout=30_000)
    qtbot.mouseClick(panel.play_button, Qt.MouseButton.LeftButton)
    assert panel.play_button.text() == "Play" and not panel.timer.isActive()
    qtbot.waitUntil(lambda: not panel.is_running(), timeout=30_000)


def test_dynamics_starts_its_workers_after_its_first_paint(qtbot, model_dirs, isolated_user_files, monkeypatch):
    """The model's curves and the starting particles were started in the tab's click, their workers taking the
    cores from the panel's first paint (its first show 195-430 ms in bench ui)."""
    from PySide6.QtCore import QEvent, QObject

    from desktop_app.ui.panels.dynamics import DynamicsPanel

    w, state = open_window(qtbot, model_dirs["demo"], name="demo")
    painted, started = [], []

    class FirstPaint(QObject):
        def eventFilter(self, obj, event) -> bool:  # noqa: N802
            if isinstance(obj, DynamicsPanel) and event.type() == QEvent.Type.Paint:
                painted.append(obj)
            return False

    seen = FirstPaint()
    from PySide6.QtWidgets import QApplication
    QApplication.instance().installEventFilter(seen)
    run = type(state).run

    def noted(self, fn, *args, **kwargs):
        started.append((getattr(fn, "__name__", str(fn)), bool(painted)))
        return run(self, fn, *args, **kwargs)

    monkeypatch.setattr(type(state), "run", noted)
    try:
        panel = click_panel_tab(qtbot, w, "Dynamics")
        qtbot.waitUntil(lambda: panel.sim is not None and panel._layer_curves is not None and panel.screenshot_ready(),
                        timeout=30_000)
    finally:
        QApplication.instance().removeEventFilter(seen)
    assert {name for name, _ in started} >= {"build_simulation", "stack_layer_curves"}
    assert all(after_paint for _, after_paint in started), started


def test_generates_logit_lens_shows_each_cell_whole_at_1024x640(qtbot, model_dirs, isolated_user_files):
    """The right column had ~225 px at 1024x640: 'top prediction' read 'predic' and its cells "'les' (57…"."""
    w, state = open_window(qtbot, model_dirs["demo"], name="demo")
    w.resize(1024, 640)
    panel = click_panel_tab(qtbot, w, "Generate")
    qtbot.waitUntil(panel.step_button.isEnabled, timeout=20_000)
    for _ in range(2):
        qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: not panel.busy, timeout=20_000)
    last = panel.strip.count() - 1  # the last generated token, clicked: its logit lens
    qtbot.mouseClick(panel.strip.canvas, Qt.MouseButton.LeftButton, pos=panel.strip.chip_center(last))
    table = panel.lens_table
    qtbot.waitUntil(lambda: table.rowCount() == 5 and table.isVisible(), timeout=20_000)
    qtbot.wait(50)  # (laid out)
    metrics = table.fontMetrics()
    header = table.horizontalHeader()
    for c in range(table.columnCount()):
        title = table.horizontalHeaderItem(c).text()
        assert header.sectionSize(c) >= header.fontMetrics().horizontalAdvance(title) + 8, title
        for r in range(table.rowCount()):
            text = table.item(r, c).text()
            assert table.columnWidth(c) >= metrics.horizontalAdvance(text) + 8, (text, table.columnWidth(c))
    assert header.sectionPosition(table.columnCount() - 1) + header.sectionSize(table.columnCount() - 1) \
        <= table.viewport().width()  # and no column past the table's right edge


CTRL = Qt.KeyboardModifier.ControlModifier


def _press(qtbot, window, key, modifier=Qt.KeyboardModifier.NoModifier) -> None:
    """The key pressed where the focus is; then the button's animated click (Qt's 100 ms press) is let happen."""
    qtbot.keyClick(window.focusWidget() or window, key, modifier)
    qtbot.wait(300)


def test_ctrl_return_and_esc_on_what_if_graph_and_generate(qtbot, model_dirs, isolated_user_files, monkeypatch,
                                                             tmp_path):
    """What if's Attribute and patching Run/Cancel, Graph's Compute/Cancel and Generate's Run N had no key."""
    import time

    from desktop_app.core.jobs import Cancelled
    from desktop_app.ui.dialogs import ShortcutsDialog
    from desktop_app.ui.panels import graph
    from PySide6.QtWidgets import QFileDialog

    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    window.activateWindow()
    qtbot.waitActive(window)
    dialog = ShortcutsDialog(window.shortcut_actions(), window, window.panel_shortcuts())
    rows = {(dialog.table.item(r, 0).text(), dialog.table.item(r, 1).text()) for r in range(dialog.table.rowCount())}
    dialog.deleteLater()
    for row in (("What if: Attribute", "Ctrl+Return"), ("What if: Run the patching", "Ctrl+Return"),
                ("What if: Cancel the patching", "Esc"), ("Graph: Compute graph…", "Ctrl+Return"),
                ("Graph: Cancel the graph", "Esc"), ("Generate: Run N (Stop while it runs)", "Ctrl+Return")):
        assert row in rows, sorted(rows)

    whatif = click_panel_tab(qtbot, window, "What if")
    chart = whatif.dla_chart
    qtbot.waitUntil(lambda: chart.attribution is not None, timeout=20_000)  # (its first look attributes)
    assert "(#5)" not in chart.plot_item.titleLabel.text
    whatif.token_edit.setText("#5")  # another token, attributed by the key
    whatif.token_edit.setFocus()
    _press(qtbot, window, Qt.Key.Key_Return, CTRL)
    qtbot.waitUntil(lambda: "(#5)" in chart.plot_item.titleLabel.text, timeout=20_000)

    # the Graph panel's Compute (its folder dialog answered) and Cancel, on a graph held until cancelled
    started = []

    def held(*args, job=None):
        started.append(True)
        while not job.cancelled:
            time.sleep(0.01)
        raise Cancelled()

    monkeypatch.setattr(graph, "_compute_and_prune", held)
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(tmp_path)))
    panel = click_panel_tab(qtbot, window, "Graph")
    qtbot.waitUntil(panel.compute_button.isVisible)
    _press(qtbot, window, Qt.Key.Key_Return, CTRL)
    qtbot.waitUntil(lambda: bool(started) and panel.cancel_button.isEnabled(), timeout=20_000)
    _press(qtbot, window, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: panel.summary.text() == "Cancelled: no graph computed.", timeout=20_000)
    assert panel.compute_button.isEnabled()

    gen = click_panel_tab(qtbot, window, "Generate")
    qtbot.waitUntil(gen.run_button.isEnabled, timeout=20_000)
    gen.run_n.setValue(3)
    n = len(gen._prompt_ids())
    qtbot.wait(300)  # (a key pressed within milliseconds of the panel's build found no shortcut offscreen)
    _press(qtbot, window, Qt.Key.Key_Return, CTRL)  # Run N with no session: starts one from the prompt, runs 3
    qtbot.waitUntil(lambda: gen.session is not None and not gen.busy and len(gen.session.ids()) == n + 3,
                    timeout=30_000)


def test_attention_says_its_whole_summary_on_a_t5_at_1024x640(qtbot, tmp_path, isolated_user_files):
    """An encoder-decoder's row has the attention kind's box too: the summary ('38 tokens, 2 layers x 4 heads')
    had no room left and read '…' alone."""
    from tiny_models import save_tiny_model

    from .walkthrough import choose_item, click_tab

    folder = save_tiny_model(tmp_path / "t5", "abcdefghijklmnopqrstuvwxyz .A", "t5", context_length=128)
    w, state = open_window(qtbot, folder, text="Alice was beginning to get very tired of sitting.")
    w.resize(1024, 640)
    panel = click_panel_tab(qtbot, w, "Attention")
    qtbot.waitUntil(panel.kind_combo.isVisible, timeout=20_000)
    for kind in range(panel.kind_combo.count()):
        choose_item(qtbot, panel.kind_combo, panel.kind_combo.itemText(kind))
        qtbot.waitUntil(panel.screenshot_ready, timeout=20_000)
        qtbot.wait(50)  # (laid out)
        assert "heads" in panel.status.text()
        assert panel.status.shown_text() == panel.status.text(), (panel.status.text(), panel.status.width())
    assert not panel.stat_combo.isVisible()  # (disabled on this view: it took the room)
    click_tab(qtbot, panel.tabs, "Head statistics")  # where it applies, it is shown and chosen
    qtbot.waitUntil(panel.screenshot_ready, timeout=20_000)
    assert panel.stat_combo.isVisible() and panel.stat_combo.isEnabled()
    choose_item(qtbot, panel.stat_combo, panel.stat_combo.itemText(1))
    assert panel.view_state.statistic == panel.stat_combo.itemData(1)


def test_the_graph_panels_axes_show_a_graph_only(qtbot, model_dirs, isolated_user_files, tmp_path, monkeypatch):
    """Before any graph the plot showed bare axes (-0.5..0.5, its top tick cut); after another text cleared a
    graph, its rows (L0..Logit) and the old text's tokens stayed on the axes with nothing drawn."""
    from PySide6.QtWidgets import QFileDialog

    from desktop_app.core.graphs.transcoders import random_transcoders

    random_transcoders(tmp_path / "clt", 4, 128, 64, cross_layer=True, seed=2)
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(tmp_path / "clt")))
    w, state = open_window(qtbot, model_dirs["demo"], text="The cat sat on the mat because it was")
    panel = click_panel_tab(qtbot, w, "Graph")
    plot = panel.plot.getPlotItem()
    axes = [plot.getAxis("left"), plot.getAxis("bottom")]
    assert not any(a.isVisible() for a in axes)
    qtbot.mouseClick(panel.compute_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.layout_data is not None and panel.compute_button.isEnabled(), timeout=120_000)
    assert all(a.isVisible() for a in axes)
    ticks = [label for _, label in axes[1]._tickLevels[0]]
    assert ticks[-2:] == [" it", " was"] or ticks[-2:] == ["it", "was"] or "was" in ticks[-1], ticks
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        state.set_text("Alice was beginning to get very tired")
    qtbot.waitUntil(lambda: panel.result is None, timeout=20_000)
    assert not any(a.isVisible() for a in axes)
    assert not axes[1]._tickLevels  # (none of the old text's tokens)


def test_dynamics_keeps_the_sphere_in_view_for_a_models_tokens(qtbot, model_dirs, isolated_user_files):
    """The demo model's tokens driven by its head, on the sphere: their 3-D projection lies well inside the unit
    sphere, and the view was fitted to them, cutting the sphere's outline at the plot's edges."""
    from .walkthrough import choose_item

    w, state = open_window(qtbot, model_dirs["demo"], name="demo")
    panel = click_panel_tab(qtbot, w, "Dynamics")
    qtbot.waitUntil(panel.screenshot_ready, timeout=30_000)
    choose_item(qtbot, panel.init, "tokens of the current text")
    choose_item(qtbot, panel.qkv, "a head of the loaded model")
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.sim is not None and panel.screenshot_ready(), timeout=30_000)
    assert panel.sim.config.sphere and panel.sim.config.d == 128
    assert float(abs(panel.screen_xy).max()) < 1 / 1.15  # (the case: the view fitted to them would cut the sphere)
    (x0, x1), (y0, y1) = panel.particles.getViewBox().viewRange()
    assert x0 <= -1 and x1 >= 1 and y0 <= -1 and y1 >= 1, ((x0, x1), (y0, y1))


def test_dynamics_space_plays_and_right_steps_after_a_click_on_its_tab(qtbot, model_dirs, isolated_user_files):
    """Help lists Space (play / pause) and Right (one step); after a click on the tab the focus is on the tab bar,
    so Space did nothing and Right showed the next panel (Train)."""
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    window.activateWindow()
    qtbot.waitActive(window)
    panel = click_panel_tab(qtbot, window, "Dynamics")
    qtbot.waitUntil(lambda: panel.sim is not None and panel.screenshot_ready(), timeout=30_000)
    qtbot.wait(300)  # (a key pressed within milliseconds of the panel's build found no shortcut offscreen)
    frames = len(panel._frames)
    _press(qtbot, window, Qt.Key.Key_Right)
    assert window.tabs.currentWidget() is window.slot("Dynamics")  # still on show
    qtbot.waitUntil(lambda: len(panel._frames) == frames + 1 and not panel.is_running(), timeout=30_000)
    _press(qtbot, window, Qt.Key.Key_Space)
    assert panel.play_button.isChecked() and panel.timer.isActive()
    qtbot.waitUntil(lambda: len(panel._frames) >= frames + 3, timeout=30_000)
    _press(qtbot, window, Qt.Key.Key_Space)
    assert not panel.play_button.isChecked() and not panel.timer.isActive()
    qtbot.waitUntil(lambda: not panel.is_running(), timeout=30_000)


def test_generate_right_steps_and_left_goes_back_after_a_click_on_its_tab(qtbot, model_dirs, isolated_user_files):
    """After a click on the Generate tab the focus is on the tab bar: Right showed the Attention panel instead of
    stepping (the arrows were the panel's keys only with the focus inside it)."""
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    window.activateWindow()
    qtbot.waitActive(window)
    panel = click_panel_tab(qtbot, window, "Generate")
    qtbot.waitUntil(panel.step_button.isEnabled, timeout=20_000)
    qtbot.wait(300)
    n = len(panel._prompt_ids())
    for _ in range(2):
        _press(qtbot, window, Qt.Key.Key_Right)
        qtbot.waitUntil(lambda: not panel.busy, timeout=20_000)
    assert window.tabs.currentWidget() is window.slot("Generate")
    assert len(panel.session.ids()) == n + 2
    _press(qtbot, window, Qt.Key.Key_Left)
    qtbot.waitUntil(lambda: not panel.busy, timeout=20_000)
    assert len(panel.session.ids()) == n + 1 and window.tabs.currentWidget() is window.slot("Generate")
    panel.prompt.setFocus()  # a text box keeps its own arrows
    panel.prompt.setCursorPosition(3)
    _press(qtbot, window, Qt.Key.Key_Right)
    assert panel.prompt.cursorPosition() == 4 and len(panel.session.ids()) == n + 1


def test_the_graphs_intervention_table_shows_every_column_whole_at_1024x640(qtbot, model_dirs, isolated_user_files,
                                                                             tmp_path, monkeypatch):
    """The logits before and after an intervention: five columns of 100 px in a ~420 px side panel ('p after'
    past the edge, a horizontal scroll bar)."""
    from .walkthrough import click_tab, graph_with_its_top_feature_clicked

    w, state = open_window(qtbot, model_dirs["demo"], text="The cat sat on the mat because it was")
    w.resize(1024, 640)
    panel, top = graph_with_its_top_feature_clicked(qtbot, w, tmp_path, monkeypatch)
    qtbot.waitUntil(lambda: panel.selected == top, timeout=3000)
    qtbot.mouseClick(panel.pin_button, Qt.MouseButton.LeftButton)
    click_tab(qtbot, panel.side, "Intervene")
    qtbot.mouseClick(panel.run_edit_button, Qt.MouseButton.LeftButton)
    table = panel.logits_table
    qtbot.waitUntil(lambda: panel.edit_result is not None and table.rowCount() > 0, timeout=20_000)
    qtbot.wait(50)  # (laid out)
    header = table.horizontalHeader()
    last = table.columnCount() - 1
    assert header.sectionPosition(last) + header.sectionSize(last) <= table.viewport().width()
    assert not table.horizontalScrollBar().isVisible()
    for c in range(table.columnCount()):
        title = table.horizontalHeaderItem(c).text()
        assert header.sectionSize(c) >= header.fontMetrics().horizontalAdvance(title) + 8, title
        for r in range(table.rowCount()):
            assert table.columnWidth(c) >= table.fontMetrics().horizontalAdvance(table.item(r, c).text()) + 8


def test_generates_png_holds_the_model_as_trained_beside_the_edited_bars(qtbot, model_dirs, isolated_user_files,
                                                                         monkeypatch, tmp_path):
    """With what-if edits the panel shows two sets of bars (with and without the edits); its PNG held the first
    only."""
    from PySide6.QtGui import QImage

    from desktop_app.ui.widgets import export

    w, state, panel = _generate_with_a_head_ablated(qtbot, model_dirs)
    qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.session is not None and panel.screenshot_ready(), timeout=20_000)
    assert panel.plain_box.isVisible() and "log p" in panel.plain_label.text()
    qtbot.wait(300)  # (the bars made while hidden widen their token axis a relayout after being shown)
    for name in ("bars.png", "bars.svg"):
        monkeypatch.setattr(export, "ask_save_path", lambda *a, name=name, **k: str(tmp_path / name))
        qtbot.mouseClick(panel.export_bar.buttons[name[-3:].upper()], Qt.MouseButton.LeftButton)
    image = QImage(str(tmp_path / "bars.png"))
    plot, plain = panel.bars.plot, panel.plain_box  # (the two sets of bars side by side: their span on screen)
    both = plain.mapTo(panel, plain.rect().topRight()).x() - plot.mapTo(panel, plot.rect().topLeft()).x()
    assert image.width() >= both > 1.8 * panel.bars.plot.width(), (image.width(), both, panel.bars.plot.width())
    svg = (tmp_path / "bars.svg").read_text()
    assert "Without them" in svg or "without" in svg.lower()
