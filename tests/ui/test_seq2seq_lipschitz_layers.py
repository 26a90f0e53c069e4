"""Lipschitz and Layers on encoder-decoders (issue 28), clicked: the Lipschitz panel's Stack (encoder,
decoder or cross-attention with the encoder's output fixed) runs a sweep with the core's numbers; the
Layers panel shows either stack's residual stream (the decoder's cross-attention as its own stage) and the
decoder's logit lens."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from desktop_app.core import lipschitz as lip

from .test_seq2seq_whatif_lab import _folder, _window
from .walkthrough import choose_item, click_panel_tab, type_into

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
    label = {"cross": "Cross-attention", "encoder": "Encoder self-attention"}[stack]
    choose_item(qtbot, panel.stack, label)
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
    choose_item(qtbot, panel.stack, "Decoder self-attention")
    assert panel.masked.isChecked()
    assert panel.layer.maximum() == state.loaded.config.n_decoder_layers - 1
    type_into(qtbot, panel.lengths, "2,4,16")
    type_into(qtbot, panel.samples, "1")
    _run(qtbot, panel)
    assert panel.table.rowCount() == 2
    assert "skipped n = 16" in panel.status.text() and "target" in panel.status.text()


def test_the_layers_panel_shows_either_stack_with_the_decoders_cross_attention_as_a_stage(qtbot, window):
    win, state = window
    panel = click_panel_tab(qtbot, win, "Layers")
    qtbot.waitUntil(panel.isVisible, timeout=10_000)
    assert panel.isEnabled() and panel.stack.isVisible() and panel.stack.currentData() == "decoder"
    qtbot.waitUntil(lambda: panel.data is not None and len(panel.labels) == len(state.decoder_ids), timeout=30_000)
    res = panel.data.result
    assert res.depth_labels == ["embed", "L0 self", "L0 cross", "L0", "L1 self", "L1 cross", "L1"]
    trace = state.trace
    want = [trace["decoder.embed"]] + [trace[f"decoder.blocks.{l}.{n}"] for l in range(2)
                                       for n in ("resid_mid", "resid_cross", "resid_post")]
    np.testing.assert_allclose(res.resid_norms, np.stack([w[0].double().norm(dim=-1).numpy() for w in want]), rtol=1e-5)
    assert panel.labels == state.token_strings(state.decoder_ids)
    # components: each self-attention head, each cross-attention head, the MLP
    panel.show_view("component-norms")
    assert panel.component_map.col_labels == ["head 0", "head 1", "cross 0", "cross 1", "MLP"]
    cross = trace["decoder.blocks.1.cross_attn.head_out"][0, 1].double().norm(dim=-1).mean().item()
    assert panel.component_map.values[1, 3] == pytest.approx(cross, rel=1e-5)
    # the logit lens is the decoder's: its last layer's top token is the model's own prediction
    panel.show_view("logit-lens")  # (each view drawn when shown)
    lens = panel.lens_view.lens
    assert lens.tokens == panel.labels and lens.ids.shape == (2, len(state.decoder_ids))
    np.testing.assert_array_equal(lens.ids[-1], trace["logits"][0].argmax(-1).numpy())

    # the encoder: the source's tokens, one depth per block, no logit lens (said in the status)
    choose_item(qtbot, panel.stack, "Encoder")
    qtbot.waitUntil(lambda: panel.data is not None and panel.data.result.depth_labels == ["embed", "L0", "L1"]
                    and len(panel.labels) == len(state.token_ids), timeout=30_000)
    enc = [trace["encoder.embed"]] + [trace[f"encoder.blocks.{l}.resid_post"] for l in range(2)]
    np.testing.assert_allclose(panel.data.result.resid_norms,
                               np.stack([w[0].double().norm(dim=-1).numpy() for w in enc]), rtol=1e-5)
    assert "no logit lens" in panel.status.text() and "Decoder stack" in panel.status.text()
    assert panel.view_state.stack == "encoder"


def test_a_t5_with_no_target_opens_the_layers_panel_on_the_encoder_and_says_so(qtbot, tmp_path_factory,
                                                                             isolated_user_files, error_watch):
    """Layers opened on the Decoder stack, which with no target typed is [START] alone (one token): it opens on
    the stack that holds the input, the encoder, and says why; a typed target brings the decoder; a stack picked by
    the person is kept."""
    from .test_seq2seq_whatif_lab import SOURCE, _folder
    from .walkthrough import open_window

    win, state = open_window(qtbot, _folder(tmp_path_factory, "t5", relative_buckets=8, relative_max_distance=12),
                             text=SOURCE, watch=error_watch)
    assert state.target == "" and len(state.decoder_ids) == 1
    panel = click_panel_tab(qtbot, win, "Layers")
    qtbot.waitUntil(lambda: panel.data is not None, timeout=30_000)
    assert panel.stack.isVisible() and panel.stack.currentText() == "Encoder"
    assert panel.labels == state.token_strings(state.token_ids) and len(panel.labels) > 1  # the source's tokens
    assert "encoder shown: no target typed" in panel.status.text()
    assert panel.resid_map.values.shape[0] == len(state.token_ids)

    model_panel = click_panel_tab(qtbot, win, "Model")  # a target typed: the decoder's stream has it
    qtbot.mouseClick(model_panel.target_edit.viewport(), Qt.MouseButton.LeftButton)
    qtbot.keyClicks(model_panel.target_edit, "le chien")
    qtbot.waitUntil(lambda: state._trace_job is None and state.target == "le chien", timeout=30_000)
    click_panel_tab(qtbot, win, "Layers")
    qtbot.waitUntil(lambda: panel.data is not None and len(panel.labels) == len(state.decoder_ids) > 1,
                    timeout=30_000)
    assert panel.stack.currentText() == "Decoder" and "encoder shown" not in panel.status.text()

    choose_item(qtbot, panel.stack, "Encoder")  # the person's pick is kept when the target changes
    model_panel = click_panel_tab(qtbot, win, "Model")
    qtbot.mouseClick(model_panel.target_edit.viewport(), Qt.MouseButton.LeftButton)
    qtbot.keyClicks(model_panel.target_edit, " noir")
    qtbot.waitUntil(lambda: state._trace_job is None and state.target == "le chien noir", timeout=30_000)
    click_panel_tab(qtbot, win, "Layers")
    qtbot.waitUntil(lambda: panel.data is not None and len(panel.labels) == len(state.token_ids), timeout=30_000)
    assert panel.stack.currentText() == "Encoder" and "encoder shown" not in panel.status.text()
    win.close()
