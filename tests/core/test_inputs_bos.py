"""inputs.encode puts the BOS token first for a tokenizer folder that declares add_bos_token, as
transformers' LLaMA tokenizer does, and for no other."""
from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors

from desktop_app.core.inputs import encode
from desktop_app.core.tokenizer import load_tokenizer_folder

transformers = pytest.importorskip("transformers")

# A LLaMA-style tokenizer.json, built as transformers' LlamaTokenizer builds one (BPE with byte
# fallback over "▁"-marked words), so that the reference class reads the same vocabulary and merges.
CHARS = ["▁", "t", "h", "e", "c", "a", "s", "o", "n", "m"]
MERGES = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("▁", "c"), ("a", "t"), ("▁c", "at"), ("▁", "s"), ("▁s", "at")]
VOCAB = {"<unk>": 0, "<s>": 1, "</s>": 2, **{t: 3 + i for i, t in enumerate(CHARS + [a + b for a, b in MERGES])}}
TEXTS = ["the cat sat on the mat", "a cat", "cats on a mast", "<s> the cat", ""]


def write_folder(folder, add_bos: bool):
    tok = HFTokenizer(models.BPE(vocab=VOCAB, merges=MERGES, fuse_unk=True, byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    if add_bos:  # as LLaMA's tokenizer.json ships it: transformers 5 reads the BOS from here, not the config
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", 1)])
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"add_bos_token": add_bos, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
         "unk_token": "<unk>", "tokenizer_class": "LlamaTokenizerFast", "legacy": False}), encoding="utf-8")
    return folder


def reference_ids(folder, text: str) -> list[int]:
    reference = transformers.LlamaTokenizerFast.from_pretrained(folder)
    assert reference.get_vocab() == {**VOCAB}  # the same vocabulary, so the comparison is of the ids only
    return reference(text)["input_ids"]


@pytest.mark.parametrize("text", TEXTS)
def test_bos_is_prepended_as_transformers_does(tmp_path, text):
    folder = write_folder(tmp_path / "tok", add_bos=True)
    tokenizer = load_tokenizer_folder(folder)
    ids = encode(tokenizer, text).ids
    assert ids[0] == 1 and ids[1:] == tokenizer.encode(text)  # only the BOS is added
    assert ids == reference_ids(folder, text)


@pytest.mark.parametrize("text", TEXTS)
def test_no_bos_without_add_bos_token(tmp_path, text):
    folder = write_folder(tmp_path / "tok", add_bos=False)
    tokenizer = load_tokenizer_folder(folder)
    ids = encode(tokenizer, text).ids
    assert ids == tokenizer.encode(text) == reference_ids(folder, text)


def test_bos_counts_against_the_context_length(tmp_path):
    tokenizer = load_tokenizer_folder(write_folder(tmp_path / "tok", add_bos=True))
    out = encode(tokenizer, "the cat sat", vocab_size=len(VOCAB), context_length=2)
    assert out.ids == [1, VOCAB["▁the"]] and out.total == 4 and "4 tokens" in out.notice
