"""Masked filling for encoder (BERT-family) models: each step fills one [MASK] position, most confident first or left to right."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from ..jobs import JobControl
from .sampling import (ContextLengthReached, Distribution, GenerationError, GenerationSettings, in_limits, pick,
                       process_logits)
from .session import _model_of

@dataclass
class FillStep:
    position: int
    token: int
    prob: float  # processed probability when picked
    model_prob: float
    logits: torch.Tensor  # [V] float32 CPU at that position when it was picked
    how: str


class MaskedFillSession:
    """Masked-token prediction for encoder (BERT-family) models.

    The positions in `masked` start as the mask token; each step runs the whole sequence
    (attention is bidirectional: no cache), then fills one masked position: the one whose
    processed distribution has the highest top probability ("confident") or the leftmost
    ("left-to-right"), with the token the strategy picks (greedy or sampling; beam is not offered).
    """

    ORDERS = ("confident", "left-to-right")

    def __init__(self, loaded_or_model, ids: Sequence[int], masked: Sequence[int], mask_token_id: int | None = None,
                 settings: GenerationSettings | None = None, order: str = "confident", seed: int | None = 0,
                 interventions: Sequence | None = None) -> None:
        self.model, self.tokenizer = _model_of(loaded_or_model)
        cfg = self.model.cfg
        if not cfg.lm_head:
            raise GenerationError("this model has no masked-language-model head: it cannot predict tokens")
        if mask_token_id is None and self.tokenizer is not None:
            mask_token_id = self.tokenizer.mask_token_id
        if mask_token_id is None:
            raise GenerationError("no mask token: the tokenizer has no [MASK] and none was given")
        if order not in self.ORDERS:
            raise GenerationError(f"unknown fill order {order!r} (known: {', '.join(self.ORDERS)})")
        self.ids0 = [int(t) for t in ids]
        if len(self.ids0) > cfg.context_length:
            raise ContextLengthReached(f"{len(self.ids0)} tokens exceed the context length {cfg.context_length}")
        bad = sorted(set(int(p) for p in masked) - set(range(len(self.ids0))))
        if bad:
            raise GenerationError(f"mask positions outside the text of {len(self.ids0)} tokens: {bad[:5]}")
        self.masked = sorted(set(int(p) for p in masked))
        self.mask_token_id = int(mask_token_id)
        self.settings = (settings or GenerationSettings()).validated()
        if self.settings.strategy == "beam":
            raise GenerationError("beam search is for decoders; fill masks greedily or by sampling")
        self.order = order
        self.seed = None if seed is None else in_limits("seed", seed)  # 2.5 was seed 2, without a word
        self._generator = torch.Generator(device="cpu")
        # what-if edits (core/interventions.py) every forward applies; "mean" is over the masked text
        self.interventions = None
        if interventions:
            from ..interventions import resolve
            self.interventions = resolve(self.model, self._masked_ids(), [iv.check(cfg) for iv in interventions])
        self.reset()

    def _masked_ids(self) -> list[int]:
        out = list(self.ids0)
        for p in self.masked:
            out[p] = self.mask_token_id
        return out

    def reset(self, seed: int | None = None) -> None:
        """Unfill every mask and reseed (with `seed` when given, like GenerationSession.reset)."""
        if seed is not None:
            self.seed = in_limits("seed", seed)
        self.history: list[FillStep] = []
        self._generator.manual_seed(0 if self.seed is None else int(self.seed))
        self._logits_cache: tuple[tuple[int, ...], torch.Tensor] | None = None

    def ids(self) -> list[int]:
        out = list(self.ids0)
        for p in self.masked:
            out[p] = self.mask_token_id
        for s in self.history:
            out[s.position] = s.token
        return out

    def context_ids(self, position: int) -> list[int]:
        """The sequence whose logits give `position`'s distribution: as it was when that position was
        filled (the fills before it, masks elsewhere), else the current one."""
        done = next((k for k, st in enumerate(self.history) if st.position == position), len(self.history))
        out = self._masked_ids()
        for st in self.history[:done]:
            out[st.position] = st.token
        return out

    @property
    def remaining(self) -> list[int]:
        filled = {s.position for s in self.history}
        return [p for p in self.masked if p not in filled]

    @property
    def finished(self) -> bool:
        return not self.remaining

    def all_logits(self) -> torch.Tensor:
        """Logits [T, V] (float32, CPU) of the current partially filled sequence."""
        key = tuple(self.ids())
        if self._logits_cache is None or self._logits_cache[0] != key:
            with torch.no_grad():
                out = self.model(torch.tensor([key], device=self.model.device), interventions=self.interventions)
            self._logits_cache = (key, out.logits[0].float().cpu())
        return self._logits_cache[1]

    def set_settings(self, settings: GenerationSettings) -> None:
        s = settings.validated()
        if s.strategy == "beam":
            raise GenerationError("beam search is for decoders; fill masks greedily or by sampling")
        self.settings = s

    def cached_logits(self) -> torch.Tensor | None:
        """all_logits() if they are already computed for the current sequence, else None
        (for views that must not run the model themselves)."""
        if self._logits_cache is not None and self._logits_cache[0] == tuple(self.ids()):
            return self._logits_cache[1]
        return None

    def distribution(self, position: int, settings: GenerationSettings | None = None) -> Distribution:
        s = self.settings if settings is None else settings.validated()
        return process_logits(self.all_logits()[position], s.temperature, s.top_k, s.top_p)

    def next_position(self) -> int:
        rem = self.remaining
        if not rem:
            raise GenerationError("every masked position is filled")
        if self.order == "left-to-right":
            return rem[0]
        conf = [float(self.distribution(p).probs.max()) for p in rem]
        return rem[max(range(len(rem)), key=lambda i: conf[i])]  # ties: leftmost

    def step(self) -> FillStep:
        pos = self.next_position()
        dist = self.distribution(pos)
        token, how = pick(dist, self.settings.strategy, self._generator)
        return self._fill(pos, token, dist, how)

    def choose(self, token_id: int, position: int | None = None) -> FillStep:
        pos = self.next_position() if position is None else int(position)
        if pos not in self.remaining:
            raise GenerationError(f"position {pos} is not a masked position still to fill")
        return self._fill(pos, int(token_id), self.distribution(pos), "chosen")

    def back(self) -> None:
        if self.history:
            self.history.pop()

    def with_interventions(self, interventions: Sequence | None, job: JobControl | None = None) -> "MaskedFillSession":
        """The same fills, in the same order, on the model with other what-if edits (None or []: the
        model as trained): each fill's distribution is the new model's. This session is not changed."""
        new = MaskedFillSession(self.model, self.ids0, self.masked, self.mask_token_id, self.settings, self.order,
                                self.seed, interventions=interventions)
        new.tokenizer = self.tokenizer
        new._generator.set_state(self._generator.get_state())
        for st in self.history:
            if job is not None:
                job.check()
            new._fill(st.position, st.token, new.distribution(st.position), st.how)
        return new

    def run(self, n: int, job: JobControl | None = None) -> Iterator[FillStep]:
        n = in_limits("max_new", n, "n")
        for i in range(n):
            if job is not None:
                job.progress(i, n, f"mask {i + 1}/{n}")
            if self.finished:
                return
            yield self.step()

    def _fill(self, pos: int, token: int, dist: Distribution, how: str) -> FillStep:
        s = FillStep(pos, token, float(dist.probs[token]), float(dist.model_probs[token]),
                     self.all_logits()[pos].clone(), how)
        self.history.append(s)
        return s
