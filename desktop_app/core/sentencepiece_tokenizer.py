"""SentencePiece tokenizers as model folders ship them, read and run by the `sentencepiece` library:
spiece.model (T5), source.spm / target.spm + vocab.json (Marian) and tokenizer.model alone (older
Llama, Mistral folders). Each tokenizes as the `transformers` tokenizer that folder gets (T5Tokenizer,
MarianTokenizer, LlamaTokenizer): the same ids, special tokens and decoded text (checked against them
in tests/core/test_sentencepiece_tokenizers.py); `sentencepiece` cuts the text, the rules around it
(special tokens typed in the text, </s> or <s> added, Marian's vocab.json ids, decoding) are the
`transformers` classes' own, written out here. core.tokenizer.load_tokenizer_folder wraps the backend
in the app's Tokenizer (this module imports nothing of core.tokenizer, and `sentencepiece` only when a
model is read)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:
    import sentencepiece

T5_MODEL = "spiece.model"
LLAMA_MODEL = "tokenizer.model"
MARIAN_SOURCE, MARIAN_TARGET = "source.spm", "target.spm"
MARIAN_VOCAB, MARIAN_TARGET_VOCAB = "vocab.json", "target_vocab.json"
SENTENCEPIECE_FILES = (T5_MODEL, LLAMA_MODEL, MARIAN_SOURCE, MARIAN_TARGET, MARIAN_TARGET_VOCAB)
SPIECE_UNDERLINE = "▁"
_STYLES = ("t5", "llama", "gemma", "marian")


MAX_EXTRA_IDS = 1 << 16  # a T5 tokenizer_config.json's extra_ids (<extra_id_N> sentinels) read at most


class SentencePieceError(ValueError):
    """A SentencePiece file that cannot be used; `path` names it (load_tokenizer_folder raises it as a
    TokenizerError)."""

    def __init__(self, message: str, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


def read_sentencepiece_model(path: Path) -> sentencepiece.SentencePieceProcessor:
    """The SentencePiece model in `path`, or a SentencePieceError naming the file."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SentencePieceError(f"{path}: cannot be read ({exc.strerror or exc})", path) from None
    import sentencepiece

    # its own log lines (absl's "Model is not initialized" for an empty file...) would come before the app's
    # one line: the app says what is wrong itself
    sentencepiece.set_min_log_level(3)
    try:
        sp = sentencepiece.SentencePieceProcessor(model_proto=data)
    except (RuntimeError, ValueError, TypeError):  # sentencepiece: RuntimeError "INTERNAL: ... ParseFromArray"
        raise SentencePieceError(f"{path}: not a valid SentencePiece model (the file cannot be parsed)", path) from None
    size = sp.get_piece_size()
    if size == 0 or not 0 <= sp.unk_id() < size or not sp.is_unknown(sp.unk_id()):
        raise SentencePieceError(f"{path}: not a valid SentencePiece model (no pieces or no unknown piece)", path)
    return sp


def _clean_up_tokenization(text: str) -> str:
    """transformers' clean_up_tokenization (a tokenizer_config.json may ask for it)."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                 (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


class _Encoding:
    """What Tokenizer reads from an encoding: the ids, and which of them the rules added (</s>)."""

    def __init__(self, ids: list[int], special_tokens_mask: list[int]) -> None:
        self.ids, self.special_tokens_mask = ids, special_tokens_mask


class SentencePieceBackend:
    """A SentencePiece model with the rules of the `transformers` tokenizer of its folder, behind the
    calls core.tokenizer.Tokenizer makes of a `tokenizers.Tokenizer` (encode, decode, token_to_id,
    id_to_token, get_vocab, get_vocab_size): Tokenizer(SentencePieceBackend(...)) is the app's tokenizer,
    so every panel works unchanged.

    `style` is the transformers class whose rules apply around SentencePiece's own cutting:
    - "t5" (T5Tokenizer): </s> after the text; the <extra_id_N> sentinels after the pieces; decoding
      as its Metaspace decoder does (an unknown piece reads <unk>).
    - "llama" (LlamaTokenizer): </s> last when tokenizer_config.json says add_eos_token (<s> first with
      add_bos_token is Tokenizer.bos_prepended's); a text (or the text after a special token) that
      starts with a space gets no extra one; byte pieces (<0xE2>...) decoded to UTF-8.
    - "gemma" (GemmaTokenizer): as "llama", with no space added anywhere (Gemma's model adds none
      itself) and none dropped in decoding.
    - "marian" (MarianTokenizer): pieces mapped to ids through vocab.json (a piece it lacks is <unk>),
      a leading >>lang<< code kept whole, </s> after the text.
    Special tokens typed in the text (</s>, <extra_id_0>, ...) stay one token each, as in transformers.
    Not written as tokenizer.json: to_str() raises SentencePieceError; `files` names the files it was
    read from, for whoever copies a model folder."""

    padding = truncation = normalizer = pre_tokenizer = None  # no padding or truncation to switch off

    def __init__(self, sp: sentencepiece.SentencePieceProcessor, source: Path, style: str,
                 vocab: dict[str, int] | None = None, added: dict[int, str] | None = None,
                 split_tokens: Iterable[str] = (), special_tokens: Iterable[str] = (),
                 eos_appended: bool = True, clean_up_spaces: bool = False, files: tuple[Path, ...] = (),
                 unk_token: str | None = None, eos_token: str = "</s>") -> None:
        if style not in _STYLES:
            raise ValueError(f"style must be one of {_STYLES}, not {style!r}")
        self.source = source
        self.files = files or (source,)
        self.sp = sp
        self.style = style
        self.eos_appended = eos_appended
        self.clean_up_spaces = clean_up_spaces
        self._eos_text = eos_token
        # token text -> id: Marian's vocab.json; else SentencePiece's pieces
        self._vocab = vocab
        self._added = dict(added or {})                       # id -> text, tokens beyond or over the pieces
        self._added_ids = {t: i for i, t in self._added.items()}
        self._id_to_token = {i: t for t, i in vocab.items()} if vocab is not None else {}
        # the unknown token's text: Marian maps a piece vocab.json lacks to it (MarianTokenizer's unk_token)
        self._unk_text = unk_token if unk_token is not None else sp.id_to_piece(sp.unk_id())
        # the tokens typed in a text that stay whole (longest first: leftmost-longest matching)
        split = sorted({t for t in (*split_tokens, *special_tokens, *self._added.values()) if t}, key=len, reverse=True)
        self._split_re = re.compile("|".join(map(re.escape, split))) if split else None
        self._special_texts = {t for t in special_tokens if t}

    # -- ids and texts -------------------------------------------------------------------
    @property
    def unk_token_id(self) -> int:
        if self._vocab is not None:
            return self._vocab[self._unk_text]
        return self.sp.unk_id()

    def token_to_id(self, text: str) -> int | None:
        """The id of a token text, None when the vocabulary lacks it."""
        if text in self._added_ids:
            return self._added_ids[text]
        if self._vocab is not None:
            return self._vocab.get(text)
        i = self.sp.piece_to_id(text)
        return i if self.sp.id_to_piece(i) == text else None

    def id_to_token(self, i: int) -> str | None:
        i = int(i)
        if i in self._added:
            return self._added[i]
        if self._vocab is not None:
            if i in self._id_to_token:
                return self._id_to_token[i]
            # MarianTokenizer._convert_id_to_token: an id vocab.json lacks reads as its SentencePiece piece
            return self.sp.id_to_piece(i) if 0 <= i < self.sp.get_piece_size() else None
        return self.sp.id_to_piece(i) if 0 <= i < self.sp.get_piece_size() else None

    def _split_id(self, text: str) -> int:
        """A typed special token's id (transformers reads one the vocabulary lacks as <unk>)."""
        i = self.token_to_id(text)
        return self.unk_token_id if i is None else i

    @property
    def special_ids(self) -> set[int]:
        """The ids decode(skip_special_tokens=True) leaves out: transformers' all_special_ids."""
        return {self._split_id(t) for t in self._special_texts}

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        ids = [self.sp.get_piece_size() - 1, *self._added]
        if self._vocab is not None:
            ids = [max(self._vocab.values()), *self._added]
        return max(ids) + 1

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        if self._vocab is not None:
            return {**self._vocab, **self._added_ids}
        return {**{self.sp.id_to_piece(i): i for i in range(self.sp.get_piece_size())}, **self._added_ids}

    # -- encoding ------------------------------------------------------------------------
    def _chunks(self, text: str) -> list[tuple[str, bool]]:
        """`text` cut around the special tokens typed in it: (piece, is a special token)."""
        if self._split_re is None:
            return [(text, False)] if text else []
        out: list[tuple[str, bool]] = []
        start = 0
        for m in self._split_re.finditer(text):  # leftmost, longest first (the alternatives' order)
            if m.start() > start:
                out.append((text[start:m.start()], False))
            out.append((m.group(), True))
            start = m.end()
        if start < len(text):
            out.append((text[start:], False))
        return out

    def _encode_piece(self, text: str, first: bool) -> list[int]:
        sp = self.sp
        if self.style == "marian":
            code = []
            if text.startswith(">>") and (end := text.find("<<")) != -1:  # MarianTokenizer.remove_language_code
                code, text = [text[:end + 2]], text[end + 2:]
            unk = self.unk_token_id
            return [self._vocab.get(p, unk) for p in code + sp.encode(text, out_type=str)]
        if self.style == "llama" and (not first or text.startswith((" ", SPIECE_UNDERLINE))):
            # LlamaTokenizer's Metaspace adds the "▁" only at the start of the whole text, and not when it
            # starts with a space already: SentencePiece always adds it, so it is made to add it to a
            # piece dropped after (transformers' own slow LlamaTokenizer did the same)
            lead = sp.encode(sp.id_to_piece(sp.unk_id()))
            ids = sp.encode(sp.id_to_piece(sp.unk_id()) + text)
            if ids[:len(lead)] == lead:
                return ids[len(lead):]
        return sp.encode(text)

    def encode(self, text: str, add_special_tokens: bool = False) -> _Encoding:
        """`text`'s ids; with `add_special_tokens`, </s> after them where the rules add it (T5 and
        Marian always, Llama with add_eos_token), marked in special_tokens_mask."""
        ids: list[int] = []
        for i, (piece, special) in enumerate(self._chunks(text)):
            ids.extend([self._split_id(piece)] if special else self._encode_piece(piece, first=i == 0))
        mask = [0] * len(ids)
        eos = self.token_to_id(self._eos_text)
        if add_special_tokens and self.eos_appended and eos is not None:
            ids.append(eos)
            mask.append(1)
        return _Encoding(ids, mask)

    # -- decoding ------------------------------------------------------------------------
    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        skip = self.special_ids if skip_special_tokens else set()
        tokens = [self.id_to_token(i) for i in (int(i) for i in ids) if i not in skip]
        tokens = [t if t is not None else self._unk_text for t in tokens]
        if self.style == "marian":
            text = self._marian_tokens_to_string(tokens)
        elif self.style == "t5":
            # tokenizers' Metaspace decoder (prepend_scheme "always"): "▁" reads as a space, the first dropped
            text = "".join(t.replace(SPIECE_UNDERLINE, " ") for t in tokens)
            if tokens and tokens[0].replace(SPIECE_UNDERLINE, " ").startswith(" "):
                text = text[1:]
        else:
            text = self._llama_tokens_to_string(tokens)
            if self.style == "llama" and text.startswith(" "):  # LlamaTokenizer's Strip decoder
                text = text[1:]
        return _clean_up_tokenization(text) if self.clean_up_spaces else text

    def _marian_tokens_to_string(self, tokens: list[str]) -> str:
        """MarianTokenizer.convert_tokens_to_string: pieces decoded by SentencePiece, special tokens
        as they are, each followed by a space."""
        out, pending = "", []
        for token in tokens:
            if token in self._special_texts:
                out += self.sp.decode_pieces(pending) + token + " "
                pending = []
            else:
                pending.append(token)
        out += self.sp.decode_pieces(pending)
        return out.replace(SPIECE_UNDERLINE, " ").strip()

    @staticmethod
    def _llama_tokens_to_string(tokens: list[str]) -> str:
        """LlamaTokenizer's and GemmaTokenizer's decoder: "▁" -> " ", byte pieces <0x..> to UTF-8
        (U+FFFD each when invalid), joined."""
        out: list[str] = []
        pending: list[int] = []

        def flush() -> None:
            if pending:
                try:
                    out.append(bytes(pending).decode("utf-8"))
                except UnicodeDecodeError:
                    out.append("\ufffd" * len(pending))
                pending.clear()

        for token in tokens:
            token = token.replace(SPIECE_UNDERLINE, " ")
            if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                try:
                    pending.append(int(token[3:5], 16))
                    continue
                except ValueError:
                    pass
            flush()
            out.append(token)
        flush()
        return "".join(out)

    def to_str(self) -> str:
        raise SentencePieceError(f"{self.source}: a SentencePiece tokenizer is not written as tokenizer.json "
                                 f"(copy {', '.join(p.name for p in self.files)} instead)", self.source)


# -- model folders -------------------------------------------------------------------------------


def _vocab_json(path: Path) -> dict[str, int]:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SentencePieceError(f"{path}: cannot be read ({exc.strerror or exc})", path) from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise SentencePieceError(f"{path}: not valid JSON ({exc})", path) from None
    if not isinstance(d, dict) or not d or not all(isinstance(k, str) and type(v) is int and v >= 0
                                                   for k, v in d.items()):
        raise SentencePieceError(f"{path}: expected a JSON object of tokens and their ids", path)
    return d


class SentencePieceFolder:
    """What load_sentencepiece_folder found: the backend for the (source) text, Marian's target-side
    backend (None for one model), and the special tokens, the transformers class's defaults included."""

    def __init__(self, backend: SentencePieceBackend, target: SentencePieceBackend | None,
                 specials: dict[str, str]) -> None:
        self.backend, self.target, self.specials = backend, target, specials


def sentencepiece_style(folder: Path, config: dict) -> str | None:
    """Which SentencePiece tokenizer a folder ships ("marian", "t5", "llama", "gemma"), None when none:
    source.spm (Marian), else spiece.model (T5), else tokenizer.model (Llama and Mistral; Gemma when
    tokenizer_config.json `config` names a Gemma tokenizer_class)."""
    if (folder / MARIAN_SOURCE).is_file():
        return "marian"
    if (folder / T5_MODEL).is_file():
        return "t5"
    if (folder / LLAMA_MODEL).is_file():
        cls = config.get("tokenizer_class")
        return "gemma" if isinstance(cls, str) and cls.lower().startswith("gemma") else "llama"
    return None


def load_sentencepiece_folder(folder: Path, config: dict, specials: dict[str, str],
                              token_text: Callable[[object], str | None]) -> SentencePieceFolder | None:
    """The SentencePiece tokenizer of a model folder (see sentencepiece_style), None when it ships none.
    `config`: tokenizer_config.json; `specials`: the special tokens the folder declares; `token_text`
    reads a token as the config files write it ("</s>" or {"content": "</s>", ...}).
    Raises SentencePieceError naming the file."""
    style = sentencepiece_style(folder, config)
    if style is None:
        return None
    shipped: dict[int, tuple[str, bool]] = {}  # added_tokens_decoder: id -> (text, special)
    if isinstance(config.get("added_tokens_decoder"), dict):
        for key, entry in config["added_tokens_decoder"].items():
            text = token_text(entry)
            if text is not None and str(key).isdigit():
                shipped[int(key)] = (text, not isinstance(entry, dict) or bool(entry.get("special", True)))
    listed = [t for key in ("additional_special_tokens", "extra_special_tokens")
              for t in map(token_text, config.get(key) if isinstance(config.get(key), list) else []) if t]
    clean_up = bool(config.get("clean_up_tokenization_spaces", False))
    if style == "marian":
        return _marian(folder, config, specials, shipped, listed, clean_up)
    path = folder / (T5_MODEL if style == "t5" else LLAMA_MODEL)
    sp = read_sentencepiece_model(path)
    size = sp.get_piece_size()
    controls = [sp.id_to_piece(i) for i in range(size) if sp.is_control(i) or sp.is_unknown(i)]
    if style == "t5":
        defaults = {"eos": "</s>", "unk": "<unk>", "pad": "<pad>"}
        extra = config.get("extra_ids", 100)
        extra = extra if type(extra) is int and extra >= 0 else 100
        if extra > MAX_EXTRA_IDS:  # each is a token kept in memory: refused before any is made
            where = folder / "tokenizer_config.json"
            raise SentencePieceError(f"{where}: extra_ids {extra:,} is more sentinel tokens than any T5 tokenizer "
                                     f"has (T5's: 100; at most {MAX_EXTRA_IDS:,} are read)", where)
        added = {size + extra - 1 - i: f"<extra_id_{i}>" for i in range(extra)}  # T5: <extra_id_0> last
        eos_appended = True
    else:
        defaults = ({"bos": "<s>", "eos": "</s>", "unk": "<unk>"} if style == "llama" else
                    {"bos": "<bos>", "eos": "<eos>", "unk": "<unk>", "pad": "<pad>", "mask": "<mask>"})
        added = {}
        eos_appended = bool(config.get("add_eos_token", False))
    if shipped:  # the file's own ids win
        added = {i: t for i, (t, _) in shipped.items() if i >= size or sp.id_to_piece(i) != t}
        added_special = [t for t, special in shipped.values() if special]
    else:
        added_special = list(added.values())
    specials = {**defaults, **specials}
    backend = SentencePieceBackend(sp, path, style, added=added, split_tokens=controls,
                                   special_tokens=[*specials.values(), *added_special, *listed],
                                   eos_appended=eos_appended, clean_up_spaces=clean_up, eos_token=specials["eos"])
    return SentencePieceFolder(backend, None, specials)


def _marian(folder: Path, config: dict, specials: dict[str, str], shipped: dict[int, tuple[str, bool]],
            listed: list[str], clean_up: bool) -> SentencePieceFolder:
    """source.spm + target.spm + vocab.json (+ target_vocab.json with separate_vocabs), as MarianTokenizer."""
    source_path, target_path, vocab_path = folder / MARIAN_SOURCE, folder / MARIAN_TARGET, folder / MARIAN_VOCAB
    for p in (target_path, vocab_path):
        if not p.is_file():
            raise SentencePieceError(f"{folder}: {MARIAN_SOURCE} comes without {p.name} (a Marian tokenizer "
                                     f"needs {MARIAN_SOURCE}, {MARIAN_TARGET} and {MARIAN_VOCAB})", p)
    source_sp, target_sp = read_sentencepiece_model(source_path), read_sentencepiece_model(target_path)
    vocab = _vocab_json(vocab_path)
    separate = bool(config.get("separate_vocabs", False))
    target_vocab = _vocab_json(folder / MARIAN_TARGET_VOCAB) if separate else vocab
    specials = {"eos": "</s>", "unk": "<unk>", "pad": "<pad>", **specials}
    for v, path in ((vocab, vocab_path), (target_vocab, folder / MARIAN_TARGET_VOCAB)):
        if specials["unk"] not in v:  # MarianTokenizer refuses it too
            raise SentencePieceError(f"{path}: the unknown token {specials['unk']!r} is not in it", path)
    special = [*specials.values(), *(t for t, s in shipped.values() if s), *listed]
    split = [t for t, _ in shipped.values()]
    files = tuple(p for p in (source_path, target_path, vocab_path, folder / MARIAN_TARGET_VOCAB) if p.is_file())

    def make(sp, v, path):
        return SentencePieceBackend(sp, path, "marian", vocab=v, split_tokens=split, special_tokens=special,
                                    eos_appended=True, clean_up_spaces=clean_up, files=files,
                                    unk_token=specials["unk"], eos_token=specials["eos"])

    return SentencePieceFolder(make(source_sp, vocab, source_path), make(target_sp, target_vocab, target_path),
                               specials)
