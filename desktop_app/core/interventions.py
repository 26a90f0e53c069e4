"""What if: edits applied by the one model at its trace names, and the analyses built on them.

An Intervention is data: which named activation (the names of trace.py), which positions, and what
to put there. The model applies a list of them during its forward (Transformer.forward's
`interventions=`), at the points where it records; without any, nothing here runs.

Edit points (l = layer; every tensor has positions on axis -2):
    embed                    [B, T, d]
    blocks.l.attn.z          each head's output before W_O [B, H, T, d_head]; target a head as
                             "blocks.l.attn.head.h" (zeroing it removes exactly its W_O,h z_h term)
    blocks.l.attn.out        attention sublayer output, before the residual add
    blocks.l.resid_mid       residual stream after attention
    blocks.l.mlp.out         MLP output, before the residual add
    blocks.l.resid_post      output of block l
  a mixture of experts (core/moe.py) also:
    blocks.l.mlp.router      router logits [B, T, E]
    blocks.l.mlp.experts     each token's chosen expert ids [B, T, k]: "replace" forces a routing
                             (force_routing); the weights follow the router's probabilities of those
    blocks.l.mlp.expert_weights  their weights [B, T, k]
    blocks.l.mlp.expert_out.e    expert e's weighted output at every token [B, T, d]: "zero" ablates
                             the expert (ablate_expert)

How: "zero"; "replace" (value [width], the same at every position, or [T, width], one row per
absolute position); "add" (a value of the same shapes added to the activation: steering, see
`steering_vector` and `steer`); "features" (a sparse dictionary's feature edit, core/features/edits.py:
its `features` object maps the activation, see FeatureEdit.apply); "mean" and "resample" are turned
into "replace" by `resolve` from
a forward on the text itself (the mean over its positions) or on another text (its activation
position by position), so the model itself only ever zeroes, copies or adds.

Also: direct logit attribution (what each head and MLP adds to one token's logit through the
final norm's linearisation and the unembedding) and activation patching (how much of a clean
answer restoring one activation of a corrupted run recovers).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import torch

from .jobs import JobControl, report
from .streamed import holding
from .trace import Trace

HOWS = ("zero", "mean", "resample", "replace", "add", "features")
_LAYER_POINTS = ("attn.z", "attn.out", "resid_mid", "mlp.out", "resid_post")
# an encoder-decoder's points carry their stack (encoder. / decoder.), its decoder also cross_attn.* and
# resid_cross (core/seq2seq.py)
_TARGET = re.compile(r"^(?P<stack>encoder\.|decoder\.)?blocks\.(?P<layer>\d+)\.(?:(?P<kind>attn|cross_attn)\.head\."
                     r"(?P<head>\d+)|attn\.z|attn\.out|cross_attn\.z|cross_attn\.out|resid_mid|resid_cross|mlp\.out|"
                     r"resid_post|mlp\.router|mlp\.experts|mlp\.expert_weights|mlp\.expert_out\.(?P<expert>\d+))$")
# a mixture of experts' routing points (core/moe.py): widths E or k, not the residual stream's
_ROUTING_POINTS = (".mlp.router", ".mlp.experts", ".mlp.expert_weights")
_EMBEDS = ("embed", "encoder.embed", "decoder.embed")


@dataclass(frozen=True, eq=False)
class Intervention:
    target: str  # an edit point, or "blocks.l.attn.head.h"
    how: str = "zero"
    positions: tuple[int, ...] | None = None  # absolute positions; None: every position
    value: torch.Tensor | None = None  # replace, add: [width] or [T, width]
    source_ids: tuple[int, ...] | None = None  # resample: the text whose activations are copied
    name: str | None = None  # what the edit is called where it is listed (a steer's texts); None: from the rest
    features: object | None = None  # "features": apply(x, local, trace) -> x, and `reads` (a point it needs seen)

    def __post_init__(self) -> None:
        if self.how not in HOWS:
            raise ValueError(f"unknown intervention {self.how!r} (one of {', '.join(HOWS)})")
        if self.target not in _EMBEDS and not _TARGET.match(self.target):
            raise ValueError(f"{self.target!r} is not an edit point (e.g. blocks.2.attn.head.3, blocks.2.attn.out, "
                             "blocks.2.mlp.out, blocks.2.resid_post, embed)")
        if self.how in ("replace", "add") and self.value is None:
            raise ValueError(f"{self.target}: {self.how!r} needs a value")
        if self.how == "resample" and not self.source_ids:
            raise ValueError(f"{self.target}: 'resample' needs the other text's token ids")
        if self.how == "features" and self.features is None:
            raise ValueError(f"{self.target}: 'features' needs the feature edit it applies")
        if self.how in ("mean", "resample", "features") and (".mlp.expert" in self.target
                                                              or self.target.endswith(".mlp.router")):
            raise ValueError(f"{self.target}: a routing point or an expert's output is zeroed, replaced or added to "
                             f"(not {self.how!r})")

    @property
    def point(self) -> str:
        """The model's edit point (a head's target edits blocks.l.attn.z)."""
        m = _TARGET.match(self.target)
        if m and m["head"] is not None:
            return f"{m['stack'] or ''}blocks.{m['layer']}.{m['kind']}.z"
        return self.target

    @property
    def layer(self) -> int | None:
        m = _TARGET.match(self.target)
        return int(m["layer"]) if m else None

    @property
    def head(self) -> int | None:
        m = _TARGET.match(self.target)
        return int(m["head"]) if m and m["head"] is not None else None

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        where = "" if self.positions is None else " @" + ",".join(map(str, self.positions))
        return f"{self.how} {self.target}{where}"

    def check(self, cfg) -> "Intervention":
        """Itself, or ValueError (one line) when its layer or head is not in this model."""
        decoder = self.target.startswith("decoder.")
        n_layers = cfg.n_decoder_layers if decoder and getattr(cfg, "is_encoder_decoder", False) else cfg.n_layers
        if self.layer is not None and not 0 <= self.layer < n_layers:
            raise ValueError(f"{self.target}: the model has layers 0..{n_layers - 1}")
        if self.head is not None and not 0 <= self.head < cfg.n_heads:
            raise ValueError(f"{self.target}: the model has heads 0..{cfg.n_heads - 1}")
        if self.positions is not None and any(p < 0 for p in self.positions):
            raise ValueError(f"{self.target}: positions must be >= 0, got {list(self.positions)}")
        m = _TARGET.match(self.target)
        if m and m["expert"] is not None and not 0 <= int(m["expert"]) < cfg.num_experts:
            raise ValueError(f"{self.target}: the model has experts 0..{cfg.num_experts - 1}" if cfg.num_experts
                             else f"{self.target}: the model has no experts (it is not a mixture of experts)")
        if self.target.endswith(_ROUTING_POINTS) and not cfg.num_experts:
            raise ValueError(f"{self.target}: the model has no router (it is not a mixture of experts)")
        if self.target.endswith(".mlp.experts") and self.how != "zero":
            ids = self.value
            if ids.dtype.is_floating_point or ids.shape[-1] != cfg.experts_per_token or ids.dim() > 2 \
                    or ids.min() < 0 or ids.max() >= cfg.num_experts:
                raise ValueError(f"{self.label}: a routing is {cfg.experts_per_token} expert ids in "
                                 f"0..{cfg.num_experts - 1} per position")
            if any(len(set(row)) != len(row) for row in ids.reshape(-1, ids.shape[-1]).tolist()):
                raise ValueError(f"{self.label}: a token's experts must differ")
        if self.how == "add" and not self.point.endswith("attn.z") and not self.target.endswith(_ROUTING_POINTS) \
                and self.value.shape[-1] != cfg.d_model:  # a vector from another model would broadcast oddly
            raise ValueError(f"{self.label}: the vector has width {self.value.shape[-1]}, the model's residual "
                             f"stream {cfg.d_model}")
        return self


def ablate_expert(layer: int, expert: int) -> Intervention:
    """Expert `expert` of block `layer` removed: its output zeroed at every token (the other chosen
    experts keep their weights)."""
    return Intervention(f"blocks.{layer}.mlp.expert_out.{expert}", "zero")


def force_routing(layer: int, positions: Sequence[int], experts: Sequence[int]) -> Intervention:
    """The tokens at `positions` routed to `experts` (experts_per_token ids) in block `layer`, weighted by
    the router's probabilities of those experts (normalised as the family does)."""
    return Intervention(f"blocks.{layer}.mlp.experts", "replace", positions=tuple(positions),
                        value=torch.tensor(list(experts), dtype=torch.long),
                        name=f"route L{layer} @{','.join(map(str, positions))} to experts {','.join(map(str, experts))}")


ABLATION_STACKS = {"enc": ("encoder.", "attn"), "dec": ("decoder.", "attn"), "cross": ("decoder.", "cross_attn")}


def parse_ablations(spec: str, cfg=None) -> list[Intervention]:
    """"L.H[,L.H...]" (also "L.attn", "L.mlp", a mixture's "L.expert.E") -> zero ablations; checked against cfg when given. An
    encoder-decoder's name their stack (ABLATION_STACKS): enc.L.H, dec.L.H, cross.L.H (a cross-attention
    head), enc.L.mlp, dec.L.attn, cross.L.attn ..."""
    out = []
    seq2seq = bool(getattr(cfg, "is_encoder_decoder", False))
    for part in (p.strip() for p in spec.split(",")):
        m = re.fullmatch(r"(?:(enc|dec|cross)\.)?(\d+)\.(\d+|attn|mlp|expert\.\d+)", part, re.ASCII)  # not '٣'.
        if not m or (m[1] == "cross" and m[3] == "mlp") or (m[1] and m[3].startswith("expert")):
            raise ValueError(f"--ablate: {part!r} is not LAYER.HEAD (e.g. 2.3), LAYER.attn, LAYER.mlp or "
                             "LAYER.expert.E (an encoder-decoder's with enc., dec. or cross. first, e.g. cross.0.1)")
        stack, layer, what = m.groups()
        if cfg is not None and seq2seq != (stack is not None):
            raise ValueError(f"--ablate: {part!r}: " + ("an encoder-decoder's ablation names its stack: enc.L.H, "
                             "dec.L.H, cross.L.H (also enc.L.mlp, dec.L.attn ...)" if seq2seq else
                             "enc., dec. and cross. are for encoder-decoders; this model has one stack"))
        prefix, kind = ABLATION_STACKS[stack] if stack else ("", "attn")
        target = {"attn": f"{prefix}blocks.{layer}.{kind}.out", "mlp": f"{prefix}blocks.{layer}.mlp.out"}.get(
            what, f"{prefix}blocks.{layer}.{kind}.head.{what}")
        if what.startswith("expert."):  # a mixture's expert (ablate_expert)
            target = f"blocks.{layer}.mlp.expert_out.{what.split('.')[1]}"
        iv = Intervention(target)
        out.append(iv.check(cfg) if cfg is not None else iv)
    return out


# -- applying: the trace the model edits through ----------------------------------------------


class EditingTrace(Trace):
    """What the model's forward holds while interventions are set: records go to the caller's
    trace (if any), and `edit(name, x)` applies the edits at that point (the forward's calls of
    trace.point do both). `start` is the absolute
    position of the forward's first token (after a KV cache)."""

    def __init__(self, interventions: Sequence[Intervention], inner: Trace | None, start: int) -> None:
        super().__init__(())
        self.inner, self.start = inner, start
        self.by_point: dict[str, list[Intervention]] = {}
        # activations a feature edit reads at an earlier point (a transcoder's input): kept as they pass
        self.keep = {iv.features.reads for iv in interventions if iv.how == "features" and iv.features.reads}
        self.seen: dict[str, torch.Tensor] = {}
        for iv in interventions:
            if iv.how in ("mean", "resample"):
                raise ValueError(f"{iv.label}: resolve it first (interventions.resolve) - the model only zeroes, "
                                 "replaces or adds")
            self.by_point.setdefault(iv.point, []).append(iv)

    def wants(self, name: str) -> bool:
        return self.inner is not None and self.inner.wants(name)

    def asks_for(self, name: str, kind: str) -> bool:
        return self.inner is not None and self.inner.asks_for(name, kind)

    def record(self, name: str, tensor: torch.Tensor) -> None:
        if self.inner is not None:
            self.inner.record(name, tensor)

    def point(self, name: str, x: torch.Tensor) -> torch.Tensor:
        x = self.edit(name, x)
        self.record(name, x)
        return x

    def edit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        x = self._edit(name, x)
        if name in self.keep:
            self.seen[name] = x
        return x

    def _edit(self, name: str, x: torch.Tensor) -> torch.Tensor:
        edits = self.by_point.get(name)
        if not edits:
            return x
        if self.inner is not None and name in self.inner.keep_unedited:
            self.inner.unedited[name] = x.detach()
        x = x.clone()  # never write into a tensor the forward (or a cache) still holds
        T = x.shape[-2]
        for iv in edits:
            if iv.positions is None:
                local = torch.arange(T)
            else:
                local = torch.tensor([p - self.start for p in iv.positions if 0 <= p - self.start < T], dtype=torch.long)
                if local.numel() == 0:
                    continue
            local = local.to(x.device)
            if iv.how == "features":
                x = iv.features.apply(x, local, self)
                continue
            part = x[:, iv.head] if iv.head is not None else x  # a view: writing it writes x
            if iv.how == "zero":
                part[..., local, :] = 0
                continue
            value = iv.value.to(x.device, x.dtype)
            if value.dim() >= 2:  # one row per absolute position
                rows = local + self.start
                if int(rows.max()) >= value.shape[0]:
                    what = "vector" if iv.how == "add" else "replacement"
                    raise ValueError(f"{iv.label}: the {what} covers {value.shape[0]} positions, the text "
                                     f"reaches position {int(rows.max())}")
                value = value[rows]
            if iv.how == "add":
                part[..., local, :] += value
            else:
                part[..., local, :] = value
        return x


def editing_trace(interventions: Sequence[Intervention], trace: Trace | None, start: int) -> EditingTrace:
    return EditingTrace(interventions, trace, start)


def edited_at(trace: Trace | None, name: str) -> bool:
    """Whether the forward carries an edit at this point (what a point computed only on demand asks)."""
    return isinstance(trace, EditingTrace) and name in trace.by_point


def resolve(model, ids: Sequence[int] | torch.Tensor, interventions: Sequence[Intervention],
            decoder_ids: Sequence[int] | None = None) -> list[Intervention]:
    """The same list with "mean" (over `ids`' positions) and "resample" (from each one's source text,
    position by position) turned into "replace" values computed by clean forwards. `ids` may also be
    a ViT's pixel values [1, C, H, W] (the mean is then over [CLS] and the patches). An encoder-decoder's
    `ids` are its source and `decoder_ids` its decoder's input: the mean of an encoder point is over the
    source's positions, of a decoder point (self- or cross-attention) over the decoder input's; resampling
    one is refused (it would need another source and another target)."""
    seq2seq = bool(getattr(model.cfg, "is_encoder_decoder", False))
    out: list[Intervention] = []
    clean: Trace | None = None
    for iv in interventions:
        if iv.how not in ("mean", "resample"):
            out.append(iv)
            continue
        if iv.how == "mean":
            if clean is None:
                clean = _run_pair(model, ids, decoder_ids) if seq2seq else _run(model, ids, ["embed", "blocks.*"])
            act = _activation(clean, iv)
            out.append(replace(iv, how="replace", value=act.mean(0)))
        else:
            if seq2seq:
                raise ValueError(f"{iv.label}: resampled ablations of an encoder-decoder are not supported "
                                 "(zero or mean-ablate instead)")
            if model.cfg.input_kind == "patches":
                raise ValueError("resampling copies activations from another text; an image model has none "
                                 "(zero or mean-ablate instead)")
            act = _activation(_run(model, iv.source_ids, [iv.point]), iv)
            out.append(replace(iv, how="replace", value=act, source_ids=None))
    return out


# -- steering (activation addition) ------------------------------------------------------------


def steering_vector(model, ids_plus: Sequence[int], ids_minus: Sequence[int], layer: int,
                    job: JobControl | None = None) -> torch.Tensor:
    """[d_model] (float32, CPU): the mean over positions of blocks.{layer}.resid_post on the first
    text minus the same on the second, each from a plain forward (the texts may differ in length;
    the means make them comparable). `job` is checked after each block (a cancel lands within one)."""
    model = getattr(model, "model", model)
    cfg = model.cfg
    if not 0 <= layer < cfg.n_layers:
        raise ValueError(f"steering layer {layer}: the model has layers 0..{cfg.n_layers - 1}")
    point = f"blocks.{layer}.resid_post"
    means = []
    for ids, which in ((ids_plus, "towards"), (ids_minus, "away from")):
        if not len(ids):
            raise ValueError(f"the {which} text is empty")
        means.append(_run(model, ids, [point], between_blocks(job))[point][0].float().mean(0))
    return (means[0] - means[1]).cpu()


def _quoted(text: str, limit: int = 20) -> str:
    text = " ".join(text.split())
    return '"' + (text if len(text) <= limit else text[:limit - 1] + "…") + '"'


def steer(vector: torch.Tensor, layer: int, scale: float, towards: str = "", away: str = "") -> Intervention:
    """The edit that adds scale x vector to block `layer`'s output at every position (the generated
    ones too), named after the two texts it came from."""
    times = f"{scale:.1f}" if scale == round(scale, 1) else f"{scale:g}"  # 4.0, -2.5, 0.25
    return Intervention(f"blocks.{layer}.resid_post", "add", value=scale * vector,
                        name=f"steer L{layer} x{times} ({_quoted(towards)} - {_quoted(away)})")


def is_steer(iv: Intervention) -> bool:
    """Whether an edit adds a vector to a block's output (what `steer` makes; the app keeps one steer at a time).
    An attribution graph's edits add at MLP outputs (core/graphs/edits.py): not steers."""
    return iv.how == "add" and iv.target.endswith("resid_post")


def between_blocks(job: JobControl | None) -> dict:
    """A forward's keyword that checks `job` after each block (a decoder-only model's on_layer): {} without one."""
    return {} if job is None else {"on_layer": lambda _layer: job.check()}


def _run(model, ids: Sequence[int] | torch.Tensor, names, checks: dict | None = None) -> Trace:
    trace = Trace(names)
    # a tensor is a batch of one input as the model reads it (a ViT's pixel values [1, C, H, W])
    inputs = ids.to(model.device) if torch.is_tensor(ids) else torch.tensor([list(ids)], device=model.device)
    with torch.no_grad():
        model(inputs, trace=trace, compute_logits=False, **(checks or {}))
    return trace


def _run_pair(model, src_ids: Sequence[int], decoder_ids: Sequence[int] | None) -> Trace:
    """A clean forward of an encoder-decoder recording both stacks (what a mean ablation reads)."""
    if decoder_ids is None or not len(decoder_ids):
        raise ValueError("a mean ablation of an encoder-decoder needs its decoder's input too (decoder_ids)")
    trace = Trace(["encoder.embed", "encoder.blocks.*", "decoder.embed", "decoder.blocks.*"])
    with torch.no_grad():
        model(torch.tensor([list(src_ids)], device=model.device), torch.tensor([list(decoder_ids)],
              device=model.device), trace=trace)
    return trace


def _activation(trace: Trace, iv: Intervention) -> torch.Tensor:
    """[T, width] of this intervention's target in a recorded trace (batch row 0)."""
    t = trace[iv.point][0]
    return t[iv.head] if iv.head is not None else t


# -- direct logit attribution -------------------------------------------------------------------


@dataclass
class Attribution:
    """Direct contributions to one token's logit at one position. rows: (component, layer, head);
    layer/head -1 where they do not apply. Components: embed, head (W_O,h z_h), attn_bias (W_O's
    bias), mlp, final_norm_bias, logits_bias (a decoder head's bias: GPT-J, Phi). Their sum is the logit (up to
    float rounding). A mixture of experts' MLP term comes split: one "expert" row per expert the token chose (its
    id in the head column) and, Qwen2-MoE's, a "shared_expert" row; `mlp` still holds each layer's total."""
    position: int
    token_id: int
    logit: float
    components: list[str]
    layers: np.ndarray
    heads: np.ndarray
    contributions: np.ndarray  # float64
    head_table: np.ndarray = field(default=None)  # [L, H]
    mlp: np.ndarray = field(default=None)  # [L]
    experts: np.ndarray | None = None  # [L, E]: a mixture's expert terms (0 for the experts not chosen)

    @property
    def sum(self) -> float:
        return float(self.contributions.sum())

    def rows(self) -> list[tuple]:
        return [(c, int(l), int(h), float(v)) for c, l, h, v in
                zip(self.components, self.layers, self.heads, self.contributions)]


ATTRIBUTION_COLUMNS = ("component", "layer", "head", "contribution")


def _final_norm_linear(model, resid: torch.Tensor):
    """(f, bias): f(c) = what a residual-stream piece c adds after the final norm, linearised at
    `resid` (its scale is taken from the whole residual, as TransformerLens does); bias: the
    norm's own additive part (None if it has none)."""
    if not model.cfg.final_norm:
        return (lambda c: c), None
    # an encoder-decoder's logits read its decoder's final norm (core/seq2seq.py EncoderDecoder.unembed)
    norm = model.decoder.final_norm if getattr(model.cfg, "is_encoder_decoder", False) else model.final_norm
    r = resid.double()
    if isinstance(norm, torch.nn.LayerNorm):
        scale = torch.sqrt(r.var(-1, unbiased=False) + norm.eps)
        gain = norm.weight.detach().double() if norm.weight is not None else 1.0
        bias = norm.bias.detach().double() if norm.bias is not None else None
        return (lambda c: (c.double() - c.double().mean(-1, keepdim=True)) / scale * gain), bias
    if model.cfg.norm in ("rmsnorm", "rmsnorm_offset"):  # the config names the norm (model.make_norm)
        scale = torch.sqrt(r.pow(2).mean(-1) + norm.eps)
        offset = model.cfg.norm == "rmsnorm_offset"  # Gemma's (1 + w)
        gain = 1.0 + norm.weight.detach().double() if offset else norm.weight.detach().double()
        return (lambda c: c.double() / scale * gain), None
    raise ValueError(f"direct attribution does not know the final norm {type(norm).__name__}")


def check_additive(cfg, what: str) -> None:
    """Raise ValueError (one line starting with `what`) unless the model's logits are a sum of its
    components' direct contributions (what direct logit attribution reads)."""
    if not cfg.lm_head or cfg.lm_head_kind == "mlm":
        raise ValueError(f"{what} needs a model whose logits are the unembedding of its residual stream "
                         "(a causal LM head)")
    if cfg.norm_placement == "post":
        raise ValueError(f"{what}: a post-norm model's residual stream is not a sum of its sublayers' outputs")
    if cfg.sandwich_norms or cfg.norm_placement == "output":
        raise ValueError(f"{what}: with {'sandwich' if cfg.sandwich_norms else 'output'} norms a head's output is "
                         "normed with the others, so heads do not add up")
    if cfg.final_logit_softcap is not None:
        raise ValueError(f"{what}: the logit soft-cap is not linear, logits are not a sum of contributions")
    if cfg.residual_multiplier is not None:
        raise ValueError(f"{what}: the residual multiplier scales each sublayer's output after its heads' shares "
                         "are recorded, so heads do not add up")


def direct_logit_function(model, resid: torch.Tensor, token_id: int):
    """(through, bias): through(c) maps residual-stream pieces c [..., d_model] to their direct
    contributions to `token_id`'s logit (float64), through the final norm linearised at `resid` (the
    last block's output at the position) and the unembedding; bias: the final norm's own additive
    part's contribution (None without one). What direct_logit_attribution (and the sparse-feature
    attribution, core/features/edits.py) sum."""
    f, norm_bias = _final_norm_linear(model, resid)
    w_u = model.lm_head.weight[token_id].detach().double().cpu()
    if getattr(model.cfg, "lm_head_scale", None) is not None:  # T5's rescaling before a tied head
        w_u = w_u * model.cfg.lm_head_scale

    def through(c: torch.Tensor) -> torch.Tensor:
        return f(c.detach().cpu()) @ w_u

    return through, (float(norm_bias.cpu() @ w_u) if norm_bias is not None else None)


def check_position_and_token(cfg, n_tokens: int, position: int, token_id: int) -> int:
    """The position (negative counts from the end) made absolute; ValueError in one line when it is
    outside the text or the token id outside the vocabulary (what an attribution is asked for)."""
    if not -n_tokens <= position < n_tokens:
        raise ValueError(f"position {position} is outside the text (0..{n_tokens - 1})")
    if not 0 <= token_id < cfg.vocab_size:
        raise ValueError(f"token id {token_id} is outside the vocabulary (0..{cfg.vocab_size - 1})")
    return position % n_tokens


# residual-stream points an edit can change without the change being in a recorded sublayer output (an
# edit of mlp.out, attn.z or the embedding is in what the attribution reads already)
EDIT_BAR_POINTS = ("attn.out", "resid_mid", "cross_attn.out", "resid_cross", "resid_post")


_BLOCK_POINT = re.compile(r"^(?:encoder\.|decoder\.)?blocks\.(\d+)\.(.+)$")


def edit_bar_points(interventions, prefix: str = "") -> list[tuple[str, int]]:
    """(point, layer) of each residual-stream point of the stack `prefix` ("" or "decoder.") that the
    interventions edit, whose change the direct logit attribution shows as its own bar, in forward order."""
    out = set()
    for iv in interventions or ():
        m = _BLOCK_POINT.match(iv.point)
        if m and iv.point.startswith(prefix + "blocks.") and m[2] in EDIT_BAR_POINTS:
            out.add((iv.point, int(m[1])))
    return sorted(out, key=lambda p: (p[1], EDIT_BAR_POINTS.index(_BLOCK_POINT.match(p[0])[2])))


def edit_bar(point: str) -> str:
    """The component name of an edit's bar at `point`: edit_attn.out, edit_resid_post..."""
    return "edit_" + _BLOCK_POINT.match(point)[2]


def traced_forward(model, args, names, interventions=None, unedited=(), job: JobControl | None = None):
    """(output, Trace) of model(*args) under `interventions`, recording `names` and keeping the `unedited`
    points' values before the edits too (trace.unedited)."""
    trace = Trace(names, unedited=unedited)
    trace.bind(model)
    with torch.no_grad():
        out = model(*args, trace=trace, interventions=interventions or None, **between_blocks(job))
    return out, trace


def direct_logit_attribution(loaded, ids: Sequence[int], position: int, token_id: int,
                             interventions: Sequence[Intervention] | None = None,
                             job: JobControl | None = None) -> Attribution:
    """Each head's, each MLP's (and the embedding's and biases') direct contribution to the logit of
    `token_id` at `position`: c -> W_U[token] . norm_linear(c). An edit of a residual-stream point (a
    feature edit or ablation at resid_post, attn.out...) gets its own bar, the change it made there, so
    the bars still add up to the logit."""
    model = getattr(loaded, "model", loaded)
    cfg = model.cfg
    check_additive(cfg, "direct logit attribution")
    position = check_position_and_token(cfg, len(ids), position, token_id)
    L, H = cfg.n_layers, cfg.n_heads
    bars = edit_bar_points(interventions)
    names = ["embed", "logits", "blocks.*.attn.head_out", "blocks.*.mlp.out", f"blocks.{L - 1}.resid_post",
             *(p for p, _ in bars)]
    E = cfg.num_experts
    if E:  # each expert's term (core/moe.py: recorded only when asked for by name) and the choice
        names += ["blocks.*.mlp.expert_out.*", "blocks.*.mlp.experts"]
    _, trace = traced_forward(model, (torch.tensor([list(ids)], device=model.device),), names, interventions,
                              unedited=[p for p, _ in bars], job=job)
    resid = trace[f"blocks.{L - 1}.resid_post"][0, position]
    direct, bias_part = direct_logit_function(model, resid, token_id)

    def through(c: torch.Tensor) -> float:
        return float(direct(c))

    comps, layers, heads, vals = ["embed"], [-1], [-1], [through(trace["embed"][0, position])]
    head_table, mlp, experts = np.zeros((L, H)), np.zeros(L), np.zeros((L, cfg.num_experts))
    for l in range(L):
        per_head = trace[f"blocks.{l}.attn.head_out"][0, :, position]  # [H, d]
        for h in range(H):
            head_table[l, h] = through(per_head[h])
            comps.append("head"), layers.append(l), heads.append(h), vals.append(head_table[l, h])
        o, o_bias = model.blocks[l].attn.o, None
        if o.bias is not None:
            with holding(model, l, only={"attn.o.bias"}):  # (a model read layer by layer: core/streamed.py)
                o_bias = o.bias
        if o_bias is not None:
            comps.append("attn_bias"), layers.append(l), heads.append(-1), vals.append(through(o_bias))
        mlp_out = trace[f"blocks.{l}.mlp.out"][0, position]
        mlp[l] = through(mlp_out)
        if not E:
            comps.append("mlp"), layers.append(l), heads.append(-1), vals.append(mlp[l])
        else:
            outs = [trace[f"blocks.{l}.mlp.expert_out.{e}"][0, position] for e in range(E)]
            for e in sorted(set(trace[f"blocks.{l}.mlp.experts"][0, position].tolist())):
                experts[l, e] = through(outs[e])
                comps.append("expert"), layers.append(l), heads.append(e), vals.append(experts[l, e])
            if cfg.shared_expert_d_ff:  # what the routed experts do not add
                comps.append("shared_expert"), layers.append(l), heads.append(-1)
                vals.append(through(mlp_out - sum(outs)))
        for point, _ in (b for b in bars if b[1] == l):
            comps.append(edit_bar(point)), layers.append(l), heads.append(-1)
            vals.append(through(trace[point][0, position] - trace.unedited[point][0, position]))
    if bias_part is not None:
        comps.append("final_norm_bias"), layers.append(-1), heads.append(-1)
        vals.append(bias_part)
    if cfg.final_logits_bias:  # GPT-J, Phi-2: the unembedding's own bias
        comps.append("logits_bias"), layers.append(-1), heads.append(-1)
        vals.append(float(model.lm_bias[token_id].detach()))
    logit = float(trace["logits"][0, position, token_id])
    return Attribution(position, token_id, logit, comps, np.array(layers), np.array(heads), np.array(vals),
                       head_table, mlp, experts if E else None)


# -- activation patching ------------------------------------------------------------------------


@dataclass
class Patching:
    """Recovery (corrupted = 0, clean = 1) of the answer's logit difference at the last position when
    one clean activation is copied into the corrupted run.
    resid[r, p]: residual stream row r (resid_rows: embed, then each block's output) at position p;
    heads[l, h]: head h's output (before W_O) at every position."""
    answer_id: int
    wrong_id: int | None
    clean_metric: float
    corrupted_metric: float
    resid_rows: list[str]
    resid: np.ndarray  # [L + 1, T]
    heads: np.ndarray  # [L, H]


def _metric(logits: torch.Tensor, answer_id: int, wrong_id: int | None) -> float:
    last = logits[0, -1].double()
    return float(last[answer_id] - (last[wrong_id] if wrong_id is not None else 0.0))


def patch_each(model, clean_ids, corrupted_ids, rows: list[str], head_points: list[str], answer_id: int,
               wrong_id: int | None, edits: list, job=None, extra: tuple = (), what: str = "texts"):
    """The patching loop (activation_patching, analysis.seq2seq_activation_patching): one forward of the
    corrupted ids per patched activation, each recovery (m - corrupted) / (clean - corrupted) of the metric
    logit[answer] (- logit[wrong]) at the last position. `rows`: residual names patched one position at a
    time; `head_points`: attention sublayers ("blocks.l.attn", "decoder.blocks.l.cross_attn") whose heads'
    outputs (z) are patched whole; `extra`: further positional inputs of every run (an encoder-decoder's
    decoder ids). Returns (clean metric, corrupted metric, resid [rows, T], heads [head_points, H])."""
    dev = model.device
    corrupted = torch.tensor([list(corrupted_ids)], device=dev)
    clean_out, clean = model.run_with_trace(torch.tensor([list(clean_ids)], device=dev), *extra,
                                            names=rows + [f"{p}.z" for p in head_points], interventions=edits or None)
    clean_m = _metric(clean_out.logits, answer_id, wrong_id)
    with torch.no_grad():
        corrupted_m = _metric(model(corrupted, *extra, interventions=edits or None).logits, answer_id, wrong_id)
    span = clean_m - corrupted_m
    if abs(span) < 1e-9:
        raise ValueError(f"the clean and corrupted {what} give the same answer logit difference ({clean_m:.6g}): "
                         "there is nothing to recover")
    T, H = len(clean_ids), model.cfg.n_heads
    total, done = len(rows) * T + len(head_points) * H, 0

    def recovery(iv: Intervention) -> float:
        nonlocal done
        if job is not None:
            job.check()
        with torch.no_grad():
            m = _metric(model(corrupted, *extra, interventions=[iv, *edits]).logits, answer_id, wrong_id)
        done += 1
        report(job, done, total, "patching")
        return (m - corrupted_m) / span

    resid = np.zeros((len(rows), T))
    for r, name in enumerate(rows):
        for p in range(T):
            resid[r, p] = recovery(Intervention(name, "replace", (p,), clean[name][0]))
    heads = np.zeros((len(head_points), H))
    for r, point in enumerate(head_points):
        z = clean[f"{point}.z"][0]  # [H, T, dh]
        for h in range(H):
            heads[r, h] = recovery(Intervention(f"{point}.head.{h}", "replace", None, z[h]))
    return clean_m, corrupted_m, resid, heads


def activation_patching(loaded, clean_ids: Sequence[int], corrupted_ids: Sequence[int], answer_id: int,
                        wrong_id: int | None = None, job=None,
                        interventions: Sequence[Intervention] | None = None) -> Patching:
    """Metric: logit[answer] (minus logit[wrong] when given) at the last position. One forward of the
    corrupted text per patched activation; `job` (JobControl) is told the progress and may cancel.

    Under `interventions` (ablations) the edited model is the model patched: they apply in the
    clean, the corrupted and every patched run alike, "mean"/"resample" resolved once on the clean
    text so all three runs share the same replacement values. The clean activations copied are the
    edited model's, and each patch is applied before the ablations at its point, so an ablation
    always wins: a zero-ablated head carries nothing in any run and patching it recovers 0."""
    model = getattr(loaded, "model", loaded)
    cfg = model.cfg
    if not cfg.lm_head:
        raise ValueError("activation patching needs a model with a language-model head")
    if len(clean_ids) != len(corrupted_ids):
        raise ValueError(f"the clean and corrupted texts must have the same length in tokens "
                         f"({len(clean_ids)} and {len(corrupted_ids)})")
    if not clean_ids:
        raise ValueError("the texts are empty")
    for name, t in (("answer", answer_id), ("wrong", wrong_id)):
        if t is not None and not 0 <= t < cfg.vocab_size:
            raise ValueError(f"{name} token id {t} is outside the vocabulary (0..{cfg.vocab_size - 1})")
    edits = resolve(model, clean_ids, [iv.check(cfg) for iv in interventions]) if interventions else []
    rows = ["embed"] + [f"blocks.{l}.resid_post" for l in range(cfg.n_layers)]
    clean_m, corrupted_m, resid, heads = patch_each(model, clean_ids, corrupted_ids, rows,
                                                    [f"blocks.{l}.attn" for l in range(cfg.n_layers)],
                                                    answer_id, wrong_id, edits, job)
    return Patching(answer_id, wrong_id, clean_m, corrupted_m, rows, resid, heads)
