"""Input sources: what a sweep measures its function at, one declaration each.

A source is an `InputSource`: its name (the CLI's --data choice and SweepSpec.data), the label the
panel's combo shows, which functions it can feed ("model": a layer or one of its heads;
"synthetic": a standalone head), what it needs, and its function. The function gets the sweep's
context once (`SourceContext`: the spec, the measured map, the lengths, the radius) and returns the
per-length step n -> (X [K, n, d], estimate or None); a source that already measured its inputs
(the search) returns its estimate, the others leave the measuring to run_sweep.

Adding a source: write its function, declare it with `register_source(InputSource(...))` (below,
or from any module imported before the CLI parser and the panel are built), and test it; the CLI
(--data), the panel's combos and run_sweep pick it up from INPUT_SOURCES.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..jobs import JobControl
from .bounds import _adversarial_head, _construction, head_eigen
from .estimator import SpectralEstimate
from .inputs import ball_inputs, real_inputs, search_adversarial, window_starts
from .measured import AttentionMap

MODEL = "model"  # a model layer's attention sublayer, or one head of it
SYNTHETIC = "synthetic"  # a standalone head (random, or the user's A and V)

LengthInputs = Callable[[int], "tuple[torch.Tensor, SpectralEstimate | None]"]


@dataclass
class SourceContext:
    """What a source's function may read: fixed for the whole sweep."""
    spec: object  # the SweepSpec (model, layer, token_ids, samples, seed, tol, search options)
    fmap: AttentionMap  # the function measured (its d, dtype and device; the search differentiates it)
    lengths: list[int]  # sorted
    radius: float | None  # R, resolved (None only for a source that does not use it)
    job: JobControl | None = None

    def cast(self, X: torch.Tensor) -> torch.Tensor:
        """X on the measured map's device and in its dtype."""
        return X.to(device=self.fmap.W_Q.device, dtype=self.fmap.W_Q.dtype)


@dataclass(frozen=True)
class InputSource:
    name: str  # CLI --data choice; SweepSpec.data for a model, SweepSpec.synthetic_inputs for a synthetic head
    label: str  # the panel's combo text
    functions: tuple[str, ...]  # MODEL and/or SYNTHETIC
    inputs: Callable[[SourceContext], LengthInputs]  # context -> (n -> (X, estimate or None))
    needs_text: bool = False  # windows of real text: fails without token ids
    uses_radius: bool = False  # tokens at radius R (default: observed on real data for a model, 1 synthetic)
    one_input_per_length: bool = False  # ignores the sample count (the panel says so)
    description: str = ""


INPUT_SOURCES: dict[str, InputSource] = {}


def register_source(source: InputSource) -> InputSource:
    """Declare a source (a name already taken is an error: two sources must not share a --data choice)."""
    if source.name in INPUT_SOURCES:
        raise ValueError(f"an input source named {source.name!r} already exists")
    INPUT_SOURCES[source.name] = source
    return source


def sources_for(function: str) -> list[InputSource]:
    """The sources that can feed a model's layer (MODEL) or a synthetic head (SYNTHETIC), in declaration order."""
    return [s for s in INPUT_SOURCES.values() if function in s.functions]


def source_names(function: str) -> tuple[str, ...]:
    return tuple(s.name for s in sources_for(function))


def get_source(name: str, function: str) -> InputSource:
    source = INPUT_SOURCES.get(name)
    if source is None or function not in source.functions:
        known = ", ".join(source_names(function))
        raise ValueError(f"unknown input source {name!r} for a {function} function (known: {known})")
    return source


# -- the sources -----------------------------------------------------------------------------------


def random_ball_inputs(ctx: SourceContext) -> LengthInputs:
    """K inputs per n, tokens uniform in B_R; seeded per n so each length's draw is reproducible."""
    spec = ctx.spec
    return lambda n: (ctx.cast(ball_inputs(spec.samples, n, ctx.fmap.d, ctx.radius, seed=spec.seed + n)), None)


def real_text_windows(ctx: SourceContext) -> LengthInputs:
    """The layer's input on K windows of the text, the same windows for every n."""
    spec, model = ctx.spec, ctx.spec.model
    longest_n = ctx.lengths[-1]
    starts = window_starts(len(spec.token_ids), longest_n, spec.samples)
    longest = None
    stack = {"stack": spec.stack, "source_ids": spec.source_ids} if spec.stack else {}
    if (model.cfg.causal and not spec.stack) or spec.stack in ("decoder", "cross"):
        # causal model (or an encoder-decoder's decoder): a window's first n tokens are processed as the
        # n-token window would be, so one forward pass at the longest length gives every length's inputs
        longest = real_inputs(model, spec.token_ids, spec.layer, longest_n, spec.samples, starts, **stack)

    def at(n: int):
        if longest is not None:
            return ctx.cast(longest[:, :n]), None
        return ctx.cast(real_inputs(model, spec.token_ids, spec.layer, n, spec.samples, starts, **stack)), None

    return at


def adversarial_construction(ctx: SourceContext) -> LengthInputs:
    """The paper's lower-bound construction on the head with the largest gamma; it is x_1 then
    n - 1 equal rows, so every n is a prefix of the longest."""
    fmap = ctx.fmap
    if not isinstance(fmap, AttentionMap):
        raise ValueError("the paper's adversarial construction is for self-attention: measure cross-attention on "
                         "real data or a search")
    construction = _construction(*head_eigen(fmap, _adversarial_head(fmap)), ctx.lengths[-1], ctx.radius)
    construction = construction.to(fmap.W_Q.dtype)
    return lambda n: (ctx.cast(construction[None, :n]), None)


def gradient_search(ctx: SourceContext) -> LengthInputs:
    """Gradient ascent of ||D_X f||_2 on the sphere of radius R, from random tokens or real windows."""
    spec, fmap = ctx.spec, ctx.fmap

    def at(n: int):
        if spec.search_start == "real" and spec.token_ids:
            stack = {"stack": spec.stack, "source_ids": spec.source_ids} if spec.stack else {}
            X0 = real_inputs(spec.model, spec.token_ids, spec.layer, n, spec.samples, **stack)
        else:
            g = torch.Generator().manual_seed(spec.seed + n)
            X0 = torch.randn(spec.samples, n, fmap.d, generator=g)
        return search_adversarial(fmap, ctx.cast(X0), ctx.radius, spec.search_steps, tol=spec.tol, job=ctx.job)

    return at


def image_sequence_length(cfg) -> int:
    """How many tokens a ViT reads: [CLS] + its patches (the longest n image patch data can give)."""
    return 1 + (cfg.image_size // cfg.patch_size) ** 2


def image_layer_inputs(model, layer: int, samples: int) -> torch.Tensor:
    """[K, 1 + patches, d]: a ViT layer's input on K held-out 8 x 8 digits, each whole image in one
    forward pass (pixel values with ViTImageProcessor's defaults, mean = std = 0.5, as the digits task
    trains)."""
    from ..training.image_tasks import digits_split, load_digits, pixel_settings
    from ..vit import preprocess_image

    cfg = model.cfg
    images, _ = load_digits()
    _, held = digits_split(len(images))
    settings = pixel_settings(cfg.image_size, cfg.num_channels)
    pixels = torch.from_numpy(np.stack([preprocess_image(images[i], settings, cfg.num_channels)
                                        for i in held[:samples]]))
    name = f"blocks.{layer}.attn.input"
    _, trace = model.run_with_trace(pixels.to(model.device), names=(name,), compute_logits=False,
                                    stop_at=name)  # nothing after the point changes it
    return trace[name].float()


def image_patch_inputs(ctx: SourceContext) -> LengthInputs:
    """A ViT layer's input on K held-out digits (image_layer_inputs), then for each n the rows of
    [CLS] and n - 1 patches drawn at random (seeded per n and image; sorted, so the patches keep their
    row-by-row order). The tokens carry their position embeddings, so a subset is the same tokens the
    layer sees in the whole image, fewer of them. Lengths beyond [CLS] + patches are refused here: the
    panel skips them first, with a note, as it does lengths longer than a text."""
    spec, model = ctx.spec, ctx.spec.model
    cfg = model.cfg
    if cfg.input_kind != "patches":
        raise ValueError("image patch data needs a vision transformer (ViT): this model reads tokens (use real data)")
    longest = image_sequence_length(cfg)
    patches = longest - 1
    outside = [n for n in ctx.lengths if not 1 <= n <= longest]
    if outside:
        raise ValueError(f"n = {', '.join(map(str, outside))} outside 1 .. {longest}: this ViT reads "
                         f"[CLS] + {patches} patches")
    whole = image_layer_inputs(model, spec.layer, spec.samples)  # [K, 1 + patches, d]

    def at(n: int):
        g = torch.Generator().manual_seed(spec.seed + n)
        cls = torch.zeros(1, dtype=torch.long)
        rows = [torch.cat([cls, 1 + torch.randperm(patches, generator=g)[:n - 1].sort().values]) for _ in whole]
        return ctx.cast(torch.stack([x[r] for x, r in zip(whole, rows)])), None

    return at


# Declaration order is the order of the CLI's choices and the panel's combos.
register_source(InputSource("random", "random in B_R", (SYNTHETIC,), random_ball_inputs, uses_radius=True,
                            description="tokens drawn uniformly in the ball of radius R"))
register_source(InputSource("real", "real", (MODEL,), real_text_windows, needs_text=True,
                            description="windows of real text, traced to the layer's input"))
register_source(InputSource("adversarial", "adversarial", (MODEL, SYNTHETIC), adversarial_construction,
                            uses_radius=True, one_input_per_length=True,
                            description="x_1 = R u, x_2..x_n = R u / 2 (Theorem 3.1's lower-bound construction)"))
register_source(InputSource("search", "search", (MODEL,), gradient_search, uses_radius=True,
                            description="gradient ascent of the local constant over inputs on the sphere of radius R"))
register_source(InputSource("image", "image patches", (MODEL,), image_patch_inputs,
                            description="a ViT's [CLS] + n - 1 random patches of held-out digits, at the layer's input"))
