"""Lines that quote tokens show them as written, never as markup: BART's, RoBERTa's and Llama's <s> is an
HTML tag (strike-through) to a QLabel left to guess its format, so "Special tokens added: <s> (start), </s>
(end)" showed "(start)," struck through with the token gone, and a Generate step writing <s> lost it from
its status line and its cross-attention caption. A BART folder as transformers writes it (test-only)."""
from __future__ import annotations

import pytest
import torch
from PySide6.QtCore import Qt
from PySide6.QtGui import Qt as QtGui

from .walkthrough import click_panel_tab, open_window

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def bart_dir(tmp_path_factory):
    """A tiny random BART with a byte-level BPE tokenizer; final_logits_bias makes <s> (id 0) the decoder's
    first greedy token, as trained BART models write it."""
    folder = tmp_path_factory.mktemp("bart") / "m"
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(["the black dog runs over the bridge", "le chien noir court"] * 50, vocab_size=300,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    words = folder.parent / "bpe"
    words.mkdir()
    bpe.save_model(str(words))
    tok = transformers.BartTokenizer(vocab=str(words / "vocab.json"), merges=str(words / "merges.txt"))
    torch.manual_seed(0)
    hf = transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=len(tok), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32))
    with torch.no_grad():
        hf.final_logits_bias[0, 0] = 50.0
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _shows_markup(label) -> bool:
    """Whether the QLabel renders its text as rich text (Qt's rule for its text format)."""
    fmt = label.textFormat()
    return fmt == Qt.TextFormat.RichText or (fmt == Qt.TextFormat.AutoText and QtGui.mightBeRichText(label.text()))


def test_the_model_panels_special_tokens_line_shows_s(qtbot, bart_dir, isolated_user_files, error_watch):
    w, state = open_window(qtbot, bart_dir, text="the black dog", watch=error_watch)
    panel = click_panel_tab(qtbot, w, "Model")
    qtbot.waitUntil(lambda: "<s> (start)" in panel.special_label.text(), timeout=20_000)
    assert not _shows_markup(panel.special_label), panel.special_label.text()
    error_watch.assert_clean()
    w.close()


def test_a_generate_step_writing_s_names_it(qtbot, bart_dir, isolated_user_files, error_watch):
    w, state = open_window(qtbot, bart_dir, text="the black dog", watch=error_watch)
    panel = click_panel_tab(qtbot, w, "Generate")
    qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.session is not None and not panel.busy and "'<s>'" in panel.status.text(),
                    timeout=30_000)
    caption = panel.cross_view.caption
    labels = [panel.status, panel.dist_label, caption]
    assert not [label.text() for label in labels if _shows_markup(label)]
    error_watch.assert_clean()
    w.close()
