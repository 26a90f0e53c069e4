"""The next-token distribution: temperature, top-k and top-p on a step's logits, and the settings that pick a token.

Decoding facts (SOURCES.md): p_i ~ exp(logit_i / T); top-k keeps the k most probable tokens; top-p
keeps the smallest set whose mass reaches p. Temperature never changes top-k's set (ranking is
preserved) but can change top-p's. Ties at a boundary are all kept, so a set depends only on the
probabilities, never on token order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..numbers import GENERATION as LIMITS

STRATEGIES = ("greedy", "sample", "top-k", "top-p", "beam")


EARLY_STOPPING = (False, True, "never")  # transformers' early_stopping modes of beam search


class GenerationError(ValueError):
    """Generation cannot go on (bad settings, wrong kind of model); the message says why."""


def in_limits(name: str, value, called: str | None = None):
    """`value` within LIMITS[name] (numpy's numbers as Python's; an int where a float is asked is taken), else
    GenerationError naming it (as `called` where the argument has another name): "top_p: must be in (0, 1], got 2"."""
    import numbers

    limit = LIMITS[name]
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)
        if limit.kind is float:
            value = float(value)
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = float(value)
    if problem := limit.problem(value):
        raise GenerationError(f"{called or name}: {problem}")
    return value


_TOP_K, _TEMPERATURE = LIMITS["top_k"], LIMITS["temperature"]


class ContextLengthReached(GenerationError):
    """The sequence fills the model's context: no further token can be appended."""


@dataclass
class Distribution:
    """One next-token distribution before and after processing (all [V], float64, CPU)."""
    logits: torch.Tensor  # the model's logits (after the folder's generation rules, if any: generation_rules.py)
    model_probs: torch.Tensor  # softmax(logits): what the model itself says (T = 1, no filter)
    tempered_probs: torch.Tensor  # softmax(logits / T)
    probs: torch.Tensor  # after top-k and top-p, renormalised: what sampling draws from
    kept: torch.Tensor  # bool [V]: tokens that survived top-k and top-p
    temperature: float
    top_k: int
    top_p: float

    @property
    def entropy(self) -> float:
        """Entropy (nats) of the processed distribution."""
        p = self.probs[self.probs > 0]
        return float(-(p * p.log()).sum())

    @property
    def model_entropy(self) -> float:
        p = self.model_probs[self.model_probs > 0]
        return float(-(p * p.log()).sum())

    def top(self, k: int, by: str = "probs") -> list[tuple[int, float]]:
        """The k largest (token, probability) under `by` (probs, tempered_probs or model_probs)."""
        values = getattr(self, by)
        k = min(k, values.numel())
        v, i = torch.topk(values, k)
        return [(int(a), float(b)) for a, b in zip(i, v)]


def top_k_mask(probs: torch.Tensor, k: int) -> torch.Tensor:
    """Tokens among the k most probable: every token with probability >= the k-th largest
    (ties with the k-th are kept). k <= 0 or k >= V keeps everything."""
    if k <= 0 or k >= probs.numel():
        return torch.ones_like(probs, dtype=torch.bool)
    kth = torch.topk(probs, k).values[-1]
    return probs >= kth


def top_p_mask(probs: torch.Tensor, p: float) -> torch.Tensor:
    """Smallest set of most probable tokens whose mass reaches p (ties at the edge kept).

    A token is in when the mass of the strictly more probable tokens is still below p; p >= 1
    keeps everything (even tokens of probability 0)."""
    if not 0.0 < p <= 1.0:
        raise GenerationError(f"top-p must be in (0, 1], got {p}")
    if p >= 1.0:
        return torch.ones_like(probs, dtype=torch.bool)
    sorted_p, order = torch.sort(probs.double(), descending=True)
    before = torch.cumsum(sorted_p, 0) - sorted_p
    keep_sorted = before < p * (1 - 1e-12)  # 1e-12: a sum that equals p up to rounding has reached it
    threshold = sorted_p[keep_sorted].min()
    return probs >= threshold.to(probs.dtype)


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0) -> Distribution:
    """Pure: raw logits [V] -> the distribution a sampler draws from.

    Order as in Hugging Face: temperature, then top-k, then top-p on the tempered probabilities.
    temperature == 0 means greedy: all mass on the most probable token(s). Its numbers as GenerationSettings checks
    them (LIMITS), else GenerationError naming one ("top_k: must be an integer from 0 to ..., got 2.5")."""
    if not (type(top_k) is int and type(temperature) is float and type(top_p) is float  # noqa: E721 - exact types
            and 0 <= top_k <= _TOP_K.hi and 0 <= temperature <= _TEMPERATURE.hi and 0 < top_p <= 1):
        # outside what a checked GenerationSettings holds: a script's own numbers, checked by name (the per-token
        # path passes the settings' numbers, so only the comparisons above run there)
        temperature, top_k, top_p = (in_limits("temperature", temperature), in_limits("top_k", top_k),
                                     in_limits("top_p", top_p))
    logits = logits.detach().reshape(-1).to("cpu", torch.float64)
    V = logits.numel()
    model_probs = torch.softmax(logits, 0)
    if temperature == 0:
        tempered = (logits == logits.max()).double()
        tempered = tempered / tempered.sum()
    elif temperature == 1:
        tempered = model_probs
    else:
        tempered = torch.softmax(logits / temperature, 0)
    filter_k, filter_p = 0 < top_k < V, top_p < 1.0
    if not (filter_k or filter_p):  # nothing to filter: no extra tensor work on the decoding path
        kept = torch.ones(V, dtype=torch.bool)
        probs = tempered
    else:
        kept = top_k_mask(tempered, top_k) & top_p_mask(tempered, top_p)
        probs = torch.where(kept, tempered, torch.zeros_like(tempered))
        probs = probs / probs.sum()
    return Distribution(logits, model_probs, tempered, probs, kept, temperature, top_k, top_p)


def pick(dist: Distribution, strategy: str, generator: torch.Generator) -> tuple[int, str]:
    """(token, how) the strategy picks from the distribution: greedy takes the most likely, the others sample."""
    if strategy == "greedy":  # max(0)'s index: argmax's (the first of tied maxima, a NaN's if any), in half its time
        return int(dist.logits.max(0).indices), "greedy"
    return int(torch.multinomial(dist.probs, 1, generator=generator)), "sampled"


@dataclass
class GenerationSettings:
    strategy: str = "greedy"  # greedy | sample | top-k | top-p | beam
    temperature: float = 1.0
    top_k: int = 0  # 0: off ("top-k" strategy defaults to 40)
    top_p: float = 1.0  # 1: off ("top-p" strategy defaults to 0.9)
    beams: int = 4
    length_penalty: float = 1.0  # beam search: a finished hypothesis scores log p / generated length ** this
    early_stopping: bool | str = False  # beam search: transformers' modes (search.py): False, True or "never"

    def __post_init__(self) -> None:
        """Each number within its LIMITS, else GenerationError naming it ("top_k: must be an integer from 0 to
        1,000,000,000, got -1"), where a script makes the settings."""
        for name in ("temperature", "top_k", "top_p", "beams", "length_penalty"):
            setattr(self, name, in_limits(name, getattr(self, name)))

    def validated(self) -> "GenerationSettings":
        if self.strategy not in STRATEGIES:
            raise GenerationError(f"unknown strategy {self.strategy!r} (known: {', '.join(STRATEGIES)})")
        s = GenerationSettings(**self.__dict__)  # (its numbers checked again: a field may have been set since)
        if s.strategy == "top-k" and s.top_k <= 0:
            s.top_k = 40
        if s.strategy == "top-p" and s.top_p >= 1.0:
            s.top_p = 0.9
        if s.early_stopping not in EARLY_STOPPING:
            raise GenerationError(f"early_stopping must be true, false or 'never', got {s.early_stopping!r}")
        process_logits(torch.zeros(2), s.temperature, s.top_k, s.top_p)  # validates the numbers
        return s
