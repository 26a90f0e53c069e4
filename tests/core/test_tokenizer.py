from __future__ import annotations

import json

from desktop_app.core.tokenizer import Tokenizer, char_tokenizer, train_bpe

CORPUS = ["chat"] * 5 + ["chats"] * 3 + ["chien"] * 2 + ["patte"] * 5  # SOURCES.md worked example


def test_bpe_worked_example_from_the_lectures():
    # byte-level BPE starts from the 256 bytes + 1 special token; two more tokens = two merges
    tok = train_bpe(CORPUS, vocab_size=256 + 1 + 2)
    merges = json.loads(tok.to_str())["model"]["merges"]
    as_pairs = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]
    assert as_pairs == [("a", "t"), ("c", "h")]
    assert sum(len(c) for c in CORPUS) == 70
    assert sum(len(tok.encode(w)) for w in CORPUS) == 47


def test_char_tokenizer_round_trip_and_specials():
    tok = char_tokenizer("hello world", specials=("[PAD]", "[MASK]"))
    ids = tok.encode("hello")
    assert len(ids) == 5 and tok.decode(ids) == "hello"
    assert tok.mask_token_id == 1 and tok.special_id("pad") == 0
    assert tok.token_strings(tok.encode("lo w")) == ["l", "o", " ", "w"]
    assert tok.vocab_size == 2 + len(set("hello world"))


def test_tokenizer_json_round_trip(tmp_path):
    tok = train_bpe(["the cat sat on the mat"] * 20, vocab_size=270)
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    again = Tokenizer.from_file(path)
    text = "the mat sat"
    assert again.encode(text) == tok.encode(text)
    assert again.decode(again.encode(text)) == text


def _shipped_bert_tokenizer():
    """The walkthrough's WordPiece tokenizer, which ships "Fixed 128" padding and truncation at 128."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "ui" / "walkthrough.py"
    spec = importlib.util.spec_from_file_location("walkthrough_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.bert_wordpiece_tokenizer()


def test_shipped_padding_and_truncation_never_apply_to_analysis_text(tmp_path):
    path = tmp_path / "tokenizer.json"
    _shipped_bert_tokenizer().save(path)
    shipped = json.loads(path.read_text())
    assert shipped["padding"] is not None and shipped["truncation"]["max_length"] == 128  # saved as it ships
    tok = Tokenizer.from_file(path)
    words = "the cat sat on the mat and the dog sat on the log ."
    ids = tok.encode(words)
    assert len(ids) == 14 and tok.special_id("pad") not in ids
    assert len(tok.encode(" ".join(["cat"] * 300))) == 300  # not cut at 128
    again = Tokenizer.from_str(path.read_text())
    assert again.encode(words) == ids
    assert json.loads(again.to_str())["padding"] == shipped["padding"]  # re-saving keeps the file's settings


def test_a_word_outside_a_vocabulary_without_unk_is_named():
    import pytest
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    from desktop_app.core.tokenizer import TokenizerError

    hf = HFTokenizer(models.WordLevel({w: i for i, w in enumerate("ABCD")}, unk_token=None))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = Tokenizer(hf)  # as a motif model saved before its tokenizer had [UNK]
    assert tok.encode("A B D") == [0, 1, 3]
    with pytest.raises(TokenizerError, match=r"^'hello' is not in this model's vocabulary \(A, B, C, D\)$"):
        tok.encode("A B hello")


def test_char_tokenizer_unknown_token_keeps_the_character_ids():
    plain = char_tokenizer("hello world")
    tok = char_tokenizer("hello world", unknown="[UNK]")
    assert tok.encode("hello") == plain.encode("hello")
    unk = tok.special_id("unk")
    assert unk == plain.vocab_size and tok.encode("hez") == plain.encode("he") + [unk]
