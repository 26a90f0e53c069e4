"""DistilBERT against transformers: parity (with and without the MLM head, learned and sinusoidal
positions), mask filling against transformers' logits, [MASK] found in a vocab.txt folder."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from family_cases.distilbert import VOCAB, config  # noqa: E402
from family_parity import check_family  # noqa: E402

from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.core.generation import GenerationSettings, MaskedFillSession  # noqa: E402

def test_distilbert_mlm(tmp_path):
    loaded = check_family(lambda: transformers.DistilBertForMaskedLM(config()), tmp_path)
    assert loaded.config.family == "distilbert" and loaded.config.type_vocab_size == 0


def test_distilbert_base_model_relu(tmp_path):
    loaded = check_family(lambda: transformers.DistilBertModel(config(activation="relu")), tmp_path)
    assert not loaded.config.lm_head and loaded.config.activation == "relu"


def test_distilbert_sinusoidal_positions(tmp_path):
    loaded = check_family(lambda: transformers.DistilBertForMaskedLM(config(sinusoidal_pos_embds=True)), tmp_path,
                          seq_len=38)
    assert loaded.config.positions == "sinusoidal"


def test_mask_filling_proposes_transformers_top_token(tmp_path):
    torch.manual_seed(1)
    hf = transformers.DistilBertForMaskedLM(config()).eval()
    hf.save_pretrained(tmp_path)
    words = [f"w{i}" for i in range(VOCAB - 5)]
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n",
                                        encoding="utf-8")
    loaded = load_model_folder(tmp_path)
    mask = loaded.tokenizer.mask_token_id
    assert mask == 4
    assert loaded.tokenizer.encode("w1 [MASK] w2") == [6, mask, 7]  # typed "[MASK]" is one token
    ids = [2, 10, 11, mask, 12, mask, 13, 3]
    session = MaskedFillSession(loaded, ids, [3, 5], settings=GenerationSettings(strategy="greedy"),
                                order="left-to-right")
    for position in (3, 5):  # the second fill sees the first one's token, in both models
        with torch.no_grad():
            logits = hf(torch.tensor([session.ids()])).logits[0]
        step = session.step()
        assert step.position == position and step.token == int(logits[position].argmax())
