"""Ablating from the Attention panel: the right-click menu on a head's thumbnail and the Ablate
button, the strip of active edits at the top of the window (remove one, clear all), and the
Generate panel's next-token distribution with and without the edits.

The context menu is opened through the model view's customContextMenuRequested signal at the
real position of the head's thumbnail (a right-click offscreen does not reliably deliver a
QContextMenuEvent), then its QAction is triggered through menu.actions()."""
from __future__ import annotations

import torch
from PySide6.QtCore import Qt

from .walkthrough import click_panel_tab, open_window


def _action(menu, *path):
    for text in path[:-1]:
        menu = next(a.menu() for a in menu.actions() if a.text() == text)
    return next(a for a in menu.actions() if a.text() == path[-1])


def _wait_traced(qtbot, state):
    qtbot.waitUntil(lambda: state._trace_job is None or state._trace_job.done, timeout=20_000)


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
    w.grab().save("/tmp/whatif_ablation_strip.png")

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
