"""What a model folder's generation_config.json says about the ids generation writes (Qt-free).

transformers' `model.generate(ids, do_sample=False, max_new_tokens=N)` reads generation_config.json
(or, when the folder has none, the generation fields of config.json: GenerationConfig.from_model_config)
and then, besides the model's own logits:
  - stops at every id of its eos_token_id (an int or a list: Llama-3.x-Instruct's [128001, 128008,
    128009], Qwen2.5-Instruct's [151645, 151643], Gemma-3-it's [1, 106]);
  - applies its logits processors, in this order (generation/utils.py _get_logits_processor):
    repetition_penalty, no_repeat_ngram_size, bad_words_ids, min_length, forced_bos_token_id,
    forced_eos_token_id (at max_length - 1), suppress_tokens, begin_suppress_tokens, then
    renormalize_logits (a log-softmax). Greedy search applies them to the raw logits, beam search to
    the log-softmax of the logits.
GenerationRules carries exactly those, and `process` applies them as generate does. What the file says
about sampling and the search itself (do_sample, temperature, top_k, top_p, num_beams, length_penalty,
early_stopping) is deliberately NOT taken: the app's own settings rule sampling and the strategy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from .files import JsonFileError, read_json

GENERATION_CONFIG = "generation_config.json"


@dataclass(frozen=True)
class GenerationRules:
    eos_ids: tuple[int, ...] = ()  # every end token (empty: the session's own default)
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    min_length: int = 0
    forced_bos_token_id: int | None = None
    forced_eos_token_id: tuple[int, ...] = ()
    max_length: int | None = None  # where forced_eos applies when the caller gives no length
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    renormalize_logits: bool = False
    source: str = ""  # the file these came from ("" : none)
    problem: str = ""  # one line when the file could not be used (then only config.json's end tokens)
    ignored: tuple[str, ...] = field(default=())  # the file's sampling/search fields the app does not take
    # fields that change generate's ids but are not applied here (rare in shipped checkpoints): named, never silent
    unsupported: tuple[str, ...] = field(default=())

    @property
    def changes_logits(self) -> bool:
        return bool(self.bad_words_ids or self.min_length > 0 or self.forced_bos_token_id is not None
                    or self.forced_eos_token_id or self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0
                    or self.suppress_tokens or self.begin_suppress_tokens or self.renormalize_logits)

    @property
    def needs_ids(self) -> bool:
        """Whether `process` reads the sequence itself (not only its length)."""
        return (self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0
                or any(len(w) > 1 for w in self.bad_words_ids))

    def describe(self) -> str:
        """One line: the end tokens and the constraints in use, and where they come from."""
        parts = [f"stop ids {list(self.eos_ids)}" if self.eos_ids else "stop ids: the model's default"]
        for name in ("bad_words_ids", "min_length", "forced_bos_token_id", "forced_eos_token_id", "max_length",
                     "repetition_penalty", "no_repeat_ngram_size", "suppress_tokens", "begin_suppress_tokens",
                     "renormalize_logits"):
            value = getattr(self, name)
            if value != getattr(_NONE, name):
                parts.append(f"{name} {_plain(value)}")
        if self.unsupported:
            parts.append(f"not applied: {', '.join(self.unsupported)}")
        return ", ".join(parts) + (f" (from {self.source})" if self.source else "")

    def process(self, scores: torch.Tensor, cur_len: int, ids: Callable[[], Sequence[int]], *,
                begin_index: int, max_length: int | None = None) -> torch.Tensor:
        """generate's processors on one row of scores [V] (raw logits for greedy, log-probs for beam):
        cur_len is the length of the sequence so far (a decoder's prompt included; an encoder-decoder's
        [start] + target), ids() that sequence (called only when needed), begin_index generate's
        begin_suppress index, max_length the caller's (prompt + max_new; None: this file's)."""
        if not self.changes_logits:
            return scores
        scores = scores.clone()
        seq = list(ids()) if self.needs_ids else None
        if self.repetition_penalty != 1.0:
            idx = torch.tensor(sorted(set(seq)), dtype=torch.long)
            s = scores[idx]
            scores[idx] = torch.where(s < 0, s * self.repetition_penalty, s / self.repetition_penalty)
        n = self.no_repeat_ngram_size
        if n > 0 and cur_len + 1 >= n:
            prev = tuple(seq[cur_len + 1 - n:cur_len])
            banned = {seq[i + n - 1] for i in range(cur_len - n + 1) if tuple(seq[i:i + n - 1]) == prev}
            if banned:
                scores[list(banned)] = -math.inf
        for word in self.bad_words_ids:
            if len(word) == 1 or (seq is not None and len(seq) >= len(word) - 1
                                  and tuple(seq[len(seq) - len(word) + 1:]) == word[:-1]):
                scores[word[-1]] = -math.inf
        if self.min_length > 0 and cur_len < self.min_length and self.eos_ids:
            scores[list(self.eos_ids)] = -math.inf
        if self.forced_bos_token_id is not None and cur_len == 1:
            scores = torch.full_like(scores, -math.inf)
            scores[self.forced_bos_token_id] = 0
        limit = self.max_length if max_length is None else max_length
        if self.forced_eos_token_id and limit is not None and cur_len == limit - 1:
            scores = torch.full_like(scores, -math.inf)
            scores[list(self.forced_eos_token_id)] = 0
        if self.suppress_tokens:
            scores[list(self.suppress_tokens)] = -math.inf
        if self.begin_suppress_tokens and cur_len == begin_index:
            scores[list(self.begin_suppress_tokens)] = -math.inf
        if self.renormalize_logits:
            scores = torch.log_softmax(scores, dim=-1)
        return scores

    def begin_index(self, prompt_length: int) -> int:
        """generate's begin_suppress_tokens index for a sequence that starts with prompt_length tokens."""
        return prompt_length + (1 if prompt_length == 1 and self.forced_bos_token_id is not None else 0)


_NONE = GenerationRules()


def _plain(value):
    """Tuples (of tuples) as the JSON lists the file wrote."""
    return [_plain(v) for v in value] if isinstance(value, tuple) else value
_SAMPLING = ("do_sample", "temperature", "top_k", "top_p", "num_beams", "length_penalty", "early_stopping")
_UNSUPPORTED = ("min_new_tokens", "sequence_bias", "encoder_repetition_penalty", "encoder_no_repeat_ngram_size",
                "exponential_decay_length_penalty", "remove_invalid_values")


def _unsupported(d: dict) -> tuple[str, ...]:
    return tuple(k for k in _UNSUPPORTED if d.get(k) not in (None, 0, 1, 1.0, False))


class _Bad(ValueError):
    pass


def _id(v, name: str, vocab: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab:
        raise _Bad(f"{name!r} must be a token id in 0..{vocab - 1}, got {v!r}")
    return v


def _ids(v, name: str, vocab: int) -> tuple[int, ...]:
    """An int or a list of ints (None: none)."""
    if v is None:
        return ()
    if isinstance(v, list):
        return tuple(_id(x, name, vocab) for x in v)
    return (_id(v, name, vocab),)


def _fields(d: dict, vocab: int, eos_fallback: tuple[int, ...]) -> dict:
    out: dict = {}
    eos = _ids(d.get("eos_token_id"), "eos_token_id", vocab)
    out["eos_ids"] = eos or eos_fallback
    bad = d.get("bad_words_ids")
    if bad is not None:
        if not isinstance(bad, list) or not all(isinstance(w, list) and w for w in bad):
            raise _Bad(f"'bad_words_ids' must be a list of non-empty lists of token ids, got {bad!r}")
        words = tuple(tuple(_id(x, "bad_words_ids", vocab) for x in w) for w in bad)
        # generate drops a bad word that is one end token (NoBadWordsLogitsProcessor)
        out["bad_words_ids"] = tuple(w for w in words if not (len(w) == 1 and w[0] in out["eos_ids"]))
    for name in ("min_length", "no_repeat_ngram_size", "max_length"):
        v = d.get(name)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise _Bad(f"{name!r} must be a non-negative integer, got {v!r}")
            out[name] = v
    if d.get("forced_bos_token_id") is not None:
        out["forced_bos_token_id"] = _id(d["forced_bos_token_id"], "forced_bos_token_id", vocab)
    out["forced_eos_token_id"] = _ids(d.get("forced_eos_token_id"), "forced_eos_token_id", vocab)
    for name in ("suppress_tokens", "begin_suppress_tokens"):
        v = d.get(name)
        if v is not None:
            if not isinstance(v, list):
                raise _Bad(f"{name!r} must be a list of token ids, got {v!r}")
            out[name] = _ids(v, name, vocab)
    rp = d.get("repetition_penalty")
    if rp is not None:
        if isinstance(rp, bool) or not isinstance(rp, (int, float)) or not (math.isfinite(rp) and rp > 0):
            raise _Bad(f"'repetition_penalty' must be a positive number, got {rp!r}")
        out["repetition_penalty"] = float(rp)
    rn = d.get("renormalize_logits")
    if rn is not None:
        if not isinstance(rn, bool):
            raise _Bad(f"'renormalize_logits' must be true or false, got {rn!r}")
        out["renormalize_logits"] = rn
    return out


def read_generation_rules(folder: Path, config: dict, vocab_size: int) -> GenerationRules:
    """The rules of a model folder: generation_config.json when there is one, else the generation fields
    of its config.json (`config`, already read), as transformers takes them. A file that cannot be used
    (bad JSON, a field of the wrong type) gives the rules of config.json's end tokens alone, with
    `problem` saying so in one line; loading goes on."""
    try:
        config_eos = _ids(config.get("eos_token_id"), "eos_token_id", vocab_size)
    except _Bad:
        config_eos = ()
    path = folder / GENERATION_CONFIG
    if not path.is_file():
        try:
            return GenerationRules(**_fields(config, vocab_size, ()), source="config.json",
                                   unsupported=_unsupported(config))
        except _Bad as exc:
            return GenerationRules(eos_ids=config_eos, source="config.json",
                                   problem=f"{folder / 'config.json'}: {exc}; generation uses its end tokens only")
    try:
        d = read_json(path)
        if not isinstance(d, dict):
            raise _Bad("expected a JSON object")
        # a generation_config.json without eos_token_id: config.json's (generate would then never stop on
        # an end token; no real checkpoint's file lacks it, and stopping where the model ends is kept)
        fields = _fields(d, vocab_size, config_eos)
    except (JsonFileError, _Bad) as exc:
        why = exc.problem if isinstance(exc, JsonFileError) else str(exc)
        return GenerationRules(eos_ids=config_eos, source="config.json",
                               problem=f"{path}: {why}; ignored: generation stops at config.json's end token "
                                       "and applies no other rule")
    ignored = tuple(k for k in _SAMPLING if k in d)
    return GenerationRules(**fields, source=GENERATION_CONFIG, ignored=ignored, unsupported=_unsupported(d))
