"""The Generate panel on an encoder-decoder (issue 28), clicked: the box is the source; Step writes the
target from the decoder's start token; beside the bars, the step's cross-attention over the source
tokens (every head of a decoder layer and their mean, each row summing to 1); beam search gives
core.seq2seq.beam_decode's ids; a new source never shows the old source's steps."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PySide6.QtCore import Qt

from seq2seq_decode import beam_decode, greedy_decode
from tiny_models import tiny_model
from .walkthrough import show_generation_panel

TEXT = "the cat sat on the mat and the dog sat on the log. "
SPECIALS = ["<pad>", "[START]", "[END]"]


def _loaded():
    return tiny_model(TEXT, "marian", specials=SPECIALS, name="marian-test", n_decoder_layers=2, context_length=32,
                      init_std=0.3, pad_token_id=0, decoder_start_token_id=1, eos_token_id=2)


@pytest.fixture
def panel(qtbot):
    return show_generation_panel(qtbot, _loaded(), size=(1200, 700))


def _idle(qtbot, p):
    qtbot.waitUntil(lambda: not p.busy, timeout=15_000)
    qtbot.wait(10)


def _type_source(qtbot, p, text: str) -> None:
    p.prompt.selectAll()
    qtbot.keyClick(p.prompt, Qt.Key.Key_Delete)
    qtbot.keyClicks(p.prompt, text)


def _click_step(qtbot, p, depth: int) -> None:
    qtbot.mouseClick(p.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: p.session is not None and p.session.current.depth == depth, timeout=15_000)
    _idle(qtbot, p)


def _teacher_forced(p, src, tgt):
    """Decoder layer 0's cross-attention [H, T, S] of a plain teacher-forced forward."""
    with torch.no_grad():
        _, trace = p.state.loaded.model.run_with_trace(torch.tensor([src]), torch.tensor([tgt]),
                                                       names=("decoder.blocks.0.cross_attn.pattern",))
    return trace["decoder.blocks.0.cross_attn.pattern"][0]


def test_type_a_source_step_and_see_the_cross_attention_over_its_tokens(qtbot, panel):
    p = panel
    assert p.prompt_label.isVisible() and p.prompt_label.text() == "<b>Source</b>" and p.cross_view.isVisible()
    _type_source(qtbot, p, "the cat sat")
    for depth in (1, 2, 3):
        _click_step(qtbot, p, depth)
    s = p.session
    tok = p.state.loaded.tokenizer
    src = tok.encode("the cat sat")
    assert s.source == src and s.ids()[0] == 1  # the target starts at the decoder's start token
    assert s.ids()[1:] == greedy_decode(p.state.loaded.model, src, 3)
    assert p.strip.canvas.strings[0] == "[START]" and len(p.strip.canvas.strings) == 4
    hm = p.cross_view.heatmap
    assert hm.col_labels == [tok.tok.id_to_token(i) for i in src]  # S cells labelled with the source tokens
    assert hm.row_labels == ["head 0", "head 1", "head 2", "head 3", "mean"]
    assert hm.values.shape == (5, len(src))
    np.testing.assert_allclose(hm.values.sum(1), 1.0, atol=1e-5)  # each head reads a distribution
    # what is shown is the last layer's cross-attention of the step in the bars (the next token's)
    with torch.no_grad():
        _, trace = p.state.loaded.model.run_with_trace(torch.tensor([src]), torch.tensor([s.ids()]),
                                                       names=("decoder.blocks.1.cross_attn.pattern",))
    want = trace["decoder.blocks.1.cross_attn.pattern"][0, :, -1].numpy()
    np.testing.assert_allclose(hm.values[:4], want, atol=1e-5)
    np.testing.assert_allclose(hm.values[4], want.mean(0), atol=1e-5)
    # another layer from the selector
    p.cross_view.layer.setCurrentIndex(0)
    want0 = p.session.cross_attention()[0].numpy()
    np.testing.assert_allclose(hm.values[:4], want0, atol=1e-6)
    # a generated token clicked in the strip: the bars and the cross-attention of the step that wrote it
    from desktop_app.ui.panels.attention import AttentionPanel

    attention = AttentionPanel(p.state)
    qtbot.addWidget(attention)
    attention.show()
    qtbot.mouseClick(p.strip.canvas, Qt.MouseButton.LeftButton, pos=p.strip.chip_center(2))
    _idle(qtbot, p)
    node = s.current.path()[2]
    assert p.selected_node is node and p.bars.chosen == node.token
    np.testing.assert_allclose(hm.values[:4], s.cross_attention(node.parent)[0].numpy(), atol=1e-6)
    assert "Step 2" in p.cross_view.caption.text()
    # ... and that step's trace in the Attention panel: the source, and what the decoder read to write it
    qtbot.waitUntil(lambda: p.state.trace_source == "generation", timeout=15_000)
    assert p.state.token_ids == src and p.state.decoder_ids == s.ids(node.parent) == [1, s.ids()[1]]
    combo = attention.kind_combo
    qtbot.waitUntil(combo.isVisible, timeout=10_000)
    combo.setCurrentIndex(combo.findData("cross"))
    attention.show_view("attention")
    qtbot.waitUntil(lambda: attention.heatmap.values.shape == (2, len(src)), timeout=15_000)
    np.testing.assert_allclose(attention.heatmap.values, _teacher_forced(p, src, s.ids(node.parent))[0].numpy(),
                               atol=1e-5)  # layer 0, head 0: the model's own
    assert attention.heatmap.col_labels == hm.col_labels


def test_beam_search_on_the_target_gives_beam_decodes_ids(qtbot, panel):
    p = panel
    _type_source(qtbot, p, "a dog on the log")
    p.strategy.setCurrentText("beam")
    p.beams.setValue(3)
    p.run_n.setValue(8)
    qtbot.mouseClick(p.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: p.session is not None and not p.busy and p.session.current.depth > 0, timeout=30_000)
    _idle(qtbot, p)
    s = p.session
    src = p.state.loaded.tokenizer.encode("a dog on the log")
    assert s.ids()[1:] == beam_decode(p.state.loaded.model, src, 8, 3, eos_id=2)
    assert p.beam_table.rowCount() >= 3
    assert p.cross_view.heatmap.values.shape == (5, len(src))


def test_a_new_source_never_shows_the_old_sources_steps(qtbot, panel):
    p = panel
    _type_source(qtbot, p, "the cat")
    _click_step(qtbot, p, 1)
    _click_step(qtbot, p, 2)
    old = p.cross_view.heatmap.col_labels
    assert len(old) == len("the cat")
    qtbot.keyClicks(p.prompt, " sat on the mat")
    # the old steps are gone from the panel at once: no bars, no target, no cross-attention
    assert p.session is None and p.strip.canvas.strings == [] and p.cross_view.heatmap.values.size == 0
    assert p.bars.token_ids == []
    assert "source changed" in p.status.text()
    _click_step(qtbot, p, 1)
    src = p.state.loaded.tokenizer.encode("the cat sat on the mat")
    assert p.session.source == src and p.cross_view.heatmap.values.shape == (5, len(src))
    assert p.session.ids()[1:] == greedy_decode(p.state.loaded.model, src, 1)


def test_run_n_with_beams_ends_with_the_forced_end_token_as_generate_does(qtbot):
    """Issue 41: a Marian folder's generation_config forces the end token at the last of max_new_tokens;
    the CLI (core.generation.generate, as transformers' generate) writes it, Run N in the panel did not
    (its session had no length, so the file's max_length was used)."""
    import dataclasses

    from desktop_app.core.generation import GenerationSettings, generate
    from desktop_app.core.generation_rules import GenerationRules

    loaded = _loaded()
    loaded = dataclasses.replace(loaded, generation=GenerationRules(eos_ids=(2,), forced_eos_token_id=(2,),
                                                                    max_length=512))
    p = show_generation_panel(qtbot, loaded, size=(1200, 700))
    _type_source(qtbot, p, "a dog on the log")
    p.strategy.setCurrentText("beam")
    p.beams.setValue(3)
    p.run_n.setValue(4)
    qtbot.mouseClick(p.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: p.session is not None and not p.busy and p.session.current.depth > 0, timeout=30_000)
    _idle(qtbot, p)
    src = loaded.tokenizer.encode("a dog on the log")
    cli, _ = generate(loaded, src, 4, GenerationSettings("beam", beams=3))
    unforced = beam_decode(loaded.model, src, 4, 3, eos_id=2)
    assert unforced[-1] != 2  # without the rule these weights do not end there: the test can tell
    assert p.session.ids() == cli and cli[-1] == 2
