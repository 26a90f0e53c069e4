"""The tokenizer a GGUF file embeds (tokenizer.ggml.*) against transformers' GGUF tokenizer on the same
file, over generated sentences: byte-level BPE (GPT-2's split, LLaMA 3's and Qwen2's regexes) and
SentencePiece-style BPE with byte fallback (LLaMA 2 and Gemma spellings), special tokens added, BOS
as the file says."""
from __future__ import annotations

import random

import pytest

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from tokenizers import Regex, models, pre_tokenizers, trainers  # noqa: E402
from tokenizers import Tokenizer as HFTokenizer  # noqa: E402

from desktop_app.core.formats.gguf_file import GGUFFile  # noqa: E402
from desktop_app.core.formats.gguf_tokenizer import PRE_SPLITS, tokenizer_from_gguf, tokenizer_metadata  # noqa: E402
from desktop_app.core.tokenizer import Tokenizer, train_bpe  # noqa: E402

WORDS = ("the", "cat", "sat", "on", "a", "mat", "Hello", "world", "don't", "it's", "naïve", "café", "Zürich",
         "東京", "🙂", "42", "3.14159", "2024", "1000000", "12345", "x=y+1;", "#tag", "@user", "e-mail", "C++",
         "(brackets)", "'quoted'", "tab\there")


def sentences(n: int, seed: int = 0, specials: tuple[str, ...] = ()) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS + specials if rng.random() < 0.05 else WORDS) for _ in range(rng.randint(1, 12))]
        seps = [rng.choice((" ", " ", " ", "  ", "\n", ", ", ". ")) for _ in words]
        text = "".join(w + s for w, s in zip(words, seps)).rstrip(" ")
        if rng.random() < 0.2:
            text = " " + text
        out.append(text)
    return out


def write(tmp_path, arch: str, tok: Tokenizer, name: str):
    path = tmp_path / f"{name}.gguf"
    w = gguf.GGUFWriter(path, arch)
    for key, value in tokenizer_metadata(tok, tok.vocab_size).items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    w.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def byte_level(split: str | None, bos: bool = False) -> Tokenizer:
    tok = train_bpe(sentences(300, seed=5), 400, specials=("<|endoftext|>", "<|im_start|>"))
    if split is not None:  # the same vocabulary cut by a llama.cpp pre-tokenizer's regex
        tok.tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(PRE_SPLITS[split]), "isolated"),
                                                         pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                  use_regex=False)])
    tok.declared_specials = {"bos": "<|endoftext|>", "eos": "<|endoftext|>"}
    tok.bos_prepended = bos  # LLaMA 3's files say add_bos_token
    return tok


def sentencepiece_style() -> Tokenizer:
    """A LLaMA-2-like vocabulary: <unk> <s> </s>, the 256 byte tokens, then merges learned on "▁"-words."""
    base = HFTokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    base.train_from_iterator(sentences(300, seed=6), trainers.BpeTrainer(vocab_size=500, show_progress=False))
    trained = base.get_vocab()
    head = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    vocab = {t: i for i, t in enumerate(head)}
    for t, _ in sorted(trained.items(), key=lambda kv: kv[1]):
        vocab.setdefault(t, len(vocab))
    import json
    merges = json.loads(base.to_str())["model"]["merges"]
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" "))
                                                      for m in merges], byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = base.pre_tokenizer
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    out = Tokenizer(tok)
    out.declared_specials = {"bos": "<s>", "eos": "</s>", "unk": "<unk>"}
    out.bos_prepended = True
    return out


CASES = {"gpt2-split": ("qwen2", lambda: byte_level(None)), "llama-bpe": ("llama", lambda: byte_level("llama-bpe", bos=True)),
         "qwen2": ("qwen2", lambda: byte_level("qwen2")), "llama-spm": ("llama", sentencepiece_style),
         "gemma-spm": ("gemma3", sentencepiece_style)}


@pytest.mark.parametrize("case", list(CASES))
def test_ids_match_transformers_gguf_tokenizer(case, tmp_path):
    arch, make = CASES[case]
    path = write(tmp_path, arch, make(), case)
    ours, why = tokenizer_from_gguf(GGUFFile(path))
    assert ours is not None, why
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    texts = sentences(1000, seed=11, specials=("<|endoftext|>", "<s>", "</s>", "<|im_start|>"))
    mismatches = []
    for text in texts:
        want = theirs(text)["input_ids"]
        got = ours.encode_for_model(text)[0]
        if got != want:
            mismatches.append((text, got, want))
    assert not mismatches, f"{len(mismatches)} of {len(texts)} differ, e.g. {mismatches[0]}"
    # without special tokens too, and the ids decode back the way transformers decodes them
    for text in texts[:50]:
        ids = theirs(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text) == ids
        assert ours.decode(ids) == theirs.decode(ids)


def test_chat_template_and_specials_are_kept(tmp_path):
    path = write(tmp_path, "llama", sentencepiece_style(), "spm")
    f = GGUFFile(path)
    tok, _ = tokenizer_from_gguf(f)
    assert f.summary.chat_template.startswith("{% for m in messages %}")
    assert tok.bos_token_id == 1 and tok.eos_token_id == 2 and tok.bos_prepended
    assert tok.encode_for_model("hi")[0][0] == 1
