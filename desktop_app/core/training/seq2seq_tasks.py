"""Sequence-to-sequence tasks for encoder-decoder models: copy, reverse, sort and a small translation.

An instance is a source sequence and its target. Training uses teacher forcing: the encoder reads the
source, the decoder reads [START] followed by the first i - 1 target tokens and predicts target token i;
the target ends with [END], so greedy decoding knows where to stop. A batch (tasks.Batch) carries
`src` [B, S] (padded with the pad token), `inputs` [B, T] (the decoder's input: [START] + target[:-1])
and `targets` [B, T] (target + [END], IGNORE on padding). Source and target share one word vocabulary
whose first three ids are the specials: <pad> (0), [START] (1, the decoder's start token) and [END]
(2, the end of a target); the task's words follow and [UNK] comes last.

Held-out split: an instance belongs to the validation split when the CRC-32 of its padded source ids
falls in the first fifth of the hash range (tasks.heldout): deterministic, and since the target is a
function of the source, no held-out source (and so no held-out pair) is ever trained on.

Translation: English sentences generated from a small grammar and their French translations. French
puts these adjectives after the noun and agrees them with its gender:
    "the black dog runs"            -> "le chien noir court"
    "a white cow sees the red fox"  -> "une vache blanche voit le renard rouge"
Sentence := NP verb [adverb] | NP transitive-verb NP [adverb]; NP := determiner [adjective] noun.
Every word has one role (determiner, adjective, noun, verb, adverb), so `translate` reads a sentence
word by word; nouns start with a consonant, so French never elides (l').
"""
from __future__ import annotations

from typing import Any

import torch

from .tasks import IGNORE, Batch, Task, TaskError, _keeping, declare_seq2seq_task, word_tokenizer

PAD, START, END = "<pad>", "[START]", "[END]"
SPECIALS = (PAD, START, END)  # ids 0, 1, 2 in every seq2seq task's vocabulary
PAD_ID, START_ID, END_ID = 0, 1, 2

# -- the grammar: (English, French masculine, French feminine) or (English, French, gender) --------

DETERMINERS = (("the", "le", "la"), ("a", "un", "une"), ("this", "ce", "cette"))
ADJECTIVES = (("black", "noir", "noire"), ("white", "blanc", "blanche"), ("red", "rouge", "rouge"),
              ("green", "vert", "verte"), ("blue", "bleu", "bleue"), ("grey", "gris", "grise"),
              ("brown", "brun", "brune"), ("happy", "heureux", "heureuse"), ("sad", "triste", "triste"),
              ("fast", "rapide", "rapide"), ("lazy", "paresseux", "paresseuse"), ("wild", "sauvage", "sauvage"),
              ("tired", "fatigué", "fatiguée"), ("calm", "calme", "calme"))
NOUNS = (("dog", "chien", "m"), ("cat", "chat", "m"), ("horse", "cheval", "m"), ("wolf", "loup", "m"),
         ("fox", "renard", "m"), ("rabbit", "lapin", "m"), ("duck", "canard", "m"), ("boy", "garçon", "m"),
         ("king", "roi", "m"), ("pig", "cochon", "m"), ("fish", "poisson", "m"), ("book", "livre", "m"),
         ("boat", "bateau", "m"), ("hat", "chapeau", "m"),
         ("mouse", "souris", "f"), ("cow", "vache", "f"), ("girl", "fille", "f"), ("woman", "femme", "f"),
         ("frog", "grenouille", "f"), ("goat", "chèvre", "f"), ("turtle", "tortue", "f"), ("queen", "reine", "f"),
         ("hen", "poule", "f"), ("car", "voiture", "f"), ("ball", "balle", "f"), ("house", "maison", "f"))
VERBS = (("runs", "court"), ("sleeps", "dort"), ("sings", "chante"), ("jumps", "saute"), ("swims", "nage"),
         ("walks", "marche"), ("dances", "danse"), ("plays", "joue"), ("laughs", "rit"), ("falls", "tombe"),
         ("waits", "attend"), ("cries", "pleure"))
TRANSITIVE_VERBS = (("sees", "voit"), ("likes", "aime"), ("follows", "suit"), ("watches", "regarde"),
                    ("chases", "chasse"), ("finds", "trouve"), ("eats", "mange"), ("wants", "veut"),
                    ("calls", "appelle"))
ADVERBS = (("quickly", "vite"), ("slowly", "lentement"), ("here", "ici"), ("today", "aujourd'hui"),
           ("often", "souvent"), ("now", "maintenant"), ("well", "bien"), ("quietly", "doucement"))
ADJECTIVE_P, ADVERB_P, TRANSITIVE_P = 0.5, 0.4, 0.5  # how often a noun phrase has an adjective, ...

_ROLE = {**{e: ("det", i) for i, (e, _, _) in enumerate(DETERMINERS)},
         **{e: ("adj", i) for i, (e, _, _) in enumerate(ADJECTIVES)},
         **{e: ("noun", i) for i, (e, _, _) in enumerate(NOUNS)},
         **{e: ("verb", i) for i, (e, _) in enumerate(VERBS)},
         **{e: ("tverb", i) for i, (e, _) in enumerate(TRANSITIVE_VERBS)},
         **{e: ("adv", i) for i, (e, _) in enumerate(ADVERBS)}}
ENGLISH_WORDS = tuple(_ROLE)
FRENCH_WORDS = tuple(dict.fromkeys(
    [w for _, m, f in DETERMINERS for w in (m, f)] + [w for _, m, f in ADJECTIVES for w in (m, f)]
    + [f for _, f, _ in NOUNS] + [f for _, f in VERBS] + [f for _, f in TRANSITIVE_VERBS] + [f for _, f in ADVERBS]))
MAX_SOURCE_WORDS = 8  # det adj noun verb det adj noun adverb
MAX_TARGET_WORDS = 8


def translate(sentence: str) -> str:
    """The grammar's French for an English sentence of the grammar ("the black dog runs" -> "le chien
    noir court"): adjectives move after their noun and agree with its gender. TaskError for a sentence
    the grammar does not make."""
    words = sentence.split()
    out: list[str] = []
    i = 0

    def noun_phrase() -> None:
        nonlocal i
        det = _word(words, i, "det")
        adj = _ROLE.get(words[i + 1], ("", 0)) if i + 1 < len(words) else ("", 0)
        has_adj = adj[0] == "adj"
        noun = _word(words, i + 1 + has_adj, "noun")
        _, fr_noun, gender = NOUNS[noun]
        pick = 1 if gender == "m" else 2
        out.extend([DETERMINERS[det][pick], fr_noun] + ([ADJECTIVES[adj[1]][pick]] if has_adj else []))
        i += 2 + has_adj

    noun_phrase()
    role = _ROLE.get(words[i], ("", 0))[0] if i < len(words) else ""
    if role == "verb":
        out.append(VERBS[_word(words, i, "verb")][1])
        i += 1
    else:
        out.append(TRANSITIVE_VERBS[_word(words, i, "tverb")][1])
        i += 1
        noun_phrase()
    if i < len(words):
        out.append(ADVERBS[_word(words, i, "adv")][1])
        i += 1
    if i != len(words):
        raise TaskError(f"not a sentence of the translation grammar: {sentence!r} (extra words at the end)")
    return " ".join(out)


def _word(words: list[str], i: int, role: str) -> int:
    """The index in its list of words[i], which must have `role`; TaskError otherwise."""
    names = {"det": "a determiner", "adj": "an adjective", "noun": "a noun", "verb": "a verb",
             "tverb": "a verb", "adv": "an adverb"}
    got = _ROLE.get(words[i]) if i < len(words) else None
    if got is None or got[0] != role:
        where = repr(words[i]) if i < len(words) else "the end"
        raise TaskError(f"not a sentence of the translation grammar: {' '.join(words)!r} ({names[role]} "
                        f"expected at word {i + 1}, got {where})")
    return got[1]


def random_sentence(gen: torch.Generator) -> str:
    """One English sentence of the grammar, drawn with `gen`."""
    def pick(options) -> str:
        return options[int(torch.randint(0, len(options), (1,), generator=gen))][0]

    def chance(p: float) -> bool:
        return float(torch.rand((), generator=gen)) < p

    def noun_phrase() -> list[str]:
        return [pick(DETERMINERS)] + ([pick(ADJECTIVES)] if chance(ADJECTIVE_P) else []) + [pick(NOUNS)]

    words = noun_phrase()
    if chance(TRANSITIVE_P):
        words += [pick(TRANSITIVE_VERBS)] + noun_phrase()
    else:
        words.append(pick(VERBS))
    if chance(ADVERB_P):
        words.append(pick(ADVERBS))
    return " ".join(words)


# -- the tasks --------------------------------------------------------------------------------


class Seq2SeqTask(Task):
    """Base of the sequence-to-sequence tasks: instances are padded source id rows; `target_ids(row)`
    gives the target's ids (without [END]). `encoder_decoder` tells the trainer to feed `Batch.src`."""
    encoder_decoder = True
    pad_id, start_id, end_id = PAD_ID, START_ID, END_ID
    max_source = 0  # source tokens at most
    max_target = 0  # target tokens at most, [END] included

    def target_ids(self, src: list[int]) -> list[int]:
        raise NotImplementedError

    def _encode(self, inst: torch.Tensor) -> Batch:
        n = inst.shape[0]
        inputs = torch.full((n, self.max_target), self.pad_id, dtype=torch.long)
        targets = torch.full((n, self.max_target), IGNORE, dtype=torch.long)
        for r, row in enumerate(inst.tolist()):
            tgt = self.target_ids([t for t in row if t != self.pad_id]) + [self.end_id]
            inputs[r, : len(tgt)] = torch.tensor([self.start_id] + tgt[:-1])
            targets[r, : len(tgt)] = torch.tensor(tgt)
        return Batch(inputs, targets, src=inst.long())

    def pair(self, src: str) -> tuple[str, str]:
        """(source, target) as text, for a source typed as words of the task."""
        ids = [i for i in self.tokenizer.encode(src) if i != self.pad_id]
        return src, self.tokenizer.decode(self.target_ids(ids))


class SymbolTask(Seq2SeqTask):
    """copy, reverse or sort of `length` symbols from 0..symbols-1 (no padding: every source has `length`)."""

    def __init__(self, name: str, length: int = 8, symbols: int = 10, **_: Any) -> None:
        if name not in ("copy", "reverse", "sort"):
            raise TaskError(f"unknown sequence-to-sequence symbol task {name!r} (copy, reverse or sort)")
        if length < 1 or symbols < 2:
            raise TaskError(f"task {name}: need length >= 1 and symbols >= 2")
        words = [str(i) for i in range(symbols)]
        super().__init__(name=name, tokenizer=word_tokenizer(words, specials=SPECIALS), seq_len=length + 1,
                         options={"length": length, "symbols": symbols})
        self.length, self.symbols = length, symbols
        self.max_source, self.max_target = length, length + 1

    def _instances(self, n: int, gen: torch.Generator) -> torch.Tensor:
        return torch.randint(0, self.symbols, (n, self.length), generator=gen) + len(SPECIALS)

    def target_ids(self, src: list[int]) -> list[int]:
        if self.name == "copy":
            return list(src)
        if self.name == "reverse":
            return list(reversed(src))
        return sorted(src)


class TranslationTask(Seq2SeqTask):
    """English -> French sentences of the grammar above (translate())."""

    def __init__(self, **_: Any) -> None:
        words = list(dict.fromkeys(ENGLISH_WORDS + FRENCH_WORDS))
        super().__init__(name="translate", tokenizer=word_tokenizer(words, specials=SPECIALS),
                         seq_len=max(MAX_SOURCE_WORDS, MAX_TARGET_WORDS + 1), options={})
        self.max_source, self.max_target = MAX_SOURCE_WORDS, MAX_TARGET_WORDS + 1

    def _instances(self, n: int, gen: torch.Generator) -> torch.Tensor:
        rows = torch.full((n, self.max_source), self.pad_id, dtype=torch.long)
        for r in range(n):
            ids = self.tokenizer.encode(random_sentence(gen))
            rows[r, : len(ids)] = torch.tensor(ids)
        return rows

    def target_ids(self, src: list[int]) -> list[int]:
        return self.tokenizer.encode(translate(self.tokenizer.decode(src)))


# -- their declarations (core.training imports this module after tasks.py: the task list's order) -----


def _declare_symbol_task(name: str) -> None:
    @declare_seq2seq_task(name)  # the decoder task's name, options and defaults (length, symbols)
    def make(options, causal, tokenizer):
        return _keeping(SymbolTask(name, **options), tokenizer)


for _name in ("copy", "reverse", "sort"):
    _declare_symbol_task(_name)


@declare_seq2seq_task("translate")
def _make_translate(options, causal, tokenizer):
    return _keeping(TranslationTask(**options), tokenizer)
