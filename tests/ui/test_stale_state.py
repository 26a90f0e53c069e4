"""Issue 13, defects 1 and 4: what the panels show always belongs to the open model and agrees with
the Model panel's text box (driven by clicks and typing, as a person would)."""
from __future__ import annotations

from PySide6.QtCore import Qt

from .walkthrough import TEXTS, open_window


def _wait_traced(qtbot, state):
    qtbot.waitUntil(lambda: state._trace_job is None or state._trace_job.done, timeout=30_000)


def _show_tab(qtbot, window, title):
    bar = window.tabs.tabBar()
    index = next(i for i in range(window.tabs.count()) if window.tabs.tabText(i) == title)
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(index).center())
    return window.slot(title).panel


def test_opening_a_model_that_cannot_trace_the_text_clears_the_old_models_views(qtbot, model_dirs,
                                                                                 isolated_user_files):
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    attention = _show_tab(qtbot, window, "Attention")
    layers = _show_tab(qtbot, window, "Layers")
    qtbot.waitUntil(lambda: len(attention.model_view.boxes) > 0, timeout=30_000)
    demo_grid = len(attention.model_view.boxes)
    assert demo_grid == state.loaded.config.n_layers * state.loaded.config.n_heads
    qtbot.waitUntil(lambda: layers.result is not None, timeout=30_000)

    # 'notok' has no tokenizer: the demo's English text is not a list of ids for it
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(model_dirs["notok"])
    _wait_traced(qtbot, state)
    qtbot.waitUntil(lambda: state.trace is None and state.trace_problem != "", timeout=10_000)
    assert state.token_ids == []
    assert "token ids" in state.trace_problem

    # never the old model's 6 x 12 grid (2 x 4 would be the new model's, none is right: no trace)
    assert len(attention.model_view.boxes) in (0, 2 * 4)
    assert attention.patterns == [] and attention.tokens.count() == 0
    assert attention.layer_spin.maximum() == 0 and attention.head_spin.maximum() == 0
    assert attention.status.text().startswith("No text traced for this model:")
    assert layers.result is None and layers.tokens.count() == 0 and layers.lens_view.lens.rowCount() == 0
    assert layers.status.text().startswith("No text traced for this model:")
    model = _show_tab(qtbot, window, "Model")
    assert model.token_strip.count() == 0
    assert model.message_label.text().startswith("No text traced for this model:")

    # typing ids the new model can read brings its own trace: 2 layers x 4 heads
    _show_tab(qtbot, window, "Model")
    model.text_edit.selectAll()
    qtbot.keyClicks(model.text_edit, TEXTS["notok"])
    qtbot.waitUntil(lambda: state.trace is not None, timeout=30_000)
    _wait_traced(qtbot, state)
    attention = _show_tab(qtbot, window, "Attention")
    qtbot.waitUntil(lambda: len(attention.model_view.boxes) == 2 * 4, timeout=30_000)
    assert model.message_label.text() == ""


def test_chips_from_a_generation_step_are_marked_and_the_button_brings_back_the_texts(qtbot, model_dirs,
                                                                                     isolated_user_files):
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    model = window.panel("Model")
    # a job is marked done before its result reaches the UI thread: wait for the tokens themselves
    qtbot.waitUntil(lambda: state.trace is not None and len(state.token_ids) > 0, timeout=30_000)
    text_ids = list(state.token_ids)
    assert model.token_strip.count() == len(text_ids)
    assert not model.back_button.isVisible()

    # what the Generate panel does when a generated token is inspected: a longer sequence's trace
    import torch

    loaded = state.loaded
    generated = text_ids + loaded.tokenizer.encode(" and then")
    _, trace = loaded.model.run_with_trace(torch.tensor([generated]))
    state.show_trace(trace, generated)
    assert model.token_strip.count() == len(generated)
    assert model.text_edit.toPlainText() == TEXTS["demo"]  # the text box keeps the user's text...
    assert model.back_button.isVisible()  # ...and the panel says the chips are not its tokens
    assert "generation step" in model.source_label.text()

    qtbot.mouseClick(model.back_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: state.token_ids == text_ids and state.trace_source == "text", timeout=30_000)
    qtbot.waitUntil(lambda: model.token_strip.count() == len(text_ids), timeout=10_000)
    assert not model.back_button.isVisible() and not model.source_label.isVisible()
