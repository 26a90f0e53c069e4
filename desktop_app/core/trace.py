"""Trace: what one forward pass recorded, under uniform, predictable names.

Names (l = layer index, 0-based):
    embed                       embedding output (Hugging Face hidden_states[0])      [B, T, d]
    blocks.l.attn.input         what the attention sublayer receives                  [B, T, d]
    blocks.l.attn.q             queries, after rotary positions                       [B, H, T, d_head]
    blocks.l.attn.pattern       attention probabilities                               [B, H, T_q, T_k]
    blocks.l.attn.z             each head's attention-weighted values, before W_O     [B, H, T, d_head]
    blocks.l.attn.head_out      each head's contribution after W_O (no o-bias)        [B, H, T, d]
    blocks.l.attn.out           attention sublayer output, before the residual add    [B, T, d]
    blocks.l.resid_mid          residual stream after attention (post-LN: after norm) [B, T, d]
    blocks.l.mlp.input          what the MLP receives (after its norm)                [B, T, d]
    blocks.l.mlp.out            MLP output, before the residual add                   [B, T, d]
    blocks.l.resid_post         output of block l (Hugging Face hidden_states[l + 1]) [B, T, d]
    blocks.l.logit_lens         final norm + unembedding applied to resid_post        [B, T, vocab]
    blocks.l.mlp.router         a mixture of experts' router logits (core/moe.py)     [B, T, E]
    blocks.l.mlp.experts        its chosen expert ids per token                       [B, T, k]
    blocks.l.mlp.expert_weights their weights                                         [B, T, k]
    blocks.l.mlp.expert_norms   each chosen expert's contribution norm |w_e expert_e(x)| [B, T, k]
    blocks.l.mlp.expert_out.e   expert e's weighted output, zero where not chosen     [B, T, d]
                                (only when a pattern naming expert_out asks for it: asks_for)
    final_norm.out              last block's output after the final norm (GPT-2, LLaMA) [B, T, d]
    logits                      the model's logits                                    [B, T, vocab]

A Trace is created with glob patterns (fnmatch) of the names to keep; the model asks `wants(name)`
before computing anything only a trace needs, so names nobody asked for cost nothing.

Memory follows what is shown (a `lazy` trace, the app's): the derived quantities are not recorded
for every layer up front. A layer's head outputs ([H, T, d], H times its residual) are computed
on demand from its recorded `attn.z` and the model's W_O (`head_out(layer)`, also what
trace["blocks.l.attn.head_out"] returns), the last few kept in a small cache; their norms
(`head_out_norms`) never form them. The logit lens is not recorded: analysis.logit_lens reads the
residuals through the model, in chunks. Attention patterns can be kept in a narrower dtype
(`pattern_dtype`, e.g. float16 when a bfloat16 checkpoint computes in float32).

On a GPU the card holds the weights and one layer's work (`hand_off`, called by the app's trace after
each block and at the end): the records made since the last hand-off go to pinned CPU memory in one
transfer per dtype (devices.to_host), so the panels read CPU tensors. A head output derived later is
computed on the weights' device from the CPU record and brought back to the CPU (the records' device),
in the model's dtype; the logit lens reads the CPU residuals through the model the same way.
"""
from __future__ import annotations

import fnmatch
import re
from collections import OrderedDict
from dataclasses import dataclass
from itertools import islice
from typing import Iterable, Iterator

import torch

from .devices import to_host
from .streamed import holding

# derived names of a lazy trace, and what each is computed from
_HEAD_OUT = re.compile(r"blocks\.(\d+)\.attn\.head_out$")
_LENS = re.compile(r"blocks\.\d+\.logit_lens$")
HEAD_OUT_CACHE = 2  # layers whose head outputs a lazy trace keeps (the one on show and the one before)


def point(trace: Trace | None, name: str, x: torch.Tensor) -> torch.Tensor:
    """An activation point of the forward: `x = point(trace, name, x)` hands back x edited by the
    interventions set at `name` (if any) and records what goes on under `name` (if asked for). One call
    does both, so no point can edit and forget to record, or the other way round (TransformerLens'
    HookPoint). Names only ever recorded (attn.q, attn.pattern, logits ...) use trace.record."""
    return x if trace is None else trace.point(name, x)


class Trace:
    def __init__(self, names: Iterable[str] = ("*",), to_cpu: bool = False, lazy: bool = False,
                 pattern_dtype: torch.dtype | None = None, unedited: Iterable[str] = ()) -> None:
        self.patterns = tuple(names)
        # points whose value before the interventions' edits is kept too (in `unedited`; what an edit changed)
        self.keep_unedited = frozenset(unedited)
        self.unedited: dict[str, torch.Tensor] = {}
        self.to_cpu = to_cpu
        self.lazy = lazy
        self.pattern_dtype = pattern_dtype
        self.tensors: dict[str, torch.Tensor] = {}
        self._wants: dict[str, bool] = {}
        self._model = None  # the Transformer that made it (bind): a lazy trace derives from its weights
        self._head_out: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.head_out_computed = 0  # how many layers' head outputs were formed (the cache's misses)
        self._handed = 0  # records (in insertion order) already handed off to host memory

    def wants(self, name: str) -> bool:
        hit = self._wants.get(name)
        if hit is None:
            if self.lazy and (_HEAD_OUT.match(name) or _LENS.match(name)):
                hit = False  # derived on demand
            else:
                hit = self._matches(name) or (self.lazy and name.endswith(".attn.z")
                                              and self._matches(name[:-1] + "head_out"))
            self._wants[name] = hit
        return hit

    def asks_for(self, name: str, kind: str) -> bool:
        """Whether a pattern that spells `kind` matches `name` ("blocks.*.mlp.expert_out.*" does, "*" does
        not): for points recorded only when asked for by name (a mixture's per-expert outputs)."""
        return any(kind in p and fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def _matches(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def point(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """An activation point of the forward (the module-level `point`): x recorded under `name` if asked
        for, and handed back (a trace that carries edits, interventions.EditingTrace, edits it first)."""
        self.record(name, x)
        return x

    def record(self, name: str, tensor: torch.Tensor) -> None:
        if self.wants(name):
            t = tensor.detach() if tensor.requires_grad else tensor  # (no graph to cut: an op saved, ~90 a step)
            if self.pattern_dtype is not None and name.endswith(".attn.pattern") and t.dtype != self.pattern_dtype:
                t = t.to(self.pattern_dtype)
            self.tensors[name] = t.cpu() if self.to_cpu else t

    def hand_off(self) -> None:
        """Move the records made since the last hand-off to host memory: one transfer per dtype on a
        GPU, into pinned memory (devices.to_host); records already on the CPU stay as they are (no copy)."""
        names = list(islice(self.tensors, self._handed, None))
        self._handed = len(self.tensors)
        if names:
            self.tensors.update(zip(names, to_host([self.tensors[n] for n in names])))

    def bind(self, model) -> None:
        """The model whose forward filled this trace: a lazy trace derives head outputs from its W_O."""
        self._model = model

    # -- read access ---------------------------------------------------------------------
    def __getitem__(self, name: str) -> torch.Tensor:
        t = self.tensors.get(name)
        if t is not None:
            return t
        m = _HEAD_OUT.match(name)
        if m and self._derives_head_out(int(m.group(1))):
            return self.head_out(int(m.group(1)))
        raise KeyError(f"{name!r} was not recorded (recorded: {', '.join(sorted(self.tensors)) or 'nothing'})")

    def __contains__(self, name: str) -> bool:
        if name in self.tensors:
            return True
        m = _HEAD_OUT.match(name)
        return bool(m) and self._derives_head_out(int(m.group(1)))

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def keys(self):
        return self.tensors.keys()

    def items(self):
        return self.tensors.items()

    @property
    def n_layers(self) -> int:
        layers = {int(k.split(".")[1]) for k in self.tensors if k.startswith("blocks.")}
        return max(layers) + 1 if layers else 0

    def pattern(self, layer: int) -> torch.Tensor:
        return self[f"blocks.{layer}.attn.pattern"]

    def hidden_states(self) -> list[torch.Tensor]:
        """Hugging Face's hidden_states: [embed, block 0 output, ..., block L-1 output].

        As in Hugging Face, the last entry is taken after the final norm when the model has one.
        """
        hs = [self["embed"]] + [self[f"blocks.{l}.resid_post"] for l in range(self.n_layers)]
        if "final_norm.out" in self.tensors:
            hs[-1] = self["final_norm.out"]
        return hs

    # -- derived on demand (a lazy trace) -----------------------------------------------------
    def _derives_head_out(self, layer: int) -> bool:
        return (self.lazy and self._model is not None and f"blocks.{layer}.attn.z" in self.tensors
                and self._matches(f"blocks.{layer}.attn.head_out"))

    def _w_o(self, layer: int) -> torch.Tensor:
        """Layer's W_O as [d, H, d_head]."""
        cfg = self._model.cfg
        with holding(self._model, layer, only={"attn.o"}):  # a model read layer by layer: its W_O (core/streamed.py)
            return self._model.blocks[layer].attn.o.weight.view(cfg.d_model, cfg.n_heads, cfg.d_head)

    def head_out(self, layer: int) -> torch.Tensor:
        """Each head's output after W_O (no bias) [B, H, T, d] of one layer: recorded, or computed from
        its attn.z (the model's own product, Attention.head_outputs) and cached for the last few layers."""
        name = f"blocks.{layer}.attn.head_out"
        if name in self.tensors:
            return self.tensors[name]
        if not self._derives_head_out(layer):
            raise KeyError(f"{name!r} was not recorded and cannot be derived (no attn.z or no model)")
        if layer in self._head_out:
            self._head_out.move_to_end(layer)
            return self._head_out[layer]
        attn = self._model.blocks[layer].attn
        z = self.tensors[f"blocks.{layer}.attn.z"]
        with torch.no_grad(), holding(self._model, layer, only={"attn.o"}):  # on the weights' device; the result
            out = attn.head_outputs(z.to(attn.o.weight.device)).detach()  # where the records are (CPU once handed off)
        if self.to_cpu or (z.device.type == "cpu" and out.device.type != "cpu"):
            out = to_host([out])[0]
        self.head_out_computed += 1
        self._head_out[layer] = out
        while len(self._head_out) > HEAD_OUT_CACHE:
            self._head_out.popitem(last=False)
        return out

    def head_out_norms(self, layer: int) -> torch.Tensor | None:
        """||W_O,h z_h,t|| [B, H, T] in float64 for one layer, without forming the head outputs when
        they are not recorded: z^T (W_O,h^T W_O,h) z with the [H, d_head, d_head] Gram matrices.
        None when the trace has neither the head outputs nor what they derive from."""
        name = f"blocks.{layer}.attn.head_out"
        if name in self.tensors:
            return self.tensors[name].double().norm(dim=-1)
        if not self._derives_head_out(layer):
            return None
        with torch.no_grad():
            w = self._w_o(layer).double()  # [d, H, dh]
            gram = torch.einsum("dhk,dhj->hkj", w, w)
            z = self.tensors[f"blocks.{layer}.attn.z"].to(w.device, torch.float64)  # [B, H, T, dh]
            sq = torch.einsum("bhtk,hkj,bhtj->bht", z, gram, z)
        return sq.clamp_min(0).sqrt().cpu()

    def nbytes(self) -> int:
        """Bytes the trace holds: recorded tensors (each storage once) and cached head outputs."""
        seen, total = set(), 0
        for t in list(self.tensors.values()) + list(self._head_out.values()):
            key = (t.untyped_storage().data_ptr(), t.device)
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
        return total


# -- memory estimate of a trace, before running it ----------------------------------------------


@dataclass(frozen=True)
class TraceBytes:
    """What a trace needs on top of the weights: on the model's device, and in host memory (the records
    handed off layer by layer on a GPU; 0 when they stay where they are made)."""
    device: int
    host: int = 0

    @property
    def total(self) -> int:
        return self.device + self.host


def estimate_trace_bytes(cfg, n_tokens: int, names: Iterable[str] = ("*",), compute_dtype=torch.float32,
                         pattern_dtype=None, lazy: bool = True, layers: int | None = None,
                         n_target: int | None = None) -> int:
    """Bytes a forward pass of `n_tokens` records (batch 1) under `names`, plus the largest transient
    work of one layer (scores, softmax and the MLP's hidden units): what comes on top of the weights.
    `layers`: record only that many blocks' tensors (a layer range). An encoder-decoder
    (cfg.is_encoder_decoder): `n_tokens` source tokens through the encoder (names encoder.*) and
    `n_target` (default 1, the start token) through the decoder (decoder.*, its cross-attention too)."""
    return estimate_trace_memory(cfg, n_tokens, names, compute_dtype, pattern_dtype, lazy, layers, n_target).device


def _pinned(n: int) -> int:
    """Bytes a pinned buffer of n bytes takes: torch's caching host allocator rounds up to a power of two."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def estimate_trace_memory(cfg, n_tokens: int, names: Iterable[str] = ("*",), compute_dtype=torch.float32,
                          pattern_dtype=None, lazy: bool = True, layers: int | None = None,
                          n_target: int | None = None, host_records: bool = False,
                          pinned: bool = True) -> TraceBytes:
    """estimate_trace_bytes on the device alone, or with `host_records` (a one-stack model's trace
    handed off after each block, Trace.hand_off) split between the device, which holds one layer's
    records, their packed copy and its work, and the host, which holds every record (each layer's in
    one buffer, rounded up to a power of two when `pinned`, as on CUDA)."""
    probe = Trace(names, lazy=lazy)
    d, H = cfg.d_model, cfg.n_heads
    c = torch.empty((), dtype=compute_dtype).element_size()
    p = torch.empty((), dtype=pattern_dtype or compute_dtype).element_size()

    def stack(prefix: str, T: int, L: int, S: int | None = None) -> tuple[int, int, int, int]:
        """(one layer's records in the compute dtype, its patterns, the embedding and final norm's records,
        the largest transient work) of one stack over T tokens (S: cross-attended)."""
        per_layer = {"attn.input": T * d, "attn.q": T * H * cfg.d_head, "attn.z": T * H * cfg.d_head,
                     "attn.out": T * d, "resid_mid": T * d, "mlp.input": T * d, "mlp.out": T * d,
                     "resid_post": T * d, "attn.head_out": H * T * d, "logit_lens": T * cfg.vocab_size}
        if S is not None:  # the decoder's cross-attention sublayer
            per_layer.update({"cross_attn.input": T * d, "cross_attn.q": T * H * cfg.d_head,
                              "cross_attn.z": T * H * cfg.d_head, "cross_attn.out": T * d, "resid_cross": T * d,
                              "cross_attn.head_out": H * T * d})
        layer = sum(n * c for k, n in per_layer.items() if probe.wants(f"{prefix}blocks.0.{k}"))
        patterns = H * T * T * p if probe.wants(f"{prefix}blocks.0.attn.pattern") else 0
        if S is not None and probe.wants(f"{prefix}blocks.0.cross_attn.pattern"):
            patterns += H * T * S * p
        ends = sum(T * d * c for k in ("embed", "final_norm.out") if probe.wants(prefix + k))
        keys = max(T, S or 0)
        work = max(2 * H * T * keys * 4 + H * T * keys * c, 3 * T * cfg.d_ff * c)
        return layer, patterns, ends, work

    logits = 0
    if not getattr(cfg, "is_encoder_decoder", False):
        T = n_tokens
        L = cfg.n_layers if layers is None else layers
        layer, patterns, ends, work = stack("", T, L)
        total = (layer + patterns) * L + ends
    else:
        T = n_target or 1
        el, ep, ee, enc_work = stack("encoder.", n_tokens, cfg.n_layers)
        dl, dp, de, dec_work = stack("decoder.", T, cfg.n_decoder_layers or cfg.n_layers, S=n_tokens)
        total = (el + ep) * cfg.n_layers + ee + (dl + dp) * (cfg.n_decoder_layers or cfg.n_layers) + de
        work = max(enc_work, dec_work)
        host_records = False  # (an encoder-decoder's trace is not handed off)
    if probe.wants("logits"):
        logits = T * cfg.vocab_size * c
    # transient: float32 scores and probabilities of one layer, the MLP's hidden units, the final logits
    transient = T * cfg.vocab_size * c
    if not host_records:
        return TraceBytes(int(total + logits + work + transient))
    # the device: one layer's records (with the embedding's, handed off with block 0) and their packed
    # copy, or a layer's records so far beside its work; at the end the final records and their copy
    one = layer + patterns + ends
    device = max(one + work, 2 * one) + 2 * (ends + logits) + transient
    size = _pinned if pinned else int
    groups = [layer + patterns] if p == c else [layer, patterns]  # one buffer per dtype
    host = L * sum(size(g) for g in groups if g) + size(ends + logits)  # (the embedding goes with block 0)
    return TraceBytes(int(device), int(host))
