"""Text is encoded with the tokenizer's own special tokens, as `transformers`' tokenizer(text) adds them
([CLS] ... [SEP] for BERT and DistilBERT, <s> ... </s> for RoBERTa, nothing for GPT-2), from the
vocabulary files the app builds a tokenizer from and from a tokenizer.json saved by transformers;
the switch (Tokenizer.special_tokens, the CLI's --no-special-tokens) gives the bare ids; the
result says which special tokens were added, and where."""
from __future__ import annotations

import json

import numpy as np
import pytest

from desktop_app.core.inputs import encode
from desktop_app.core.tokenizer import load_tokenizer_folder, train_bpe

transformers = pytest.importorskip("transformers")

WORDS = ["the", "cat", "sat", "on", "mat", "un", "##known", "##s", "hello", "world", "!", ".", ","]
TEXTS = ["The cat sat on the mat.", "hello [MASK] world!", "unknowns, cats", "the [SEP] cat", ""]
BPE_TEXTS = ["The cat sat on the mat.", "hello <mask> world!", " leading space", "the </s> cat", ""]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def wordpiece_folder(folder, model_type: str):
    """vocab.txt (and config.json naming the family) as BERT and DistilBERT checkpoints ship them."""
    folder.mkdir(parents=True)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n",
                                      encoding="utf-8")
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    return folder


def bpe_folder(folder, model_type: str):
    """vocab.json + merges.txt (and config.json naming the family) as RoBERTa and GPT-2 ship them."""
    specials = ("<s>", "<pad>", "</s>", "<unk>", "<mask>") if model_type == "roberta" else ("<|endoftext|>",)
    trained = train_bpe(["the cat sat on the mat. hello world! " * 5] * 10, vocab_size=300, specials=specials)
    folder.mkdir(parents=True)
    trained.tok.model.save(str(folder))
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    return folder


FOLDERS = {"bert": (wordpiece_folder, TEXTS), "distilbert": (wordpiece_folder, TEXTS),
           "roberta": (bpe_folder, BPE_TEXTS), "gpt2": (bpe_folder, BPE_TEXTS)}
ADDED = {"bert": ("[CLS]", "[SEP]"), "distilbert": ("[CLS]", "[SEP]"), "roberta": ("<s>", "</s>"), "gpt2": None}


def _check_against(reference, tokenizer, texts, family):
    for text in texts:
        with_specials = encode(tokenizer, text)
        assert with_specials.ids == reference(text)["input_ids"], (family, text)
        bare = encode(tokenizer, text, special_tokens=False)
        assert bare.ids == reference(text, add_special_tokens=False)["input_ids"], (family, text)
        assert bare.specials == [] and bare.specials_text() == ""
        first_last = ADDED[family]
        if first_last is None:  # GPT-2 adds nothing
            assert with_specials.ids == bare.ids and with_specials.specials == []
            continue
        n = len(with_specials.ids)
        assert with_specials.ids[1:-1] == bare.ids
        assert with_specials.specials == [(0, first_last[0]), (n - 1, first_last[1])], (family, text)
        assert with_specials.specials_text() == f"{first_last[0]} (start), {first_last[1]} (end)"
        assert with_specials.specials_source == "the tokenizer's post-processor"


@pytest.mark.parametrize("family", sorted(FOLDERS))
def test_vocabulary_files_get_the_special_tokens_transformers_adds(tmp_path, family):
    make, texts = FOLDERS[family]
    folder = make(tmp_path / family, family)
    reference = transformers.AutoTokenizer.from_pretrained(str(folder))
    _check_against(reference, load_tokenizer_folder(folder), texts, family)


@pytest.mark.parametrize("family", sorted(FOLDERS))
def test_tokenizer_json_saved_by_transformers_gets_its_post_processor(tmp_path, family):
    make, texts = FOLDERS[family]
    reference = transformers.AutoTokenizer.from_pretrained(str(make(tmp_path / "files", family)))
    reference.save_pretrained(str(tmp_path / "saved"))
    assert (tmp_path / "saved" / "tokenizer.json").is_file()
    tokenizer = load_tokenizer_folder(tmp_path / "saved")
    assert tokenizer.source == tmp_path / "saved" / "tokenizer.json"
    _check_against(transformers.AutoTokenizer.from_pretrained(str(tmp_path / "saved")), tokenizer, texts, family)


def test_the_switch_on_the_tokenizer_decides_for_every_caller(tmp_path):
    tokenizer = load_tokenizer_folder(wordpiece_folder(tmp_path / "bert", "bert"))
    cls, sep = tokenizer.special_id("cls"), tokenizer.special_id("sep")
    bare = tokenizer.encode("the cat")
    assert encode(tokenizer, "the cat").ids == [cls, *bare, sep]
    tokenizer.special_tokens = False
    assert encode(tokenizer, "the cat").ids == bare and encode(tokenizer, "the cat").specials == []
    assert encode(tokenizer, "the cat", special_tokens=True).ids == [cls, *bare, sep]  # asked for explicitly


def test_text_cut_at_the_context_keeps_the_closing_special_token(tmp_path):
    tokenizer = load_tokenizer_folder(wordpiece_folder(tmp_path / "bert", "bert"))
    cls, sep = tokenizer.special_id("cls"), tokenizer.special_id("sep")
    bare = tokenizer.encode("the cat sat on the mat")
    out = encode(tokenizer, "the cat sat on the mat", context_length=4)
    assert out.ids == [cls, *bare[:2], sep] and out.total == len(bare) + 2
    assert out.specials == [(0, "[CLS]"), (3, "[SEP]")]
    assert "only the first 4" in out.notice and "[SEP] kept at the end" in out.notice
    with pytest.raises(ValueError, match="exceed the model's context length 4"):
        encode(tokenizer, "the cat sat on the mat", context_length=4, cut=False)


def test_tokenizer_padding_and_truncation_still_never_apply(tmp_path):
    reference = transformers.AutoTokenizer.from_pretrained(str(wordpiece_folder(tmp_path / "files", "bert")))
    reference.save_pretrained(str(tmp_path / "saved"))
    path = tmp_path / "saved" / "tokenizer.json"
    data = json.loads(path.read_text())
    data["padding"] = {"strategy": {"Fixed": 16}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                       "pad_type_id": 0, "pad_token": "[PAD]"}
    data["truncation"] = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
    path.write_text(json.dumps(data))
    out = encode(load_tokenizer_folder(tmp_path / "saved"), "the cat sat on the mat")
    assert out.ids == reference("the cat sat on the mat")["input_ids"] and len(out.ids) == 8


# -- the CLI: --no-special-tokens --------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_model(tmp_path_factory):
    """A small BERT with an MLM head and a vocab.txt, saved by transformers."""
    import torch

    folder = wordpiece_folder(tmp_path_factory.mktemp("bert") / "bert", "bert")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=5 + len(WORDS), hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64, max_position_embeddings=32)
    transformers.BertForMaskedLM(cfg).save_pretrained(folder)
    return folder


def test_cli_trace_adds_the_special_tokens_unless_told_not_to(bert_model, tmp_path):
    from desktop_app.cli import main

    reference = transformers.AutoTokenizer.from_pretrained(str(bert_model))
    text = "the cat sat on the mat."
    assert main(["trace", str(bert_model), "--text", text, "--out", str(tmp_path / "with.npz")]) == 0
    assert main(["trace", str(bert_model), "--text", text, "--no-special-tokens",
                 "--out", str(tmp_path / "bare.npz")]) == 0
    assert np.load(tmp_path / "with.npz")["tokens"].tolist() == reference(text)["input_ids"]
    assert np.load(tmp_path / "bare.npz")["tokens"].tolist() == reference(text, add_special_tokens=False)["input_ids"]


def test_cli_generate_fills_the_mask_between_the_special_tokens(bert_model, capsys):
    from desktop_app.cli import main

    reference = transformers.AutoTokenizer.from_pretrained(str(bert_model))
    prompt = "the cat [MASK] on the mat."
    for extra, ids in (([], reference(prompt)["input_ids"]),
                       (["--no-special-tokens"], reference(prompt, add_special_tokens=False)["input_ids"])):
        capsys.readouterr()
        assert main(["generate", str(bert_model), "--prompt", prompt, "--json", *extra]) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        filled = out["ids"]
        assert len(filled) == len(ids)
        mask = ids.index(reference.mask_token_id)
        assert [f for i, f in enumerate(filled) if i != mask] == [t for i, t in enumerate(ids) if i != mask]
        assert filled[mask] != reference.mask_token_id
