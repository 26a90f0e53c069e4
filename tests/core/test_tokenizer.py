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
