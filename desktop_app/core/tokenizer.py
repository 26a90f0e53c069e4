"""Tokenizers: tokenizer.json through Hugging Face `tokenizers`, char-level and BPE training."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers


class TokenizerError(ValueError):
    pass


SPECIAL_NAMES = ("pad", "bos", "eos", "mask", "unk", "cls", "sep")
_SPECIAL_STRINGS = {
    "pad": ("[PAD]", "<pad>", "<|pad|>"),
    "bos": ("<s>", "<|begin_of_text|>", "<bos>", "<|endoftext|>"),
    "eos": ("</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>"),
    "mask": ("[MASK]", "<mask>"),
    "unk": ("[UNK]", "<unk>"),
    "cls": ("[CLS]",),
    "sep": ("[SEP]",),
}


class Tokenizer:
    """A thin wrapper over `tokenizers.Tokenizer` with the few calls the app needs."""

    def __init__(self, tok: HFTokenizer, source: Path | None = None) -> None:
        # A tokenizer.json may ship padding and truncation (sentence-embedding BERTs pad to a fixed
        # 128 and cut at 128): they never apply to analysis text, so both are switched off here.
        # The file's own settings are kept for to_str()/save(), so a re-saved model ships as it came.
        self._shipped_json: str | None = None
        if tok.padding is not None or tok.truncation is not None:
            self._shipped_json = tok.to_str()
            tok.no_padding()
            tok.no_truncation()
        self.tok = tok
        self.source = source

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path) -> "Tokenizer":
        path = Path(path)
        try:
            return cls(HFTokenizer.from_file(str(path)), path)
        except Exception as exc:  # tokenizers raises a bare Exception with the parser's message
            raise TokenizerError(f"{path}: not a valid tokenizer.json ({exc})") from exc

    @classmethod
    def from_str(cls, text: str) -> "Tokenizer":
        return cls(HFTokenizer.from_str(text))

    def to_str(self) -> str:
        return self._shipped_json if self._shipped_json is not None else self.tok.to_str()

    def save(self, path: str | Path) -> None:
        from .files import atomic_write_bytes  # one atomic writer for the whole core

        atomic_write_bytes(Path(path), self.to_str().encode("utf-8"))

    # -- use -----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        try:
            return self.tok.encode(text, add_special_tokens=add_special_tokens).ids
        except Exception as exc:  # tokenizers raises a bare Exception ("WordLevel error: Missing [UNK]...")
            raise TokenizerError(self._cannot_encode(text, exc)) from None

    def _cannot_encode(self, text: str, exc: Exception) -> str:
        """Why `text` cannot be encoded, in words: the first piece the vocabulary lacks (a
        vocabulary without an unknown token cannot encode it), else the library's own message."""
        tok = self.tok
        norm = tok.normalizer.normalize_str(text) if tok.normalizer is not None else text
        pieces = tok.pre_tokenizer.pre_tokenize_str(norm) if tok.pre_tokenizer is not None else [(norm, None)]
        for piece, _ in pieces:
            try:
                tok.encode(piece, add_special_tokens=False)
            except Exception:  # noqa: BLE001 - this piece is the one the vocabulary lacks
                return f"{piece!r} is not in this model's vocabulary ({self.vocabulary_preview()})"
        return f"the model's tokenizer cannot encode this text ({exc})"

    def vocabulary_preview(self, limit: int = 12) -> str:
        """The first tokens of the vocabulary by id, for messages: 'A, B, C, D' or 'a, b, ... (300 tokens)'."""
        by_id = sorted(self.tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
        shown = ", ".join(t for t, _ in by_id[:limit])
        return shown if len(by_id) <= limit else f"{shown}, ... ({len(by_id)} tokens)"

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """How each id reads on its own (for token strips and axis labels)."""
        out = []
        for i in ids:
            s = self.tok.decode([int(i)], skip_special_tokens=False)
            if s == "":
                s = self.tok.id_to_token(int(i)) or f"<{int(i)}>"
            out.append(s)
        return out

    def special_id(self, name: str) -> int | None:
        for s in _SPECIAL_STRINGS.get(name, ()):
            i = self.tok.token_to_id(s)
            if i is not None:
                return i
        return None

    @property
    def mask_token_id(self) -> int | None:
        return self.special_id("mask")

    @property
    def eos_token_id(self) -> int | None:
        return self.special_id("eos")


def char_tokenizer(text: str, specials: Iterable[str] = (), unknown: str | None = None) -> Tokenizer:
    """Character-level tokenizer over the characters of `text` (sorted), specials first.

    `unknown` (e.g. "[UNK]") is appended after the characters, so the characters keep their ids,
    and any character outside `text` then encodes to it instead of failing."""
    specials = list(specials)
    chars = sorted(set(text))
    vocab = {s: i for i, s in enumerate(specials)}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    unk = next((s for s in specials if s in _SPECIAL_STRINGS["unk"]), None)
    if unknown is not None and unk is None:
        vocab.setdefault(unknown, len(vocab))
        specials.append(unknown)
        unk = unknown
    tok = HFTokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    if specials:
        tok.add_special_tokens(specials)
    return Tokenizer(tok)


def train_bpe(texts: Iterable[str], vocab_size: int, specials: Iterable[str] = ("<|endoftext|>",)) -> Tokenizer:
    """Byte-level BPE (GPT-2 style) trained on `texts` to `vocab_size` tokens."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(list(texts), trainer=trainer)
    return Tokenizer(tok)
