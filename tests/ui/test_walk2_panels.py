"""What a person sees walking through the Generate, Attention, What if, Graph and Dynamics panels (walk2)."""
from __future__ import annotations

import threading

from PySide6.QtCore import Qt

from .walkthrough import click_panel_tab, open_window


def test_generate_says_nothing_is_computing_once_another_model_drops_the_plain_models_job(
        qtbot, model_dirs, isolated_user_files, monkeypatch):
    """With edits, the bars' 'model as trained' column is computed in a job; opening another model while it
    ran dropped its result and left 'computing the model as trained…' on screen for good (and
    screenshot_ready, which read that label, False for good)."""
    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.core.interventions import Intervention
    from desktop_app.ui.panels import generation

    release, started = threading.Event(), threading.Event()
    plain_logits_at = generation.plain_logits_at

    def held(*args):
        started.set()
        release.wait(30)
        return plain_logits_at(*args)

    monkeypatch.setattr(generation, "plain_logits_at", held)
    w, state = open_window(qtbot, model_dirs["llama"], name="llama")
    panel = click_panel_tab(qtbot, w, "Generate")
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        state.set_interventions([Intervention("blocks.1.attn.head.2")])
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=20_000)
    qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: started.is_set() and panel.session is not None and not panel.busy, timeout=20_000)
    assert panel.plain_box.isVisible() and panel.plain_label.text() == generation.PLAIN_COMPUTING
    assert not panel.screenshot_ready()
    state.set_model(load_model_folder(model_dirs["demo"]))  # (the job holds the one worker thread meanwhile)
    release.set()
    qtbot.waitUntil(panel.screenshot_ready, timeout=20_000)
    assert not panel.plain_box.isVisible() and panel.session is None
