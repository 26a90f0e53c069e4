"""Text, not ids: an encoder traced on a typed text gives the hidden states `transformers` gives on
tokenizer(text), special tokens included ([CLS] ... [SEP] for BERT, <s> ... </s> for RoBERTa), from
the vocabulary files the checkpoint ships."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.core.inputs import encode  # noqa: E402
from desktop_app.core.tokenizer import train_bpe  # noqa: E402

TOL = 1e-4
TEXT = "the cat sat on the mat."
WORDS = ["the", "cat", "sat", "on", "mat", "."]


def bert_folder(folder):
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    cfg = transformers.BertConfig(vocab_size=5 + len(WORDS), hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64, max_position_embeddings=32)
    transformers.BertForMaskedLM(cfg).save_pretrained(folder)
    return folder


def roberta_folder(folder):
    folder.mkdir()
    trained = train_bpe([TEXT * 10], vocab_size=270, specials=("<s>", "<pad>", "</s>", "<unk>", "<mask>"))
    trained.tok.model.save(str(folder))
    cfg = transformers.RobertaConfig(vocab_size=trained.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=40)
    transformers.RobertaForMaskedLM(cfg).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("make", [bert_folder, roberta_folder], ids=["bert", "roberta"])
def test_text_traced_with_special_tokens_matches_transformers(tmp_path, make, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    folder = make(tmp_path / "model")
    assert json.loads((folder / "config.json").read_text())["model_type"] in ("bert", "roberta")
    reference_tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    hf = transformers.AutoModelForMaskedLM.from_pretrained(str(folder)).eval()
    hf.config._attn_implementation = "eager"
    batch = reference_tok(TEXT, return_tensors="pt")

    loaded = load_model_folder(folder)
    enc = encode(loaded, TEXT)
    assert enc.ids == batch["input_ids"][0].tolist()
    assert [t for _, t in enc.specials] == [reference_tok.cls_token, reference_tok.sep_token]
    out, trace = loaded.model.run_with_trace(torch.tensor([enc.ids]))
    with torch.no_grad():
        ref = hf(**batch, output_hidden_states=True)
    hidden = trace.hidden_states()
    assert len(hidden) == len(ref.hidden_states)
    for i, (a, b) in enumerate(zip(hidden, ref.hidden_states)):
        assert (a - b).abs().max().item() < TOL, f"hidden state {i}"
    assert (out.logits - ref.logits).abs().max().item() < TOL
