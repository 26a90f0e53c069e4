"""look16: the Features lens (each token's features, one forward of the model up to the dictionaries' last layer)
had no progress and no Cancel while it computed. It now has the other long jobs' JobControl: a progress bar ("layer
k / L" after each block, core.features.record_points) and a Cancel button shown while it runs, Esc clicks it; a
cancel lands after the block the forward is in and nothing of the cancelled lens is shown."""
from __future__ import annotations

import threading

from PySide6.QtCore import Qt

from .test_features_panel import _dictionary, _lens_shown, _open_from_menu
from .test_walk2_panels import _press
from .walkthrough import click_panel_tab, open_window


def test_the_lens_shows_its_progress_and_esc_cancels_it(qtbot, model_dirs, isolated_user_files, error_watch,
                                                        tmp_path, monkeypatch):
    window, state = open_window(qtbot, model_dirs["demo"], text="Alice was beginning to get very tired",
                                watch=error_watch)
    window.activateWindow()
    panel = click_panel_tab(qtbot, window, "Features")
    assert not panel.lens_cancel_button.isVisible() and not panel.lens_progress.isVisible()
    # a worker's forward waits before block 1 (after block 0 reported "layer 1 / 3") until released
    ui, gate, entered = threading.get_ident(), threading.Event(), threading.Event()

    def wait(module, args) -> None:
        if threading.get_ident() != ui:
            entered.set()
            gate.wait(20)
    handle = state.loaded.model.blocks[1].register_forward_pre_hook(wait)
    try:
        _open_from_menu(qtbot, window, state, monkeypatch, _dictionary(tmp_path / "sae"))  # blocks.2: 3 blocks run
        assert entered.wait(20)
        qtbot.waitUntil(lambda: panel.lens_progress.value() == 1, timeout=10_000)
        assert panel.lens_progress.isVisible() and panel.lens_progress.maximum() == 3
        assert "layer 1 / 3" in panel.status.text() and "Esc" in panel.status.text()
        assert panel.lens_cancel_button.isVisible() and panel.lens_cancel_button.isEnabled()
        _press(qtbot, window, Qt.Key.Key_Escape)
    finally:
        handle.remove()
        gate.set()
    qtbot.waitUntil(lambda: panel.status.text().startswith("Cancelled"), timeout=20_000)
    qtbot.waitUntil(lambda: not panel.lens_cancel_button.isVisible(), timeout=10_000)
    assert not panel.lens_progress.isVisible()
    assert panel.lens is None and panel.tokens_table.rowCount() == 0  # nothing of the cancelled lens

    # shown again: read again, to the end; the progress and Cancel go when it is done
    click_panel_tab(qtbot, window, "Model")
    click_panel_tab(qtbot, window, "Features")
    _lens_shown(qtbot, panel)
    qtbot.waitUntil(lambda: not panel.lens_cancel_button.isVisible(), timeout=10_000)
    assert not panel.lens_progress.isVisible()
    assert panel.tokens_table.rowCount() == len(state.token_ids)
    assert "variance explained" in panel.status.text()
    error_watch.assert_clean()


def test_the_lens_forward_stops_after_the_block_it_is_in_once_cancelled(tmp_path):
    """core.features.feature_activations with a job: "layer k / L" after each block of the L it runs, and a job
    cancelled during block 0 raises Cancelled before block 1 runs."""
    import pytest
    import torch

    from desktop_app.core.features import attach, feature_activations, load_dictionary
    from desktop_app.core.jobs import Cancelled, JobControl
    from tiny_models import tiny_model

    loaded = tiny_model("abcdefgh ", n_layers=4, d_model=128)
    a = attach(load_dictionary(_dictionary(tmp_path / "sae")), loaded.config)  # blocks.2: blocks 0..2 run
    seen = []
    job = JobControl(on_progress=lambda d, t, m: seen.append((d, t, m)))
    feature_activations(loaded.model, [1, 2, 3], [a], job=job)
    assert seen == [(0, 3, "layer 0 / 3"), (1, 3, "layer 1 / 3"), (2, 3, "layer 2 / 3"), (3, 3, "layer 3 / 3")]

    ran = []
    job = JobControl()
    loaded.model.blocks[0].register_forward_hook(lambda *_: job.cancel())
    for i, block in enumerate(loaded.model.blocks):
        block.register_forward_pre_hook(lambda *_, i=i: ran.append(i))
    with pytest.raises(Cancelled), torch.no_grad():
        feature_activations(loaded.model, [1, 2, 3], [a], job=job)
    assert ran == [0]
