"""Training tasks, generated on the fly, each with a held-out validation split.

A task turns a random generator into batches (inputs [B, T], targets [B, T]); targets hold -100
where nothing is predicted. Positions are aligned: the model's output at position t is scored
against targets[:, t]. Sequence tasks for decoders (copy, reverse, sort, modadd, induction) use
the usual shift (inputs = seq[:-1], targets = seq[1:]) and score only the answer part.

Held-out split: a problem instance belongs to the validation split when the CRC-32 of its tokens
falls in the first fifth of the hash range (`heldout()`); training batches reject those, so the
validation accuracy is measured on instances the model never saw. modadd splits its p^2 pairs by a
seeded permutation instead (the grokking setup), text splits the token stream (last 10% held out).

Motif (lectures): 20 letters from A, B, C, D; the label is the letter right after the last A.
A sequence whose last A is the final letter, or that has no A, has no label: such sequences are
never generated (rejection sampling), so every sample has a label. The label is then never A
(an A after the last A would be a later A), so in practice only B, C, D occur.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from .. import inputs
from ..tokenizer import Tokenizer, char_tokenizer, train_bpe

IGNORE = -100


@dataclass(frozen=True)
class TaskDeclaration:
    """A task: its name, how it is made, and which training options (core.training.options) it reads."""
    name: str
    make: Callable[[dict[str, Any], bool, "Tokenizer | None"], "Task"]  # (options, causal, saved tokenizer)
    options: tuple[str, ...] = ()  # the task options it reads (keys of TrainConfig.task_options): the form shows them
    image: bool = False  # image classification: trains the image families (vit) only
    defaults: dict[str, Any] = field(default_factory=dict)  # its own defaults of shared options (e.g. length)
    baseline: bool = False  # the lectures' MLP baseline (train --baseline mlp) can train on it instead
    # its version for an encoder-decoder model (seq2seq_tasks.py), same signature as `make`; None: none
    seq2seq: Callable[[dict[str, Any], bool, "Tokenizer | None"], "Task"] | None = None
    decoders: bool = True  # decoder-only and encoder models train on it (False: encoder-decoders only, translate)


DECLARED_TASKS: dict[str, TaskDeclaration] = {}  # filled by declare_task, in declaration order: the only list


def declare_task(name: str, options: tuple[str, ...] = (), image: bool = False,
                 defaults: dict[str, Any] | None = None, baseline: bool = False):
    """Decorator: `make(options, causal, tokenizer) -> Task` builds task `name`. The one place a task is
    named: the CLI's --task choices, the Train panel's task combo and its option boxes, make_task and
    task_dimensions all read the declarations."""
    def declare(make):
        DECLARED_TASKS[name] = TaskDeclaration(name, make, tuple(options), image, dict(defaults or {}), baseline)
        return make
    return declare


def declare_seq2seq_task(name: str, options: tuple[str, ...] = (), defaults: dict[str, Any] | None = None):
    """Decorator: `make(options, causal, tokenizer) -> Task` builds task `name` for an encoder-decoder model
    (trained with teacher forcing, seq2seq_tasks.py). A task already declared for decoders (copy, reverse,
    sort) keeps its name, options and defaults and gains this version, which make_task(...,
    encoder_decoder=True) builds; a new name is a task for encoder-decoders only (translate)."""
    def declare(make):
        known = DECLARED_TASKS.get(name)
        if known is not None:
            DECLARED_TASKS[name] = replace(known, seq2seq=make)
        else:
            def decoder_only(opts, causal, tokenizer):
                raise TaskError(f"the {name} task trains an encoder-decoder (sequence to sequence): choose an "
                                "encoder-decoder family (marian or t5)")
            DECLARED_TASKS[name] = TaskDeclaration(name, decoder_only, tuple(options), False, dict(defaults or {}),
                                                   False, make, decoders=False)
        return make
    return declare


def task_names() -> tuple[str, ...]:
    """Every task, in declaration order (a function, so a declaration made after this module was
    imported, e.g. by a test, is seen)."""
    return tuple(DECLARED_TASKS)


def image_task_names() -> tuple[str, ...]:
    return tuple(n for n, d in DECLARED_TASKS.items() if d.image)


class TaskError(ValueError):
    """A task that cannot be built from its options or its data."""


UNK = "[UNK]"


def word_tokenizer(words: list[str], specials: tuple[str, ...] = ()) -> Tokenizer:
    """Whole-word vocabulary (one token per listed word, split on spaces): decodes with spaces.

    `specials` (e.g. the sequence-to-sequence tasks' <pad>, [START], [END]) take the first ids and are
    special tokens (never split, skipped by decode(skip_special_tokens=True)); the words follow.
    [UNK] comes last (the words keep ids 0..n-1 after the specials, which the tasks compute with): a
    word the task never uses, typed into the app, encodes to it instead of failing."""
    vocab = {w: i for i, w in enumerate(dict.fromkeys([*specials, *words]))}
    vocab.setdefault(UNK, len(vocab))
    tok = HFTokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([*specials, UNK])
    return Tokenizer(tok)


def heldout(row: torch.Tensor, fraction: float = 0.2) -> bool:
    """Whether a problem instance belongs to the validation split (a fixed rule of its tokens)."""
    h = zlib.crc32(row.to(torch.int32).numpy().tobytes())
    return h < fraction * 2**32


@dataclass
class Batch:
    inputs: torch.Tensor  # [B, T] long (an encoder-decoder's: the decoder's input)
    targets: torch.Tensor  # [B, T] long, IGNORE where nothing is scored
    src: torch.Tensor | None = None  # [B, S] long: an encoder-decoder's source (seq2seq_tasks.py), else None

    def to(self, device) -> "Batch":
        return Batch(self.inputs.to(device), self.targets.to(device),
                     None if self.src is None else self.src.to(device))

    def rows(self, index) -> "Batch":
        """The batch's rows `index` (a slice or index tensor), source included."""
        return Batch(self.inputs[index], self.targets[index], None if self.src is None else self.src[index])

    def __len__(self) -> int:
        return self.inputs.shape[0]


@dataclass
class Task:
    """Base: subclasses set tokenizer and seq_len and implement `_instances`/`_encode`."""
    name: str = ""
    tokenizer: Tokenizer | None = None
    seq_len: int = 0  # model input length
    options: dict[str, Any] = field(default_factory=dict)
    val_size: int = 512

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    # Synthetic tasks: instances [n, k] -> Batch; split by heldout().
    def _instances(self, n: int, gen: torch.Generator) -> torch.Tensor:
        raise NotImplementedError

    def _encode(self, inst: torch.Tensor) -> Batch:
        raise NotImplementedError

    def _sample(self, n: int, gen: torch.Generator, want_heldout: bool) -> Batch:
        rows: list[torch.Tensor] = []
        tries = 0
        while len(rows) < n:
            cand = self._instances(max(2 * (n - len(rows)), 16), gen)
            rows.extend(r for r in cand if heldout(r) == want_heldout)
            tries += 1
            if tries > 1000:
                raise TaskError(f"task {self.name}: cannot draw {n} instances for this split")
        return self._encode(torch.stack(rows[:n]))

    def train_batch(self, batch_size: int, gen: torch.Generator) -> Batch:
        n_train = self.options.get("n_train")
        if n_train:  # a fixed training set (the lectures' 1,500 samples), drawn with replacement
            if getattr(self, "_pool", None) is None:
                self._pool = self._sample(int(n_train), torch.Generator().manual_seed(20_000), want_heldout=False)
            idx = torch.randint(0, len(self._pool), (batch_size,), generator=gen)
            return self._pool.rows(idx)
        return self._sample(batch_size, gen, want_heldout=False)

    def val_set(self, seed: int = 0) -> Batch:
        """The fixed held-out set (the same for a given seed, across runs and resumes)."""
        gen = torch.Generator().manual_seed(10_000 + seed)
        return self._sample(self.val_size, gen, want_heldout=True)

    def describe(self) -> dict[str, Any]:
        return {"task": self.name, **self.options, "seq_len": self.seq_len, "vocab_size": self.vocab_size}


# -- motif (lectures) ------------------------------------------------------------------------


def motif_label(seq: list[int], a: int = 0) -> int | None:
    """The token right after the last `a`, or None when there is no `a` or it is the last token."""
    last = max((i for i, t in enumerate(seq) if t == a), default=None)
    if last is None or last == len(seq) - 1:
        return None
    return seq[last + 1]


class MotifTask(Task):
    LETTERS = ("A", "B", "C", "D")

    def __init__(self, length: int = 20, n_train: int | None = None, val_size: int = 512, **_: Any) -> None:
        super().__init__(name="motif", tokenizer=word_tokenizer(list(self.LETTERS)), seq_len=length,
                         options={"length": length, "n_train": n_train}, val_size=val_size)
        self.length = length

    def _instances(self, n: int, gen: torch.Generator) -> torch.Tensor:
        x = torch.randint(0, 4, (n, self.length), generator=gen)
        keep = [motif_label(r.tolist()) is not None for r in x]
        return x[torch.tensor(keep, dtype=torch.bool)]

    def _encode(self, inst: torch.Tensor) -> Batch:
        targets = torch.full_like(inst, IGNORE)
        targets[:, -1] = torch.tensor([motif_label(r.tolist()) for r in inst])
        return Batch(inst, targets)  # classification read at the last position


# -- copy / reverse / sort -------------------------------------------------------------------


class SequenceTask(Task):
    """seq | answer, where answer = f(seq); decoders predict the answer after the separator."""

    def __init__(self, name: str, length: int = 8, symbols: int = 10, **_: Any) -> None:
        if length < 1 or symbols < 2:
            raise TaskError(f"task {name}: need length >= 1 and symbols >= 2")
        words = [str(i) for i in range(symbols)] + ["|"]
        super().__init__(name=name, tokenizer=word_tokenizer(words), seq_len=2 * length,
                         options={"length": length, "symbols": symbols})
        self.length, self.symbols, self.sep = length, symbols, symbols

    def answer(self, inst: torch.Tensor) -> torch.Tensor:
        if self.name == "copy":
            return inst
        if self.name == "reverse":
            return inst.flip(-1)
        return inst.sort(-1).values

    def _instances(self, n: int, gen: torch.Generator) -> torch.Tensor:
        return torch.randint(0, self.symbols, (n, self.length), generator=gen)

    def _encode(self, inst: torch.Tensor) -> Batch:
        n, k = inst.shape
        seq = torch.cat([inst, torch.full((n, 1), self.sep), self.answer(inst)], dim=1)  # [n, 2k+1]
        inputs, targets = seq[:, :-1], seq[:, 1:].clone()
        targets[:, : k] = IGNORE  # score only the answer tokens
        return Batch(inputs, targets)


# -- modular addition ------------------------------------------------------------------------


class ModAddTask(Task):
    """'a + b =' -> (a + b) mod p; pairs split once by a seeded permutation (train_fraction)."""

    def __init__(self, p: int = 97, train_fraction: float = 0.5, split_seed: int = 0, **_: Any) -> None:
        if p < 2 or not 0.0 < train_fraction < 1.0:
            raise TaskError("modadd needs p >= 2 and 0 < train_fraction < 1")
        words = [str(i) for i in range(p)] + ["+", "="]
        super().__init__(name="modadd", tokenizer=word_tokenizer(words), seq_len=4,
                         options={"p": p, "train_fraction": train_fraction})
        self.p = p
        pairs = torch.cartesian_prod(torch.arange(p), torch.arange(p))
        perm = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(split_seed))
        n_train = max(1, int(round(train_fraction * len(pairs))))
        self.train_pairs, self.val_pairs = pairs[perm[:n_train]], pairs[perm[n_train:]]

    def _encode(self, pairs: torch.Tensor) -> Batch:
        a, b = pairs[:, 0], pairs[:, 1]
        plus, eq = torch.full_like(a, self.p), torch.full_like(a, self.p + 1)
        inputs = torch.stack([a, plus, b, eq], dim=1)
        targets = torch.full_like(inputs, IGNORE)
        targets[:, -1] = (a + b) % self.p
        return Batch(inputs, targets)

    def train_batch(self, batch_size: int, gen: torch.Generator) -> Batch:
        idx = torch.randint(0, len(self.train_pairs), (batch_size,), generator=gen)
        return self._encode(self.train_pairs[idx])

    def val_set(self, seed: int = 0) -> Batch:
        return self._encode(self.val_pairs)


# -- induction (repeated random sequences) ---------------------------------------------------


class InductionTask(Task):
    """A random sequence repeated twice; the second copy is predictable only by looking back.

    With `min_length` (1 <= min_length <= length), each sequence draws its own half length p in
    [min_length, length] and has 2 x length tokens: 2 x (length - p) random tokens, then p random tokens,
    then the same p again. The repeat then starts at a different offset in each sequence, so no head looking
    a fixed distance back can predict it: only an induction mechanism (find the earlier occurrence of the
    current token, copy the token after it) can. Only the repeat's tokens after its first are scored (its
    first follows the random part, so nothing predicts it; a repeat of 1 token scores none). An instance row is [p, its 2 x length tokens]."""

    def __init__(self, length: int = 16, symbols: int = 32, min_length: int | None = None, **_: Any) -> None:
        if min_length is not None and not 1 <= min_length <= length:
            raise TaskError(f"induction: min_length must be from 1 to length ({length}), got {min_length}")
        words = [str(i) for i in range(symbols)]
        options = {"length": length, "symbols": symbols}
        if min_length is not None:
            options["min_length"] = min_length
        super().__init__(name="induction", tokenizer=word_tokenizer(words), seq_len=2 * length - 1,
                         options=options)
        self.length, self.symbols, self.min_length = length, symbols, min_length

    def _instances(self, n: int, gen: torch.Generator) -> torch.Tensor:
        if self.min_length is None:
            return torch.randint(0, self.symbols, (n, self.length), generator=gen)
        total = 2 * self.length
        p = torch.randint(self.min_length, self.length + 1, (n, 1), generator=gen)
        tokens = torch.randint(0, self.symbols, (n, total), generator=gen)
        pos = torch.arange(total).expand(n, total)
        src = torch.where(pos >= total - p, pos - p, pos)  # the last p tokens copy the p before them
        return torch.cat([p, tokens.gather(1, src)], dim=1)

    def _encode(self, inst: torch.Tensor) -> Batch:
        if self.min_length is None:
            seq = torch.cat([inst, inst], dim=1)
            inputs, targets = seq[:, :-1], seq[:, 1:].clone()
            targets[:, : self.length - 1] = IGNORE  # the first copy is noise; score the repeat
            return Batch(inputs, targets)
        p, seq = inst[:, :1], inst[:, 1:]
        inputs, targets = seq[:, :-1], seq[:, 1:].clone()
        t = torch.arange(targets.shape[1]).expand_as(targets)
        targets[t < seq.shape[1] - p] = IGNORE  # target t is token t + 1: score the repeat after its first token
        return Batch(inputs, targets)


# -- text: causal LM or masked LM ------------------------------------------------------------

MASK = "[MASK]"


def read_text_file(path: str | Path) -> str:
    """The task's UTF-8 text (core.inputs.read_text_file), its errors as TaskError."""
    try:
        return inputs.read_text_file(path)
    except inputs.InputError as exc:
        raise TaskError(str(exc)) from None


def text_pieces(path: str | Path) -> Callable[[], Iterable[str]]:
    """The pieces of a long text file, each time they are asked for (core.inputs.iter_text_file: read
    and tokenized in pieces, never held whole), its errors as TaskError."""
    def pieces() -> Iterator[str]:
        try:
            yield from inputs.iter_text_file(path)
        except inputs.InputError as exc:
            raise TaskError(str(exc)) from None
    return pieces


def text_characters(pieces: Callable[[], Iterable[str]]) -> str:
    """The distinct characters of a text given in pieces, sorted (what char_tokenizer's vocabulary holds)."""
    chars: set[str] = set()
    for piece in pieces():
        chars.update(piece)
    return "".join(sorted(chars))


class TextTask(Task):
    """Language modelling on a text: next token (causal models) or masked tokens (encoders).

    `text` is the text, or a callable returning its pieces (text_pieces(path): a long file is read
    twice in pieces, for the vocabulary and for the ids, and never held whole). The ids are kept
    compact (int16, or int32 for a vocabulary above 32768) and a batch takes only its windows."""

    def __init__(self, text: str | Callable[[], Iterable[str]], tokenizer: str = "char", vocab_size: int = 512,
                 seq_len: int = 128, objective: str = "clm", val_fraction: float = 0.1, mask_prob: float = 0.15,
                 source: str = "<text>", tokenizer_obj: Tokenizer | None = None, **_: Any) -> None:
        if objective not in ("clm", "mlm"):
            raise TaskError(f"unknown text objective {objective!r}")
        pieces = (lambda: [text]) if isinstance(text, str) else text
        if tokenizer_obj is None:
            specials = (MASK,) if objective == "mlm" else ()
            if tokenizer == "char":
                tokenizer_obj = char_tokenizer(text_characters(pieces), specials=specials, unknown=UNK)
            elif tokenizer == "bpe":
                tokenizer_obj = train_bpe(pieces(), vocab_size, specials=("<|endoftext|>",) + specials)
            else:
                raise TaskError(f"unknown tokenizer kind {tokenizer!r} (char or bpe)")
        super().__init__(name="text", tokenizer=tokenizer_obj, seq_len=seq_len,
                         options={"tokenizer": tokenizer, "vocab_size": vocab_size, "objective": objective,
                                  "source": source})
        try:  # the text's own ids (no BOS), as the task always took them
            self._ids_buffer = inputs.encode_text_file(tokenizer_obj, source, pieces=pieces, with_bos=False)
        except inputs.InputError as exc:
            raise TaskError(str(exc)) from None
        dtype = torch.int16 if self._ids_buffer.typecode == "h" else torch.int32
        ids = (torch.frombuffer(self._ids_buffer, dtype=dtype) if len(self._ids_buffer)
               else torch.zeros(0, dtype=dtype))
        n_val = max(int(len(ids) * val_fraction), seq_len + 1)
        if len(ids) - n_val < seq_len + 1:
            raise TaskError(f"{source}: {len(ids)} tokens are too few for a context of {seq_len} "
                            f"(need about {2 * (seq_len + 1) / 1} with the held-out part); use a longer "
                            f"text or a shorter context")
        self.train_ids, self.val_ids = ids[:-n_val], ids[-n_val:]
        self.objective, self.mask_prob = objective, mask_prob
        self.mask_id = tokenizer_obj.special_id("mask") if objective == "mlm" else None

    def _windows(self, ids: torch.Tensor, starts: torch.Tensor, width: int) -> torch.Tensor:
        return torch.stack([ids[s: s + width] for s in starts.tolist()]).long()  # the ids stay compact

    def _make(self, windows: torch.Tensor, gen: torch.Generator) -> Batch:
        if self.objective == "clm":
            return Batch(windows[:, :-1], windows[:, 1:].clone())
        if self.mask_id is None:  # a saved tokenizer (resume) of a run trained next-token
            raise TaskError(f"masked-token training needs a {MASK} token, which the run's tokenizer lacks (it was "
                            "trained next-token): start a new run")
        x = windows[:, :-1].clone()
        chosen = torch.rand(x.shape, generator=gen) < self.mask_prob
        targets = torch.where(chosen, x, torch.full_like(x, IGNORE))
        r = torch.rand(x.shape, generator=gen)
        random_ids = torch.randint(0, self.vocab_size, x.shape, generator=gen)
        x = torch.where(chosen & (r < 0.8), torch.full_like(x, self.mask_id), x)  # BERT's 80/10/10
        x = torch.where(chosen & (r >= 0.8) & (r < 0.9), random_ids, x)
        return Batch(x, targets)

    def train_batch(self, batch_size: int, gen: torch.Generator) -> Batch:
        starts = torch.randint(0, len(self.train_ids) - self.seq_len, (batch_size,), generator=gen)
        return self._make(self._windows(self.train_ids, starts, self.seq_len + 1), gen)

    def val_set(self, seed: int = 0) -> Batch:
        n = len(self.val_ids)
        step = max(1, (n - self.seq_len - 1) // max(1, self.val_size - 1)) if n > self.seq_len + 1 else 1
        starts = torch.arange(0, n - self.seq_len, max(step, self.seq_len // 2 or 1))[: self.val_size]
        return self._make(self._windows(self.val_ids, starts, self.seq_len + 1),
                          torch.Generator().manual_seed(10_000 + seed))


# -- a sample of a task, as text ---------------------------------------------------------------


def sample_text(task: Task, seed: int = 0) -> str:
    """One held-out input of `task` as text its tokenizer encodes back to the same ids: what the app
    shows as the text of a model trained on the task (its own vocabulary, its own length). A
    sequence-to-sequence task's (seq2seq_tasks.py) is a source, without its padding."""
    if task.tokenizer is None:  # an image task (image_tasks.py): its inputs are pixels, not text
        raise TaskError(f"the {task.name} task has images, not text")
    if isinstance(task, TextTask):
        ids = task.val_ids[: task.seq_len]
    else:
        val = task.val_set(seed)
        ids = val.inputs[0] if val.src is None else val.src[0][val.src[0] != getattr(task, "pad_id", -1)]
    return task.tokenizer.decode(ids.tolist())


# -- a task's dimensions, cheaply --------------------------------------------------------------


def task_dimensions(name: str, options: dict[str, Any] | None = None, causal: bool = True) -> tuple[int, int]:
    """(vocabulary size, sequence length) of the task `make_task(name, options, causal)` builds, without
    drawing its data: what a model for it needs (the builder's parameter count). A synthetic task is
    built (milliseconds); the text task reads its file only for a character tokenizer (whose vocabulary
    is the text's characters) and takes a BPE vocabulary at its asked-for size. TaskError when the task
    cannot be built or its text file read."""
    opts = dict(options or {})
    if name != "text":
        task = make_task(name, opts, causal=causal)
        return task.vocab_size, task.seq_len
    seq_len = int(opts.get("seq_len", 128))
    objective = opts.get("objective") or ("clm" if causal else "mlm")
    specials = (MASK,) if objective == "mlm" else ()
    tokenizer = opts.get("tokenizer", "char")
    if tokenizer == "bpe":
        return int(opts.get("vocab_size", 512)), seq_len
    if tokenizer != "char":
        raise TaskError(f"unknown tokenizer kind {tokenizer!r} (char or bpe)")
    path = opts.get("text_file")
    if not path:
        raise TaskError("the text task needs a text file (--text-file)")
    return char_tokenizer(text_characters(text_pieces(path)), specials=specials, unknown=UNK).vocab_size, seq_len


# -- factory ---------------------------------------------------------------------------------


def make_task(name: str, options: dict[str, Any] | None = None, causal: bool = True,
              tokenizer: Tokenizer | None = None, encoder_decoder: bool = False) -> Task:
    """Build a task by name. `causal` says whether the model is a decoder (text: CLM vs MLM);
    `tokenizer` reuses a saved tokenizer (resume) instead of training a new one; `encoder_decoder`
    builds the task's sequence-to-sequence version (declare_seq2seq_task), for an encoder-decoder model."""
    declared = DECLARED_TASKS.get(name)
    if declared is None:
        raise TaskError(f"unknown task {name!r} (known: {', '.join(task_names())})")
    make = declared.make
    if encoder_decoder:
        if declared.seq2seq is None:
            with_seq2seq = ", ".join(n for n, d in DECLARED_TASKS.items() if d.seq2seq is not None)
            raise TaskError(f"the {name} task trains a decoder or an encoder, not an encoder-decoder "
                            f"(encoder-decoder tasks: {with_seq2seq})")
        make = declared.seq2seq
    return make({**declared.defaults, **(options or {})}, causal, tokenizer)


def _keeping(task: Task, tokenizer: Tokenizer | None) -> Task:
    if tokenizer is not None:  # a resumed run keeps the tokenizer its model was built for (maybe without [UNK])
        task.tokenizer = tokenizer
    return task


# -- the built-in tasks (the image tasks are declared in image_tasks.py, the encoder-decoder versions of
# copy, reverse and sort and the translate task in seq2seq_tasks.py) ---------------------------------


@declare_task("motif", options=("length", "n_train"), defaults={"length": 20}, baseline=True)
def _make_motif(options, causal, tokenizer):
    return _keeping(MotifTask(**options), tokenizer)


def _declare_sequence_task(name: str) -> None:
    @declare_task(name, options=("length", "symbols"), defaults={"length": 8, "symbols": 10})
    def make(options, causal, tokenizer):
        return _keeping(SequenceTask(name, **options), tokenizer)


for _name in ("copy", "reverse", "sort"):
    _declare_sequence_task(_name)



@declare_task("modadd", options=("p", "train_fraction"), defaults={"p": 97, "train_fraction": 0.5})
def _make_modadd(options, causal, tokenizer):
    return _keeping(ModAddTask(**options), tokenizer)


@declare_task("induction", options=("length", "symbols", "min_length"), defaults={"length": 16, "symbols": 32})
def _make_induction(options, causal, tokenizer):
    return _keeping(InductionTask(**options), tokenizer)


@declare_task("text", options=("text_file", "tokenizer", "vocab_size"))
def _make_text(options, causal, tokenizer):
    path = options.pop("text_file", None)
    if path is None:
        raise TaskError("the text task needs a text file (--text-file)")
    options.setdefault("objective", "clm" if causal else "mlm")
    if options["objective"] == "clm" and not causal:  # a bidirectional model sees the token it is to predict
        raise TaskError("next-token training (objective clm) needs a causal model; this family's model is "
                        "bidirectional (objective mlm)")
    return TextTask(text_pieces(path), source=str(path), tokenizer_obj=tokenizer, **options)
