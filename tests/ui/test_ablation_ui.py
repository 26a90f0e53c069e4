"""Ablating from the Attention panel: the right-click menu on a head's thumbnail and the Ablate
button, the strip of active edits at the top of the window (remove one, clear all), and the
Generate panel's next-token distribution with and without the edits.

The context menu is opened through the model view's customContextMenuRequested signal at the
real position of the head's thumbnail (a right-click offscreen does not reliably deliver a
QContextMenuEvent), then its QAction is triggered through menu.actions()."""
from __future__ import annotations

import pytest
import torch
from PySide6.QtCore import Qt

from .walkthrough import click_panel_tab, open_window


def _action(menu, *path):
    for text in path[:-1]:
        menu = next(a.menu() for a in menu.actions() if a.text() == text)
    return next(a for a in menu.actions() if a.text() == path[-1])


def _wait_traced(qtbot, state):
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=20_000)


def test_right_click_a_head_ablates_it_everywhere_and_the_strip_removes_it(qtbot, model_dirs, isolated_user_files,
                                                                          error_watch):
    w, state = open_window(qtbot, model_dirs["llama"], name="llama", watch=error_watch)
    assert not w.intervention_strip.isVisible()
    panel = click_panel_tab(qtbot, w, "Attention")
    qtbot.waitUntil(lambda: (1, 2) in panel.model_view.boxes, timeout=20_000)
    before = state.trace["blocks.1.attn.head_out"][0, 2].clone()
    logits_before = state.trace["logits"].clone()
    assert before.abs().max() > 0

    mv = panel.model_view
    pos = mv.mapFromScene(mv.thumb_scene_center(1, 2))
    mv.customContextMenuRequested.emit(pos)
    menu = panel.last_ablation_menu
    assert menu.isVisible()
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        _action(menu, "Ablate head 1.2", "Zero").trigger()
    _wait_traced(qtbot, state)
    assert [iv.target for iv in state.interventions] == ["blocks.1.attn.head.2"]
    assert state.trace["blocks.1.attn.head_out"][0, 2].abs().max() == 0  # the trace is the edited model's
    assert not torch.allclose(state.trace["logits"], logits_before)
    strip = w.intervention_strip
    assert strip.isVisible() and len(strip.chips) == 1
    assert "zero L1H2" in strip.chips[0].findChildren(type(strip.title))[0].text()

    # the Ablate button's menu: layer 0's MLP, mean over the text
    panel.layer_spin.setValue(0)
    panel.ablate_button.menu().aboutToShow.emit()
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        _action(panel.ablate_button.menu(), "Ablate layer 0's MLP", "Mean over the text").trigger()
    _wait_traced(qtbot, state)
    assert [iv.how for iv in state.interventions] == ["zero", "mean"] and len(strip.chips) == 2
    qtbot.waitUntil(lambda: (1, 2) in panel.model_view.boxes, timeout=20_000)  # thumbnails of the edited model

    # remove the head's edit with its x, then clear all
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        qtbot.mouseClick(strip.remove_buttons[0], Qt.MouseButton.LeftButton)
    _wait_traced(qtbot, state)
    assert [iv.target for iv in state.interventions] == ["blocks.0.mlp.out"]
    assert state.trace["blocks.1.attn.head_out"][0, 2].abs().max() > 0  # the head is back
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        qtbot.mouseClick(strip.clear_button, Qt.MouseButton.LeftButton)
    _wait_traced(qtbot, state)
    assert state.interventions == [] and not strip.isVisible()
    assert torch.allclose(state.trace["logits"], logits_before)
    assert torch.allclose(state.trace["blocks.1.attn.head_out"][0, 2], before)
    error_watch.assert_clean()


def test_resample_with_a_bad_text_says_why_in_one_line(qtbot, model_dirs, isolated_user_files, error_watch):
    w, state = open_window(qtbot, model_dirs["llama"], name="llama", watch=error_watch)
    panel = click_panel_tab(qtbot, w, "Attention")
    panel.ablate("blocks.0.attn.head.1", "resample", other_text="   ")
    assert panel.status.text().startswith("Cannot resample"), panel.status.text()
    assert state.interventions == []
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        panel.ablate("blocks.0.attn.head.1", "resample", other_text=state.text)
    _wait_traced(qtbot, state)
    assert state.interventions[0].source_ids and w.intervention_strip.isVisible()
    error_watch.assert_clean()


def test_generate_shows_the_next_token_with_and_without_the_ablation(qtbot, model_dirs, isolated_user_files,
                                                                     error_watch):
    from desktop_app.core.generation import GenerationSession, GenerationSettings, process_logits
    from desktop_app.core.interventions import Intervention

    w, state = open_window(qtbot, model_dirs["llama"], name="llama", watch=error_watch)
    panel = click_panel_tab(qtbot, w, "Generate")
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        state.set_interventions([Intervention("blocks.1.attn.head.2"), Intervention("blocks.0.mlp.out", "mean")])
    _wait_traced(qtbot, state)
    qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.session is not None and not panel.busy and bool(panel.plain_bars.token_ids),
                    timeout=20_000)
    qtbot.waitUntil(lambda: "log p" in panel.plain_label.text(), timeout=20_000)
    assert panel.session.interventions and panel.plain_box.isVisible() and panel.edited_title.isVisible()

    # the two sides are the edited and the plain model's distributions after the same prompt
    s = panel.session
    node = s.current  # the bars show the candidates for the step after the current token
    ids = s.ids(node)
    plain = GenerationSession(state.loaded, ids, GenerationSettings())
    p_plain = process_logits(plain.root.next_logits).model_probs
    p_edited = process_logits(node.next_logits).model_probs
    assert not torch.allclose(p_plain, p_edited, atol=1e-4)
    top = panel.plain_bars.token_ids[0]
    assert top == int(p_plain.argmax())
    picked = int(p_edited.argmax())  # nothing picked yet after the current token: the edited model's top one
    assert panel.plain_change == pytest.approx(float(torch.log(p_edited[picked]) - torch.log(p_plain[picked])),
                                               abs=1e-4)

    # the inspected step's head outputs are the edited ones: the ablated head wrote nothing
    trace, _ = s.step_trace()
    assert trace["blocks.1.attn.head_out"][0, 2].abs().max() == 0
    assert trace["blocks.1.attn.head_out"][0, 1].abs().max() > 0

    # clearing the edits keeps the history (issue 25), now the plain model's, with no second column
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        qtbot.mouseClick(w.intervention_strip.clear_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.session is not s and not panel.busy, timeout=20_000)
    assert panel.session.ids() == ids and not panel.session.interventions and not panel.plain_box.isVisible()
    assert torch.allclose(process_logits(panel.session.current.next_logits).model_probs, p_plain, atol=1e-4)
    error_watch.assert_clean()


def test_mask_filling_shows_each_position_with_and_without_the_ablation(qtbot, model_dirs, isolated_user_files,
                                                                        error_watch):
    """An encoder's fill view compares too: the plain model's distribution at the shown masked position
    of the same sequence, and the change in the picked (or top) token's log-probability."""
    from desktop_app.core.generation import process_logits
    from desktop_app.core.interventions import Intervention

    from .walkthrough import type_into

    w, state = open_window(qtbot, model_dirs["bert"], name="bert", watch=error_watch)
    panel = click_panel_tab(qtbot, w, "Generate")
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        state.set_interventions([Intervention("blocks.1.attn.head.2"), Intervention("blocks.0.mlp.out", "mean")])
    _wait_traced(qtbot, state)
    type_into(qtbot, panel.prompt, "the cat [MASK] on the [MASK] .")
    qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)  # fills one mask; the other is shown
    qtbot.waitUntil(lambda: panel.session is not None and not panel.busy and len(panel.session.history) == 1,
                    timeout=20_000)
    qtbot.waitUntil(lambda: "log p" in panel.plain_label.text(), timeout=20_000)
    assert panel.plain_box.isVisible() and panel.edited_title.isVisible()

    s = panel.session
    pos = s.remaining[0]
    ids = s.ids()
    with torch.no_grad():
        plain_logits = state.loaded.model(torch.tensor([ids])).logits[0, pos]
    p_plain = process_logits(plain_logits).model_probs
    p_edited = process_logits(s.all_logits()[pos]).model_probs
    assert not torch.allclose(p_plain, p_edited, atol=1e-4)
    assert panel.plain_bars.token_ids[0] == int(p_plain.argmax())
    top = int(p_edited.argmax())
    assert panel.plain_change == pytest.approx(float(torch.log(p_edited[top]) - torch.log(p_plain[top])), abs=1e-4)

    # clicking the filled position shows what it was filled from, against the plain model on that sequence
    filled = s.history[0]
    before = s.context_ids(filled.position)
    assert before[pos] == state.loaded.tokenizer.mask_token_id and before[filled.position] == before[pos]
    qtbot.mouseClick(panel.strip.canvas, Qt.MouseButton.LeftButton, pos=panel.strip.chip_center(filled.position))
    qtbot.waitUntil(lambda: not panel.busy and panel._plain_wanted == (tuple(before), filled.position)
                    and "picked" in panel.plain_label.text(), timeout=20_000)
    with torch.no_grad():
        plain_then = process_logits(state.loaded.model(torch.tensor([before])).logits[0, filled.position]).model_probs
    p_then = process_logits(filled.logits).model_probs
    assert panel.plain_change == pytest.approx(
        float(torch.log(p_then[filled.token]) - torch.log(plain_then[filled.token])), abs=1e-4)
    error_watch.assert_clean()
