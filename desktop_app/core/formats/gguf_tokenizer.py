"""A GGUF file's tokenizer: the vocabulary it embeds (tokenizer.ggml.*) as a `tokenizers` tokenizer,
built as transformers' GGUF tokenizer builds it (integrations/gguf/gguf_tokenizer_mapping.py), and
the other way for writing (gguf_export).

tokenizer.ggml.model says which kind: "gpt2" (byte-level BPE: GPT-2, LLaMA 3, Qwen) or "llama"
(SentencePiece-style BPE with byte fallback: LLaMA 2, Mistral, Gemma). Control tokens (token_type 3)
become special tokens, user-defined ones (4) added tokens; the chat template is kept (GGUFSummary).
"""
from __future__ import annotations

import json
from functools import lru_cache
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from ..tokenizer import Tokenizer
from ..weights import ModelLoadError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp's token types

# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) -> the split before byte-level BPE
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
              "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}
GEMMA_ARCHS = ("gemma", "gemma2", "gemma3")  # SentencePiece vocabularies that spell spaces as spaces


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what byte-level BPE vocabularies are spelled in)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _merges_from_scores(tokens: list[str], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The merges a SentencePiece vocabulary implies: every split of a token into two tokens, best
    score first (transformers' generate_merges, which its GGUF tokenizer uses)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for token, score in scores.items():
        local = [(token[:i], token[i:], score) for i in range(1, len(token))
                 if token[:i] in vocab and token[i:] in vocab]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _file_merges(f: "GGUFFile") -> list[tuple[str, str]] | None:
    merges = f.meta("tokenizer.ggml.merges", None)
    if merges is None:
        return None
    out = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise ModelLoadError(f.path, f"tokenizer.ggml.merges holds {m!r}, not two tokens")
        out.append((a, b))
    return out


def tokenizer_from_gguf(f: "GGUFFile") -> tuple[Tokenizer | None, str]:
    """(the file's tokenizer, "") or (None, why there is none)."""
    kind = f.meta("tokenizer.ggml.model", None)
    if kind is None:
        return None, "no embedded vocabulary (tokenizer.ggml.model)"
    tokens = f.meta("tokenizer.ggml.tokens", None)
    if not tokens:
        return None, "no tokenizer.ggml.tokens"
    types = f.meta("tokenizer.ggml.token_type", None) or [NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise ModelLoadError(f.path, f"tokenizer.ggml.token_type lists {len(types)} types for {len(tokens)} tokens")
    specials = {name: f.meta(f"tokenizer.ggml.{key}", None)
                for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                                  ("pad", "padding_token_id"))}
    for name, i in specials.items():
        if i is not None and not 0 <= i < len(tokens):
            raise ModelLoadError(f.path, f"tokenizer.ggml.{name} token id {i} is outside the {len(tokens)} tokens")
    if kind == "gpt2":
        tok = _byte_level(f, tokens, types)
    elif kind == "llama":
        tok = _sentencepiece(f, tokens, types, specials["unk"])
    else:
        return None, f"tokenizer kind {kind!r} (tokenizer.ggml.model) is not read here (only gpt2 and llama)"
    out = Tokenizer(tok, f.path)
    out.declared_specials = {name: tokens[i] for name, i in specials.items() if i is not None}
    add_bos = f.meta("tokenizer.ggml.add_bos_token", None)
    # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise (transformers too)
    out.bos_prepended = bool(add_bos if add_bos is not None else kind == "llama") and specials["bos"] is not None
    return out, ""


def _add_tokens(tok: HFTokenizer, tokens: list[str], types: list[int], allowed=None) -> None:
    """Control tokens as special tokens, user-defined ones as added tokens, matched whole in text."""
    control = [AddedToken(t, normalized=False, special=True) for t, ty in zip(tokens, types)
               if ty == CONTROL and (allowed is None or set(t) <= allowed)]
    tok.add_special_tokens(control)
    vocab = tok.get_vocab()
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types)
                    if ty == USER_DEFINED and t in vocab])


def _byte_level(f: "GGUFFile", tokens: list[str], types: list[int]) -> HFTokenizer:
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {(t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))): i
             for i, t in enumerate(tokens)}
    merges = _file_merges(f) or []
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, continuing_subword_prefix="", end_of_word_suffix="",
                                 fuse_unk=False, byte_fallback=False))
    split = PRE_SPLITS.get(f.meta("tokenizer.ggml.pre", None))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    # a control token spelled outside the byte alphabet is a llama.cpp mislabel: transformers skips it
    _add_tokens(tok, tokens, types, allowed=alphabet)
    return tok


def _sentencepiece(f: "GGUFFile", tokens: list[str], types: list[int], unk: int | None) -> HFTokenizer:
    gemma = f.arch_name in GEMMA_ARCHS
    if gemma:  # a token of two or more spaces is stored as spaces, looked up as "▁▁"
        tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = _file_merges(f)
    if merges is None:
        if gemma:  # Gemma's scores do not follow its merge order; the file's order does
            scores = {t: -i for i, t in enumerate(tokens)}
        else:
            raw = f.meta("tokenizer.ggml.scores", None)
            if raw is None or len(raw) != len(tokens):
                raise ModelLoadError(f.path, "a SentencePiece vocabulary without merges needs one score per token "
                                             "(tokenizer.ggml.scores)")
            scores = dict(zip(tokens, raw))
        merges = _merges_from_scores(tokens, scores)
    unk_token = tokens[unk] if gemma and unk is not None else None
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk_token, fuse_unk=True, byte_fallback=True))
    if gemma:
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    _add_tokens(tok, tokens, types)
    return tok


# -- writing ---------------------------------------------------------------------------------------


def _pre_name(pre: dict | None) -> str | None:
    """llama.cpp's name for a byte-level tokenizer's split: "gpt-2" for ByteLevel's own regex, the
    name of a known regex split before ByteLevel, None for any other split."""
    if pre is None:
        return None
    if pre.get("type") == "ByteLevel":
        return "gpt-2" if pre.get("use_regex", True) else None
    steps = pre.get("pretokenizers") or []
    if pre.get("type") == "Sequence" and len(steps) == 2 and steps[0].get("type") == "Split" \
            and steps[1].get("type") == "ByteLevel" and not steps[1].get("use_regex", True):
        regex = (steps[0].get("pattern") or {}).get("Regex")
        return next((name for name, rx in PRE_SPLITS.items() if rx == regex), None)
    return None


def tokenizer_metadata(tokenizer: Tokenizer, vocab_size: int) -> dict | None:
    """The tokenizer.ggml.* fields for a byte-level or SentencePiece-style BPE tokenizer.json (the
    kinds a GGUF holds), or None for one it cannot express (WordPiece, a SentencePiece model file)."""
    if getattr(tokenizer.tok, "files", None):  # core/sentencepiece_tokenizer: no tokenizer.json form
        return None
    d = json.loads(tokenizer.tok.to_str())
    model = d.get("model") or {}
    if model.get("type") != "BPE":
        return None
    vocab = model["vocab"]
    added = {a["id"]: a for a in d.get("added_tokens", [])}
    n = max(vocab_size, max(vocab.values(), default=-1) + 1, max(added, default=-1) + 1)
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [UNUSED] * n
    for t, i in vocab.items():
        tokens[i], types[i] = t, NORMAL
    for i, a in added.items():
        tokens[i], types[i] = a["content"], CONTROL if a.get("special") else USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    out = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges}
    if "ByteLevel" in json.dumps(d.get("pre_tokenizer")):
        pre = _pre_name(d.get("pre_tokenizer"))
        if pre is None:  # llama.cpp would split the text another way than this tokenizer
            return None
        out.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre})
    else:
        if not model.get("byte_fallback"):
            return None
        for i, t in enumerate(tokens):
            if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                types[i] = BYTE
        # llama.cpp's SentencePiece tokenizer merges by score: a merged token scores minus its merge's
        # rank (as SentencePiece's own BPE pieces do), every other token below all of them
        rank = {"".join(m.split(" ", 1)): r for r, m in reversed(list(enumerate(merges)))}
        scores = [-float(rank[t]) if t in rank else -float(len(merges) + i) for i, t in enumerate(tokens)]
        out.update({"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default", "tokenizer.ggml.scores": scores})
    for name in ("bos", "eos", "unk", "pad"):
        i = tokenizer.special_id(name)
        if i is not None:
            key = {"unk": "unknown_token_id", "pad": "padding_token_id"}.get(name, f"{name}_token_id")
            out[f"tokenizer.ggml.{key}"] = int(i)
    out["tokenizer.ggml.add_bos_token"] = bool(tokenizer.bos_prepended)
    return out
