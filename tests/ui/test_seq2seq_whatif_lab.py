"""What if on encoder-decoders (issue 28), clicked: the attribution of a decoder token over its self- and
cross-attention heads (a T5-style model; a post-norm Marian is refused in one line), the Ablate tab's
three kinds of head, and patching between two source texts with the Model panel's target."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PySide6.QtCore import Qt

from translate_models import save_translate_model

from .walkthrough import choose_item, click_panel_tab, click_tab, open_window, type_into

SOURCE = "the black dog sees a white cow"
TARGET = "le chien noir voit"


def _folder(tmp_path_factory, family: str, **extra):
    folder = tmp_path_factory.mktemp(family) / "m"
    save_translate_model(folder, family, d_model=16, n_layers=2, n_decoder_layers=2, n_heads=2, d_ff=32,
                         context_length=24, init_std=0.3, **extra)
    return folder


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    return _folder(tmp_path_factory, "t5", relative_buckets=8, relative_max_distance=12)


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    return _folder(tmp_path_factory, "marian")


def _window(qtbot, folder, watch):
    win, state = open_window(qtbot, folder, text=SOURCE, watch=watch)
    model_panel = click_panel_tab(qtbot, win, "Model")
    edit = model_panel.target_edit
    qtbot.mouseClick(edit.viewport(), Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(state.trace_changed, timeout=30_000):
        qtbot.keyClicks(edit, TARGET)
    qtbot.waitUntil(lambda: state._trace_job is None and state.target == TARGET, timeout=30_000)
    return win, state


def test_attribution_of_a_decoder_token_over_cross_attention_heads_then_ablating_one(qtbot, t5_dir,
                                                                                   isolated_user_files, error_watch):
    win, state = _window(qtbot, t5_dir, error_watch)
    try:
        panel = click_panel_tab(qtbot, win, "What if")
        qtbot.mouseClick(panel.attribute_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: panel.dla_chart.attribution is not None, timeout=30_000)
        att = panel.dla_chart.attribution
        cfg = state.loaded.config
        dec = state.decoder_ids
        assert len(dec) == 1 + len(TARGET.split()) and att.position == len(dec) - 1  # "last": the decoder's
        logits = state.trace["logits"][0, -1]
        assert att.token_id == int(logits.argmax())
        assert att.logit == pytest.approx(float(logits[att.token_id]), abs=1e-4)
        assert abs(att.sum - att.logit) < 1e-4
        assert att.cross_table.shape == (cfg.n_decoder_layers, cfg.n_heads)
        assert "L1xH1" in panel.dla_chart.labels and "L1H1" in panel.dla_chart.labels
        assert "at decoder position" in panel.dla_chart.plot_item.titleLabel.text
        before = att.cross_table.copy()
        assert abs(before[0, 1]) > 1e-6

        # the Ablate tab: zero cross-attention head 1 of layer 0
        click_tab(qtbot, panel.tabs, "Ablate")
        choose_item(qtbot, panel.ablate_kind, "Cross-attention head")
        type_into(qtbot, panel.ablate_layer, "0")
        type_into(qtbot, panel.ablate_head, "1")
        with qtbot.waitSignal(state.trace_changed, timeout=30_000):
            qtbot.mouseClick(panel.ablate_button, Qt.MouseButton.LeftButton)
        assert [iv.target for iv in state.interventions] == ["decoder.blocks.0.cross_attn.head.1"]
        z = state.trace["decoder.blocks.0.cross_attn.z"][0]
        assert torch.equal(z[1], torch.zeros_like(z[1])) and z[0].abs().max() > 0
        # the attribution follows the edited model: that head now adds nothing, and the bars still sum
        qtbot.waitUntil(lambda: panel.dla_chart.attribution is not None
                        and panel.dla_chart.attribution is not att, timeout=30_000)
        edited = panel.dla_chart.attribution
        assert edited.cross_table[0, 1] == 0.0 and abs(edited.sum - edited.logit) < 1e-4
        assert "edits: " in panel.dla_status.text()
    finally:
        win.close()


def test_a_post_norm_model_refuses_attribution_and_patches_two_sources(qtbot, marian_dir, isolated_user_files,
                                                                       error_watch):
    win, state = _window(qtbot, marian_dir, error_watch)
    try:
        panel = click_panel_tab(qtbot, win, "What if")
        assert not panel.attribute_button.isEnabled() and "post-norm" in panel.dla_status.text()
        assert not panel.apply_steer_button.isEnabled() and "encoder-decoder" in panel.steer_status.text()
        # the Ablate tab lists the three kinds of head and both stacks' MLPs
        kinds = [panel.ablate_kind.itemText(i) for i in range(panel.ablate_kind.count())]
        assert {"Encoder self-attention head", "Decoder self-attention head", "Cross-attention head",
                "Encoder MLP", "Decoder MLP"} <= set(kinds)
        click_tab(qtbot, panel.tabs, "Activation patching")
        type_into(qtbot, panel.clean_edit, SOURCE)
        type_into(qtbot, panel.corrupted_edit, "the black cat sees a white cow")
        type_into(qtbot, panel.answer_edit, "chien")
        type_into(qtbot, panel.wrong_edit, "chat")
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: panel.patching is not None, timeout=60_000)
        res = panel.patching
        tok = state.loaded.tokenizer
        S = len(tok.encode(SOURCE))
        assert res.resid.shape == (3, S)  # the encoder's embedding and its two layers, at each source position
        # the sources differ at one word: copying its embedding restores the clean answer, the others nothing
        diff = [i for i, (a, b) in enumerate(zip(tok.encode(SOURCE), tok.encode("the black cat sees a white cow")))
                if a != b]
        assert len(diff) == 1
        assert res.resid[0, diff[0]] == pytest.approx(1.0, abs=1e-5)
        assert np.abs(np.delete(res.resid[0], diff[0])).max() < 1e-5
        assert panel.heads_map.row_labels == ["enc L0", "enc L1", "dec L0", "dec L1", "cross L0", "cross L1"]
        assert "the encoder's residual stream" in panel.resid_map.plot.titleLabel.text
    finally:
        win.close()


def test_the_ablate_tab_on_a_one_stack_model_zeros_an_mlp(qtbot, model_dirs, isolated_user_files, error_watch):
    win, state = open_window(qtbot, model_dirs["llama"], text="Alice and the rabbit hole.", watch=error_watch)
    try:
        panel = click_panel_tab(qtbot, win, "What if")
        click_tab(qtbot, panel.tabs, "Ablate")
        assert [panel.ablate_kind.itemText(i) for i in range(panel.ablate_kind.count())] == [
            "Attention head", "MLP", "Attention layer"]
        choose_item(qtbot, panel.ablate_kind, "MLP")
        assert not panel.ablate_head.isEnabled()
        type_into(qtbot, panel.ablate_layer, "1")
        with qtbot.waitSignal(state.trace_changed, timeout=30_000):
            qtbot.mouseClick(panel.ablate_button, Qt.MouseButton.LeftButton)
        assert [iv.target for iv in state.interventions] == ["blocks.1.mlp.out"]
        assert float(state.trace["blocks.1.mlp.out"].abs().max()) == 0.0
        # the same edit again is said, not added twice
        qtbot.mouseClick(panel.ablate_button, Qt.MouseButton.LeftButton)
        assert len(state.interventions) == 1 and "already applied" in panel.ablate_status.text()
        error_watch.assert_clean()
    finally:
        win.close()


def test_an_applied_line_goes_with_its_edit(qtbot, model_dirs, isolated_user_files, error_watch):
    """Issue 41: What if > Ablate still said "Applied zero blocks.0.attn.head.1" after Clear all and two model
    changes; the line now goes when its edit does (Clear all, its x, or a model it does not fit)."""
    win, state = open_window(qtbot, model_dirs["llama"], text="Alice and the rabbit hole.", watch=error_watch)
    try:
        panel = click_panel_tab(qtbot, win, "What if")
        click_tab(qtbot, panel.tabs, "Ablate")
        choose_item(qtbot, panel.ablate_kind, "MLP")
        type_into(qtbot, panel.ablate_layer, "1")
        with qtbot.waitSignal(state.trace_changed, timeout=30_000):
            qtbot.mouseClick(panel.ablate_button, Qt.MouseButton.LeftButton)
        assert panel.ablate_status.text().startswith("Applied ")
        with qtbot.waitSignal(state.interventions_changed, timeout=10_000):
            qtbot.mouseClick(win.intervention_strip.clear_button, Qt.MouseButton.LeftButton)
        assert state.interventions == [] and panel.ablate_status.text() == ""
        with qtbot.waitSignal(state.model_changed, timeout=30_000):
            win.open_model(model_dirs["demo"])
        assert panel.ablate_status.text() == ""
        error_watch.assert_clean()
    finally:
        win.close()
