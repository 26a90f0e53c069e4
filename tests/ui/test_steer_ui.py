"""The What if panel's Steer tab, driven through its real widgets: typing the two texts, the layer
and the scale slider, Apply putting the steer among the app's edits (replacing an earlier steer,
keeping an ablation), the strip listing and removing it, the Generate panel's with/without
comparison, and one clear line for an empty text or a text the model cannot read."""
from __future__ import annotations

import pytest
import torch
from PySide6.QtCore import Qt

from .walkthrough import click_panel_tab, click_tab, open_window, type_into


def _wait_traced(qtbot, state):
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=20_000)


def _apply(qtbot, panel, state):
    with qtbot.waitSignal(state.interventions_changed, timeout=20_000):
        qtbot.mouseClick(panel.apply_steer_button, Qt.MouseButton.LeftButton)
    _wait_traced(qtbot, state)


def test_steer_applies_shows_in_the_strip_and_generate_compares(qtbot, model_dirs, isolated_user_files, error_watch):
    from desktop_app.core.generation import GenerationSession, GenerationSettings, process_logits
    from desktop_app.core.interventions import Intervention, steering_vector

    w, state = open_window(qtbot, model_dirs["llama"], text="Alice and the rabbit hole.", watch=error_watch)
    ablation = Intervention("blocks.0.attn.head.1")
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        state.set_interventions([ablation])  # an edit made elsewhere: a steer keeps it
    _wait_traced(qtbot, state)
    panel = click_panel_tab(qtbot, w, "What if")
    click_tab(qtbot, panel.tabs, "Steer")
    assert panel.steer_layer_spin.maximum() == state.loaded.config.n_layers - 1
    assert panel.scale_label.text() == "x4.0"

    # an empty text: one line, no edit
    type_into(qtbot, panel.towards_edit, "Alice")
    qtbot.mouseClick(panel.apply_steer_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.steer_status.text().startswith("Cannot steer"), timeout=20_000)
    assert "away from text is empty" in panel.steer_status.text()
    assert state.interventions == [ablation]

    type_into(qtbot, panel.away_edit, "the rabbit hole")
    type_into(qtbot, panel.steer_layer_spin, "1")
    panel.scale_slider.setFocus()
    for _ in range(2):
        qtbot.keyClick(panel.scale_slider, Qt.Key.Key_PageUp)  # +1 each
    assert panel.scale_label.text() == "x6.0"
    _apply(qtbot, panel, state)
    assert len(state.interventions) == 2 and state.interventions[0] is ablation
    steer = state.interventions[1]
    assert steer.label == 'steer L1 x6.0 ("Alice" - "the rabbit hole")'
    tok = state.loaded.tokenizer
    v = steering_vector(state.loaded.model, tok.encode("Alice"), tok.encode("the rabbit hole"), 1)
    assert torch.allclose(steer.value, 6.0 * v, atol=1e-6)
    strip = w.intervention_strip
    assert strip.isVisible() and len(strip.chips) == 2
    assert steer.label in strip.chips[1].findChildren(type(strip.title))[0].text()
    assert steer.label in panel.steer_status.text()

    # Apply again with another scale: the steer is replaced, the ablation stays
    for _ in range(20):
        qtbot.keyClick(panel.scale_slider, Qt.Key.Key_Left)  # -0.5 each
    assert panel.scale_label.text() == "x-4.0"
    _apply(qtbot, panel, state)
    assert [iv.label for iv in state.interventions] == [ablation.label,
                                                        'steer L1 x-4.0 ("Alice" - "the rabbit hole")']
    assert torch.allclose(state.interventions[1].value, -4.0 * v, atol=1e-6)

    # the Generate panel: the steered model's next token beside the model as trained
    gen = click_panel_tab(qtbot, w, "Generate")
    qtbot.mouseClick(gen.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: gen.session is not None and not gen.busy and bool(gen.plain_bars.token_ids),
                    timeout=20_000)
    qtbot.waitUntil(lambda: "log p" in gen.plain_label.text(), timeout=20_000)
    assert gen.plain_box.isVisible() and gen.edited_title.isVisible()
    node = gen.session.current
    plain = GenerationSession(state.loaded, gen.session.ids(node), GenerationSettings())
    edited = GenerationSession(state.loaded, gen.session.ids(node), GenerationSettings(),
                               interventions=list(state.interventions))
    assert torch.allclose(node.next_logits, edited.root.next_logits, atol=1e-4)  # the bars are the steered model's
    assert not torch.allclose(process_logits(plain.root.next_logits).model_probs,
                              process_logits(node.next_logits).model_probs, atol=1e-4)
    assert gen.plain_bars.token_ids[0] == int(plain.root.next_logits.argmax())

    # the strip's x: the ablation, then the steer; nothing is left
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        qtbot.mouseClick(strip.remove_buttons[0], Qt.MouseButton.LeftButton)
    _wait_traced(qtbot, state)
    assert [iv.how for iv in state.interventions] == ["add"]
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        qtbot.mouseClick(strip.remove_buttons[0], Qt.MouseButton.LeftButton)
    _wait_traced(qtbot, state)
    assert state.interventions == [] and not strip.isVisible()
    error_watch.assert_clean()


def test_steer_on_a_model_without_a_tokenizer_says_it_takes_ids(qtbot, model_dirs, isolated_user_files, error_watch):
    w, state = open_window(qtbot, model_dirs["notok"], text="1 2 3", watch=error_watch)
    panel = click_panel_tab(qtbot, w, "What if")
    click_tab(qtbot, panel.tabs, "Steer")
    type_into(qtbot, panel.towards_edit, "love")
    type_into(qtbot, panel.away_edit, "5 6")
    qtbot.mouseClick(panel.apply_steer_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.steer_status.text().startswith("Cannot steer"), timeout=20_000)
    assert "token ids" in panel.steer_status.text() and state.interventions == []
    type_into(qtbot, panel.towards_edit, "1, 2, 3")
    _apply(qtbot, panel, state)
    assert state.interventions[0].label == 'steer L1 x4.0 ("1, 2, 3" - "5 6")'  # 2 layers: the middle is 1
    error_watch.assert_clean()


@pytest.mark.parametrize("scale", [2.5, -10.0])
def test_steer_inputs_are_the_panel_view_state(qtbot, model_dirs, isolated_user_files, scale):
    from desktop_app.core.views.whatif import WhatIfViewState

    w, state = open_window(qtbot, model_dirs["llama"], text="Alice and the rabbit hole.")
    panel = click_panel_tab(qtbot, w, "What if")
    want = WhatIfViewState(tab="steer", steer_towards="Alice", steer_away="hole", steer_layer=0, steer_scale=scale)
    panel.set_view_state(want)
    assert panel.tabs.tabText(panel.tabs.currentIndex()) == "Steer"
    assert panel.steer_layer_spin.value() == 0 and panel.scale_label.text() == f"x{scale:.1f}"
    assert panel.view_state.steer_towards == "Alice" and panel.view_state == WhatIfViewState(
        tab="steer", clean=panel.clean_edit.text(), steer_towards="Alice", steer_away="hole", steer_layer=0,
        steer_scale=scale)
