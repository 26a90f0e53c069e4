"""Lipschitz and Layers on encoder-decoders (issue 28), clicked: the Lipschitz panel's Stack (encoder,
decoder or cross-attention with the encoder's output fixed) runs a sweep with the core's numbers; the
Layers panel shows either stack's residual stream (the decoder's cross-attention as its own stage) and the
decoder's logit lens."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from desktop_app.core import lipschitz as lip

from .test_seq2seq_whatif_lab import _folder, _pick, _window
from .walkthrough import click_panel_tab, type_into

TARGET = "le chien noir voit une vache blanche"


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    return _folder(tmp_path_factory, "marian")


@pytest.fixture
def window(qtbot, marian_dir, isolated_user_files, error_watch):
    win, state = _window(qtbot, marian_dir, error_watch)  # source SOURCE, target "le chien noir voit"
    yield win, state
    win.close()


def _run(qtbot, panel):
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.is_running() and panel.run_button.isEnabled(), timeout=60_000)


@pytest.mark.parametrize("stack", ["cross", "encoder"])
def test_the_lipschitz_panel_measures_the_stack_chosen(qtbot, window, stack):
    win, state = window
    panel = click_panel_tab(qtbot, win, "Lipschitz")
    qtbot.waitUntil(panel.isVisible, timeout=10_000)
    assert panel.isEnabled() and panel.stack.isVisible()
    label = {"cross": "Cross-attention (encoder output fixed)", "encoder": "Encoder self-attention"}[stack]
    _pick(qtbot, panel.stack, label)
    assert panel.masked.isChecked() is False and panel.masked.isEnabled() == (stack != "cross")
    type_into(qtbot, panel.layer, "1")
    type_into(qtbot, panel.lengths, "2,4")
    type_into(qtbot, panel.samples, "2")
    _run(qtbot, panel)
    assert panel.table.rowCount() == 4, panel.status.text()
    run = panel.runs[-1]
    assert run.label.startswith(f"m {stack} L1 real")
    model = state.loaded.model
    windows = state.decoder_ids if stack == "cross" else state.token_ids
    X = lip.real_inputs(model, windows, 1, 4, 2, lip.window_starts(len(windows), 4, 2), stack=stack,
                        source_ids=state.token_ids)
    fmap = lip.layer_map(model, 1, stack=stack, source_ids=state.token_ids)
    exact = lip.exact_jacobian_norm(fmap, X.to(fmap.W_Q.dtype)).numpy()
    shown = [float(panel.table.item(r, 3).text()) for r in range(2, 4)]
    np.testing.assert_allclose(shown, exact, rtol=1e-4)
    # the form remembers the stack
    assert panel.view_state.stack == stack


def test_the_decoder_stack_reads_windows_of_the_target_and_says_when_it_is_short(qtbot, window):
    win, state = window
    panel = click_panel_tab(qtbot, win, "Lipschitz")
    _pick(qtbot, panel.stack, "Decoder self-attention (causal)")
    assert panel.masked.isChecked()
    assert panel.layer.maximum() == state.loaded.config.n_decoder_layers - 1
    type_into(qtbot, panel.lengths, "2,4,16")
    type_into(qtbot, panel.samples, "1")
    _run(qtbot, panel)
    assert panel.table.rowCount() == 2
    assert "skipped n = 16" in panel.status.text() and "target" in panel.status.text()
