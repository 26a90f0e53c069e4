"""A sweep: the local Lipschitz constant of one function at inputs of every length n, with the
Theorem 3.1 bounds and the fitted growth exponent.

What is measured (a model layer, one of its heads, a synthetic head: `sweep_function`) and on what
(an input source from sources.INPUT_SOURCES) are independent: run_sweep asks the source for each
length's inputs and measures them the same way whatever the source. The CLI and the panel describe
a sweep with plain options and make it with `build_sweep_spec`, and name it with `sweep_label`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from ...threads import one_thread_when_small
from ..jobs import JobControl, report
from ..numbers import MAX_COUNT, MAX_SEED, Range
from .bounds import map_bounds
from .estimator import spectral_norm
from .fit import fit_exponent
from .inputs import real_inputs
from .measured import AttentionMap, layer_map, random_single_head, single_head
from .sources import MODEL, SYNTHETIC, SourceContext, get_source, source_names

DEFAULT_TOL = 1e-4  # relative tolerance of the estimator
DEFAULT_SEED = 0
DEFAULT_SEARCH_STEPS = 30
DEFAULT_SYNTHETIC_D = 16
DEFAULT_SYNTHETIC_RADIUS = 1.0

# every numeric setting's range, declared once: SweepSpec checks them (a script's sweep as the panel's), and
# the lipschitz command's options take them as their argparse types (Number.of)
LIMITS = {"samples": Range(int, 1, 10**6), "layer": Range(int, 0, 10**6), "head": Range(int, 0, 10**6),
          "d": Range(int, 1, 16384), "norm_A": Range(float, 0, 1e6),  # A = 0: uniform attention, still measured
          "norm_V": Range(float, 0, 1e6, lo_open=True), "radius": Range(float, 0, 1e6, lo_open=True),
          "search_steps": Range(int, 0, 10**6), "tol": Range(float, 0, 1, lo_open=True, hi_open=True),
          "seed": Range(int, 0, MAX_SEED)}
LENGTH = Range(int, 2, MAX_COUNT)  # each of `lengths` (the memory a length needs is estimated by the caller)


def data_kinds() -> tuple[str, ...]:
    """SweepSpec.data values: the model's input sources, and "synthetic" for a synthetic head."""
    return source_names(MODEL) + ("synthetic",)


DATA_KINDS = data_kinds()  # as declared when this module loaded; data_kinds() sees later declarations


@dataclass
class SweepSpec:
    """Everything a sweep needs; the CLI and the panel make one with build_sweep_spec and call run_sweep."""
    data: str = "real"  # a model's input source (real | adversarial | search), or synthetic
    lengths: Sequence[int] = (8, 16, 32, 64)
    samples: int = 5
    # model functions
    model: object | None = None
    layer: int = 0
    head: int | None = None
    masked: bool | None = None
    token_ids: Sequence[int] | None = None  # real data (and the default radius of adversarial data)
    # an encoder-decoder's layer: its stack, "encoder" / "decoder" (self-attention) / "cross" (the decoder's
    # cross-attention, a function of the decoder's input with the encoder's output on source_ids held
    # fixed); token_ids are then the encoder's windows (encoder) or the decoder's (decoder, cross)
    stack: str | None = None
    source_ids: Sequence[int] | None = None
    data_name: str = ""  # what the windows were taken from (a file's name, the text's first words), for the label
    # synthetic functions
    d: int = DEFAULT_SYNTHETIC_D
    norm_A: float = 1.0
    norm_V: float = 1.0
    attention: str = "softmax"
    synthetic_adversarial: bool = False
    synthetic_inputs: str | None = None  # a synthetic head's input source; None: adversarial or random by the flag
    matrices: tuple | None = None  # user (A, V), both [d, d], instead of random ones (d, norm_A, norm_V unused)
    matrices_name: str = ""  # where they came from, for the label
    # inputs
    radius: float | None = None  # adversarial / search / synthetic; default: observed on real data
    search_steps: int = DEFAULT_SEARCH_STEPS
    search_start: str = "random"  # random | real
    tol: float = DEFAULT_TOL
    seed: int = DEFAULT_SEED
    label: str = ""

    def __post_init__(self) -> None:
        """Each number within its LIMITS, else ValueError naming it ("samples: must be an integer from 1 to
        1,000,000, got 0"): a script's SweepSpec(samples=0) was a reshape error deep in the estimator, d=0 a
        ZeroDivisionError, radius=inf numpy's "SVD did not converge"."""
        import numbers

        def plain(value):  # numpy's integers as Python's
            return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else value

        for name, limit in LIMITS.items():
            value = plain(getattr(self, name))
            if value is not None and (problem := limit.problem(value)):
                raise ValueError(f"{name}: {problem}")
            setattr(self, name, value)
        if not len(self.lengths):
            raise ValueError("lengths: give at least one length")
        for n in self.lengths:
            if problem := LENGTH.problem(plain(n)):
                raise ValueError(f"lengths: each {problem}")

    @property
    def function(self) -> str:
        """What is measured: sources.SYNTHETIC (a standalone head) or sources.MODEL (a layer or one head)."""
        return SYNTHETIC if self.data == "synthetic" else MODEL

    @property
    def source_name(self) -> str:
        """The input source's name in sources.INPUT_SOURCES."""
        if self.data != "synthetic":
            return self.data
        return self.synthetic_inputs or ("adversarial" if self.synthetic_adversarial else "random")


@dataclass
class LengthResult:
    n: int
    lipschitz: np.ndarray  # [K]
    radius: np.ndarray  # [K] max_i ||x_i|| of each input
    upper_bound: np.ndarray
    lower_bound: np.ndarray
    iterations: np.ndarray


@dataclass
class SweepResult:
    label: str
    lengths: list[LengthResult] = field(default_factory=list)
    exponent: float = float("nan")
    exponent_ci: tuple[float, float] = (float("nan"), float("nan"))
    prefactor: float = float("nan")
    function: str = ""

    def rows(self) -> list[tuple]:
        """(n, sample, lipschitz, radius, upper_bound, lower_bound, iterations) per input."""
        out = []
        for r in self.lengths:
            for s in range(len(r.lipschitz)):
                out.append((r.n, s, float(r.lipschitz[s]), float(r.radius[s]), float(r.upper_bound[s]),
                            float(r.lower_bound[s]), int(r.iterations[s])))
        return out

    def snapshot(self) -> "SweepResult":
        """A copy that later lengths will not change (to hand to another thread)."""
        return SweepResult(self.label, list(self.lengths), self.exponent, tuple(self.exponent_ci), self.prefactor,
                           self.function)

    def refit(self) -> None:
        ns = np.concatenate([np.full(len(r.lipschitz), r.n) for r in self.lengths]) if self.lengths else []
        vals = np.concatenate([r.lipschitz for r in self.lengths]) if self.lengths else []
        self.exponent, self.exponent_ci, self.prefactor = fit_exponent(ns, vals)






MAX_GEOM_COUNT = 1000  # geom:LO:HI:COUNT points: more is a typo (1e9 points took 8 GB before a word)


def parse_lengths(text: str) -> list[int]:
    """'8,16,32' or 'geom:2:512:10' (geometric, rounded, distinct) -> sorted lengths >= 2."""
    from ..numbers import parse_int  # ASCII digits: not '٣' or '1_0', which int() takes

    text = text.strip()
    try:
        if text.startswith("geom:"):
            _, lo, hi, count = text.split(":")
            lo, hi, count = parse_int(lo), parse_int(hi), parse_int(count)
            if lo < 2 or hi < lo or not 1 <= count <= MAX_GEOM_COUNT:
                raise ValueError(f"lengths geom:LO:HI:COUNT needs 2 <= LO <= HI and COUNT from 1 to "
                                 f"{MAX_GEOM_COUNT}, got {text!r}")
            vals = np.geomspace(lo, hi, count)
            out = sorted({int(round(v)) for v in vals})
        else:
            out = sorted({parse_int(x) for x in text.replace(" ", "").split(",") if x})
    except ValueError as exc:
        if str(exc).startswith("lengths geom:"):
            raise
        raise ValueError(f"lengths must be comma-separated integers or geom:LO:HI:COUNT, got {text!r}") from None
    if not out or out[0] < 2:
        raise ValueError(f"lengths must be integers >= 2, got {text!r}")
    return out


# -- from plain options: the one way the CLI and the panel describe a sweep ---------------------------

_SPEC_FIELDS = {f.name for f in fields(SweepSpec)}


def build_sweep_spec(options: Mapping[str, object]) -> SweepSpec:
    """The SweepSpec a dict of plain options describes (a missing option takes SweepSpec's default,
    None counts as missing for d, norm_A, norm_V, tol, seed and search_steps).

    options["function"]: "model" (a layer, or one head with "head") or "synthetic"; options["data"]:
    the input source's name (sources.INPUT_SOURCES) for that function. Every other key is a
    SweepSpec field. With "matrices" (the user's A and V) d is theirs. Raises ValueError for an
    unknown option or a source that cannot feed the function.
    """
    options = dict(options)
    function = options.pop("function", MODEL)
    if function not in (MODEL, SYNTHETIC):
        raise ValueError(f"unknown function {function!r} (known: {MODEL}, {SYNTHETIC})")
    unknown = sorted(set(options) - _SPEC_FIELDS - {"data"})
    if unknown:
        raise ValueError(f"unknown sweep option(s): {', '.join(unknown)}")
    for name in ("d", "norm_A", "norm_V", "tol", "seed", "search_steps"):
        if options.get(name, 0) is None:
            del options[name]
    source = get_source(str(options.pop("data", "real" if function == MODEL else "random")), function)
    if function == SYNTHETIC:
        options.update(data="synthetic", synthetic_inputs=source.name,
                       synthetic_adversarial=source.name == "adversarial", model=None)
        if options.get("matrices") is not None:
            options["d"] = int(options["matrices"][0].shape[0])
        options["masked"] = bool(options.get("masked"))
    else:
        options["data"] = source.name
    return SweepSpec(**options)


def sweep_label(spec: SweepSpec, model_name: str | None = None) -> str:
    """What a run is called, in one form for the CLI's JSON and the panel's legend and table: the
    model's name leads when known (runs of several models overlay on one plot), a synthetic head's
    matrices file and non-zero seed are named, what real windows were read from (spec.data_name,
    e.g. a file's name) too, and only a mask is said ("demo-model L0 H1 real",
    "L0 H1 real masked", "synthetic l2 d=8 av.npz adversarial seed 3 masked").
    """
    source = spec.source_name
    if spec.function == SYNTHETIC:
        d = int(spec.matrices[0].shape[0]) if spec.matrices is not None else spec.d
        matrices = f" {spec.matrices_name or 'user A,V'}" if spec.matrices is not None else ""
        seed = f" seed {spec.seed}" if spec.seed else ""
        return f"synthetic {spec.attention} d={d}{matrices} {source}{seed}" + (" masked" if spec.masked else "")
    head = "" if spec.head is None else f" H{spec.head}"
    default_mask = spec.model.cfg.causal if not spec.stack else spec.stack == "decoder"  # as layer_map resolves it
    masked = default_mask if spec.masked is None else spec.masked
    name = f"{model_name} " if model_name else ""
    reads_text = get_source(source, MODEL).needs_text or (source == "search" and spec.search_start == "real")
    data = f" {spec.data_name}" if spec.data_name and reads_text else ""
    stack = f"{spec.stack} " if spec.stack else ""
    return f"{name}{stack}L{spec.layer}{head} {source}{data}" + (" masked" if masked and spec.stack != "cross" else "")


# -- running -------------------------------------------------------------------------------------


def sweep_function(spec: SweepSpec) -> AttentionMap:
    """The function a spec measures: a synthetic head (random, or the user's A and V), else the
    model's layer or one of its heads."""
    if spec.data == "synthetic" or spec.model is None:
        if spec.matrices is not None:
            A, V = (torch.as_tensor(m).to(torch.float64) for m in spec.matrices)
            fmap = single_head(A, V, spec.attention, bool(spec.masked))
            fmap.label = f"single head ({spec.attention}, A and V from {spec.matrices_name or 'the user'})"
            return fmap
        return random_single_head(spec.d, spec.norm_A, spec.norm_V, spec.attention, bool(spec.masked),
                                  seed=spec.seed)
    if spec.stack:
        return layer_map(spec.model, spec.layer, spec.head, spec.masked, stack=spec.stack, source_ids=spec.source_ids)
    return layer_map(spec.model, spec.layer, spec.head, spec.masked)


def observed_radius(spec: SweepSpec) -> float:
    """Typical token norm R at the layer's input: the median over a few windows of each window's
    largest norm, on the spec's text or, without one, on random tokens."""
    model, ids = spec.model, spec.token_ids
    if model.cfg.input_kind == "patches":  # a ViT reads images: the held-out digits' tokens
        from .sources import image_layer_inputs

        X = image_layer_inputs(model, spec.layer, 4)
        return float(torch.linalg.vector_norm(X, dim=-1).amax(-1).median())
    if not ids:
        g = torch.Generator().manual_seed(spec.seed)
        ids = torch.randint(0, model.cfg.vocab_size, (min(model.cfg.context_length, 128),), generator=g).tolist()
    stack = {"stack": spec.stack, "source_ids": spec.source_ids} if spec.stack else {}
    X = real_inputs(model, ids, spec.layer, min(len(ids), 64), 4, **stack)
    return float(torch.linalg.vector_norm(X, dim=-1).amax(-1).median())


def check_sweep_memory(spec: SweepSpec, lengths: Sequence[int] | None = None, what: str = "lengths") -> None:
    """Refuse, before the sweep, a length whose attention Jacobian work cannot fit: about 8 float64
    n x n matrices (the pattern, its derivatives, the estimator's vectors) per head at the longest n."""
    from ..devices import check_memory

    n = max(lengths or spec.lengths)
    heads = 1
    model = spec.model
    if model is not None and spec.head is None:
        heads = model.cfg.n_heads
    d = (model.cfg.d_model if model is not None else
         int(spec.matrices[0].shape[0]) if spec.matrices is not None else spec.d)
    check_memory(8.0 * 8 * heads * n * n + 8.0 * 8 * n * d, f"{what} up to {n}", "for the attention Jacobians")


def run_sweep(spec: SweepSpec, job: JobControl | None = None,
              on_length: Callable[[LengthResult, SweepResult], None] | None = None) -> SweepResult:
    """Local Lipschitz constants for every n in spec.lengths; calls on_length after each n."""
    kinds = data_kinds()
    if spec.data not in kinds:
        raise ValueError(f"unknown data kind {spec.data!r} (known: {', '.join(kinds)})")
    if spec.function == MODEL and spec.model is None:
        raise ValueError(f"data kind {spec.data!r} needs a model")
    source = get_source(spec.source_name, spec.function)
    if source.needs_text and not spec.token_ids:
        raise ValueError(f"{source.name} data needs a text (token ids)")
    check_sweep_memory(spec)  # a script's lengths=[10**6] asked torch for terabytes
    fmap = sweep_function(spec)
    lengths = sorted(int(n) for n in spec.lengths)
    result = SweepResult(label=spec.label or sweep_label(spec), function=fmap.label)
    # the inputs' traces and every product on one thread when the largest length's batch is small
    # (threads.one_thread_when_small: per-op overhead, not work, at that size)
    with one_thread_when_small(spec.samples * lengths[-1] * fmap.d):
        radius = spec.radius
        if source.uses_radius and radius is None:
            radius = DEFAULT_SYNTHETIC_RADIUS if spec.function == SYNTHETIC else observed_radius(spec)
        inputs_at = source.inputs(SourceContext(spec, fmap, lengths, radius, job))
        for i, n in enumerate(lengths):
            report(job, i, len(lengths), f"n = {n}")
            X, est = inputs_at(n)
            if est is None:
                # No warm start from the previous length: padding the previous top vector with small
                # noise starved the new directions and, on the demo model, once stopped 5.5% below
                # sigma_max; a fresh Gaussian start has a component along every direction.
                est = spectral_norm(fmap, X, tol=spec.tol, seed=spec.seed + n, job=job)
            radii = torch.linalg.vector_norm(X, dim=-1).amax(-1).double().cpu().numpy()
            up, lo = map_bounds(fmap, n, radii)
            res = LengthResult(n, est.sigma.double().cpu().numpy(), radii, up, lo, est.iterations.numpy())
            result.lengths.append(res)
            result.refit()
            if on_length is not None:
                on_length(res, result)
    report(job, len(lengths), len(lengths), "done")
    return result
