"""The input layer: token ids typed by a person, UTF-8 text files, and text encoded for a model with
checks against its vocabulary and context length. The CLI, the panels and the benchmarks all read
their inputs through these functions, so every input error reads the same everywhere.

Errors are InputError (a ValueError): one sentence naming the file or the problem; the raw
messages of `tokenizers` ("WordLevel error: ...") and torch ("index out of range in self") never
reach the user.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .tokenizer import Tokenizer, TokenizerError


class InputError(ValueError):
    """Input that cannot be used as given: the message names the file or the problem."""


@dataclass
class EncodedText:
    """Token ids ready for the model, and a sentence to show when they are not the whole text."""
    ids: list[int]
    notice: str = ""  # e.g. the text was longer than the context and only its start is used
    total: int = 0  # tokens in the whole text (len(ids) unless cut at the context length)
    # The special tokens the tokenizer added ([CLS] ... [SEP], <s> ... </s>, BOS): (position, token)
    # in `ids`, and what added them ("the tokenizer's post-processor"); none for bare text or ids.
    specials: list[tuple[int, str]] = field(default_factory=list)
    specials_source: str = ""

    def specials_text(self) -> str:
        """The added special tokens in words: "[CLS] (start), [SEP] (end)"; "" when none."""
        last = len(self.ids) - 1
        return ", ".join(f"{t} ({'start' if p == 0 else 'end' if p == last else f'position {p}'})"
                         for p, t in self.specials)


def parse_token_ids(text: str, what: str = "token ids") -> list[int]:
    """'1, 2, 3', '1 2 3' or '1,2,3' -> [1, 2, 3] (spaces and/or commas)."""
    from .numbers import parse_int

    ids = []
    for part in text.replace(",", " ").split():
        try:
            ids.append(parse_int(part))  # ASCII digits: not '٣' or '1_0', which int() takes
        except ValueError:
            raise InputError(f"{what}: {part!r} is not a token id; give integers separated by spaces "
                             f"or commas") from None
    return ids


def read_text_file(path: str | Path) -> str:
    """The text of a UTF-8 file (a byte-order mark is dropped); an empty file is refused."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such text file")
    if not path.is_file():
        raise InputError(f"{path}: not a file")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not text.strip():
        raise InputError(f"{path}: the file is empty")
    return text


def _token_id(i, prefix: str = "") -> int:
    """An integer id as an int (numpy's and torch's integers too); a float, bool or text is refused, where int()
    made 1.5 token 1 and "3" token 3 without a word."""
    import operator

    try:
        if isinstance(i, bool):
            raise TypeError
        return operator.index(i)
    except TypeError:
        raise InputError(f"{prefix}{i!r} is not a token id (an integer)") from None


def check_ids(ids: Sequence[int], vocab_size: int, context_length: int | None = None, *,
              cut: bool = True, tokenizer: Tokenizer | None = None, where: str = "") -> EncodedText:
    """`ids` checked against the vocabulary, and against the context length when one is given:
    longer input is cut to its first `context_length` tokens with a notice (`cut`), or refused.
    `tokenizer`: the ids came from it (a bigger tokenizer than the model says so)."""
    prefix = f"{where}: " if where else ""
    ids = [_token_id(i, prefix) for i in ids]
    bad = sorted({i for i in ids if not 0 <= i < vocab_size})
    if bad:
        which = f"token id {bad[0]}" if len(bad) == 1 else "token ids " + ", ".join(map(str, bad[:5]))
        which += ", ..." if len(bad) > 5 else ""
        verb = "is" if len(bad) == 1 else "are"
        origin = ""
        if tokenizer is not None:
            origin = (f" (the tokenizer has {tokenizer.vocab_size} tokens, the model {vocab_size}: "
                      f"{tokenizer.token_strings(bad[:1])[0]!r} has no embedding)")
        raise InputError(f"{prefix}{which} {verb} out of range, outside the vocabulary of {vocab_size} tokens "
                         f"(0..{vocab_size - 1}){origin}")
    total = len(ids)
    if context_length is not None and total > context_length:
        if not cut:
            raise InputError(f"{prefix}{total} tokens exceed the model's context length {context_length}")
        return EncodedText(ids[:context_length], f"{prefix}the text has {total} tokens; only the first "
                                                 f"{context_length} (the model's context length) are used", total)
    return EncodedText(ids, "", total)


def encode(source, text: str, vocab_size: int | None = None, context_length: int | None = None, *,
           cut: bool = True, where: str = "", special_tokens: bool | None = None) -> EncodedText:
    """`text` as token ids for a model: `source` is a LoadedModel (its tokenizer, and by default its
    vocabulary size and context length) or a Tokenizer. With no `context_length` (and a Tokenizer
    source) every token is kept. `where` names the text in messages (e.g. its file).

    The tokenizer's own special tokens are added as `transformers`' tokenizer(text) adds them and as
    the model saw text in training ([CLS] ... [SEP], <s> ... </s>, a LLaMA BOS; see
    Tokenizer.encode_for_model), unless `special_tokens` (default: the tokenizer's switch, the input
    setting) is False; the result's `specials` says which and where. The tokenizer's own padding and
    truncation never apply; text cut at the context length keeps the special tokens that end it."""
    prefix = f"{where}: " if where else ""
    if isinstance(source, Tokenizer):
        tokenizer = source
    else:
        tokenizer = source.tokenizer
        vocab_size = source.config.vocab_size if vocab_size is None else vocab_size
        context_length = source.config.context_length if context_length is None else context_length
        if tokenizer is None:
            raise InputError(f"{prefix}the model {source.path or source.name}: "
                             f"{getattr(source, 'tokenizer_missing', 'no tokenizer.json')}, so text "
                             f"cannot be tokenized; give token ids instead")
    try:
        ids, added, how = tokenizer.encode_for_model(text, special_tokens)
    except TokenizerError as exc:
        raise InputError(f"{prefix}{exc}") from None
    if vocab_size is None:
        vocab_size = tokenizer.vocab_size
    out = check_ids(ids, vocab_size, context_length, cut=cut, tokenizer=tokenizer, where=where)
    tail = 0  # special tokens that close the text ([SEP], </s>): kept when the text is cut before them
    while tail < len(added) and added[-1 - tail] == len(ids) - 1 - tail:
        tail += 1
    if out.total > len(out.ids) and 0 < tail < len(out.ids):
        keep = len(out.ids) - tail
        out.ids = out.ids[:keep] + ids[-tail:]
        added = [p for p in added if p < keep] + list(range(keep, keep + tail))
        out.notice += f" ({' '.join(tokenizer.token_strings(ids[-tail:]))} kept at the end)"
    out.specials = list(zip(added, tokenizer.token_strings([out.ids[p] for p in added])))
    out.specials_source = how if added else ""
    return out


def encode_text_or_ids(loaded, text: str, *, cut: bool = True) -> EncodedText:
    """What a text box holds, as token ids for `loaded`: its text through the model's tokenizer, or,
    for a model with no tokenizer, token ids typed as '1, 2, 3' or '1 2 3'; checked against the
    vocabulary and context length either way (see encode and check_ids)."""
    if loaded.tokenizer is not None:
        return encode(loaded, text, cut=cut)
    ids = parse_token_ids(text, f"{getattr(loaded, 'tokenizer_missing', 'no tokenizer.json')}, so the text box "
                                f"takes token ids")
    return check_ids(ids, loaded.config.vocab_size, loaded.config.context_length, cut=cut)


def text_file_ids(loaded, path: str | Path) -> "array":
    """Every token id of a UTF-8 text file with a model's tokenizer (no context cut: e.g. the
    Lipschitz sweep takes windows of it), checked against the model's vocabulary. The file is read
    and tokenized in pieces (encode_text_file): memory holds the ids, 2 or 4 bytes each, not the text.
    A BOS comes first where the tokenizer prepends one; the post-processor's closing tokens ([SEP],
    </s>) are not added around a whole file, whose windows are taken from inside it."""
    if loaded.tokenizer is None:
        raise InputError(f"{loaded.path or loaded.name}: {getattr(loaded, 'tokenizer_missing', 'no tokenizer.json')}, "
                         f"so real text cannot be tokenized")
    ids = encode_text_file(loaded.tokenizer, path, loaded.config.vocab_size)
    if not ids:
        raise InputError(f"{path}: the text is empty")
    return ids


# -- long text, in pieces ----------------------------------------------------------------------

TEXT_BLOCK_BYTES = 1 << 20  # read this much of a file at a time
TEXT_PIECE_CHARS = 1 << 18  # and tokenize pieces of about this many characters


def safe_cut(text: str, start: int) -> int:
    """The first index i >= start (and > 0) where `text` may be cut for tokenizing its two sides apart:
    text[i] is a space and text[i - 1] a letter, digit or punctuation; -1 when there is none.

    Before such a space every tokenizer the app uses splits its pre-tokens anyway, and the piece
    after it starts with the space, so none adds a prefix space of its own: a character tokenizer
    (any cut), byte-level BPE (GPT-2's pre-tokenizer regex never joins a non-space to the space after
    it; add_prefix_space adds nothing before a space), BERT's whitespace/punctuation split, and
    SentencePiece's Metaspace (a piece starting with the space starts with its replacement, so
    nothing is prepended). Special tokens written in the text ([MASK], <|endoftext|>) hold no space,
    so no cut splits one. Not covered: a normalizer that prepends to every input (a tokenizer.json
    with a "Prepend" normalizer) and added tokens containing spaces: there a cut may differ from
    the one-shot encoding (encode_text_file then encodes such a tokenizer's text in one piece)."""
    i = start - 1
    while True:
        i = text.find(" ", max(i + 1, 1))
        if i < 0:
            return -1
        prev = text[i - 1]
        if not prev.isspace() and prev.isprintable():
            return i


def iter_text_file(path: str | Path, piece_chars: int | None = None, block_bytes: int | None = None):
    """The text of a UTF-8 file (a byte-order mark dropped) in pieces of about `piece_chars` characters,
    (default TEXT_PIECE_CHARS; read TEXT_BLOCK_BYTES at a time), cut only where safe_cut allows (a
    text without such a place comes as one piece); joined, the pieces
    are read_text_file(path). InputError as read_text_file's: missing, not a file, not UTF-8 (naming
    the byte), unreadable, empty (said after the last piece)."""
    path = Path(path)
    piece_chars = piece_chars or TEXT_PIECE_CHARS
    block_bytes = block_bytes or TEXT_BLOCK_BYTES
    if not path.exists():
        raise InputError(f"{path}: no such text file")
    if not path.is_file():
        raise InputError(f"{path}: not a file")
    offset, carry, pending, seen_text, first = 0, b"", "", False, True
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    with f:
        while True:
            try:
                block = f.read(block_bytes)
            except OSError as exc:
                raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
            data = carry + block
            if first:
                first = False
                if data.startswith(b"\xef\xbb\xbf"):
                    data, offset = data[3:], 3
            cut = len(data)
            if block:  # keep an incomplete UTF-8 sequence at the end for the next block
                back = 0
                while back < min(3, len(data)) and (data[-1 - back] & 0xC0) == 0x80:
                    back += 1
                if back < len(data) and data[-1 - back] >= 0xC0:
                    cut = len(data) - 1 - back
            try:
                pending += data[:cut].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"{path}: not UTF-8 text (byte {offset + exc.start}); save it as UTF-8") from None
            offset += cut
            carry = data[cut:]
            while len(pending) > piece_chars:
                i = safe_cut(pending, piece_chars)
                if i < 0:
                    break
                piece, pending = pending[:i], pending[i:]
                seen_text = seen_text or not piece.isspace()
                yield piece
            if not block:
                break
    if carry:
        raise InputError(f"{path}: not UTF-8 text (byte {offset}); save it as UTF-8")
    if pending:
        seen_text = seen_text or not pending.isspace()
    if not seen_text:
        raise InputError(f"{path}: the file is empty")
    if pending:
        yield pending


def ids_dtype(vocab_size: int) -> str:
    """The smallest array type code for token ids below `vocab_size`: 'h' (2 bytes) or 'i' (4 bytes)."""
    return "h" if vocab_size <= 2**15 else "i"


def _prepends_to_every_input(tokenizer: Tokenizer) -> bool:
    """A normalizer that prepends to every input (safe_cut's exception): such text is encoded whole."""
    import json

    try:
        return '"Prepend"' in json.dumps(json.loads(tokenizer.tok.to_str()).get("normalizer"))
    except (ValueError, TypeError):
        return True


def encode_text_file(tokenizer: Tokenizer, path: str | Path, vocab_size: int | None = None,
                     pieces=None, with_bos: bool = True) -> "array":
    """Every token id of a text file, tokenized piece by piece (iter_text_file; `pieces`, a callable
    returning the pieces, replaces it), in a compact array ('h' or 'i', ids_dtype), checked against
    `vocab_size` (default the tokenizer's). The same ids as encoding the whole text at once (see
    safe_cut); BOS first when the tokenizer prepends it (and `with_bos`), as encode() did for a whole
    file. Memory: the
    ids, and one piece's text and encoding at a time."""
    from array import array

    where = str(path)
    vocab = tokenizer.vocab_size if vocab_size is None else vocab_size
    ids = array(ids_dtype(max(vocab, tokenizer.vocab_size)))
    if with_bos and tokenizer.bos_prepended and tokenizer.bos_token_id is not None:
        ids.append(tokenizer.bos_token_id)
    source = pieces() if pieces is not None else iter_text_file(path)
    if _prepends_to_every_input(tokenizer):
        source = ["".join(source)]
    for piece in source:
        try:
            got = tokenizer.encode(piece)
        except TokenizerError as exc:
            raise InputError(f"{where}: {exc}") from None
        if got and (max(got) >= vocab or min(got) < 0):
            check_ids(got, vocab, tokenizer=tokenizer, where=where)  # raises, naming the ids
        ids.extend(got)
    return ids
