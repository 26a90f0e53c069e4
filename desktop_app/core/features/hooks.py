"""Where a dictionary reads and writes: TransformerLens hook names mapped onto the app's trace names.

A dictionary trained elsewhere names its activation the way TransformerLens does; the app records
the same activations under its own names (core/trace.py). The map (L = layer):

    TransformerLens name                          app point                    layout
    blocks.L.hook_resid_pre                       embed (L = 0), else blocks.(L-1).resid_post
    blocks.L.hook_resid_mid                       blocks.L.resid_mid           (not on a parallel block)
    blocks.L.hook_resid_post                      blocks.L.resid_post
    blocks.L.hook_attn_out                        blocks.L.attn.out
    blocks.L.hook_mlp_out                         blocks.L.mlp.out
    blocks.L.attn.hook_z (also blocks.L.hook_z)   blocks.L.attn.z              [H, T, d_head] -> [T, H * d_head]
    blocks.L.ln1.hook_normalized                  blocks.L.ln1.normalized      (read only)
    blocks.L.ln2.hook_normalized                  blocks.L.ln2.normalized      (read only)

`ln*.hook_normalized` is, as in TransformerLens, the norm's input normalised BEFORE its gain and bias:
(x - mean) / sqrt(var + eps) for a LayerNorm, x / sqrt(mean(x^2) + eps) for an RMSNorm (the same with
or without fold_ln). The app derives it from the norm's input (ln1: the block's input; ln2: resid_mid, or
the block's input on a parallel block); it is not the sublayer's input. What the sublayer receives, after
the gain and bias (circuit-tracer's `mlp.hook_in`), is the app's own `blocks.L.attn.input` /
`blocks.L.mlp.input`. On a post-norm model (BERT) the ln hooks are refused: TransformerLens' points there
are elsewhere. Every name is checked against TransformerLens' HookedTransformer on the same weights
(tests/core/features/test_hooks_transformer_lens.py). The app's own names are accepted too. `hook_point(name, cfg)`
returns a HookPoint, or ValueError in one line.

An encoder-decoder (T5, BART, Marian) records both stacks under a prefix: its dictionaries are named by
the app's own names, `encoder.embed`, `encoder.blocks.L.<point>` (the source's tokens) and
`decoder.embed`, `decoder.blocks.L.<point>` (the decoder's input: [start] + the target), <point> one of
the app names above, and for the decoder also `resid_cross` and `cross_attn.out`. TransformerLens' names
(blocks.L.hook_resid_post) cannot say which stack they mean: on an encoder-decoder they are refused.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

TL_HOOKS = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out", "attn.hook_z",
            "hook_z", "ln1.hook_normalized", "ln2.hook_normalized")  # every TransformerLens name mapped, per layer
_TL = re.compile(r"^blocks\.([0-9]+)\.(" + "|".join(re.escape(h) for h in TL_HOOKS) + ")$")  # ASCII: not '٣'
_APP_POINTS = ("resid_mid", "resid_post", "attn.out", "mlp.out", "attn.z", "attn.input", "mlp.input",
               "ln1.normalized", "ln2.normalized")
_APP = re.compile(r"^blocks\.([0-9]+)\.(" + "|".join(re.escape(p) for p in _APP_POINTS) + ")$")
_TL_TO_APP = {"hook_resid_mid": "resid_mid", "hook_resid_post": "resid_post", "hook_attn_out": "attn.out",
              "hook_mlp_out": "mlp.out", "attn.hook_z": "attn.z", "hook_z": "attn.z",
              "ln1.hook_normalized": "ln1.normalized", "ln2.hook_normalized": "ln2.normalized"}
_APP_TO_TL = {"resid_mid": "hook_resid_mid", "resid_post": "hook_resid_post", "attn.out": "hook_attn_out",
              "mlp.out": "hook_mlp_out", "attn.z": "attn.hook_z", "ln1.normalized": "ln1.hook_normalized",
              "ln2.normalized": "ln2.hook_normalized"}
_STACKED = re.compile(r"^(encoder|decoder)\.(embed|blocks\.([0-9]+)\.(resid_mid|resid_post|attn\.out|mlp\.out|attn\.z|"
                      r"attn\.input|mlp\.input|resid_cross|cross_attn\.out))$")
DECODER_ONLY = ("resid_cross", "cross_attn.out")  # the decoder's cross-attention sublayer
NORMALIZED = ("ln1.normalized", "ln2.normalized")  # derived from the norm's input (TransformerLens' hook_normalized)
READ_ONLY = ("attn.input", "mlp.input") + NORMALIZED  # read (a transcoder reads them), never written by an edit
HOOK_EXAMPLES = "blocks.2.hook_resid_post, blocks.2.hook_mlp_out, blocks.2.attn.hook_z"
STACKED_EXAMPLES = "encoder.blocks.2.resid_post, decoder.blocks.2.mlp.out, encoder.blocks.2.attn.z"


@dataclass(frozen=True)
class HookPoint:
    """A dictionary's activation in the app: `name` (a trace name), its `layer` (-1: the embedding),
    whether it is per head (`heads`, attn.z: flattened to [T, H * d_head]) and the TransformerLens
    name it came from."""
    name: str
    layer: int
    hook: str
    stack: str | None = None  # an encoder-decoder's: "encoder" or "decoder"; None for a one-stack model
    source: str | None = None  # the trace name recorded (default `name`); a normalised point's: the norm's input
    norm: tuple[str, float] | None = None  # a normalised point's (cfg.norm, cfg.norm_eps)

    @property
    def heads(self) -> bool:
        return self.name.endswith(".attn.z")

    @property
    def editable(self) -> bool:
        return not self.name.endswith(READ_ONLY)

    @property
    def recorded(self) -> str:
        """The trace name a forward must record for this point."""
        return self.source or self.name

    def value(self, t: torch.Tensor) -> torch.Tensor:
        """This point's activation from its recorded one (t [..., T, d]); a normalised point's, before the
        gain and bias, in float32 (TransformerLens' LayerNorm / RMSNorm hook_normalized)."""
        if self.norm is None:
            return t
        kind, eps = self.norm
        x = t.float()
        if kind == "layernorm":
            x = x - x.mean(-1, keepdim=True)
        return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def app_point(hook: str) -> tuple[str, int]:
    """(trace name, layer) of a TransformerLens hook name or an app trace name; ValueError otherwise."""
    hook = hook.strip()
    if hook == "embed":
        return "embed", -1
    m = _TL.match(hook)
    if m:
        layer, what = int(m.group(1)), m.group(2)
        if what == "hook_resid_pre":
            return ("embed", -1) if layer == 0 else (f"blocks.{layer - 1}.resid_post", layer - 1)
        return f"blocks.{layer}.{_TL_TO_APP[what]}", layer
    m = _APP.match(hook)
    if m:
        return hook, int(m.group(1))
    m = _STACKED.match(hook)
    if m:
        if m.group(1) == "encoder" and m.group(4) in DECODER_ONLY:
            raise ValueError(f"hook {hook!r}: the encoder has no cross-attention ({m.group(4)} is the decoder's)")
        return hook, -1 if m.group(3) is None else int(m.group(3))
    raise ValueError(f"hook {hook!r} is not an activation the app records (e.g. {HOOK_EXAMPLES}; an "
                     f"encoder-decoder's: {STACKED_EXAMPLES})")


def tl_name(point: str) -> str:
    """The TransformerLens name of an app trace name (embed -> blocks.0.hook_resid_pre)."""
    if point == "embed":
        return "blocks.0.hook_resid_pre"
    m = _APP.match(point)
    if not m:
        raise ValueError(f"{point!r} is not an activation a dictionary can read (e.g. blocks.2.resid_post)")
    if m.group(2) not in _APP_TO_TL:  # attn.input / mlp.input (after the gain): TransformerLens has no name
        return point
    return f"blocks.{m.group(1)}.{_APP_TO_TL[m.group(2)]}"


def stack_of(name: str) -> str | None:
    """"encoder" or "decoder" for an encoder-decoder's trace name, else None."""
    head = name.split(".", 1)[0]
    return head if head in ("encoder", "decoder") else None


def hook_point(hook: str, cfg=None) -> HookPoint:
    """The HookPoint of `hook`, checked against a model config when given (its layer exists in its stack;
    an encoder-decoder's hook names its stack, a one-stack model's does not)."""
    try:
        name, layer = app_point(hook)
    except ValueError as exc:
        if cfg is not None and getattr(cfg, "is_encoder_decoder", False) and "not an activation" in str(exc):
            raise ValueError(f"hook {hook!r} is not an activation the app records: an encoder-decoder's are "
                             f"encoder.blocks.L.* (the source) or decoder.blocks.L.* (the target), e.g. "
                             f"{STACKED_EXAMPLES}") from None
        raise
    stack = stack_of(name)
    source, norm = None, None
    if cfg is not None:
        seq2seq = bool(getattr(cfg, "is_encoder_decoder", False))
        if seq2seq and stack is None:
            raise ValueError(f"hook {hook!r} names no stack: an encoder-decoder's activations are named "
                             "encoder.blocks.L.* (the source) or decoder.blocks.L.* (the target), e.g. "
                             "encoder.blocks.0.resid_post; TransformerLens' names (blocks.L.hook_resid_post) "
                             "cannot say which stack")
        if stack is not None and not seq2seq:
            raise ValueError(f"hook {hook!r} is an encoder-decoder's activation; this model has one stack of "
                             f"layers (e.g. {HOOK_EXAMPLES.split(',')[0]})")
        n = cfg.n_decoder_layers if stack == "decoder" else cfg.n_layers
        if layer >= n:
            raise ValueError(f"hook {hook!r}: the {stack or 'model'} has layers 0..{n - 1}")
        parallel = bool(getattr(cfg, "parallel_residual", False))
        if hook.strip().endswith("hook_resid_mid") and parallel:
            raise ValueError(f"hook {hook!r}: TransformerLens has no hook_resid_mid on a parallel block (attention "
                             f"and MLP both read the block's input); the app's own blocks.{layer}.resid_mid is "
                             "the input plus attention")
        if name.endswith(NORMALIZED):
            if getattr(cfg, "norm_placement", "pre") != "pre":
                raise ValueError(f"hook {hook!r}: this model normalises after each sublayer (post-norm), where "
                                 "TransformerLens' ln*.hook_normalized are other points; read the sublayer's input "
                                 f"as blocks.{layer}.attn.input or blocks.{layer}.mlp.input")
            block_input = "embed" if layer == 0 else f"blocks.{layer - 1}.resid_post"
            source = block_input if name.endswith("ln1.normalized") or parallel else f"blocks.{layer}.resid_mid"
            norm = (cfg.norm, float(cfg.norm_eps))
    elif name.endswith(NORMALIZED):
        raise ValueError(f"hook {hook!r}: a normalised point needs the model it reads (its norm and eps)")
    return HookPoint(name, layer, hook, stack, source, norm)


def hook_names(cfg) -> list[str]:
    """Every TransformerLens hook name a dictionary may read at on a model of `cfg`, layer by layer (what
    the Train panel offers; hook_resid_pre of layer L > 0 is hook_resid_post of layer L - 1, so left out).
    An encoder-decoder's: the encoder's, by the app's stack-prefixed names (training reads a text file as
    sources; a decoder hook would need a target for each, so training refuses it: not offered)."""
    if getattr(cfg, "is_encoder_decoder", False):
        names = ["encoder.embed"]
        for layer in range(cfg.n_layers):
            names += [f"encoder.blocks.{layer}.{what}" for what in (
                "attn.input", "attn.z", "attn.out", "resid_mid", "mlp.input", "mlp.out", "resid_post")]
        return names
    kinds = ["ln1.hook_normalized", "attn.hook_z", "hook_attn_out", "hook_resid_mid", "ln2.hook_normalized",
             "hook_mlp_out", "hook_resid_post"]
    if getattr(cfg, "norm_placement", "pre") != "pre":  # post-norm: TransformerLens' ln points are elsewhere
        kinds = [k for k in kinds if not k.startswith("ln")]
    if getattr(cfg, "parallel_residual", False):  # TransformerLens has no resid_mid on a parallel block
        kinds.remove("hook_resid_mid")
    names = ["blocks.0.hook_resid_pre"]
    for layer in range(cfg.n_layers):
        names += [f"blocks.{layer}.{what}" for what in kinds]
    return names


def default_hook(cfg) -> str:
    """The hook the Train panel starts on: the middle layer's residual stream (an encoder-decoder's encoder)."""
    if getattr(cfg, "is_encoder_decoder", False):
        return f"encoder.blocks.{cfg.n_layers // 2}.resid_post"
    return f"blocks.{cfg.n_layers // 2}.hook_resid_post"


def point_width(point: HookPoint, cfg) -> int:
    """The width a dictionary at this point reads: d_model, or n_heads x d_head at attn.z."""
    if point.heads:
        return cfg.n_heads * cfg.d_head
    return cfg.d_model
