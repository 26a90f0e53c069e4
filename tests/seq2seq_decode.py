"""An encoder-decoder's ids after its start token, as the tests compare them with transformers' generate:
greedy_decode from core.seq2seq.greedy_batch (the batched greedy path training evaluates with), beam_decode
by the app's one beam search (core/generation/search.py, through a GenerationSession).

These lived in core/seq2seq.py; only tests used them (issue 39).
"""
from __future__ import annotations

from dataclasses import replace

from desktop_app.core.generation import GenerationSession, GenerationSettings
from desktop_app.core.generation_rules import GenerationRules
from desktop_app.core.seq2seq import greedy_batch


def _ends(eos_id, rules: GenerationRules) -> tuple[int, ...]:
    """eos_id (None: every end token of the rules)."""
    return (int(eos_id),) if eos_id is not None else tuple(rules.eos_ids)


def greedy_decode(model, src_ids, max_new: int, *, eos_id: int | None = None, banned_ids=(),
                  rules: GenerationRules | None = None) -> list[int]:
    """The most likely token at each step, up to max_new of them or through eos_id (included; None: never
    stop early), never one of banned_ids (greedy_batch's first row, cut after its first end token)."""
    out = greedy_batch(model, src_ids, max_new, eos_id=eos_id, banned_ids=banned_ids, rules=rules)[0].tolist()
    ends = _ends(eos_id, rules or GenerationRules())
    stop = next((i for i, t in enumerate(out) if t in ends), None)
    return out if stop is None else out[:stop + 1]


def beam_decode(model, src_ids, max_new: int, num_beams: int, *, eos_id: int | None = None,
                length_penalty: float = 1.0, early_stopping: bool | str = False, banned_ids=(),
                rules: GenerationRules | None = None) -> list[int]:
    """The best hypothesis of the session's beam search over max_new steps (eos_id, else the rules' end
    tokens, end a hypothesis; banned_ids as one-token bad_words_ids)."""
    if max_new == 0:
        return []
    rules = rules or GenerationRules()
    if banned_ids:
        rules = replace(rules, bad_words_ids=rules.bad_words_ids + tuple((int(b),) for b in banned_ids))
    settings = GenerationSettings("beam", beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping)
    session = GenerationSession(model, [int(t) for t in src_ids], settings, stop_tokens=list(_ends(eos_id, rules)),
                                record=False, rules=rules, max_length=1 + max_new)
    for _ in session.run(max_new):
        pass
    return session.ids()[1:]
