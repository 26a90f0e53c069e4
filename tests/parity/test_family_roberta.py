"""RoBERTa against transformers: parity (with and without the MLM head), mask filling, <mask> found."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from family_cases.roberta import VOCAB, config  # noqa: E402
from family_parity import check_family  # noqa: E402

from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.core.generation import GenerationSettings, MaskedFillSession  # noqa: E402

def test_roberta_mlm(tmp_path):
    loaded = check_family(lambda: transformers.RobertaForMaskedLM(config()), tmp_path)
    assert loaded.config.family == "roberta" and loaded.config.position_offset == 2
    assert loaded.config.context_length == 38  # 40 rows, the first pad + 1 = 2 never read


def test_roberta_base_model_without_head(tmp_path):
    loaded = check_family(lambda: transformers.RobertaModel(config(), add_pooling_layer=False), tmp_path)
    assert not loaded.config.lm_head


def test_roberta_other_pad_id_and_untied_decoder(tmp_path):
    loaded = check_family(lambda: transformers.RobertaForMaskedLM(config(pad_token_id=0, tie_word_embeddings=False)),
                          tmp_path)
    assert loaded.config.position_offset == 1
    assert loaded.model.lm_head.weight is not loaded.model.tok_embed.weight


def write_bpe_tokenizer(folder, vocab_tokens):
    """A byte-level BPE vocabulary as RoBERTa ships it (vocab.json + merges.txt), <mask> included."""
    vocab = {t: i for i, t in enumerate(vocab_tokens)}
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
         "mask_token": "<mask>"}), encoding="utf-8")


def test_mask_filling_proposes_transformers_top_token(tmp_path):
    torch.manual_seed(1)
    hf = transformers.RobertaForMaskedLM(config()).eval()
    hf.save_pretrained(tmp_path)
    letters = [chr(c) for c in range(ord("a"), ord("a") + VOCAB - 5)]
    write_bpe_tokenizer(tmp_path, ["<s>", "<pad>", "</s>", "<unk>", *letters, "<mask>"])
    loaded = load_model_folder(tmp_path)
    mask = loaded.tokenizer.mask_token_id
    assert mask == VOCAB - 1 and loaded.tokenizer.tok.id_to_token(mask) == "<mask>"
    assert loaded.tokenizer.encode("ab<mask>c") == [4, 5, mask, 6]  # typed "<mask>" is one token
    ids = [0, 10, 11, mask, 12, 13, mask, 2]
    session = MaskedFillSession(loaded, ids, [3, 6], settings=GenerationSettings(strategy="greedy"),
                                order="left-to-right")
    assert session.mask_token_id == mask
    for position in (3, 6):  # the second fill sees the first one's token, in both models
        with torch.no_grad():
            logits = hf(torch.tensor([session.ids()])).logits[0]
        step = session.step()
        assert step.position == position and step.token == int(logits[position].argmax())


def test_pad_tokens_inside_the_input_get_hugging_face_positions(tmp_path):
    """HF gives a pad token position padding_idx and does not count it for the tokens after it."""
    torch.manual_seed(2)
    hf = transformers.RobertaForMaskedLM(config()).eval()
    hf.save_pretrained(tmp_path)
    loaded = load_model_folder(tmp_path)
    ids = torch.tensor([[0, 5, 1, 1, 7, 8, 1, 9, 2], [5, 6, 7, 8, 9, 10, 11, 1, 1]])  # 1 = <pad>
    with torch.no_grad():
        ours, ref = loaded.model(ids).logits, hf(ids).logits
    assert (ours - ref).abs().max().item() < 1e-4
