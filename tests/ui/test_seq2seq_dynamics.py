"""The Dynamics panel on an encoder-decoder (issue 28), clicked: its Stack row picks the encoder's or the
decoder's self-attention; the model curves, the tokens and the head of a run are that stack's."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from desktop_app.app.dynamics import stack_layer_curves, stack_trace
from desktop_app.core import dynamics as dy

from .test_seq2seq_whatif_lab import _folder, _window
from .walkthrough import choose_item, click_panel_tab, type_into


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    return _folder(tmp_path_factory, "marian")


@pytest.fixture
def window(qtbot, marian_dir, isolated_user_files, error_watch):
    win, state = _window(qtbot, marian_dir, error_watch)  # a source and the target "le chien noir voit"
    yield win, state
    panel = win.slot("Dynamics").panel
    panel.play_button.setChecked(False)
    qtbot.waitUntil(lambda: not panel.is_running(), timeout=30_000)
    win.close()


def _curves_are(panel, expected: dy.LayerCurves) -> bool:
    c = panel._layer_curves
    return c is not None and c.radius == expected.radius


def test_the_stack_chosen_drives_the_curves_the_tokens_and_the_head(qtbot, window):
    win, state = window
    panel = click_panel_tab(qtbot, win, "Dynamics")
    qtbot.waitUntil(panel.isVisible, timeout=10_000)
    slot = win.slot("Dynamics")
    assert panel.isEnabled() and getattr(slot, "banner", None) is None  # no "not supported yet" line
    assert panel.stack.isVisible() and panel.stack.currentData() == "encoder"
    # the bottom row: the encoder's residual stream after each self-attention (the source's tokens)
    encoder_curves = stack_layer_curves(state.trace, "encoder", panel.cluster_tol.value())
    qtbot.waitUntil(lambda: _curves_are(panel, encoder_curves), timeout=30_000)
    np.testing.assert_allclose(panel.c_model_cos.getData()[1], encoder_curves.mean_cosine)

    choose_item(qtbot, panel.stack, "decoder self-attention (causal)")
    cfg = state.loaded.config
    assert panel.model_layer.maximum() == cfg.n_decoder_layers - 1
    assert panel.token_layer.maximum() == cfg.n_decoder_layers
    decoder_curves = stack_layer_curves(state.trace, "decoder", panel.cluster_tol.value())
    assert decoder_curves.radius != encoder_curves.radius
    qtbot.waitUntil(lambda: _curves_are(panel, decoder_curves), timeout=30_000)

    # the decoder's tokens after layer 0's self-attention, moved by decoder layer 1's head 1
    choose_item(qtbot, panel.init, "tokens of the current text")
    type_into(qtbot, panel.token_layer, "1")
    choose_item(qtbot, panel.qkv, "a head of the loaded model")
    type_into(qtbot, panel.model_layer, "1")
    type_into(qtbot, panel.model_head, "1")
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.sim is not None, timeout=30_000)
    sim = panel.sim
    assert sim.head.name == "decoder layer 1 head 1", panel.status.text()
    expected = dy.model_head(state.loaded.model, 1, 1, stack="decoder")
    np.testing.assert_allclose(sim.head.A.double().numpy(), expected.A.numpy(), rtol=1e-12)
    tokens = stack_trace(state.trace, "decoder")["blocks.0.resid_mid"][0].double().numpy()
    assert sim.config.n == len(state.decoder_ids) == tokens.shape[0]
    on_sphere = tokens / np.linalg.norm(tokens, axis=1, keepdims=True)  # "on the sphere" is checked by default
    np.testing.assert_allclose(sim.x0.double().numpy(), on_sphere, rtol=1e-6, atol=1e-9)
    qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(panel._frames) == 2, timeout=30_000)
    assert len(panel.screen_xy) == len(state.decoder_ids)  # the particles drawn
    assert panel.view_state.stack == "decoder"
