"""One instrumented Transformer; every family (GPT-2, BERT, LLaMA, GPT-NeoX, GPT-Neo, Qwen, Mistral,
Gemma 3, OPT, RoBERTa, DistilBERT) is a choice of ModelConfig switches, never a family-name test.

Read top to bottom: norms, positions, attention, MLP, block, the model. Recording is opt-in: pass
`trace=Trace(...)` to forward and every name it asks for is stored (see trace.py for the names);
without a trace, softmax attention runs through PyTorch's fused scaled_dot_product_attention (but where it
will be differentiated in bfloat16 on a CPU with bfloat16 instructions: explicit_differentiates_faster).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import math
import operator
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.modules.module as _hooks  # nn.Module's global hooks (forward_of)

from .attention import alibi_mask, alibi_slopes, attention_probs, causal_mask  # the formulas' one home
from .config import ModelConfig
from .devices import half_matrix_units
from .interventions import editing_trace
from .trace import Trace, point

# -- norms -----------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """g * z / sqrt(mean(z^2) + eps), computed in float32 like the LLaMA reference."""

    def __init__(self, d: int, eps: float, gain_float32: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps
        self.gain_float32 = gain_float32  # config's norm_gain_float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype == torch.float32 and x.is_cpu and not self.gain_float32 and not torch.is_grad_enabled():
            # torch.rms_norm: on the CPU the same ops in C++ (pow, mean, add, rsqrt, mul, weight * z), one Python call
            # and one dispatch where six were (equal bits on 1,546 random float32 shapes, eps and scales, torch 2.13);
            # not with gradients (its backward is its own), nor in half precision (it rounds after the gain), nor
            # on a GPU (a fused kernel there, its bits not checked against the formula's yet)
            w = self._parameters["weight"]  # (self.weight: a Python __getattr__ call)
            return torch.rms_norm(x, w.shape, w, self.eps)
        # (a float32 input is used as it is: .float() and .to() would hand back the same tensor, two ops a norm)
        x32 = x if dtype == torch.float32 else x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.gain_float32:  # OLMo 2: g * z in float32, rounded once
            return (self.weight * x32).to(dtype)
        return self.weight * (x32 if dtype == torch.float32 else x32.to(dtype))


class OffsetRMSNorm(RMSNorm):
    """Gemma's RMSNorm: (1 + g) * z / sqrt(mean(z^2) + eps), the product too in float32; g starts at 0."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__(d, eps)
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


def make_norm(cfg: ModelConfig, d: int | None = None) -> nn.Module:
    """The config's norm over the last dim, of width d (default d_model; q/k norms use d_head)."""
    d = cfg.d_model if d is None else d
    if cfg.norm == "rmsnorm":
        return RMSNorm(d, cfg.norm_eps, cfg.norm_gain_float32)
    if cfg.norm == "rmsnorm_offset":
        return OffsetRMSNorm(d, cfg.norm_eps)
    if cfg.norm == "layernorm_plain":  # OLMo: no weight, no bias
        return nn.LayerNorm(d, eps=cfg.norm_eps, elementwise_affine=False)
    if cfg.norm == "layernorm_nobias":  # Cohere: a weight, no bias
        return nn.LayerNorm(d, eps=cfg.norm_eps, bias=False)
    return nn.LayerNorm(d, eps=cfg.norm_eps)


# -- positions -------------------------------------------------------------------------------


def sinusoidal_table(n: int, d: int, layout: str = "interleaved") -> torch.Tensor:
    """PE(t, 2i) = sin(t / 10000^(2i/d)), PE(t, 2i+1) = cos(same) (Vaswani et al.). layout "halves"
    (Marian): the same sines in the first ceil(d/2) dims, the cosines after them, computed in float64
    as transformers' MarianSinusoidalPositionalEmbedding does."""
    if layout == "halves":
        t64 = torch.arange(n, dtype=torch.float64)[:, None]
        angle = t64 / torch.pow(torch.tensor(10000.0, dtype=torch.float64),
                                2 * (torch.arange(d, dtype=torch.float64) // 2) / d)
        return torch.cat([torch.sin(angle[:, 0::2]), torch.cos(angle[:, 1::2])], dim=1).float()
    t = torch.arange(n, dtype=torch.float32)[:, None]
    freq = torch.pow(10000.0, -torch.arange(0, d, 2, dtype=torch.float32) / d)
    pe = torch.zeros(n, d)
    pe[:, 0::2] = torch.sin(t * freq)
    pe[:, 1::2] = torch.cos(t * freq)[:, : d // 2]
    return pe


def rotary_inv_freq(dims: int, theta: float, scaling: dict | None = None, device=None,
                    seq_len: int = 0) -> torch.Tensor:
    """Frequencies theta^(-2i/dims) of the rotating dims, rescaled as HF's rope_scaling asks:
    "linear" divides every frequency by factor; "llama3" (Llama 3.1) divides the low frequencies
    by factor, keeps the high ones, and interpolates smoothly between; "longrope" (Phi-3) divides each
    by its short factor, or by its long one when the sequence (`seq_len`: the last position + 1) is
    longer than the original context (modeling_rope_utils)."""
    if scaling is not None and scaling.get("rope_type") == "longrope":
        long = seq_len > scaling["original_max_position_embeddings"]
        ext = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32, device=device)
        return 1.0 / (ext * theta ** (torch.arange(0, dims, 2, dtype=torch.int64, device=device).float() / dims))
    inv_freq = 1.0 / (theta ** (torch.arange(0, dims, 2, dtype=torch.float32, device=device) / dims))
    if scaling is None:
        return inv_freq
    kind, factor = scaling.get("rope_type", scaling.get("type")), scaling["factor"]
    if kind == "linear":
        return inv_freq / factor
    old_context = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_context / high) & ~(wavelen > old_context / low)
    return torch.where(medium, smoothed, scaled)


_INV_FREQ: dict[tuple, torch.Tensor] = {}  # rotary_cos_sin's frequencies by (dims, theta, device, scaling)


def rotary_cos_sin(positions: torch.Tensor, dims: int, theta: float,
                   scaling: dict | None = None, seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, dims] for the first `dims` dims of each head (all of them unless the
    config's rotary_fraction is below 1); longrope's are scaled by its attention_factor. seq_len: the last
    position + 1 when the caller knows it (else longrope reads it back from `positions`)."""
    longrope = scaling is not None and scaling.get("rope_type") == "longrope"
    # only longrope's frequencies depend on the length (read back from the device: a sync, so not asked
    # otherwise, nor when the caller knows it); the others are the same at every step of a generation:
    # made once (_INV_FREQ)
    if seq_len is None:
        seq_len = int(positions.max()) + 1 if longrope and positions.numel() else 0
    key = (dims, theta, positions.device, None if scaling is None else repr(sorted(scaling.items())),
           longrope and seq_len > scaling["original_max_position_embeddings"])
    inv_freq = _INV_FREQ.get(key)
    if inv_freq is None:
        inv_freq = _INV_FREQ[key] = rotary_inv_freq(dims, theta, scaling, positions.device, seq_len)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    if longrope:
        return emb.cos() * scaling["attention_factor"], emb.sin() * scaling["attention_factor"]
    return emb.cos(), emb.sin()


def rotate_half_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with 'rotate half''s sign in it, (-sin_1, sin_2) over the two halves: x rolled by half a head
    times this is cat(-x2, x1) * sin bit for bit (negation is exact), one op where a chunk, a neg and a cat
    were (apply_rotary); the forward makes it once for every layer."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 signed_sin: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate [B, H, T, dh] by position (the non-interleaved 'rotate half' convention of LLaMA).

    Only the first cos.shape[-1] dims rotate, 'rotate half' within them; the rest pass through
    unchanged (GPT-NeoX's partial rotary, exactly as transformers' apply_rotary_pos_emb).
    signed_sin: rotate_half_sin(sin), when the caller made it (else made here)."""
    dims = cos.shape[-1]
    x_rot = x if dims == x.shape[-1] else x[..., :dims]
    rotated = x_rot.roll(dims // 2, -1)  # (x2, x1); the sign of (-x2, x1) is in signed_sin
    if signed_sin is None:
        signed_sin = rotate_half_sin(sin)
    if x.dtype in (torch.bfloat16, torch.float16) and cos.dtype == torch.float32:
        # half-precision q, k rotated in float32 and rounded once (rotary_precision "float32...": OLMo, Cohere)
        x_rot = (x_rot.float() * cos + rotated.float() * signed_sin).to(x.dtype)
    else:  # in x's dtype, cos and sin rounded to it, as transformers computes it (in bfloat16 too)
        if cos.dtype != x.dtype:  # (the forward's tables come rounded already: no cast op a layer)
            cos, signed_sin = cos.to(x.dtype), signed_sin.to(x.dtype)
        x_rot = x_rot * cos + rotated * signed_sin
    return x_rot if dims == x.shape[-1] else torch.cat([x_rot, x[..., dims:]], dim=-1)


def rotary_dims(cfg: ModelConfig) -> int:
    """How many dims of each head rotate (HF: int(head_dim * partial_rotary_factor))."""
    return int(cfg.d_head * cfg.rotary_fraction)


# layer_window(cfg, layer): the window rule, which reads only the config, lives on it (a family may
# use it without the model); the name stays here for the model's readers (generation, lipschitz)
layer_window = ModelConfig.layer_window


def layer_rotary(cfg: ModelConfig, layer: int, positions: torch.Tensor,
                 seq_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """cos, sin for this layer at these absolute positions (None without rotary positions); seq_len:
    rotary_cos_sin's. Gemma 3's sliding layers use their own base (rope_local_theta) and no scaling."""
    if not layer_rotates(cfg, layer):
        return None
    if cfg.rope_local_theta is not None and layer_window(cfg, layer) is not None:
        return rotary_cos_sin(positions, rotary_dims(cfg), cfg.rope_local_theta)
    return rotary_cos_sin(positions, rotary_dims(cfg), cfg.rope_theta, cfg.rope_scaling, seq_len)


def layer_rotates(cfg: ModelConfig, layer: int) -> bool:
    """Whether this layer rotates q and k: rotary positions, and not one of SmolLM3's "NoPE" layers."""
    return cfg.positions == "rotary" and (cfg.rotary_layers is None or cfg.rotary_layers[layer])


def attention_scale(cfg: ModelConfig) -> float:
    """What q . k is multiplied by before the softmax: 1/sqrt(d_head) unless the config says."""
    return cfg.attn_scale if cfg.attn_scale is not None else 1.0 / math.sqrt(cfg.d_head)


# -- attention -------------------------------------------------------------------------------


# attention_probs and causal_mask live in core/attention.py (shared with generation, the Lipschitz
# lab and the dynamics); imported above.


def packed_linears(linears) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(W [sum of outputs, in], b): the weights (and biases) of nn.Linear layers reading the same input,
    as views of the one buffer pack_linears laid them out in, side by side (one product computes them
    all); None when they are not (or no longer: a device move, a load, a replaced weight) laid out so.
    The answer is kept on the first layer while every weight and bias stays where it was (a one-token
    step asks once per layer; working it out took ~24 us a call, a tenth of a small layer's step)."""
    first = linears[0]
    key = [p.data_ptr() for lin in linears for p in lin._parameters.values() if p is not None]
    kept = first.__dict__.get("_packed_views")
    if kept is not None and kept[0] == key:
        return kept[1]
    views = _packed_views(linears)
    first.__dict__["_packed_views"] = (key, views)
    return views


def _packed_views(linears) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    first = linears[0]
    outs = [lin.out_features for lin in linears]
    n, d = sum(outs), first.in_features
    starts = [sum(outs[:i]) for i in range(len(outs))]

    def side_by_side(ts, step: int) -> bool:
        ptr = ts[0].untyped_storage().data_ptr()
        return all(t.untyped_storage().data_ptr() == ptr and t.storage_offset() == ts[0].storage_offset() + a * step
                   for t, a in zip(ts, starts))

    ws = [lin.weight for lin in linears]
    ld = first.weight.stride(1)  # column-major: n, or more where laid_out lengthened the rows (padded_rows)
    if ld >= n and all(w.stride() == (1, ld) for w in ws) and side_by_side(ws, 1):  # column-major [in, ld] buffer
        w = first.weight.as_strided((n, d), (1, ld))
    elif all(w.stride() == (d, 1) for w in ws) and side_by_side(ws, d):  # row-major [n, in] buffer
        w = first.weight.as_strided((n, d), (d, 1))
    else:
        return None
    b = None
    if first.bias is not None:
        bs = [lin.bias for lin in linears]
        if any(t is None for t in bs) or not side_by_side(bs, 1):
            return None
        b = first.bias.as_strided((n,), (1,))
    return w, b


def pack_linears(linears, column_major: bool = True) -> None:
    """Lay out the weights of nn.Linear layers that read the same input in one buffer [sum of outputs, in]
    (column-major or row-major), biases in another; each parameter becomes a view (same values and
    shapes), and packed_linears hands the whole. Idempotent when already packed either way."""
    packed, first = packed_linears(linears), linears[0]
    if packed is not None and (first.__dict__.get("_laid_out") == packed[0].data_ptr()
                               or not huge_pages_for(packed[0].numel() * packed[0].element_size())):
        return  # (packed by the loader, e.g. GPT-2's c_attn, but not in huge pages: laid out again)
    w = laid_out(torch.cat([lin.weight.detach() for lin in linears], 0), column_major)
    bias = [lin.bias for lin in linears]
    b = None if any(t is None for t in bias) else torch.cat([t.detach() for t in bias])
    start = 0
    for lin in linears:
        end = start + lin.out_features
        lin.weight.data = w[start:end]
        if b is not None:
            lin.bias.data = b[start:end]
        start = end
    first.__dict__["_laid_out"] = first.weight.data_ptr()


HUGE_PAGE = 2 << 20  # the x86-64 (and most arm64) transparent huge page


def huge_page_buffer(numel: int, dtype: torch.dtype) -> torch.Tensor | None:
    """An uninitialised 1-D CPU tensor of `numel` in memory the kernel backs with transparent huge pages (2 MB
    pages advised before the first touch; madvise mode, this machine's default, gives them to nothing else),
    or None where it cannot: not Linux, huge pages off, or smaller than one such page. A one-row product
    streams its weight from memory, and with 4 KB pages every 4 KB of it is another address translation: GPT-2
    small's float32 products alone, one thread, 1.18-1.23x faster (medians of 40 interleaved pairs, 2-core AMD
    EPYC [load 5-6]); the same kernels, so the same bits."""
    import mmap

    nbytes = numel * dtype.itemsize
    if not huge_pages_for(nbytes):
        return None
    # private anonymous memory (a shared mapping is shmem, which has huge pages of its own setting, off by default);
    # kept alive by the tensor made from it
    m = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(m, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE  # the first 2 MB boundary: only aligned 2 MB spans get a huge page
    try:
        m.madvise(mmap.MADV_HUGEPAGE, start, nbytes // HUGE_PAGE * HUGE_PAGE)
    except OSError:
        return None
    return raw[start:start + nbytes].view(dtype)


def huge_pages_for(nbytes: int) -> bool:
    """Whether huge_page_buffer gives `nbytes` huge pages here (not while pack_for_decoding has no room for its
    huge-page copies: _huge_pages_if_room)."""
    import mmap

    return nbytes >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE") and _huge_pages_on() and not _NO_ROOM.get()


@functools.cache
def _huge_pages_on() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


# set (this thread) while pack_for_decoding lays weights out without room for its huge-page copies (_huge_pages_if_room)
_NO_ROOM = contextvars.ContextVar("no_room_for_huge_page_copies", default=False)


def decoding_copy_bytes(model, prepack: bool = True) -> int:
    """What memory grows by when model.pack_for_decoding(prepack) copies the weights now (0 once made, and where it
    makes none: not on the CPU, streamed): what a memory estimate before a generation counts. In float32, its
    layouts: a copy of weights in a file's map (a model read from its folder) is memory of its own; one of weights
    in anonymous memory frees them once made (a model converted to float32 as it loaded, a new one), so only the
    largest such copy counts (the peak; one block's Q/K/V concatenated on the way aside). In half precision, the
    prepacked copies _prepack_one_row makes (_one_row_groups_to_pack: none where they would not fit), kept beside
    the weights."""
    return _decoding_copy(model)[0] + (_one_row_bytes(_one_row_groups_to_pack(model)) if prepack else 0)


def _laid_out_for_steps(model) -> bool:
    """Whether Transformer.pack_for_decoding lays `model` out (its own method, not another's; not streamed; on the
    CPU); which copies it makes then depends on the dtype."""
    return (getattr(type(model), "pack_for_decoding", None) is Transformer.pack_for_decoding
            and getattr(model, "streamed", None) is None and model.device.type == "cpu")


def _decoding_copy(model) -> tuple[int, int, int | None]:
    """(memory it grows by, bytes held back, memory available) for pack_for_decoding now. Huge pages only where the
    memory available covers the growth with a quarter to spare (as the prepacked half-precision copy); else the
    copies made only for huge pages are held back: those weights stay where they are (e.g. the file's map: slower
    steps, the same bits); the other layout and Q/K/V side by side are made either way (4 KB pages: the same bytes)."""
    from .devices import available_memory

    copies = _decoding_copies(model)
    need = _growth(copies)
    have = available_memory("cpu") if any(huge for _, _, huge in copies) else None
    if have is not None and need * 5 // 4 > have:
        return _growth([c for c in copies if not c[2]]), sum(n for n, _, huge in copies if huge), have
    return need, 0, have


def _growth(copies) -> int:
    return (sum(n for n, kept, _ in copies if kept)
            + max((n for n, kept, _ in copies if not kept), default=0))


def _decoding_copies(model) -> list[tuple[int, bool, bool]]:
    """(bytes, whether the weights copied stay in memory, whether copied only for huge pages) of each copy
    Transformer.pack_for_decoding's float32 layouts make now, by its rules and pack_linears' (the tests in
    test_decoding_layout check them against the copies it makes)."""
    if not _laid_out_for_steps(model) or model.dtype != torch.float32:
        return []

    def size(t: torch.Tensor | None) -> int:
        return 0 if t is None else t.numel() * t.element_size()

    mapped = _file_mapped()
    copies = []
    for block in model.blocks:  # Attention.pack_qkv
        linears = (block.attn.q, block.attn.k, block.attn.v)
        packed = packed_linears(linears)
        w = size(packed[0]) if packed is not None else sum(size(lin.weight) for lin in linears)
        if packed is None or (linears[0].__dict__.get("_laid_out") != packed[0].data_ptr() and huge_pages_for(w)):
            n, itemsize = sum(lin.out_features for lin in linears), linears[0].weight.element_size()
            made = linears[0].in_features * padded_rows(n, itemsize) * itemsize  # (column-major: pack_qkv's)
            made += 0 if any(lin.bias is None for lin in linears) else sum(size(lin.bias) for lin in linears)
            copies.append((made, mapped(linears[0].weight.data_ptr()), packed is not None))
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear) or name.endswith(("attn.q", "attn.k", "attn.v")):
            continue
        w = mod.weight.data
        if mod.__dict__.get("_laid_out") == (w.data_ptr(), w.stride()):
            continue
        column_major = mod.out_features >= mod.in_features
        if column_major == w.is_contiguous():
            copies.append((laid_out_bytes(w, column_major), mapped(w.data_ptr()), False))
        elif huge_pages_for(size(w)):
            copies.append((laid_out_bytes(w, column_major), mapped(w.data_ptr()), True))
    return copies


def _file_mapped() -> Callable[[int], bool]:
    """Whether an address is in a mapping of a file (/proc/self/maps: one with a path): a copy of what is there is
    memory of its own, the file's pages stay (page cache); where that cannot be read, every address (an upper bound).
    The maps are read at the first question (none once the weights are laid out)."""
    import bisect

    @functools.cache
    def spans() -> list[tuple[int, int]] | None:
        out = []
        try:
            with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
                for line in f:
                    parts = line.split(maxsplit=5)
                    if len(parts) == 6 and parts[5].startswith("/"):
                        start, end = parts[0].split("-")
                        out.append((int(start, 16), int(end, 16)))
        except (OSError, ValueError):
            return None
        return sorted(out)

    def inside(address: int) -> bool:
        known = spans()
        if known is None:
            return True
        i = bisect.bisect_right(known, (address, float("inf"))) - 1
        return i >= 0 and address < known[i][1]
    return inside


@contextlib.contextmanager
def _huge_pages_if_room(model):
    """pack_for_decoding's copies without those made only for huge pages where the memory is not there
    (_decoding_copy); one line in the app's log says so."""
    _, held_back, have = _decoding_copy(model)
    if held_back:
        from .devices import human_bytes
        logging.getLogger("desktop_app").info(
            "generation: %s of float32 weights not copied into huge pages (%s available, short of the copy and a "
            "quarter to spare): steps read them where they are (slower, the same values)",
            human_bytes(held_back), human_bytes(have))
    token = _NO_ROOM.set(bool(held_back))
    try:
        yield
    finally:
        _NO_ROOM.reset(token)


def padded_rows(n: int, itemsize: int) -> int:
    """The elements laid_out stores each row of a column-major matrix's buffer [in, out] in: `out` = n, or n and 64
    bytes more where a row of n is a multiple of 4 KB, 24 KB or more. MKL's float32 product of several rows by such a
    weight (a prompt's forward, a beam step of 4 beams or more, a trace) reads rows 4 KB apart, which share cache sets:
    64 bytes more a row, 8 rows 1.2-1.4x faster (1,024 inputs by 1,024 to 8,192 outputs), the same kernels, the same
    bits (1 to 512 rows). One row (a step) by rows 64 bytes longer: 4 KB rows 1.23x slower, 8 KB 1.08x, 12 KB
    (GPT-2 small's MLP up) 1.015-1.045x, 16 KB 1.015x, 24 and 32 KB 0.99-1.00x: only those lengthened (thread time,
    medians of 31-121 interleaved runs, one thread, 2-core AMD EPYC [load 2-4]). (A row-major matrix's rows: none
    faster, one row 7% slower: not lengthened.)"""
    return n + 64 // itemsize if (n * itemsize) % 4096 == 0 and n * itemsize >= 24 * 1024 else n


def laid_out_bytes(w: torch.Tensor, column_major: bool) -> int:
    """The bytes of laid_out(w, column_major)'s buffer (rows lengthened: padded_rows)."""
    out, inn = w.shape
    return (inn * padded_rows(out, w.element_size()) if column_major else w.numel()) * w.element_size()


def laid_out(w: torch.Tensor, column_major: bool) -> torch.Tensor:
    """A copy of the matrix w [out, in] (same values and shape), column-major (its buffer's rows padded_rows long)
    or row-major, in huge pages where it is large enough (huge_page_buffer); else in memory torch allocates."""
    if not column_major:
        buf = huge_page_buffer(w.numel(), w.dtype)
        return w.contiguous() if buf is None else buf.view(w.shape).copy_(w)
    out, inn = w.shape
    ld = padded_rows(out, w.element_size())
    buf = huge_page_buffer(inn * ld, w.dtype)
    if buf is None:
        buf = torch.empty(inn * ld, dtype=w.dtype, device=w.device)
    return buf.view(inn, ld)[:, :out].copy_(w.t()).t()


# -- one-row products in bfloat16 on the CPU (generation steps) -------------------------------------

_DATA_PTR, _VERSION = torch.Tensor.data_ptr, operator.attrgetter("_version")


def _made_from(tensors) -> tuple:
    """Where each tensor's values are and how many times they were written in place (a load copies into
    them, an edit writes them: either bumps the version). C calls only: a step asks at every product."""
    return (*map(_DATA_PTR, tensors), *map(_VERSION, tensors))


class OneRowCopy(NamedTuple):
    """A oneDNN-prepacked copy of the weights [out, in] an owner multiplies by (prepack_one_row), kept in
    the owner's __dict__ (one dict read a product, where a weak-key table took two Python calls)."""
    made_from: tuple  # _made_from of the weight (one layer) or of every weight and bias (a group)
    weight: torch.Tensor
    bias: torch.Tensor | None  # a group's biases side by side (one layer's own is passed at each call)

    def __deepcopy__(self, memo):  # a copy of the model (moved to another device) packs its own when it steps
        return None


def one_row_copy(owner: nn.Module) -> OneRowCopy | None:
    """The prepacked copy made for `owner` (fresh or stale: _prepacked says which), or None."""
    return owner.__dict__.get("_one_row")


def _group_tensors(linears) -> list[torch.Tensor]:
    """The weights and biases of nn.Linear layers multiplied as one, in order (no module __getattr__)."""
    return [t for lin in linears for t in lin._parameters.values() if t is not None]


def prepack_one_row(owner: nn.Module, linears) -> bool:
    """Keep a oneDNN-prepacked copy of the weights [out, in] of `linears` (nn.Linear layers reading the same
    input) for `owner` to multiply by (linear; several side by side as one product: products): a one-row
    bfloat16 product then streams it 1.5-1.9x faster than F.linear (which re-lays the weight out at every
    call), with the same values (oneDNN computes both, the same kernel). The copy is made from the weights
    where they are (no other copy kept: several are put side by side one group at a time); the weights'
    memory twice. False where this CPU or build has no such product."""
    if _prepacked(owner, linears) is not None:
        return True
    weights = [lin.weight for lin in linears]
    w = weights[0] if len(weights) == 1 else torch.cat(weights)
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), 1)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    biases = [lin.bias for lin in linears]
    # a group's biases side by side; one without (none of today's families) adds zeros: never a bias dropped
    b = None if len(linears) == 1 or all(t is None for t in biases) else torch.cat(
        [t.detach() if t is not None else lin.weight.new_zeros(lin.out_features) for t, lin in zip(biases, linears)])
    owner.__dict__["_one_row"] = OneRowCopy(_made_from(weights if len(linears) == 1 else _group_tensors(linears)),
                                            packed, b)
    return True


def _one_row_groups_to_pack(model) -> list[tuple[nn.Module, tuple]]:
    """(owner, the nn.Linear layers it multiplies by as one) of every product a half-precision step makes that
    Transformer._prepack_one_row prepacks now: those without a fresh copy (prepack_one_row), all of them or none,
    when their copies (_one_row_bytes) fit in the memory available with a quarter to spare; none where this CPU or
    build has no such product for the dtype, and none outside pack_for_decoding's half-precision path. The one rule
    for the copies made (_prepack_one_row) and counted before a generation (decoding_copy_bytes)."""
    from .devices import available_memory

    if not _laid_out_for_steps(model) or model.dtype not in (torch.bfloat16, torch.float16):
        return []
    if not _one_row_products_here(model.dtype):
        return []
    groups: list[tuple[nn.Module, tuple]] = []
    for block in model.blocks:
        attn = block.attn
        groups += [(attn, (attn.q, attn.k, attn.v)), (attn.o, (attn.o,))]
        for mlp in dense_mlps(block.mlp):
            groups.append((mlp, (mlp.gate, mlp.up)) if hasattr(mlp, "gate") else (mlp.up, (mlp.up,)))
            groups.append((mlp.down, (mlp.down,)))
    if model.cfg.lm_head and model.cfg.lm_head_kind not in ("mlm", "classifier"):
        groups.append((model.lm_head, (model.lm_head,)))
    groups = [(owner, linears) for owner, linears in groups if _prepacked(owner, linears) is None]
    have = available_memory("cpu") if groups else None
    if have is not None and _one_row_bytes(groups) * 5 // 4 > have:
        return []
    return groups


def _one_row_bytes(groups) -> int:
    """The bytes of the copies prepack_one_row keeps for `groups` (owner, linears): the weights prepacked (the
    bytes the prepacked tensor reports, the weights'; oneDNN's blocked layout may pad a dimension that is not a
    multiple of its block, not counted), and a group's biases side by side where it has any (zeros for a layer
    without)."""
    total = 0
    for _, linears in groups:
        total += sum(lin.weight.numel() * lin.weight.element_size() for lin in linears)
        if len(linears) > 1 and any(lin.bias is not None for lin in linears):
            total += sum(lin.out_features * (lin.bias if lin.bias is not None else lin.weight).element_size()
                         for lin in linears)
    return total


@functools.cache
def _one_row_products_here(dtype: torch.dtype) -> bool:
    """Whether this CPU and torch build prepack `dtype` weights for one-row products (prepack_one_row): oneDNN, and
    for float16 AVX-512 FP16 or AVX-NE-CONVERT (its reorder refuses otherwise). A small weight tried once."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), 1)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return True


def linear(owner: nn.Module, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w, b); one row (a generation step) through the prepacked copy of `w` prepack_one_row
    made for `owner`, while `w` is where and as it was (a load or an edit in place changes its version:
    the plain product then, until packed again) and nothing needs gradients."""
    kept = owner.__dict__.get("_one_row")  # (none made, e.g. in float32: one dict read)
    if (kept is not None and x.numel() == x.shape[-1] and not torch.is_grad_enabled()
            and kept.made_from == (w.data_ptr(), w._version)):
        return torch.ops.mkldnn._linear_pointwise(x, kept.weight, b, "none", [], "")
    return F.linear(x, w, b)


def products(owner: nn.Module, x: torch.Tensor, linears,
             concatenated_with_gradients: bool = False) -> tuple[torch.Tensor, ...]:
    """Each of `linears` (nn.Linear reading the same input x) applied to x. One product when nothing needs
    their separate gradients and they are prepacked side by side for `owner` (a one-row step:
    prepack_one_row) or laid out side by side (pack_linears); with gradients (training), one product over
    their weights concatenated when asked; else one product each."""
    if len(linears) == 1:
        return (linear(owner, x, linears[0].weight, linears[0].bias),)
    outs = [lin.out_features for lin in linears]
    if torch.is_grad_enabled():
        biases = [lin.bias for lin in linears]
        if concatenated_with_gradients and (all(b is None for b in biases) or all(b is not None for b in biases)):
            # the weights' copy is small beside the product, its backward free views: the backward too makes
            # one product for the input's gradient and one for the weights' where there was one each
            # (bench training: attention projections about 1.8x faster on 2 threads; the whole step 3-5%, median
            # of 12 and 8 interleaved A/B pairs at bench quick's and the default size)
            b = None if biases[0] is None else torch.cat(biases)
            return F.linear(x, torch.cat([lin.weight for lin in linears]), b).split(outs, dim=-1)
    else:
        joined = joined_product(owner, x, linears)
        if joined is not None:  # (split_with_sizes: what Tensor.split calls for a list, without its Python wrapper)
            return joined.split_with_sizes(outs, -1)
    return tuple(lin(x) for lin in linears)


def joined_product(owner: nn.Module, x: torch.Tensor, linears) -> torch.Tensor | None:
    """x times the weights of `linears` side by side, [..., sum of their outputs] (products' one product, not
    split), where one product makes them all (prepacked for `owner` for one row: prepack_one_row; or laid
    out side by side: pack_linears); else None. Without gradients."""
    kept = owner.__dict__.get("_one_row")
    if kept is not None and x.numel() == x.shape[-1] and kept.made_from == _made_from(_group_tensors(linears)):
        return torch.ops.mkldnn._linear_pointwise(x, kept.weight, kept.bias, "none", [], "")
    fused = packed_linears(linears)
    return None if fused is None else F.linear(x, *fused)


def _prepacked(owner: nn.Module, linears) -> OneRowCopy | None:
    """The copy prepack_one_row made for `owner` from `linears`, while their tensors are where and as they
    were when packed (what linear and products check inline)."""
    kept = one_row_copy(owner)
    if kept is None:
        return None
    tensors = [linears[0].weight] if len(linears) == 1 else _group_tensors(linears)
    return kept if kept.made_from == _made_from(tensors) else None


@dataclass(eq=False)
class LayerCache:
    k: torch.Tensor | None = None  # [B, H_kv, T, dh], after rotary
    v: torch.Tensor | None = None
    owner: "KVCache | None" = None  # the cache whose buffers hold k and v (None: a lone layer, concatenated)
    index: int = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Put the new keys and values [B, H_kv, T_new, dh] after the cached ones; all of them back."""
        if self.owner is not None:
            return self.owner.append(self.index, k, v)
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v


class KVCache:
    """Keys and values of every layer for the tokens seen so far (for step-by-step generation).

    Preallocated: every layer's keys live in one buffer [L, B, H_kv, capacity, dh] (values in
    another) that grows by doubling, and a step writes its one new row in place; each layer's
    k and v are views of the first T rows. Concatenating instead copied every cached key and value
    once per step, and stacking the layers' keys for the recorded attention rows copied them again
    (both ~10% of a GPT-2-small step at 60 tokens, measured with torch.profiler). The buffers are
    also what generation reads for all layers' attention rows at once (stacked_keys).

    Sliding-window layers keep every key too: the window is applied by the mask, so truncating
    (going back in the generation tree) never needs keys that were dropped; truncating only
    shortens the views. A clone shares the buffers until either side writes (copy-on-write).
    When autograd needs the keys (a forward with gradients) nothing is written in place: the
    cache drops its buffers and concatenates as a lone layer would."""

    def __init__(self, n_layers: int) -> None:
        self.layers = [LayerCache(owner=self, index=l) for l in range(n_layers)]
        self._keys: torch.Tensor | None = None  # [L, B, H_kv, capacity, dh]; every layer's k is a view
        self._values: torch.Tensor | None = None
        self._sharers: list[int] | None = None  # [caches sharing the buffers] after clone(), shared by them
        self._layer_buffers: list[tuple[torch.Tensor, torch.Tensor]] = []  # (keys[l], values[l]) of each layer

    @property
    def length(self) -> int:
        k = self.layers[0].k
        return 0 if k is None else k.shape[2]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lc = self.layers[layer]
        past = 0 if lc.k is None else lc.k.shape[2]
        end = past + k.shape[2]
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad or (lc.k is not None and lc.k.requires_grad)):
            self._drop_buffers()  # in-place writes would break the graph: concatenate out of place
            if lc.k is not None:
                k, v = torch.cat([lc.k, k], dim=2), torch.cat([lc.v, v], dim=2)
            lc.k, lc.v = k, v
            return k, v
        if not self._can_write(k, end):
            self._reallocate(k, end)
        keys, values = self._layer_buffers[layer]  # (views of the buffers made once: two ops fewer a call)
        keys[:, :, past:end] = k
        values[:, :, past:end] = v
        lc.k, lc.v = keys[:, :, :end], values[:, :, :end]
        return lc.k, lc.v

    def _can_write(self, k: torch.Tensor, end: int) -> bool:
        buf = self._keys
        return (buf is not None and end <= buf.shape[3] and buf.shape[1:3] == k.shape[:2] and buf.shape[4] == k.shape[3]
                and buf.dtype == k.dtype and buf.device == k.device
                and (self._sharers is None or self._sharers[0] == 1)
                and (torch.is_inference_mode_enabled() or not buf.is_inference()))

    def _reallocate(self, k: torch.Tensor, end: int) -> None:
        """Fresh buffers of at least `end` rows (doubling: amortised O(1) copies per row), holding
        what every layer has cached; they belong to this cache alone."""
        old = 0 if self._keys is None else self._keys.shape[3]
        capacity = max(end, 2 * old, 64)
        B, Hkv, _, dh = k.shape
        shape = (len(self.layers), B, Hkv, capacity, dh)
        keys = torch.empty(shape, dtype=k.dtype, device=k.device)
        values = torch.empty(shape, dtype=k.dtype, device=k.device)
        for l, lc in enumerate(self.layers):
            if lc.k is not None:
                n = lc.k.shape[2]
                keys[l, :, :, :n], values[l, :, :, :n] = lc.k, lc.v
                lc.k, lc.v = keys[l, :, :, :n], values[l, :, :, :n]
        self._drop_buffers()
        self._set_buffers(keys, values)

    def _set_buffers(self, keys: torch.Tensor | None, values: torch.Tensor | None, sharers: list[int] | None = None) -> None:
        self._keys, self._values, self._sharers = keys, values, sharers
        self._layer_buffers = [] if keys is None else list(zip(keys.unbind(0), values.unbind(0)))  # each layer's

    def _drop_buffers(self) -> None:
        if self._sharers is not None:
            self._sharers[0] -= 1
        self._set_buffers(None, None)

    def truncate(self, n: int) -> None:
        for lc in self.layers:
            if lc.k is not None:
                lc.k, lc.v = lc.k[:, :, :n], lc.v[:, :, :n]

    def clone(self) -> "KVCache":
        c = KVCache(len(self.layers))
        for src, dst in zip(self.layers, c.layers):
            dst.k, dst.v = src.k, src.v
        if self._keys is not None:  # shared until either side writes (then that side copies)
            self._sharers = self._sharers or [1]
            self._sharers[0] += 1
            c._set_buffers(self._keys, self._values, self._sharers)
        return c

    def select(self, index: torch.Tensor) -> "KVCache":
        """Reorder / repeat the batch (beam search)."""
        c = KVCache(len(self.layers))
        if self._keys is not None and all(lc.k is not None for lc in self.layers):
            c._set_buffers(self._keys[:, index], self._values[:, index])
            for src, dst in zip(self.layers, c.layers):
                n = src.k.shape[2]
                dst.k, dst.v = c._keys[dst.index, :, :, :n], c._values[dst.index, :, :, :n]
            return c
        for src, dst in zip(self.layers, c.layers):
            if src.k is not None:
                dst.k, dst.v = src.k[index], src.v[index]
        return c

    def stacked_keys(self, padded: bool = False) -> torch.Tensor:
        """Every layer's keys [L, B, H_kv, T, dh]: a view of the buffer when all layers hold T. padded: the
        whole buffer's rows (past T: not set, any values) when there is one, else the T rows."""
        n = self.length
        if self._keys is not None and all(lc.k is not None and lc.k.shape[2] == n for lc in self.layers):
            return self._keys if padded else self._keys[:, :, :, :n]
        return torch.stack([lc.k for lc in self.layers])


@functools.cache
def _native_bfloat16_products() -> bool:
    return bool(half_matrix_units(torch.bfloat16))  # (asked once: half_matrix_units probes the CPU each call)


def explicit_differentiates_faster(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether softmax attention that will be differentiated (training, attribution) runs faster as its
    explicit products than through PyTorch's fused CPU kernel: in bfloat16 on a CPU with bfloat16 matrix
    instructions, up to 512 keys. That kernel's bfloat16 backward is slow on the CPU: forward and backward
    of [16, 4, 128, 32] took 21.7 ms against 7.8 ms for the explicit products (one thread; two: 18.4 against
    6.9), [64, 4, 64, 16] 42.7 against 6.4, [2, 12, 512, 64] 78 against 62, while at [1, 14, 1024, 64] the
    fused kernel won (115 against 146; AVX-512 BF16, 2 Dec 2026); bench training's bfloat16 step spent 96 of
    its 216 ms there. float16 stays fused (the explicit float16 products are emulated: 1.8x slower). The
    explicit weights are kept for the backward, so only up to 2^24 of them a layer (32 MB; the fused kernel
    keeps none): a long context's large batch stays fused."""
    return (q.dtype == torch.bfloat16 and q.device.type == "cpu" and k.shape[-2] <= 512
            and q.shape[:-2].numel() * q.shape[-2] * k.shape[-2] <= EXPLICIT_WEIGHTS_KEPT
            and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad) and _native_bfloat16_products())


EXPLICIT_WEIGHTS_KEPT = 2 ** 24


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, dh = cfg.d_model, cfg.d_head
        self.q = nn.Linear(d, cfg.n_heads * dh, bias=cfg.attention_bias)
        self.k = nn.Linear(d, cfg.n_kv_heads * dh, bias=cfg.attention_bias)
        self.v = nn.Linear(d, cfg.n_kv_heads * dh, bias=cfg.attention_bias)
        self.o = nn.Linear(cfg.n_heads * dh, d, bias=cfg.attention_out_bias)
        if cfg.qk_norm:  # one norm of width d_head, shared by every head (Qwen3, Gemma 3), or over all heads (OLMo 2)
            self.q_norm = make_norm(cfg, cfg.n_heads * dh if cfg.qk_norm_across_heads else dh)
            self.k_norm = make_norm(cfg, cfg.n_kv_heads * dh if cfg.qk_norm_across_heads else dh)
        self.scale = cfg.attn_scale  # None: SDPA's and attention_probs' default 1/sqrt(dh)
        self.dropout = cfg.dropout
        self._trace_names: dict[str, tuple[str, str, str, str]] = {}  # by prefix: trace_names'

    def trace_names(self, prefix: str) -> tuple[str, str, str, str]:
        """prefix + "q", "pattern", "z", "head_out", joined once per prefix (four string joins a layer a step)."""
        names = self._trace_names.get(prefix)
        if names is None:
            names = self._trace_names[prefix] = (prefix + "q", prefix + "pattern", prefix + "z", prefix + "head_out")
        return names

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, rotary: tuple | None = None,
                cache: LayerCache | None = None, trace: Trace | None = None, prefix: str = "",
                is_causal_full: bool = False) -> torch.Tensor:
        cfg = self.cfg
        B, T, _ = x.shape
        H, Hkv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
        per_head_norm = cfg.qk_norm and not cfg.qk_norm_across_heads
        # one token (a generation step): q and k rotate as one [B, 1, H + Hkv, dh] tensor, the same values in
        # half the operations
        one_token = rotary is not None and T == 1 and not per_head_norm
        qkv = None
        if one_token and not torch.is_grad_enabled() and not cfg.qk_norm and cfg.clip_qkv is None:
            m = self._modules  # (self.q ...: a Python __getattr__ call each)
            qkv = joined_product(self, x, (m["q"], m["k"], m["v"]))  # [B, 1, (H + 2 Hkv) dh], or None
        if qkv is not None:  # q and k side by side in it already (split from it and concatenated: a copy more);
            # heads-first [B, H + 2 Hkv, 1, dh] as the one-token branch below takes them (one view, not two)
            qk, v = qkv.view(B, H + 2 * Hkv, 1, dh).split_with_sizes((H + Hkv, Hkv), 1)
        else:
            q, k, v = self.project_qkv(x)
            if cfg.clip_qkv is not None:  # OLMo
                q, k, v = (t.clamp(-cfg.clip_qkv, cfg.clip_qkv) for t in (q, k, v))
            if cfg.qk_norm_across_heads:  # OLMo 2: every head's q (and k) normed at once, before the split
                q, k = self.q_norm(q), self.k_norm(k)
            qk = torch.cat([q, k], dim=-1) if one_token else None
        if one_token:  # with T = 1, [B, H, 1, dh] is a view of [B, 1, H dh]: no transposes (the same values)
            if qkv is None:
                qk, v = qk.view(B, H + Hkv, 1, dh), v.view(B, Hkv, 1, dh)
            q, k = apply_rotary(qk, *rotary).split_with_sizes((H, Hkv), 1)
        else:
            v = v.view(B, T, Hkv, dh).transpose(1, 2)
            q = q.view(B, T, H, dh).transpose(1, 2)
            k = k.view(B, T, Hkv, dh).transpose(1, 2)
            if per_head_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            if rotary is not None:
                q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if trace is not None:
            trace.record(self.trace_names(prefix)[0], q)
        if cache is not None:
            k, v = cache.append(k, v)
        return self.attend(q, k, v, mask, trace, prefix, is_causal_full)

    def cross(self, x: torch.Tensor, source: torch.Tensor, mask: torch.Tensor | None, cache: LayerCache | None = None,
              trace: Trace | None = None, prefix: str = "") -> torch.Tensor:
        """Cross-attention (encoder-decoders): queries from x [B, T, d], keys and values from `source`
        [B, S, d] (the encoder's output). With a cache, the keys and values are computed on its first
        use and read back after (the source does not change while the decoder runs)."""
        cfg = self.cfg
        B, T, _ = x.shape
        q = self.q(x).view(B, T, cfg.n_heads, cfg.d_head).transpose(1, 2)
        if cache is not None and cache.k is not None:
            k, v = cache.k, cache.v
        else:
            S = source.shape[1]
            k = self.k(source).view(B, S, cfg.n_kv_heads, cfg.d_head).transpose(1, 2)
            v = self.v(source).view(B, S, cfg.n_kv_heads, cfg.d_head).transpose(1, 2)
            if cache is not None:
                cache.k, cache.v = k, v
        if trace is not None:
            trace.record(prefix + "q", q)
        return self.attend(q, k, v, mask, trace, prefix, False)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               trace: Trace | None, prefix: str, is_causal_full: bool) -> torch.Tensor:
        """The attention of queries [B, H, T, dh] over keys and values [B, H_kv, T_k, dh], through W_O:
        [B, T, d]. mask: boolean (True where query i may see key j) or additive (T5's position bias)."""
        cfg = self.cfg
        B, H, T, dh = q.shape
        Hkv = k.shape[1]
        names = None if trace is None else self.trace_names(prefix)  # (q, pattern, z, head_out)
        heads_out = names is not None and trace.wants(names[3])
        recording = heads_out or (names is not None and trace.wants(names[1]))
        # (scaled_dot_product_attention has no soft-capping: a soft-capped model takes the explicit path)
        fused = (cfg.attention_kind == "softmax" and not recording and cfg.attn_logit_softcap is None
                 and not explicit_differentiates_faster(q, k))
        # the fused kernel reads grouped keys and values as they are (enable_gqa: the same values as
        # repeated ones, bit for bit on the CPU; two copies fewer, ~2x faster for a one-token step)
        grouped = fused and Hkv != H
        if Hkv != H and not grouped:
            k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)

        drop = self.dropout if self.training else 0.0
        if fused:
            if is_causal_full:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop, scale=self.scale,
                                                   enable_gqa=grouped)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop, scale=self.scale,
                                                   enable_gqa=grouped)
        else:
            p = attention_probs(q, k, cfg.attention_kind, mask, cfg.sinkhorn_iters, self.scale, cfg.attn_logit_softcap)
            if trace is not None:
                trace.record(names[1], p)
            y = F.dropout(p, drop, self.training) @ v
        if names is not None:
            y = trace.point(names[2], y)  # [B, H, T, dh], each head's output before W_O (point's)
            if heads_out:
                trace.record(names[3], self.head_outputs(y))
        o = self._modules["o"]  # (a module attribute is a Python __getattr__ call: a dict read instead)
        # [B, T, H dh]; one query's [B, H, 1, dh] is in that order already (one op, not a transpose and a reshape)
        y = y.reshape(B, 1, H * dh) if T == 1 else y.transpose(1, 2).reshape(B, T, H * dh)
        return linear(o, y, *weight_bias(o))

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values [B, T, H*dh]: one matrix product when the three weights are laid out
        side by side (pack_qkv) or prepacked so for one-token steps, or, in training, concatenated for
        the step; else three (products)."""
        return products(self, x, (self.q, self.k, self.v), concatenated_with_gradients=True)

    def pack_qkv(self, column_major: bool = True) -> None:
        """Store W_Q, W_K, W_V (and their biases) in one buffer [dq + 2 dk, d] (column-major, or row-major);
        each parameter becomes a view of it
        (same values, same shapes), so one product computes all three."""
        pack_linears((self.q, self.k, self.v), column_major)

    def _packed_qkv(self) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(W [dq + 2 dk, d], b) as views of the packed buffer, or None when the three weights are not
        (or no longer: a device move, a load) laid out that way."""
        return packed_linears((self.q, self.k, self.v))

    def head_outputs(self, y: torch.Tensor) -> torch.Tensor:
        """Each head's share of the sublayer's output, W_O,h y_h (before the output bias):
        y [..., H, T, d_head] (attention-weighted values) -> [..., H, T, d_model]."""
        cfg = self.cfg
        return torch.einsum("...htk,dhk->...htd", y, self.o.weight.view(cfg.d_model, cfg.n_heads, cfg.d_head))


# -- MLP -------------------------------------------------------------------------------------


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """The tanh GELU as transformers' gelu_new (NewGELUActivation) evaluates it, op by op: in half
    precision each op rounds, so only this order gives its bfloat16 values (F.gelu rounds once)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class MLP(nn.Module):
    """The dense MLP, down(act(up(x))), or down(act(gate(x)) * up(x)) with a gated activation. Called as
    every MLP-like module of a block is (make_mlp), mlp(x, trace, prefix); a dense MLP has no points of its
    own (a mixture of experts records its routing under prefix)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.activation = cfg.activation
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.mlp_bias)
        if cfg.activation in ("swiglu", "geglu"):
            self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.mlp_bias)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor, trace: Trace | None = None, prefix: str = "") -> torch.Tensor:
        # trace and prefix: the MLP-like call every block makes (a mixture of experts records there)
        if self.activation in ("swiglu", "geglu"):
            g, u = self.gate_up(x)
            # Gemma (geglu): gelu_pytorch_tanh on the gate
            h = (F.silu(g) if self.activation == "swiglu" else F.gelu(g, approximate="tanh")) * u
        else:
            up = linear(self.up, x, self.up.weight, self.up.bias)
            if self.activation == "gelu_tanh" and up.dtype in (torch.bfloat16, torch.float16) and not self.training:
                # gelu_new, which GPT-2, GPT-J, GPT-Neo and Phi name, for transformers' half-precision bits; F.gelu in
                # float32 and in training (it rounds once: forward and backward of 2048 x 512 in bfloat16 took 4.8
                # against gelu_new's 7.7 ms on one thread, 2.7 against 6.6 on two)
                h = gelu_new(up)
            elif self.activation == "gelu_tanh":
                h = F.gelu(up, approximate="tanh")
            elif self.activation == "gelu":
                h = F.gelu(up)
            elif self.activation == "silu":  # ungated (Marian's swish)
                h = F.silu(up)
            else:
                h = F.relu(up)
        down = self._modules["down"]
        return linear(down, h, *weight_bias(down))

    def gate_up(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A gated MLP's gate and up products: one product when pack_for_decoding has prepacked the two
        side by side for one-token steps (and nothing needs their separate gradients), else two."""
        m = self._modules
        return products(self, x, (m["gate"], m["up"]))


def make_mlp(cfg: ModelConfig) -> nn.Module:
    """A block's MLP-like sublayer: the dense (or gated) MLP, or with num_experts a mixture of experts."""
    if cfg.num_experts:
        from .moe import MoE
        return MoE(cfg, MLP)
    return MLP(cfg)


def dense_mlps(mlp: nn.Module) -> list[nn.Module]:
    """The dense MLPs of a block's MLP-like sublayer: itself, or a mixture's experts (MoE.mlps)."""
    return mlp.mlps() if hasattr(mlp, "mlps") else [mlp]


def token_embedding(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The tokens' rows of the embedding, scaled where the config says (Gemma, BART / Marian's
    scale_embedding: the scale rounded to the embedding dtype first, float32 first as HF's buffer)."""
    x = model.tok_embed(ids)
    if model.cfg.embed_scale is not None:
        x = x * torch.tensor(model.cfg.embed_scale).to(x.dtype)
    return x


def weight_bias(lin: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """An nn.Linear's weight and bias read from its parameters' dict: two Python __getattr__ calls fewer."""
    p = lin._parameters
    return p["weight"], p["bias"]


# -- block -----------------------------------------------------------------------------------


def forward_of(module: nn.Module) -> Callable:
    """What calling `module` runs: its forward itself where nn.Module.__call__ would run nothing more (no hook
    on it, nor a global one; streamed.py's are on the blocks): two Python frames fewer a call, ~0.5 us."""
    if (module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks
            or _hooks._global_forward_hooks or _hooks._global_forward_pre_hooks or _hooks._global_backward_hooks
            or _hooks._global_backward_pre_hooks):
        return module
    return module.forward


@dataclass(frozen=True)
class Sublayer:
    """One residual step of a block: a module f (`name`), which of the block's norms go where, and how
    f's output joins the residual stream x:

        pre-norm                  x + f(norm(x))                  GPT-2, LLaMA
        post-norm (post)          norm(x + f(x))                  BERT, BART, Marian
        out_norm                  x + out_norm(f(norm(x)))        Gemma 3's sandwich norms
        out_norm, no norm         x + out_norm(f(x))              OLMo 2
        parallel                  f reads the block's input, not the stream after the sublayer before it:
                                  x + attn(norm1(x)) + mlp(norm2(x)) (GPT-NeoX), or with the one norm
                                  x + attn(norm1(x)) + mlp(norm1(x)) (GPT-J, Phi-2, Falcon, Cohere)
        multiplier r              x + r * f(...)                  Granite

    The modules are the block's own attributes, named here, so parameters keep their names
    (blocks.L.norm1.weight, blocks.L.attn.q.weight). Activation points: `name`.input (what f reads),
    `name`.out (what is added to the stream), then `resid` (the stream after it)."""
    name: str  # the block's module and the stem of its trace names: "attn", "cross_attn" or "mlp"
    resid: str  # the stream after it: "resid_mid", "resid_cross" or "resid_post"
    norm: str | None  # the block's norm on f's input (with post: on the sum); None: none
    out_norm: str | None = None  # the block's norm on f's output, before the residual add
    post: bool = False
    parallel: bool = False
    input_first: bool = False  # parallel: (input + attn) + f, not (f + attn) + input (config's parallel_sum)
    multiplier: float | None = None  # None: 1


def sublayers_of(cfg: ModelConfig, cross_attention: bool = False) -> list[Sublayer]:
    """A block's sublayers in order, placed as the config says: self-attention, cross-attention (an
    encoder-decoder's decoder block) over the encoder's output, the MLP."""
    post, output = cfg.norm_placement == "post", cfg.norm_placement == "output"
    out_norms, r = cfg.sandwich_norms or output, cfg.residual_multiplier
    attn = Sublayer("attn", "resid_mid", None if output else "norm1", "post_attn_norm" if out_norms else None,
                    post=post, multiplier=r)
    cross = Sublayer("cross_attn", "resid_cross", "norm_cross", post=post, multiplier=r)
    mlp = Sublayer("mlp", "resid_post", None if output else "norm1" if cfg.shared_input_norm else "norm2",
                   "post_mlp_norm" if out_norms else None, post=post, parallel=cfg.parallel_residual,
                   input_first=cfg.parallel_sum == "input_first", multiplier=r)
    return [attn, cross, mlp] if cross_attention else [attn, mlp]


class Block(nn.Module):
    """The residual stream through the block's sublayers in order (Hugging Face's T5Block.layer):
    self-attention, then (an encoder-decoder's decoder block) cross-attention over the encoder's
    output, then the MLP; each a Sublayer placed as the config says (sublayers_of)."""

    def __init__(self, cfg: ModelConfig, cross_attention: bool = False) -> None:
        super().__init__()
        self.sublayers = sublayers_of(cfg, cross_attention)
        self._point_names: dict[str, list[tuple[str, str, str]]] = {}  # compose's, by prefix
        norms = {s.norm for s in self.sublayers} | {s.out_norm for s in self.sublayers}
        if "norm1" in norms:  # created in this order: a model's random initialisation stays as it was
            self.norm1 = make_norm(cfg)
        self.attn = Attention(cfg)
        if "norm2" in norms:
            self.norm2 = make_norm(cfg)
        self.mlp = make_mlp(cfg)
        if "post_attn_norm" in norms:
            self.post_attn_norm = make_norm(cfg)
            self.post_mlp_norm = make_norm(cfg)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        if cross_attention:
            self.norm_cross = make_norm(cfg)
            self.cross_attn = Attention(cfg)

    def output_norm(self, name: str) -> nn.Module | None:
        """The norm on sublayer `name`'s output before its residual add (sandwich or output norms), or None."""
        s = next(s for s in self.sublayers if s.name == name)
        return None if s.out_norm is None else getattr(self, s.out_norm)

    def forward(self, x, mask, rotary, cache, trace: Trace | None, prefix: str, is_causal_full: bool, *,
                source: torch.Tensor | None = None, source_mask: torch.Tensor | None = None,
                cross_cache: LayerCache | None = None, stop_at: str | None = None) -> torch.Tensor:
        """x [B, T, d] through every sublayer. mask, rotary, cache, is_causal_full: the self-attention's
        (Attention.forward); source [B, S, d], source_mask, cross_cache: the cross-attention's (Attention.cross);
        stop_at: compose's."""
        modules = self._modules  # (a module attribute is a Python __getattr__ call: read the dict once)
        attn, mlp = forward_of(modules["attn"]), forward_of(modules["mlp"])
        run = {"attn": lambda h: attn(h, mask, rotary, cache, trace, prefix + "attn.", is_causal_full),
               "cross_attn": lambda h: self.cross_attn.cross(h, source, source_mask, cross_cache, trace,
                                                             prefix + "cross_attn."),
               "mlp": lambda h: mlp(h, trace, prefix + "mlp.")}
        return self.compose(x, run, trace=trace, prefix=prefix, stop_at=stop_at)

    def compose(self, x: torch.Tensor, run: dict, *, norm: Callable[[str], Callable] | None = None,
                replace: dict | None = None, trace: Trace | None = None, prefix: str = "",
                stop_at: str | None = None) -> torch.Tensor:
        """The residual stream x through the sublayers as their records say: run[name](h) computes f from
        its input h; norm(name) is the callable applied for the block's norm `name` (default: the norm
        itself); replace[name](h, stream) gives a sublayer's whole output (what `.out` records: f, its
        output norm and multiplier) from its input h and the stream it read before its norm. The
        attribution graph's replacement model (core/graphs) drives its blocks through here with norms and
        attention patterns frozen and the MLPs replaced, so every family's placement is this one code.
        stop_at: a point of this block (prefix + "attn.input", "attn.out", "resid_mid" ...) after which
        nothing more runs; the stream as it is there is returned."""
        if norm is None:  # the block's own norms: its modules (no __getattr__ call), through forward_of
            modules = self._modules
            norm = lambda name: forward_of(modules[name])  # noqa: E731
        # the sublayers' point names under this prefix, made once (3 string joins a point, 9 comparisons with
        # stop_at a layer, a step: ~5% of a one-token step's Python at the tiny Qwen shape)
        names = self._point_names.get(prefix)
        if names is None:
            names = self._point_names[prefix] = [(prefix + s.name + ".input", prefix + s.name + ".out", prefix + s.resid)
                                                 for s in self.sublayers]
        record = None if trace is None else trace.point  # point(trace, ...) without its call
        block_in, added, made = x, None, None  # the block's input; the last sublayer's output, the stream it made
        for s, (at_input, at_out, at_resid) in zip(self.sublayers, names):
            h = stream = block_in if s.parallel else x
            if s.norm is not None and not s.post:
                h = norm(s.norm)(h)
            if record is not None:
                h = record(at_input, h)  # read only: a transcoder's input (core/features)
            if stop_at is not None and stop_at == at_input:
                return x
            if replace is not None and s.name in replace:
                out = replace[s.name](h, stream)
            else:
                out = run[s.name](h)
                if s.out_norm is not None:
                    out = norm(s.out_norm)(out)
                if s.multiplier is not None:
                    out = out * s.multiplier
            if self.training:
                out = self.resid_dropout(out)
            if record is not None:
                out = record(at_out, out)
            if stop_at is not None and stop_at == at_out:
                return x
            if s.post:
                new = norm(s.norm)(x + out)
            elif s.parallel and x is made and not s.input_first:  # (m + a) + input, transformers' GPT-NeoX order:
                new = (out + added) + block_in  # bfloat16 rounds (input + a) + m (Cohere's, the else) differently;
                # an edited stream is added to as it is
            else:
                new = x + out
            x = new if record is None else record(at_resid, new)
            if stop_at is not None and stop_at == at_resid:
                return x
            added, made = out, new
        return x


def check_stop_at(stop_at: str | None, prefix: str, n_layers: int, what: str = "model") -> None:
    """A pass's stop_at names one of its points: prefix + "embed", or a point of one of its n_layers blocks
    (prefix + "blocks.{l}."); anything else (a typo, a layer past the last) would run the whole pass."""
    if stop_at is None or stop_at == prefix + "embed" or any(stop_at.startswith(f"{prefix}blocks.{l}.")
                                                             for l in range(n_layers)):
        return
    raise ValueError(f"stop_at {stop_at!r} is no point of this {n_layers}-layer {what}'s pass "
                     "(a typo would run the whole pass)")


# -- the model -------------------------------------------------------------------------------


@dataclass
class ModelOutput:
    logits: torch.Tensor | None  # [B, T, vocab] when the model has an LM head
    hidden: torch.Tensor  # last block's output [B, T, d]
    cache: KVCache | None


@dataclass
class HeadMatrices:
    """One head's analysis matrices (model space d, head width dh).

    A = W_K^T W_Q * s (s the score scale, 1/sqrt(dh) unless the config's attn_scale says
    otherwise) so that x_i^T A^T x_j = s q_i . k_j (biases and rotary positions left out);
    V = W_O W_V is the head's value map into model space, f(X)_i = V sum_j P_ij x_j.
    With qk_norm (Qwen3, Gemma 3) q and k are normed per head before the product, so the score
    is no longer a bilinear form in x: A is then only the linear part, not the head's score.
    """
    W_Q: torch.Tensor  # [dh, d]
    W_K: torch.Tensor  # [dh, d]
    W_V: torch.Tensor  # [dh, d]
    W_O: torch.Tensor  # [d, dh]
    b_Q: torch.Tensor | None
    b_K: torch.Tensor | None
    b_V: torch.Tensor | None
    A: torch.Tensor  # [d, d]
    V: torch.Tensor  # [d, d]


def head_matrices_of(attn: Attention, head: int) -> HeadMatrices:
    """One head's analysis matrices from an attention module (a decoder's, an encoder's or a cross-attention)."""
    cfg = attn.cfg
    dh = cfg.d_head
    kv = head // (cfg.n_heads // cfg.n_kv_heads)
    rows = slice(head * dh, (head + 1) * dh)
    kv_rows = slice(kv * dh, (kv + 1) * dh)
    W_Q = attn.q.weight[rows].detach().float()
    W_K = attn.k.weight[kv_rows].detach().float()
    W_V = attn.v.weight[kv_rows].detach().float()
    W_O = attn.o.weight[:, rows].detach().float()
    bias = lambda lin, r: None if lin.bias is None else lin.bias[r].detach().float()  # noqa: E731
    return HeadMatrices(W_Q, W_K, W_V, W_O, bias(attn.q, rows), bias(attn.k, kv_rows), bias(attn.v, kv_rows),
                        A=W_K.T @ W_Q * attention_scale(cfg), V=W_O @ W_V)


class ModelBase(nn.Module):
    """What every model built of Blocks has (Transformer here, the encoder-decoder in seq2seq.py): its
    initialisation rules, its parameter count, its weights' device and dtype."""

    # -- initialisation ------------------------------------------------------------------
    def reset_parameters(self) -> None:
        cfg = self.cfg
        for name, mod in self.named_modules():
            if isinstance(mod, nn.Linear):
                if cfg.init == "glorot":
                    nn.init.xavier_normal_(mod.weight)
                elif cfg.init == "he":
                    nn.init.kaiming_normal_(mod.weight, nonlinearity="relu")
                else:
                    std = cfg.init_std
                    if name.endswith(("attn.o", ".down")):  # mlp.down, a mixture's experts.e.down and shared_expert.down
                        std = std / math.sqrt(2 * cfg.n_layers)  # GPT-2's scaled residual projections
                    nn.init.normal_(mod.weight, 0.0, std)
                if mod.bias is not None:
                    nn.init.zeros_(mod.bias)
            elif isinstance(mod, nn.Embedding):
                nn.init.normal_(mod.weight, 0.0, cfg.init_std)
            elif isinstance(mod, OffsetRMSNorm):
                nn.init.zeros_(mod.weight)  # scales by 1 + w
            elif isinstance(mod, (nn.LayerNorm, RMSNorm)) and mod.weight is not None:
                nn.init.ones_(mod.weight)
                if getattr(mod, "bias", None) is not None:
                    nn.init.zeros_(mod.bias)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # tied weights are counted once

    @property
    def device(self) -> torch.device:  # the first parameter: tok_embed, or patch_embed for images
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype


class Transformer(ModelBase):
    def __init__(self, cfg: ModelConfig, init_weights: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        if cfg.input_kind == "patches":  # ViT: one token per image patch (a Conv2d), a learned [CLS] first
            self.patch_embed = nn.Conv2d(cfg.num_channels, cfg.d_model, cfg.patch_size, stride=cfg.patch_size)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.d_model))
        else:
            self.tok_embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.positions == "learned":  # OPT, RoBERTa: the first position_offset rows are never read
            self.pos_embed = nn.Embedding(cfg.context_length + cfg.position_offset, cfg.d_model)
        elif cfg.positions == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_table(cfg.context_length, cfg.d_model, cfg.sinusoidal_layout),
                                 persistent=False)
        if cfg.type_vocab_size:
            self.type_embed = nn.Embedding(cfg.type_vocab_size, cfg.d_model)
        if cfg.embed_norm:
            self.embed_norm = make_norm(cfg)
        self.embed_dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        if cfg.final_norm:
            self.final_norm = make_norm(cfg)
        if cfg.lm_head:
            if cfg.lm_head_kind == "mlm":  # BERT/RoBERTa/DistilBERT: dense -> GELU -> LayerNorm -> decoder + bias
                self.mlm_dense = nn.Linear(cfg.d_model, cfg.d_model)
                self.mlm_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
                self.lm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
            elif cfg.lm_head_kind == "classifier" or cfg.final_logits_bias:  # ViT on [CLS]; GPT-J's and Phi's head bias
                self.lm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            if cfg.tie_embeddings:
                self.lm_head.weight = self.tok_embed.weight
        if cfg.pooler_size:  # ViTModel's pooler: tanh(dense([CLS] after the final norm))
            self.pooler = nn.Linear(cfg.d_model, cfg.pooler_size)
        if init_weights:  # skipped when weights are about to be loaded (saves time on big models)
            self.reset_parameters()

    def pack_for_decoding(self, prepack: bool = True) -> None:
        """Lay the weights out for one-token steps on the CPU; values and shapes stay the same (prepack:
        the half-precision prepacked copy too, which only one-row products use).

        A step multiplies one row by every weight matrix, so it is bound by reading the weights.
        CPU BLAS (MKL, one thread) streams a matrix with at least as many outputs as inputs faster
        stored [in, out] (the layout of GPT-2's Conv1D; here a column-major nn.Linear weight) than
        nn.Linear's row-major [out, in]: 1.6x on GPT-2's 50257 x 768 unembedding, 1.5-1.7x on its
        Q/K/V and MLP-up products; a wide-input one (the MLP's down projection, 3072 -> 768) the
        other way round (row-major 1.3x faster; 6-7% per token kept row-major, interleaved runs).
        Q, K and V also become one product (Attention.pack_qkv) in float32. (Gate and up as one
        column-major float32 product: 8-10% slower per token, interleaved runs on one thread; not done.)
        In half precision on the CPU the weights stay as loaded (not copied nor laid out again) and each product a step makes gets a oneDNN-prepacked copy instead
        (_prepack_one_row: 1.5-1.9x per product at the Qwen2.5-0.5B shape in bfloat16, one thread; the
        copy costs about four products' time, so it pays for itself within the first dozen tokens), Q/K/V
        and a gated MLP's gate and up prepacked side by side as one product each: oneDNN's bfloat16
        products run one row faster row-major (the column-major layout was 1.25x slower), and each product
        is a parallel region whose threads meet at its end, so fewer of them per step waste less time on
        a busy machine. (They were first laid out side by side in a buffer of their own, then prepacked:
        a second copy of half the weights, made and kept for nothing.) Other devices were not measured.
        Idempotent; training and state_dict still work (checkpoints are saved contiguous).
        """
        if getattr(self, "streamed", None) is not None:  # blocks read while they compute (core/streamed.py)
            return
        if self.device.type != "cpu" or self.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return
        if self.dtype != torch.float32:
            if prepack:
                self._prepack_one_row()
            return
        with torch.inference_mode(False), torch.no_grad(), _huge_pages_if_room(self):
            for block in self.blocks:
                block.attn.pack_qkv(column_major=True)
            for name, mod in self.named_modules():
                if not isinstance(mod, nn.Linear) or name.endswith(("attn.q", "attn.k", "attn.v")):
                    continue
                column_major = mod.out_features >= mod.in_features
                w = mod.weight.data
                if mod.__dict__.get("_laid_out") == (w.data_ptr(), w.stride()):  # by an earlier call: as it is
                    continue
                if column_major == w.is_contiguous() or huge_pages_for(w.numel() * w.element_size()):
                    # (laid out again, in huge pages too; or already in this layout, e.g. GPT-2's Conv1D weights,
                    # copied into huge pages only: a tied lm_head's copy is the embedding's too)
                    mod.weight.data = laid_out(w, column_major)
                    mod.__dict__["_laid_out"] = (mod.weight.data_ptr(), mod.weight.stride())

    def _prepack_one_row(self) -> None:
        """Half precision on the CPU: a oneDNN-prepacked copy of every product a step makes (prepack_one_row:
        Qwen2.5-0.5B shape, one thread, bfloat16 products 1.5-1.9x faster, the step's ids and values unchanged),
        when the copies fit in the memory available with a quarter to spare (_one_row_groups_to_pack)."""
        with torch.inference_mode(False), torch.no_grad():
            for owner, linears in _one_row_groups_to_pack(self):
                if not prepack_one_row(owner, linears):
                    return  # oneDNN refused (the dtype was probed: _one_row_products_here)

    # -- pieces --------------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor,
              token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = token_embedding(self, input_ids)
        if self.cfg.positions_from_pad and positions[0] == 0:
            # RoBERTa numbers positions from the ids: a pad token reads row pad_token_id, the others
            # count only the non-pad tokens up to them (HF create_position_ids_from_input_ids)
            kept = input_ids.ne(self.cfg.pad_token_id)
            x = x + self.pos_embed(torch.cumsum(kept, 1) * kept + self.cfg.pad_token_id)
        elif self.cfg.positions == "learned":
            x = x + self.pos_embed(positions + self.cfg.position_offset)
        elif self.cfg.positions == "sinusoidal":
            x = x + self.pos_table[positions].to(x.dtype)
        if self.cfg.type_vocab_size:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.type_embed(token_type_ids)
        if self.cfg.embed_norm:
            x = self.embed_norm(x)
        return self.embed_dropout(x) if self.training else x

    def embed_patches(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """ViT: pixel values [B, C, H, W] -> [CLS] then one vector per patch (row by row), plus the
        learned position embeddings: [B, 1 + patches, d]."""
        cfg = self.cfg
        expected = (cfg.num_channels, cfg.image_size, cfg.image_size)
        if pixel_values.dim() != 4 or tuple(pixel_values.shape[1:]) != expected:
            raise ValueError(f"pixel values of shape {list(pixel_values.shape)}; this model reads "
                             f"[batch, {expected[0]}, {expected[1]}, {expected[2]}]")
        x = self.patch_embed(pixel_values.to(self.dtype)).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.embed_dropout(x + self.pos_embed.weight[None])

    def unembed(self, h: torch.Tensor, *, normed: bool = False) -> torch.Tensor:
        """Final norm + unembedding (or the encoders' MLM head): logits from any residual stream
        (`normed`: h is already the final norm's output)."""
        cfg = self.cfg
        if not cfg.lm_head:
            raise ValueError("this model has no language-model head")
        if cfg.final_norm and not normed:
            h = self.final_norm(h)
        if cfg.lm_head_kind == "classifier":  # ViT: class logits [..., classes] from [CLS] alone
            return self.lm_head(h[..., 0, :]) + self.lm_bias
        if cfg.lm_head_kind == "mlm":
            h = self.mlm_norm(F.gelu(self.mlm_dense(h)))
            return self.lm_head(h) + self.lm_bias
        if cfg.lm_head_scale is not None:  # Granite's 1 / logits_scaling
            h = h * cfg.lm_head_scale
        logits = linear(self.lm_head, h, self.lm_head.weight, self.lm_bias if cfg.final_logits_bias else None)
        if cfg.final_logit_softcap is not None:
            logits = torch.tanh(logits / cfg.final_logit_softcap) * cfg.final_logit_softcap
        return logits

    def head_matrices(self, layer: int, head: int) -> HeadMatrices:
        """A head's W_Q, W_K, W_V, W_O, A and V (HeadMatrices); out of range in one line (EncoderDecoder's)."""
        if not 0 <= layer < len(self.blocks):
            raise ValueError(f"the model has layers 0..{len(self.blocks) - 1}, not {layer}")
        if not 0 <= head < self.cfg.n_heads:
            raise ValueError(f"the model has heads 0..{self.cfg.n_heads - 1}, not {head}")
        return head_matrices_of(self.blocks[layer].attn, head)

    # -- forward -------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, *, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, trace: Trace | None = None,
                cache: KVCache | None = None, compute_logits: bool = True,
                interventions=None, stop_at: str | None = None,
                on_layer: Callable[[int], None] | None = None) -> ModelOutput:
        """input_ids [B, T] (or [T]); attention_mask [B, T_total] with 1 for real tokens.

        With a cache, input_ids are the new tokens only and positions continue after the cache.
        interventions: Intervention edits (core/interventions.py) applied at their trace names.
        stop_at: a trace point ("embed", "blocks.3.attn.input", "blocks.3.resid_post" ...) after which the
        pass returns: nothing after it runs (not the rest of its block, nor the later blocks, the logit
        lens, the final norm or the logits); `hidden` is the residual stream there, a cache holds only
        the layers run. A point inside a sublayer (attn.q, attn.pattern ...) ends the pass at its block's
        end (before its logit lens). For callers that need early activations only (the Lipschitz lab's
        inputs, the features' hook points).
        on_layer: called with each block's index once it has run and its records are in the trace
        (a first look that arrives layer by layer; it may raise, e.g. core.jobs.Cancelled, to stop).
        A ViT (input_kind "patches") takes pixel values [B, C, H, W] (or [C, H, W]) in place of
        input_ids; its sequence is [CLS] + patches, and its logits [B, classes] come from [CLS].
        """
        cfg = self.cfg
        check_stop_at(stop_at, "", cfg.n_layers)
        x = None
        if cfg.input_kind == "patches":
            x = self.embed_patches(input_ids if input_ids.dim() == 4 else input_ids[None])
            B, T = x.shape[:2]
        else:
            if input_ids.dim() == 1:
                input_ids = input_ids[None]
            B, T = input_ids.shape
        past = cache.length if cache is not None else 0
        total = past + T
        if cfg.positions in ("learned", "sinusoidal") and total > cfg.context_length:
            raise ValueError(f"sequence of {total} tokens exceeds the context length {cfg.context_length}")
        positions = torch.arange(past, total, device=input_ids.device)

        # one mask and one rotary table per kind of layer (full / each window; Gemma 3's local rotary)
        pad = None if attention_mask is None else attention_mask.to(torch.bool)[:, None, None, :]
        masks: dict[int | None, torch.Tensor | None] = {}
        rotaries: dict[tuple, tuple | None] = {}

        def mask_for(window: int | None) -> torch.Tensor | None:
            if window not in masks:
                mask = None
                if cfg.causal and (T > 1 or (window is not None and total > window)):
                    mask = causal_mask(T, total, input_ids.device, window)[None, None]
                masks[window] = pad if mask is None else (mask if pad is None else mask & pad)
                if cfg.positions == "alibi":  # the bias by distance, additive, the unseen keys at the minimum
                    seen = masks[window] if masks[window] is not None else torch.ones(1, 1, T, total, dtype=torch.bool,
                                                                                       device=input_ids.device)
                    masks[window] = alibi_mask(alibi_slopes(cfg.n_heads, input_ids.device), seen, x.dtype)
            return masks[window]

        def rotary_for(l: int) -> tuple | None:
            key = (cfg.rope_local_theta is not None and layer_window(cfg, l) is not None, layer_rotates(cfg, l))
            if key not in rotaries:
                rot = layer_rotary(cfg, l, positions, seq_len=total)  # (no read back); in the dtype apply_rotary
                # multiplies in, once
                if rot is not None and cfg.rotary_precision != "float32":  # float32: never rounded (OLMo)
                    rot = rot[0].to(x.dtype), rot[1].to(x.dtype)
                    if cfg.rotary_precision == "float32_rounded":  # rounded, then multiplied in float32 (Cohere)
                        rot = rot[0].float(), rot[1].float()
                rotaries[key] = rot if rot is None else (*rot, rotate_half_sin(rot[1]))
            return rotaries[key]

        if interventions:  # the edits ride on the trace: every record point is also an edit point
            trace = editing_trace(interventions, trace, past)
        if x is None:
            x = self.embed(input_ids, positions, token_type_ids)
        x = point(trace, "embed", x)
        if stop_at == "embed":
            return ModelOutput(logits=None, hidden=x, cache=cache)
        for l, block in enumerate(self.blocks):
            lc = cache.layers[l] if cache is not None else None
            window = layer_window(cfg, l)
            # the fused causal kernel only when no window can hide a key (else an explicit mask)
            is_causal_full = (cfg.causal and past == 0 and attention_mask is None and (window is None or total <= window)
                              and cfg.positions != "alibi")
            prefix = f"blocks.{l}."
            x = block(x, mask_for(window), rotary_for(l), lc, trace, prefix, is_causal_full, stop_at=stop_at)
            if stop_at is not None and stop_at.startswith(prefix):
                return ModelOutput(logits=None, hidden=x, cache=cache)
            if trace is not None and cfg.lm_head and trace.wants(prefix + "logit_lens"):
                trace.record(prefix + "logit_lens", self.unembed(x))
            if on_layer is not None:
                on_layer(l)
        if trace is not None and cfg.final_norm and trace.wants("final_norm.out"):
            trace.record("final_norm.out", self.final_norm(x))
        if trace is not None and cfg.pooler_size and trace.wants("pooler"):
            trace.record("pooler", torch.tanh(self.pooler(self.final_norm(x)[:, 0])))
        logits = self.unembed(x) if (cfg.lm_head and compute_logits) else None
        if trace is not None and logits is not None:
            trace.record("logits", logits)
        return ModelOutput(logits=logits, hidden=x, cache=cache)

    def run_with_trace(self, input_ids: torch.Tensor, names=("*",), *, lazy: bool = False,
                       pattern_dtype: torch.dtype | None = None,
                       on_layer: Callable[[int, Trace], None] | None = None, **kw) -> tuple[ModelOutput, Trace]:
        """Forward pass that hands back a Trace of everything matching `names`. `lazy`: head outputs
        and the logit lens are derived on demand instead of recorded for every layer (trace.py);
        `pattern_dtype`: the dtype attention patterns are kept in (default: the model's); `on_layer`:
        called with (block index, the trace being filled) as each block's records arrive (forward's)."""
        trace = Trace(names, lazy=lazy, pattern_dtype=pattern_dtype)
        trace.bind(self)  # bound first: a layer already recorded can be read (derived) while the rest runs
        if on_layer is not None:
            kw["on_layer"] = lambda l: on_layer(l, trace)
        with torch.no_grad():
            out = self.forward(input_ids, trace=trace, **kw)
        return out, trace
