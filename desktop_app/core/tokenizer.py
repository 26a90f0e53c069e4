"""Tokenizers: tokenizer.json through Hugging Face `tokenizers`, the older vocabulary files
(vocab.txt, vocab.json + merges.txt) as models ship them, char-level and BPE training."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import AddedToken, normalizers, processors
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers


class TokenizerError(ValueError):
    """A tokenizer file that cannot be used; `path` names it when there is one."""

    def __init__(self, message: str, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


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
    """A thin wrapper over `tokenizers.Tokenizer` with the few calls the app needs (or over a
    SentencePieceBackend, which answers the same calls: core/sentencepiece_tokenizer.py).

    `target`: the decoder-side tokenizer of a sequence-to-sequence model whose target text is cut
    by another model, None when the target side is this tokenizer (T5, BART, every decoder). Marian
    ships source.spm for the source text and target.spm for the target text, with one vocab.json
    (or target_vocab.json beside it): `target` encodes target text with target.spm into those ids,
    as MarianTokenizer(text_target=...) does, and decodes with target.spm."""

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
        # What tokenizer_config.json / special_tokens_map.json declare (see load_tokenizer_folder):
        # name ("bos", "eos", "mask", "unk", ...) -> token string. Empty for a bare tokenizer.json,
        # whose special tokens are then recognised by their usual spellings, as before.
        self.declared_specials: dict[str, str] = {}
        # True when the model expects its BOS token first (add_bos_token, LLaMA-style): encode() never
        # adds it (analysis text is what was typed); with_bos() and encode_for_model() do.
        self.bos_prepended = False
        # The input setting "add the tokenizer's special tokens": encode_for_model (and so every text
        # core.inputs.encode reads, in every panel and command) adds them while this is True (the
        # default, as transformers does); the Model panel's checkbox and --no-special-tokens turn it off.
        self.special_tokens = True
        self.target: Tokenizer | None = None

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path) -> "Tokenizer":
        from .files import file_problem

        path = Path(path)
        problem = file_problem(path)  # (tokenizers' own words made an unreadable file "not a valid tokenizer.json")
        if problem is not None:
            raise TokenizerError(f"{path}: {problem}", path)
        try:
            return cls(HFTokenizer.from_file(str(path)), path)
        except Exception as exc:  # tokenizers raises a bare Exception with the parser's message
            raise TokenizerError(f"{path}: not a valid tokenizer.json ({exc})", path) from exc

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

    def encode_for_model(self, text: str, special_tokens: bool | None = None) -> tuple[list[int], list[int], str]:
        """`text` as the model reads it: (ids, positions of the special tokens the tokenizer added, what
        added them). With `special_tokens` (default: the switch self.special_tokens) the tokenizer's
        post-processor adds its tokens as transformers' tokenizer(text) does ([CLS] ... [SEP] for BERT,
        <s> ... </s> for RoBERTa, a LLaMA BOS, nothing for GPT-2 or Qwen2); a folder whose
        tokenizer_config.json says add_bos_token gets its BOS first even when the post-processor does
        not add it (never a second one). Without, the ids of the text alone. Never pads or truncates."""
        add = self.special_tokens if special_tokens is None else special_tokens
        try:
            enc = self.tok.encode(text, add_special_tokens=add)
        except Exception as exc:  # tokenizers raises a bare Exception ("WordLevel error: Missing [UNK]...")
            raise TokenizerError(self._cannot_encode(text, exc)) from None
        if not add:
            return list(enc.ids), [], ""
        ids = list(enc.ids)
        added = [i for i, m in enumerate(enc.special_tokens_mask) if m]  # the post-processor's, not typed ones
        how = ["the tokenizer's post-processor"] if added else []
        bos = self.bos_token_id
        if self.bos_prepended and bos is not None and 0 not in added:
            ids, added = [bos, *ids], [0, *(i + 1 for i in added)]
            how.append(f"add_bos_token in {TOKENIZER_CONFIG}")
        return ids, added, " and ".join(how)

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
            piece = self.tok.id_to_token(int(i))
            if s == "":
                s = piece or f"<{int(i)}>"
            elif piece and piece.startswith("\u2581") and not s.startswith(" "):
                s = " " + s  # SentencePiece's word-start mark, which decoding a piece alone drops (GPT-2 keeps its space)
            out.append(s)
        return out

    def special_id(self, name: str) -> int | None:
        declared = self.declared_specials.get(name)
        if declared is not None and self.tok.token_to_id(declared) is not None:
            return self.tok.token_to_id(declared)
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

    @property
    def bos_token_id(self) -> int | None:
        return self.special_id("bos")

    def with_bos(self, ids: list[int]) -> list[int]:
        """`ids` as the model saw them in training: BOS first when the tokenizer prepends it."""
        bos = self.bos_token_id
        if not self.bos_prepended or bos is None or (ids and ids[0] == bos):
            return list(ids)
        return [bos, *ids]


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
    """Byte-level BPE (GPT-2 style) trained on `texts` (any iterable, read once: e.g. a long file's
    pieces from core.inputs.iter_text_file, cut where the pre-tokens are the same) to `vocab_size` tokens."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)  # streamed: a long text may come in pieces
    return Tokenizer(tok)


# -- model folders ---------------------------------------------------------------------------------

TOKENIZER_JSON = "tokenizer.json"
WORDPIECE_VOCAB = "vocab.txt"          # BERT-style WordPiece
BPE_VOCAB, BPE_MERGES = "vocab.json", "merges.txt"  # GPT-2 / RoBERTa-style byte-level BPE
TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP = "tokenizer_config.json", "special_tokens_map.json"
# What BertTokenizer and GPT2Tokenizer assume when no config file names them (used when in the vocabulary).
_BERT_DEFAULTS = {"unk": "[UNK]", "sep": "[SEP]", "pad": "[PAD]", "cls": "[CLS]", "mask": "[MASK]"}
_GPT2_DEFAULTS = {"unk": "<|endoftext|>", "bos": "<|endoftext|>", "eos": "<|endoftext|>"}
# ... and RobertaTokenizer (the same vocab.json + merges.txt files, told apart by the folder's names).
_ROBERTA_DEFAULTS = {"bos": "<s>", "eos": "</s>", "sep": "</s>", "cls": "<s>", "unk": "<unk>", "pad": "<pad>",
                     "mask": "<mask>"}
MODEL_CONFIG = "config.json"
_CONFIG_SPECIALS = {"bos": "bos_token", "eos": "eos_token", "unk": "unk_token", "mask": "mask_token",
                    "pad": "pad_token", "cls": "cls_token", "sep": "sep_token"}


def _read_json_object(path: Path) -> dict:
    """tokenizer_config.json, special_tokens_map.json: through read_json's cap (a 2 GB one is refused unread), a
    key given twice keeping its last value as transformers reads them (files.read_json's duplicates)."""
    from .files import JsonFileError, read_json

    if not path.is_file():
        return {}
    try:
        d = read_json(path, duplicates=True)
    except JsonFileError as exc:
        raise TokenizerError(str(exc), path) from None
    if not isinstance(d, dict):
        raise TokenizerError(f"{path}: expected a JSON object", path)
    return d


def _token_text(value) -> str | None:
    """A special token as the config files write it: "[MASK]" or {"content": "[MASK]", ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _folder_settings(folder: Path) -> tuple[dict, dict[str, str]]:
    """(tokenizer_config.json, the special tokens it and special_tokens_map.json declare).
    tokenizer_config.json wins where both name one, as in transformers."""
    config = _read_json_object(folder / TOKENIZER_CONFIG)
    specials: dict[str, str] = {}
    for source in (_read_json_object(folder / SPECIAL_TOKENS_MAP), config):
        for name, key in _CONFIG_SPECIALS.items():
            text = _token_text(source.get(key))
            if text is not None:
                specials[name] = text
    return config, specials


def _add_shipped_specials(tok: HFTokenizer, specials: dict[str, str], config: dict, where: Path) -> None:
    """Declared special tokens that are in the vocabulary become special (never split, e.g.
    "[MASK]" or "<|endoftext|>" typed in the text); added_tokens_decoder entries beyond the
    vocabulary are appended, and must land on the id the file gives them."""
    vocab = tok.get_vocab(with_added_tokens=True)
    present = [t for t in dict.fromkeys(specials.values()) if t in vocab]
    if present:
        tok.add_special_tokens(present)
    added = config.get("added_tokens_decoder")
    if not isinstance(added, dict):
        return
    for key, entry in sorted(added.items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else -1):
        text = _token_text(entry)
        if text is None or not str(key).isdigit():
            continue
        if tok.token_to_id(text) is None:
            token = AddedToken(text, special=bool(entry.get("special", False)), normalized=False)
            (tok.add_special_tokens if token.special else tok.add_tokens)([token])
        if tok.token_to_id(text) != int(key):
            raise TokenizerError(f"{where}: added token {text!r} has id {tok.token_to_id(text)} in the vocabulary, "
                                 f"but {key} in {TOKENIZER_CONFIG}", where)


def wordpiece_tokenizer(vocab_file: Path, config: dict, specials: dict[str, str]) -> HFTokenizer:
    """A BERT vocab.txt as BertTokenizer (and DistilBertTokenizer) reads it: BERT normalizer (lowercase
    and accent stripping from do_lower_case), BERT pre-tokenizer, WordPiece with ## continuations,
    and the post-processor [CLS] x [SEP]."""
    try:
        vocab = models.WordPiece.read_file(str(vocab_file))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception
        raise TokenizerError(f"{vocab_file}: not a readable WordPiece vocabulary ({exc})", vocab_file) from None
    if not vocab:
        raise TokenizerError(f"{vocab_file}: empty vocabulary", vocab_file)
    unk = specials.get("unk", "[UNK]")
    lower = bool(config.get("do_lower_case", True))
    strip = config.get("strip_accents")  # None: strip when lowercasing, as BertTokenizer does
    tok = HFTokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, lowercase=lower, strip_accents=strip,
                                                handle_chinese_chars=bool(config.get("tokenize_chinese_chars", True)))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    cls, sep = specials.get("cls", "[CLS]"), specials.get("sep", "[SEP]")
    if cls in vocab and sep in vocab:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    return tok


def byte_bpe_tokenizer(vocab_file: Path, merges_file: Path, config: dict,
                       roberta_specials: dict[str, str] | None = None) -> HFTokenizer:
    """vocab.json + merges.txt as GPT-2 and RoBERTa ship them: byte-level BPE, no prefix space
    unless tokenizer_config.json says add_prefix_space. GPT-2 adds no special tokens; RoBERTa
    (`roberta_specials`: its cls and sep) puts <s> ... </s> around a text, as RobertaTokenizer does."""
    try:
        vocab, merges = models.BPE.read_file(str(vocab_file), str(merges_file))
        bpe = models.BPE(vocab, merges)  # checks every merge against the vocabulary
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception
        raise TokenizerError(f"{vocab_file.parent}: {BPE_VOCAB} + {BPE_MERGES} are not a readable BPE "
                             f"vocabulary ({exc})", merges_file) from None
    tok = HFTokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=bool(config.get("add_prefix_space", False)))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    if roberta_specials is not None:
        cls, sep = roberta_specials["cls"], roberta_specials["sep"]
        if cls in vocab and sep in vocab:
            tok.post_processor = processors.RobertaProcessing(
                (sep, vocab[sep]), (cls, vocab[cls]), trim_offsets=False,
                add_prefix_space=bool(config.get("add_prefix_space", False)))
    return tok


def _is_roberta(folder: Path, config: dict) -> bool:
    """Whether vocab.json + merges.txt are RoBERTa's or BART's (not GPT-2's), as AutoTokenizer decides: the
    tokenizer_class of tokenizer_config.json, else the model_type of config.json."""
    cls = config.get("tokenizer_class")
    if isinstance(cls, str):  # BartTokenizer is RobertaTokenizer's twin: the same specials, <s> ... </s>
        return cls.lower().startswith(("roberta", "bart"))
    try:
        model_type = _read_json_object(folder / MODEL_CONFIG).get("model_type")
    except TokenizerError:  # a broken config.json is the model loader's to report, not the tokenizer's
        return False
    return model_type in ("roberta", "bart")


def load_tokenizer_folder(folder: str | Path) -> Tokenizer | None:
    """The tokenizer a model folder ships, or None when it ships none.

    tokenizer.json first (as before); else vocab.txt (WordPiece); else vocab.json + merges.txt
    (byte-level BPE); else a SentencePiece model (source.spm + target.spm + vocab.json: Marian;
    spiece.model: T5; tokenizer.model: Llama; see core.sentencepiece_tokenizer).
    tokenizer_config.json / special_tokens_map.json name the BOS, EOS, mask, unknown ... tokens and
    whether BOS is prepended (add_bos_token). Raises TokenizerError naming the file."""
    folder = Path(folder)
    config, specials = _folder_settings(folder)
    if (folder / TOKENIZER_JSON).is_file():
        tokenizer = Tokenizer.from_file(folder / TOKENIZER_JSON)
    elif (folder / WORDPIECE_VOCAB).is_file():
        specials = {**_BERT_DEFAULTS, **specials}
        hf = wordpiece_tokenizer(folder / WORDPIECE_VOCAB, config, specials)
        _add_shipped_specials(hf, specials, config, folder / TOKENIZER_CONFIG)
        tokenizer = Tokenizer(hf, folder / WORDPIECE_VOCAB)
    elif (folder / BPE_VOCAB).is_file() and (folder / BPE_MERGES).is_file():
        roberta = _is_roberta(folder, config)
        specials = {**(_ROBERTA_DEFAULTS if roberta else _GPT2_DEFAULTS), **specials}
        hf = byte_bpe_tokenizer(folder / BPE_VOCAB, folder / BPE_MERGES, config, specials if roberta else None)
        _add_shipped_specials(hf, specials, config, folder / TOKENIZER_CONFIG)
        tokenizer = Tokenizer(hf, folder / BPE_VOCAB)
    else:
        from .sentencepiece_tokenizer import SentencePieceError, load_sentencepiece_folder  # imported when needed

        try:
            found = load_sentencepiece_folder(folder, config, specials, _token_text)
        except SentencePieceError as exc:
            raise TokenizerError(str(exc), exc.path) from None
        if found is None:
            return None
        tokenizer, specials = Tokenizer(found.backend, found.backend.source), found.specials
        if found.target is not None:  # Marian: target.spm for the target text
            tokenizer.target = Tokenizer(found.target, found.target.source)
            tokenizer.target.declared_specials = specials
    tokenizer.declared_specials = specials
    tokenizer.bos_prepended = bool(config.get("add_bos_token", False)) and tokenizer.bos_token_id is not None
    return tokenizer
