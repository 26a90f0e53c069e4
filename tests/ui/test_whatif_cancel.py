"""look15: What if's attribution and steering vector had no Cancel (called short jobs): on a GPT-2-small-shaped
(124M) model on CPU an attribution took 3 s at 64 tokens and 18 s at 1,024, a steering vector 1-11 s. Both now
have the patching's Cancel button and Esc key; a cancel lands after the block the forward is in (on_layer), and
nothing of the cancelled job is shown or applied."""
from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt

from .test_walk2_panels import _press
from .walkthrough import click_panel_tab, click_tab, open_window


@pytest.fixture
def held_forwards():
    """hold(model): every forward a worker thread makes waits in its first block until release() (the job is
    really busy while Esc is pressed); `entered` is set once one waits. Each hold() a new gate."""
    ui = threading.get_ident()
    gates, handles = [], []
    entered = threading.Event()

    def hold(model):
        gate = threading.Event()
        gates.append(gate)
        entered.clear()

        def wait(module, args) -> None:  # (returns None: a pre-hook's return value would replace the args)
            if threading.get_ident() != ui:
                entered.set()
                gate.wait(20)
        handles.append(model.blocks[0].register_forward_pre_hook(wait))

    def release():
        for h in handles:
            h.remove()
        handles.clear()
        for g in gates:
            g.set()

    hold.entered, hold.release = entered, release
    yield hold
    release()


def test_esc_cancels_the_attribution_and_the_steering_vector(qtbot, model_dirs, isolated_user_files, held_forwards):
    window, state = open_window(qtbot, model_dirs["demo"], text="Alice was beginning to get very tired")
    panel = click_panel_tab(qtbot, window, "What if")
    qtbot.waitUntil(lambda: panel.dla_chart.attribution is not None and not panel._dla_running(), timeout=20_000)
    shown = panel.dla_chart.attribution
    assert not panel.dla_cancel_button.isEnabled()

    held_forwards(state.loaded.model)
    panel.token_edit.setText("#5")
    qtbot.mouseClick(panel.attribute_button, Qt.MouseButton.LeftButton)
    assert held_forwards.entered.wait(20) and panel.dla_cancel_button.isEnabled()
    _press(qtbot, window, Qt.Key.Key_Escape)
    held_forwards.release()
    qtbot.waitUntil(lambda: panel.dla_status.text() == "Attribution cancelled.", timeout=20_000)
    qtbot.waitUntil(lambda: not panel.dla_cancel_button.isEnabled(), timeout=20_000)
    assert panel.dla_chart.attribution is shown  # (the bars before: not token #5's)

    steer = click_tab(qtbot, panel.tabs, "Steer")
    qtbot.waitUntil(steer.isVisible)
    panel.towards_edit.setText("Alice was")
    panel.away_edit.setText("very tired")
    held_forwards(state.loaded.model)
    qtbot.mouseClick(panel.apply_steer_button, Qt.MouseButton.LeftButton)
    assert held_forwards.entered.wait(20) and panel.steer_cancel_button.isEnabled()
    _press(qtbot, window, Qt.Key.Key_Escape)
    held_forwards.release()
    qtbot.waitUntil(lambda: panel.steer_status.text() == "Steering vector cancelled: nothing applied.", timeout=20_000)
    qtbot.waitUntil(lambda: not panel.steer_cancel_button.isEnabled(), timeout=20_000)
    assert not state.interventions


@pytest.mark.parametrize("which", ["attribution", "steering vector"])
def test_a_cancel_lands_after_the_block_the_forward_is_in(which):
    """The check is the forward's on_layer: a job cancelled while block 0 runs stops before block 1."""
    from desktop_app.app.whatif import attribute_ids
    from desktop_app.core.interventions import steering_vector
    from desktop_app.core.jobs import Cancelled, JobControl
    from tiny_models import tiny_model

    loaded = tiny_model("abcdefgh ", "gpt2", n_layers=4)
    job, ran = JobControl(), []
    for l, block in enumerate(loaded.model.blocks):
        block.register_forward_pre_hook(lambda m, a, l=l: ran.append(l) or (job.cancel() if l == 0 else None))
    ids = loaded.tokenizer.encode("abc abc")
    with pytest.raises(Cancelled):
        if which == "attribution":
            attribute_ids(loaded, ids, len(ids) - 1, 1, [], job=job)
        else:
            steering_vector(loaded.model, ids, ids[:3], 2, job=job)
    assert ran == [0]
