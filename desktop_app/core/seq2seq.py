"""The encoder-decoder (T5, BART, Marian, the original Transformer): two stacks of model.py's blocks
plus cross-attention, one class for every family, behaviour by ModelConfig switches.

The encoder is n_layers bidirectional Blocks (model.Block); the decoder is n_decoder_layers causal
Blocks with a cross-attention sublayer between their self-attention and their MLP, reading the
encoder's output (Block(cfg, cross_attention=True), Hugging Face's T5Block.layer shape). Both
stacks share the token embedding; T5's relative position bias comes from a [buckets, heads] table per
stack (the first layer's, in Hugging Face's files) and is added to every layer's scores.

Trace names (trace.py's, with a stack prefix; l = layer):
    encoder.embed, encoder.blocks.l.attn.pattern [B, H, S, S], encoder.blocks.l.attn.z, .attn.out,
    encoder.blocks.l.resid_mid, .mlp.out, .resid_post, encoder.final_norm.out (T5: what encode returns)
    decoder.embed, decoder.blocks.l.attn.pattern [B, H, T, T] (causal), ...
    decoder.blocks.l.cross_attn.input, .cross_attn.q, .cross_attn.pattern [B, H, T, S],
    .cross_attn.z [B, H, T, d_head], .cross_attn.head_out, .cross_attn.out, decoder.blocks.l.resid_cross
    (the residual stream after cross-attention), decoder.blocks.l.logit_lens, decoder.final_norm.out, logits
Every name but q, pattern, head_out, logit_lens, final_norm.out and logits is an activation point
(trace.point): what it records is also where the interventions edit (core/interventions.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from .attention import causal_mask
from .config import ModelConfig
from .interventions import editing_trace
from .model import (Attention, Block, HeadMatrices, KVCache, LayerCache, ModelBase, ModelOutput, check_stop_at,
                    head_matrices_of, make_norm, sinusoidal_table, token_embedding)
from .generation_rules import GenerationRules
from .trace import Trace, point


# -- T5's relative positions -------------------------------------------------------------------


def relative_bucket(relative: torch.Tensor, bidirectional: bool, buckets: int, max_distance: int) -> torch.Tensor:
    """T5's bucket of each offset key - query (Mesh TensorFlow's, as transformers computes it): half the
    buckets for exact small offsets, the rest logarithmic up to max_distance; bidirectional splits them
    between keys before and after the query."""
    out = torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        out += (relative > 0).to(torch.long) * buckets
        relative = relative.abs()
    else:
        relative = -torch.min(relative, torch.zeros_like(relative))
    exact = buckets // 2
    small = relative < exact
    large = exact + (torch.log(relative.float() / exact) / math.log(max_distance / exact)
                     * (buckets - exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, buckets - 1))
    return out + torch.where(small, relative, large)


# -- one stack -----------------------------------------------------------------------------------


class Stack(nn.Module):
    """The encoder's or the decoder's own pieces: positions, embedding norm, relative bias, blocks, final norm."""

    def __init__(self, cfg: ModelConfig, decoder: bool) -> None:
        super().__init__()
        self.decoder = decoder
        if cfg.positions == "learned":  # BART: the first position_offset (2) rows are never read
            self.pos_embed = nn.Embedding(cfg.context_length + cfg.position_offset, cfg.d_model)
        if cfg.relative_buckets:
            self.rel_bias = nn.Embedding(cfg.relative_buckets, cfg.n_heads)
        if cfg.embed_norm:
            self.embed_norm = make_norm(cfg)
        n = cfg.n_decoder_layers if decoder else cfg.n_layers
        self.blocks = nn.ModuleList(Block(cfg, cross_attention=decoder) for _ in range(n))
        if cfg.final_norm:
            self.final_norm = make_norm(cfg)
        self.cfg = cfg

    def position_bias(self, t_q: int, t_k: int, past: int) -> torch.Tensor:
        """T5's bias [1, H, t_q, t_k] for queries at past..past+t_q-1 and keys at 0..t_k-1."""
        cfg = self.cfg
        device = self.rel_bias.weight.device
        query = torch.arange(t_q, dtype=torch.long, device=device)[:, None] + past
        key = torch.arange(t_k, dtype=torch.long, device=device)[None, :]
        bucket = relative_bucket(key - query, not self.decoder, cfg.relative_buckets, cfg.relative_max_distance)
        return self.rel_bias(bucket).permute(2, 0, 1)[None]


# -- the cache -----------------------------------------------------------------------------------


class Seq2SeqCache:
    """What decode() keeps between steps: the decoder's self-attention keys and values (a KVCache) and
    each layer's cross-attention keys and values, computed from the encoder output on the first step."""

    def __init__(self, n_layers: int) -> None:
        self.self_attn = KVCache(n_layers)
        self.cross = [LayerCache() for _ in range(n_layers)]

    @property
    def layers(self) -> list[LayerCache]:  # the self-attention layers, as KVCache.layers
        return self.self_attn.layers

    @property
    def length(self) -> int:
        return self.self_attn.length

    def truncate(self, n: int) -> None:
        self.self_attn.truncate(n)

    def clone(self) -> "Seq2SeqCache":
        c = Seq2SeqCache(0)
        c.self_attn = self.self_attn.clone()
        c.cross = [LayerCache(k=lc.k, v=lc.v) for lc in self.cross]  # read only: shared
        return c

    def select(self, index: torch.Tensor) -> "Seq2SeqCache":
        """Reorder / repeat the batch (beam search)."""
        c = Seq2SeqCache(0)
        c.self_attn = self.self_attn.select(index)
        c.cross = [LayerCache(k=None if lc.k is None else lc.k[index], v=None if lc.v is None else lc.v[index])
                   for lc in self.cross]
        return c

    def stacked_keys(self) -> torch.Tensor:
        return self.self_attn.stacked_keys()


# -- the model -----------------------------------------------------------------------------------


@dataclass
class Seq2SeqOutput:
    logits: torch.Tensor | None  # [B, T, vocab]
    encoder_hidden: torch.Tensor  # the encoder's output [B, S, d] (after its final norm)
    hidden: torch.Tensor  # the decoder's last block output [B, T, d]


class EncoderDecoder(ModelBase):
    def __init__(self, cfg: ModelConfig, init_weights: bool = True) -> None:
        super().__init__()
        if not cfg.is_encoder_decoder:
            raise ValueError("EncoderDecoder needs a config with is_encoder_decoder true")
        self.cfg = cfg
        self.tok_embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.positions == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_table(cfg.context_length, cfg.d_model, cfg.sinusoidal_layout),
                                 persistent=False)
        self.embed_dropout = nn.Dropout(cfg.dropout)
        self.encoder = Stack(cfg, decoder=False)
        self.decoder = Stack(cfg, decoder=True)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_embed.weight
        if cfg.final_logits_bias:  # a buffer, as in transformers: saved, never trained
            self.register_buffer("lm_bias", torch.zeros(cfg.vocab_size))
        if init_weights:
            self.reset_parameters()

    # -- initialisation ------------------------------------------------------------------------
    def reset_parameters(self) -> None:
        super().reset_parameters()  # the Transformer's rules (norms to one, linears by cfg.init ...)
        if self.cfg.final_logits_bias:
            nn.init.zeros_(self.lm_bias)

    def pack_for_decoding(self, prepack: bool = True) -> None:
        """Nothing to do: the decoder-only layouts of Transformer.pack_for_decoding were not measured here."""

    def new_cache(self) -> Seq2SeqCache:
        return Seq2SeqCache(self.cfg.n_decoder_layers)

    # -- pieces ----------------------------------------------------------------------------------
    def embed(self, stack: Stack, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        x = token_embedding(self, ids)  # BART / Marian scale_embedding: sqrt(d_model)
        if cfg.positions == "learned":
            x = x + stack.pos_embed(positions + cfg.position_offset)
        elif cfg.positions == "sinusoidal":
            x = x + self.pos_table[positions].to(x.dtype)
        if cfg.embed_norm:
            x = stack.embed_norm(x)
        return self.embed_dropout(x)

    def _check_length(self, new: int, n: int, what: str) -> None:
        """`new` tokens given, `n` in all (after a cache)."""
        if new == 0:
            raise ValueError(f"the {what} is empty: the {'encoder' if what == 'source' else 'decoder'} needs at least one token")
        if self.cfg.positions in ("learned", "sinusoidal") and n > self.cfg.context_length:
            raise ValueError(f"{what} of {n} tokens exceeds the context length {self.cfg.context_length}")

    def unembed(self, h: torch.Tensor, *, normed: bool = False) -> torch.Tensor:
        """The decoder's final norm (unless `normed`: h is its output), T5's rescaling, the unembedding and
        BART / Marian's logits bias."""
        cfg = self.cfg
        if cfg.final_norm and not normed:
            h = self.decoder.final_norm(h)
        if cfg.lm_head_scale is not None:
            h = h * cfg.lm_head_scale
        logits = self.lm_head(h)
        if cfg.final_logits_bias:
            logits = logits + self.lm_bias
        return logits

    def attention(self, stack: str, layer: int, kind: str = "attn") -> Attention:
        """The attention module of a stack ("encoder" / "decoder") and kind ("attn", or "cross_attn" in the decoder)."""
        if stack not in ("encoder", "decoder") or kind not in ("attn", "cross_attn") \
                or (stack == "encoder" and kind == "cross_attn"):
            raise ValueError(f"no {stack} {kind} (the encoder has attn, the decoder attn and cross_attn)")
        blocks = getattr(self, stack).blocks
        if not 0 <= layer < len(blocks):
            raise ValueError(f"the {stack} has layers 0..{len(blocks) - 1}, not {layer}")
        return getattr(blocks[layer], kind)

    def head_matrices(self, layer: int, head: int, *, stack: str = "decoder", kind: str = "attn") -> HeadMatrices:
        """A head's W_Q, W_K, W_V, W_O, A and V (model.HeadMatrices). For cross-attention the queries read the
        decoder's stream and the keys the encoder's output: x_i^T A^T y_j is the score (T5's relative bias aside)."""
        if not 0 <= head < self.cfg.n_heads:
            raise ValueError(f"the model has heads 0..{self.cfg.n_heads - 1}, not {head}")
        return head_matrices_of(self.attention(stack, layer, kind), head)

    # -- forward ---------------------------------------------------------------------------------
    def encode(self, src_ids: torch.Tensor, *, src_mask: torch.Tensor | None = None, trace: Trace | None = None,
               interventions=None, stop_at: str | None = None,
               on_layer: Callable[[int], None] | None = None) -> torch.Tensor:
        """src_ids [B, S] (or [S]); src_mask [B, S], 1 for real tokens -> the encoder output [B, S, d].
        stop_at: an encoder point ("encoder.embed", "encoder.blocks.3.attn.input" ...) after which nothing
        runs (Transformer.forward's); the residual stream there is returned, without the final norm.
        on_layer: called with each encoder block's index once it has run (Transformer.forward's: it may raise,
        e.g. core.jobs.Cancelled, to stop)."""
        cfg = self.cfg
        check_stop_at(stop_at, "encoder.", cfg.n_layers, "encoder")
        if src_ids.dim() == 1:
            src_ids = src_ids[None]
        S = src_ids.shape[1]
        self._check_length(S, S, "source")
        if interventions:
            trace = editing_trace(interventions, trace, 0)
        mask = None if src_mask is None else src_mask.to(torch.bool)[:, None, None, :]
        if cfg.relative_buckets:
            bias = self.encoder.position_bias(S, S, 0).to(self.dtype)
            mask = bias if mask is None else bias.masked_fill(~mask, torch.finfo(bias.dtype).min)
        x = self.embed(self.encoder, src_ids, torch.arange(S, device=src_ids.device))
        x = point(trace, "encoder.embed", x)
        if stop_at == "encoder.embed":
            return x
        for l, block in enumerate(self.encoder.blocks):
            x = block(x, mask, None, None, trace, f"encoder.blocks.{l}.", False, stop_at=stop_at)
            if stop_at is not None and stop_at.startswith(f"encoder.blocks.{l}."):
                return x
            if on_layer is not None:
                on_layer(l)
        if cfg.final_norm:
            x = self.encoder.final_norm(x)
            if trace is not None:
                trace.record("encoder.final_norm.out", x)
        return x

    def decode(self, tgt_ids: torch.Tensor, enc_out: torch.Tensor, *, src_mask: torch.Tensor | None = None,
               trace: Trace | None = None, cache: Seq2SeqCache | None = None, compute_logits: bool = True,
               interventions=None, stop_at: str | None = None,
               on_layer: Callable[[int], None] | None = None) -> ModelOutput:
        """tgt_ids [B, T] (or [T]): the decoder's input (its start token first); with a cache, the new
        tokens only, positions continuing after it. enc_out [B, S, d] from encode(). stop_at: a decoder
        point ("decoder.blocks.3.cross_attn.input" ...) after which nothing runs; on_layer: called with each
        decoder block's index once it has run (both Transformer.forward's)."""
        cfg = self.cfg
        check_stop_at(stop_at, "decoder.", cfg.n_decoder_layers, "decoder")
        if tgt_ids.dim() == 1:
            tgt_ids = tgt_ids[None]
        if enc_out.dim() == 2:
            enc_out = enc_out[None]
        B, T = tgt_ids.shape
        past = cache.length if cache is not None else 0
        total = past + T
        self._check_length(T, total, "target")
        if interventions:
            trace = editing_trace(interventions, trace, past)
        causal = causal_mask(T, total, tgt_ids.device)[None, None] if T > 1 else None
        mask = causal
        if cfg.relative_buckets:
            bias = self.decoder.position_bias(T, total, past).to(self.dtype)
            mask = bias if causal is None else bias.masked_fill(~causal, torch.finfo(bias.dtype).min)
        is_causal_full = past == 0 and not cfg.relative_buckets
        source_mask = None if src_mask is None else src_mask.to(torch.bool)[:, None, None, :]
        x = self.embed(self.decoder, tgt_ids, torch.arange(past, total, device=tgt_ids.device))
        x = point(trace, "decoder.embed", x)
        if stop_at == "decoder.embed":
            return ModelOutput(logits=None, hidden=x, cache=cache)
        for l, block in enumerate(self.decoder.blocks):
            x = block(x, mask, None, cache.self_attn.layers[l] if cache is not None else None, trace,
                      f"decoder.blocks.{l}.", is_causal_full, source=enc_out, source_mask=source_mask,
                      cross_cache=cache.cross[l] if cache is not None else None, stop_at=stop_at)
            if stop_at is not None and stop_at.startswith(f"decoder.blocks.{l}."):
                return ModelOutput(logits=None, hidden=x, cache=cache)
            if trace is not None and trace.wants(f"decoder.blocks.{l}.logit_lens"):
                trace.record(f"decoder.blocks.{l}.logit_lens", self.unembed(x))
            if on_layer is not None:
                on_layer(l)
        if trace is not None and cfg.final_norm and trace.wants("decoder.final_norm.out"):
            trace.record("decoder.final_norm.out", self.decoder.final_norm(x))
        logits = self.unembed(x) if compute_logits else None
        if trace is not None and logits is not None:
            trace.record("logits", logits)
        return ModelOutput(logits=logits, hidden=x, cache=cache)

    def forward(self, src_ids: torch.Tensor, tgt_ids: torch.Tensor, *, src_mask: torch.Tensor | None = None,
                trace: Trace | None = None, interventions=None) -> Seq2SeqOutput:
        """Teacher forcing: the encoder reads src_ids, the decoder tgt_ids (its start token first)."""
        enc = self.encode(src_ids, src_mask=src_mask, trace=trace, interventions=interventions)
        out = self.decode(tgt_ids, enc, src_mask=src_mask, trace=trace, interventions=interventions)
        return Seq2SeqOutput(logits=out.logits, encoder_hidden=enc, hidden=out.hidden)

    def run_with_trace(self, src_ids: torch.Tensor, tgt_ids: torch.Tensor, names=("*",), *, lazy: bool = False,
                       pattern_dtype: torch.dtype | None = None, **kw) -> tuple[Seq2SeqOutput, Trace]:
        """forward with a Trace of every name matching `names` (Transformer.run_with_trace's arguments; a
        lazy trace derives nothing here: the stack-prefixed names are recorded as asked)."""
        trace = Trace(names, lazy=lazy, pattern_dtype=pattern_dtype)
        with torch.no_grad():
            out = self.forward(src_ids, tgt_ids, trace=trace, **kw)
        trace.bind(self)
        return out, trace

    def start_token(self) -> int:
        start = self.cfg.decoder_start_token_id
        if start is None:
            raise ValueError("the model's config has no decoder_start_token_id: the decoder cannot start")
        return start


# -- decoding (greedy, batched, for training's evaluation; generation with its one beam search: core/generation/) --


def _source(model: EncoderDecoder, src_ids, max_new: int) -> torch.Tensor:
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 0:
        raise ValueError(f"the number of new tokens must be a non-negative integer, got {max_new!r}")
    src = torch.as_tensor(src_ids, dtype=torch.long, device=model.device)
    return src[None] if src.dim() == 1 else src


def _ban(scores: torch.Tensor, banned_ids) -> torch.Tensor:
    """Scores [..., vocab] with the banned tokens at -inf (transformers' bad_words_ids of one token each,
    e.g. Marian's pad token)."""
    if banned_ids:
        scores = scores.clone()
        scores[..., list(banned_ids)] = float("-inf")
    return scores


def _ruled(scores: torch.Tensor, written: torch.Tensor, rules: GenerationRules | None, max_new: int) -> torch.Tensor:
    """Scores [B, vocab] with a model folder's generation rules applied to each row as generate applies
    them (core/generation_rules.py); written [B, n]: [start] + each row's target so far."""
    if rules is None or not rules.changes_logits:
        return scores
    n = written.shape[1]
    rows = [rules.process(scores[b], n, lambda b=b: written[b].tolist(), begin_index=rules.begin_index(1),
                          max_length=1 + max_new) for b in range(scores.shape[0])]
    return torch.stack(rows)


def _ends(eos_id, rules: GenerationRules | None) -> tuple[int, ...]:
    """The end tokens: eos_id (an int, or None), else every end token of the rules."""
    if eos_id is not None:
        return (int(eos_id),)
    return rules.eos_ids if rules is not None else ()


@torch.no_grad()
def greedy_batch(model: EncoderDecoder, src_ids, max_new: int, *, src_mask: torch.Tensor | None = None,
                 eos_id: int | None = None, banned_ids=(), rules: GenerationRules | None = None) -> torch.Tensor:
    """[B, n]: each source's most likely token at each step after the decoder's start token, never one
    of banned_ids; the sources encoded once, the decoder's keys and values cached. n is max_new, or less
    when every row has written eos_id (a row goes on after its own end token: callers read up to it).
    src_mask [B, S]: 1 on source tokens, 0 on padding. rules: a model folder's end tokens (when eos_id is
    None) and id constraints (LoadedModel.generation), as generate applies them."""
    ends = torch.tensor(_ends(eos_id, rules), dtype=torch.long)
    src = _source(model, src_ids, max_new)
    enc = model.encode(src, src_mask=src_mask)
    cache = model.new_cache()
    token = torch.full((src.shape[0], 1), model.start_token(), dtype=torch.long, device=enc.device)
    written = [token[:, :0]]
    sequence = [token]
    ended = torch.zeros(src.shape[0], dtype=torch.bool, device=enc.device)
    for _ in range(max_new):
        logits = model.decode(token, enc, src_mask=src_mask, cache=cache).logits[:, -1]
        if rules is not None and rules.changes_logits:
            logits = _ruled(logits.float().cpu(), torch.cat(sequence, 1).cpu(), rules, max_new).to(enc.device)
        token = _ban(logits, banned_ids).argmax(-1, keepdim=True)
        written.append(token)
        sequence.append(token)
        if ends.numel():
            ended |= torch.isin(token[:, 0], ends.to(token.device))
            if bool(ended.all()):
                break
    return torch.cat(written, 1)
