"""A generation session: one model step at a time (a decoder's, or an encoder-decoder's over its source), recorded.

GenerationSession(model, prompt_ids, settings, seed, stop_tokens) runs the prompt once, then:
    step()           pick the next token with the strategy and move there (one token's forward)
    choose(token)    force a token (starts a branch when another child exists)
    back()           go to the parent (the cache is truncated, nothing is recomputed)
    goto(node)       jump to any node of the tree (the cache keeps the shared prefix)
    with_interventions(edits)  the same tree on the edited model (the tokens kept, the rest recomputed)
    run(n, job)      iterator of step() results; stops at stop tokens, the context length or cancel
                     (lazy_last=True, as generate(): the forward consuming its last token is made at the
                     first read of that node, settle(); never for a node a UI thread may read)
    reset()          forget the tree, keep the prompt's forward

Every node holds the token, its probability, the logits of the next-token distribution (so views
can re-process them with other temperature/top-k/top-p without running the model) and what the
forward that consumed the token recorded: each layer's attention row of the new query
[H, 1, T] and the new token's residual streams. `step_trace(node)` assembles a Trace of the whole
path for the attention panel; `logit_lens(node)` gives the top prediction at every layer.

The tree is tree.py's, the distribution sampling.py's, beam search search.py's (transformers' rule).

Encoder-decoders (T5, BART, Marian; core/seq2seq.py) run through the same session: the prompt given
is then the source, encoded once; the session's sequence is the target, from the decoder's start
token (session.prompt is [start]), each step one decode() with the cache. Every record is the
decoder's, under the decoder-only names (blocks.l.attn.pattern, embed, ...), plus each layer's
cross-attention of the new token over the source, blocks.l.cross_attn.pattern [H, 1, S]:
cross_attention(node) gives [L, H, S] for the step that produced node's next-token distribution.
_Steps is the one place that knows which kind of model runs a step.

Encoder (BERT-family) models cannot continue a text: fill.py fills their [MASK] positions.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from ..attention import alibi_slopes, attention_probs, causal_layer_mask
from ..devices import to_host
from ..generation_rules import GenerationRules
from ..jobs import JobControl
from ..model import KVCache, Transformer, attention_scale, layer_window
from ..streamed import holding
from ...threads import torch_threads
from ..trace import Trace
from .sampling import (ContextLengthReached, Distribution, GenerationError, GenerationSettings, in_limits, pick,
                       process_logits)
from .search import BeamSearch
from .tree import BatchRow, HistoryTree, Node

RECORD_NAMES = ("embed", "blocks.*.attn.input", "blocks.*.attn.pattern", "blocks.*.attn.out",
                "blocks.*.resid_mid", "blocks.*.mlp.out", "blocks.*.resid_post", "final_norm.out")
_STEP_NAMES = tuple(n for n in RECORD_NAMES if n != "blocks.*.attn.pattern") + ("blocks.*.attn.q",)


class _StepTrace(Trace):
    """Trace whose name matching is shared by every step with the same names (a step makes a
    new Trace; matching ~150 names against the patterns each time is wasted work)."""
    _shared_wants: dict[tuple, dict[str, bool]] = {}

    def __init__(self, names: tuple[str, ...] = RECORD_NAMES) -> None:
        super().__init__(names)
        self._wants = _StepTrace._shared_wants.setdefault(names, {})

    # Trace.point and .record for a step's trace, which has none of a Trace's options (no pattern dtype, not
    # to the CPU) and is filled in inference mode (nothing to detach): a dict read a point, not three calls
    def record(self, name: str, tensor: torch.Tensor) -> None:
        hit = self._wants.get(name)
        if hit or (hit is None and self.wants(name)):
            self.tensors[name] = tensor

    def point(self, name: str, x: torch.Tensor) -> torch.Tensor:
        hit = self._wants.get(name)
        if hit or (hit is None and self.wants(name)):
            self.tensors[name] = x
        return x


class _Steps:
    """How a session runs its model, one `step(ids, cache, trace, interventions)` per model kind: a
    decoder-only Transformer reads its sequence; the session's records carry the names of trace.py."""
    prefix = ""  # the model's own trace names of the session's records
    source: list[int] | None = None

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.blocks = model.blocks
        self.n_layers = model.cfg.n_layers
        self.encoder_records: dict[str, torch.Tensor] = {}

    def new_cache(self):
        return KVCache(self.n_layers)

    def names(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The model's trace names for the session's record names."""
        return names

    def step(self, ids: torch.Tensor, cache, trace: Trace | None, interventions, on_layer=None) -> torch.Tensor:
        """The last block's output [B, T, d] for `ids` [B, T] after the cache; on_layer(l) after each block."""
        return self.model(ids, cache=cache, trace=trace, compute_logits=False, interventions=interventions,
                          on_layer=on_layer).hidden


class _Seq2SeqSteps(_Steps):
    """An encoder-decoder: the source is encoded once (with the session's edits); each step decodes
    target tokens over it. The decoder's records lose their "decoder." prefix in the session, and add
    each layer's cross-attention pattern."""
    prefix = "decoder."

    def __init__(self, model, source: list[int], interventions, record: bool) -> None:
        self.model = model
        self.blocks = model.decoder.blocks
        self.n_layers = model.cfg.n_decoder_layers
        self.source = source
        trace = Trace(("encoder.*",)) if record else None
        with torch.inference_mode():
            self.encoded = model.encode(torch.tensor([source], device=model.device), trace=trace,
                                        interventions=interventions)
        recorded = [] if trace is None else list(trace.items())
        host = to_host([t for _, t in recorded])  # one device-to-host transfer
        # (step_trace reads them as they are: float32 once, here)
        self.encoder_records = dict(zip([n for n, _ in recorded], _of_their_own(host, model.device, n_float32=len(host))))

    def new_cache(self):
        return self.model.new_cache()

    def names(self, names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(self.prefix + n for n in names) + (self.prefix + "blocks.*.cross_attn.pattern",)

    def step(self, ids, cache, trace, interventions, on_layer=None) -> torch.Tensor:
        enc = self.encoded.expand(ids.shape[0], -1, -1)
        return self.model.decode(ids, enc, cache=cache, trace=trace, compute_logits=False,
                                 interventions=interventions, on_layer=on_layer).hidden


def _is_encoder_decoder(model) -> bool:
    return bool(getattr(model.cfg, "is_encoder_decoder", False))


@dataclass
class LensRow:
    layer: int  # -1 is the embedding
    top_token: int
    top_prob: float
    chosen_prob: float | None  # probability of the token actually picked at this step


def _model_of(loaded_or_model) -> tuple[Transformer, object | None]:
    if isinstance(loaded_or_model, torch.nn.Module):  # a Transformer or an EncoderDecoder
        return loaded_or_model, None
    return loaded_or_model.model, getattr(loaded_or_model, "tokenizer", None)


def _default_stops(model: Transformer, tokenizer) -> list[int]:
    if model.cfg.eos_token_id is not None:
        return [int(model.cfg.eos_token_id)]
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        return [int(tokenizer.eos_token_id)]
    return []


class GenerationSession(HistoryTree, BeamSearch):
    """A prompt (or an encoder-decoder's source) and the tree of what followed it (module docstring)."""

    def __init__(self, loaded_or_model, prompt_ids: Sequence[int], settings: GenerationSettings | None = None,
                 seed: int | None = 0, stop_tokens: Sequence[int] | None = None, record: bool = True,
                 use_cache: bool | None = None, interventions: Sequence | None = None,
                 rules: GenerationRules | None = None, max_length: int | None = None) -> None:
        """rules: the end tokens and id constraints of the model folder's generation_config.json
        (core/generation_rules.py; default: the loaded model's, none for a bare model), applied to every
        step's raw logits (beam search: to its log-probabilities) before temperature / top-k / top-p, as
        transformers' generate applies them. max_length: the sequence length (prompt, or an encoder-decoder's
        [start], + tokens to generate) where a forced end token comes (None: the file's max_length)."""
        self.model, self.tokenizer = _model_of(loaded_or_model)
        self.rules = rules or getattr(loaded_or_model, "generation", None) or GenerationRules()
        self.max_length = max_length
        cfg = self.model.cfg
        if not cfg.causal:
            raise GenerationError("this is an encoder (bidirectional) model: it fills masked positions "
                                  "(MaskedFillSession) instead of continuing a text")
        if not cfg.lm_head:
            raise GenerationError("this model has no language-model head: it cannot predict tokens")
        seq2seq = _is_encoder_decoder(self.model)
        what = "source" if seq2seq else "prompt"
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise GenerationError(f"the {what} is empty: give at least one token")
        bad = [t for t in prompt if not 0 <= t < cfg.vocab_size]
        if bad:
            raise GenerationError(f"token ids out of range for a vocabulary of {cfg.vocab_size}: {bad[:5]}")
        if len(prompt) > cfg.context_length and not (seq2seq and cfg.positions not in ("learned", "sinusoidal")):
            raise ContextLengthReached(f"the {what} has {len(prompt)} tokens but the model's context length "
                                       f"is {cfg.context_length}")
        # what-if edits (core/interventions.py) every forward applies, the cached steps too; "mean"
        # ablations take the prompt's mean. Per-head outputs that step_trace rebuilds from patterns
        # do not see a head's ablation.
        self.interventions = None
        if interventions:
            from ..interventions import resolve
            checked = [iv.check(cfg) for iv in interventions]
            if seq2seq:
                if any(iv.how in ("mean", "resample") for iv in checked):
                    raise GenerationError("an encoder-decoder generates with zero or replaced activations only: "
                                          "mean and resample ablations need one text, and it has two")
                self.interventions = checked
            else:
                self.interventions = resolve(self.model, prompt, checked)
        if seq2seq:  # the prompt given is the source; the session's sequence is the target
            try:
                start = self.model.start_token()
            except ValueError as exc:
                raise GenerationError(str(exc)) from None
            self._steps: _Steps = _Seq2SeqSteps(self.model, prompt, self.interventions, record)
            prompt = [int(start)]
        else:
            self._steps = _Steps(self.model)
        self.prompt = prompt
        self.source = self._steps.source  # an encoder-decoder's source ids, else None
        self.settings = (settings or GenerationSettings()).validated()
        self._packed_with: bool | None = None  # the prepack choice the weights were last laid out for
        self._pack_for(self.settings)
        self.seed = None if seed is None else in_limits("seed", seed)  # 2.5 was seed 2, without a word
        if stop_tokens is None:  # every end token of generation_config.json / config.json, else the model's one
            stop_tokens = self.rules.eos_ids or _default_stops(self.model, self.tokenizer)
        self.stop_tokens = set(stop_tokens)
        self.record = record
        # Sinkhorn's column normalisation mixes all queries: an old row changes when a token is
        # added, so those models are recomputed in full each step instead of extending a cache.
        self.incremental = cfg.attention_kind != "sinkhorn" if use_cache is None else use_cache
        self.stop_reason: str | None = None
        self._generator = torch.Generator(device="cpu")
        self._cache: KVCache | None = None  # K/V of the path to self._cache_nodes (rows: a batch)
        self._cache_nodes: list[Node] = []
        # the node whose forward run() left for the first read (its last token's); made before anything
        # else moves the cache (settle), so it sees the cache as it was: the same values as made at once
        self._pending: Node | None = None
        self._pending_lock = threading.RLock()  # a view's read (UI thread) against a worker's next step
        self._between_layers = None  # run()'s cancel check, called by each forward after every block
        self.root = self._make_root()
        self.reset()

    # -- public API ------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> None:
        """Forget every generated token (the prompt's forward is kept) and reseed."""
        if seed is not None:
            self.seed = in_limits("seed", seed)
        self.root.children.clear()
        self.current = self.root
        self._start_beams(self.root)
        self.stop_reason = None
        self._generator.manual_seed(0 if self.seed is None else int(self.seed))
        # the cache is kept: the next step truncates it to the prompt (the shared prefix)

    def set_settings(self, settings: GenerationSettings) -> None:
        new = settings.validated()
        if new.strategy == "beam" and self.settings.strategy != "beam":
            self._start_beams(self.current)
        self.settings = new  # the weights laid out for it at the next forward (a worker's, not the caller's)

    @staticmethod
    def search_width(settings: GenerationSettings) -> int:
        """The rows a step multiplies with these settings: a beam search's beams, else 1 (_pack_for's choice;
        app.generation's memory checks count the prepacked copy by it, before a session exists)."""
        return settings.beams if settings.strategy == "beam" else 1

    def _pack_for(self, settings: GenerationSettings) -> None:
        """Faster one-token steps (Transformer.pack_for_decoding: same values). Its half-precision prepacked
        copy only where steps multiply one row: beam steps multiply a row per beam (F.linear), never the
        copy, which cost its time and the weights' memory again for nothing (issue 38). Made once per
        change of that choice, before a forward: set_settings runs on the panel's UI thread, and a copy
        of every weight (a second or so at 0.5B) is model work."""
        prepack = self.search_width(settings) == 1
        if self._packed_with != prepack:
            self.model.pack_for_decoding(prepack=prepack)
            self._packed_with = prepack

    def distribution(self, node: Node | None = None, settings: GenerationSettings | None = None) -> Distribution:
        """The next-token distribution after `node` (default: the current one), processed."""
        node = self.current if node is None else node
        s = self.settings if settings is None else settings.validated()
        if node.next_logits is None:
            raise GenerationError("nothing follows a stop token")
        return process_logits(self._ruled(node, node.next_logits), s.temperature, s.top_k, s.top_p)

    def _ruled(self, node: Node, scores: torch.Tensor) -> torch.Tensor:
        """The scores [V] after `node` with the folder's generation rules applied (generate's processors;
        unchanged when it has none: no per-step work)."""
        r = self.rules
        if not r.changes_logits:
            return scores
        return r.process(scores, node.position + 1, lambda: self.ids(node),
                         begin_index=r.begin_index(len(self.prompt)), max_length=self.max_length)

    @property
    def finished(self) -> bool:
        if self.settings.strategy == "beam":
            return self._beams_finished or all(b.position + 1 >= self.model.cfg.context_length for b in self.beams)
        return self.current.stop

    def step(self) -> Node:
        """Advance one token with the current strategy; returns the new current node."""
        return self._step(lazy_last=False, last=False)

    def _step(self, lazy_last: bool, last: bool) -> Node:
        """step(); with lazy_last, the forward of a token that ends a run (the last, or a stop token), its
        next-token logits and records, is made at their first read (transformers' generate never makes it)."""
        if self.settings.strategy == "beam":
            return self._beam_step()
        node = self.current
        self._check_can_extend(node)
        dist = self.distribution(node)
        token, how = pick(dist, self.settings.strategy, self._generator)
        return self._extend(node, token, dist, how, lazy=lazy_last and (last or token in self.stop_tokens))

    def choose(self, token_id: int) -> Node:
        """Force `token_id` after the current node (a new branch if that child is not there yet)."""
        token_id = int(token_id)
        if not 0 <= token_id < self.model.cfg.vocab_size:
            raise GenerationError(f"token id {token_id} is outside the vocabulary (0..{self.model.cfg.vocab_size - 1})")
        node = self.current
        self._check_can_extend(node)
        self._leave_beam_mode()
        return self._extend(node, token_id, self.distribution(node), "chosen")

    def with_interventions(self, interventions: Sequence | None, job: JobControl | None = None) -> "GenerationSession":
        """The same history tree on the model with other what-if edits (None or []: the model as
        trained): every node keeps its token, how it was picked and its place among its siblings;
        its probabilities, score, next-token logits and records are the new model's (one forward
        per node, sharing the cache along each path). The current node, the beams and the random
        generator's state carry over; `job.check()` is seen between nodes. This session is not changed."""
        new = GenerationSession(self.model, self.source or self.prompt, self.settings, seed=self.seed,
                                stop_tokens=sorted(self.stop_tokens), record=self.record,
                                use_cache=self.incremental, interventions=interventions, rules=self.rules,
                                max_length=self.max_length)
        new.tokenizer = self.tokenizer
        new._generator.set_state(self._generator.get_state())
        mapped = {id(self.root): new.root}
        stack = [self.root]
        while stack:  # depth first, children in order: each path extends the cache of the last
            old = stack.pop()
            for child in old.children:
                if job is not None:
                    job.check()
                parent = mapped[id(child.parent)]
                node = new._extend(parent, child.token, new.distribution(parent), child.how)
                mapped[id(child)] = node
            stack.extend(reversed(old.children))
        new.current = mapped[id(self.current)]
        new.beams = [mapped[id(b)] for b in self.beams]
        new._beam_history = [[mapped[id(b)] for b in beams] for beams in self._beam_history]
        new.finished_beams = [mapped[id(b)] for b in self.finished_beams]
        new._finished_history = [([mapped[id(b)] for b in done], flag) for done, flag in self._finished_history]
        new._beam_done = self._beam_done
        return new

    def run(self, n: int, job: JobControl | None = None, lazy_last: bool = False) -> Iterator[Node]:
        """Up to n steps, yielding each new current node; stops early (setting stop_reason) at a
        stop token or the context length. With a job, cancel() is seen between tokens and also
        between layers of a forward (a slow model still stops within about one layer's time);
        an interrupted step leaves the tree as it was. lazy_last: the forward that consumes the run's
        last token (or a stop token) is made when something first reads that node's next_logits or
        record (settle), as generate() wants (transformers' never makes it); whichever thread reads first
        makes it, so a session whose nodes a UI thread reads runs without it (every node made at once)."""
        n = in_limits("max_new", n, "n")  # (-1 ran nothing, 2.5 was a TypeError in range)
        self.settle()  # the last run's, before the cancel check: it cannot be interrupted half made
        if job is not None:
            owner = threading.get_ident()

            def check(layer: int) -> None:  # the forward's on_layer: no hook on the blocks (a hook puts every
                if threading.get_ident() == owner:  # block call on nn.Module's slow path); a view's read of a
                    job.check()  # waiting node (another thread) is not cancelled
            self._between_layers = check
        try:
            yield from self._run(n, job, lazy_last)
        finally:
            self._between_layers = None

    def _run(self, n: int, job: JobControl | None, lazy_last: bool) -> Iterator[Node]:
        for i in range(n):
            if job is not None:
                job.progress(i, n, f"token {i + 1}/{n}")
            if self.finished:
                self.stop_reason = self._finished_reason()
                return
            try:
                node = self._step(lazy_last, last=i == n - 1)
            except ContextLengthReached as exc:
                self.stop_reason = str(exc)
                return
            yield node
        if job is not None:
            job.progress(n, n, "done")

    def _finished_reason(self) -> str:
        # beams that did not end on a stop token have filled the context: say so, not "stop token"
        ended = self.beams if self.settings.strategy == "beam" else [self.current]
        if all(b.stop for b in ended):
            return "a stop token was generated"
        if self.settings.strategy == "beam" and self._beam_done:
            return "beam search is done: no running beam can beat the finished ones"
        return f"the context length ({self.model.cfg.context_length} tokens) is reached"

    # -- inspection ------------------------------------------------------------------------
    def step_trace(self, node: Node | None = None) -> tuple[Trace, list[int]]:
        """A Trace of the whole path up to `node`, assembled from what each step recorded.

        Attention patterns are [1, H, T, T]: the prompt's block, then each generated token's
        query row (zero-padded on the right: a causal query never sees later keys). An
        encoder-decoder's trace has the model's own names: the encoder's (recorded once) and the
        decoder's, "decoder." first, with its cross-attention [1, H, T, S]; `ids` is the target.
        """
        node = self.current if node is None else node
        path = node.path()
        ids = self.ids(node)
        T = len(ids)
        trace = Trace(self._steps.names(RECORD_NAMES) + tuple(self._steps.encoder_records))
        if not self.record:
            raise GenerationError("this session was started without recording")
        prefix = self._steps.prefix
        # each node's records as kept ([1, ...], in the model's dtype until the node is read): joined, then float32
        # once a name (the cast is exact: the values every node's record reads as), the nodes left as they are
        kept = [n.kept_records() for n in path]
        for name in kept[0]:
            if name.endswith("cross_attn.pattern"):  # every row sees the whole source
                joined = torch.cat([k[name] for k in kept], dim=2)
            elif name.endswith("attn.pattern"):  # [1, H, t_q, t_k]
                joined = torch.cat([torch.nn.functional.pad(k[name], (0, T - k[name].shape[-1])) for k in kept], dim=2)
            else:
                joined = torch.cat([k[name] for k in kept], dim=1)
            trace.tensors[prefix + name] = joined.float()
        for l in range(self._steps.n_layers):
            trace.tensors[f"{prefix}blocks.{l}.attn.head_out"] = self._head_outputs(trace, l)
        trace.tensors.update(self._steps.encoder_records)
        return trace, ids

    def cross_attention(self, node: Node | None = None) -> torch.Tensor:
        """An encoder-decoder's cross-attention [L, H, S] (float32, CPU) of the step that produced
        `node`'s next-token distribution (default: the current node's): which source tokens each
        decoder layer's heads read while predicting the token after `node`. Each row sums to 1."""
        if self.source is None:
            raise GenerationError("only an encoder-decoder reads a source: this model has no cross-attention")
        node = self.current if node is None else node
        if not self.record or not node.record:
            raise GenerationError("this session was started without recording")
        return torch.stack([node.record[f"blocks.{l}.cross_attn.pattern"][:, -1]
                            for l in range(self._steps.n_layers)])

    def _head_outputs(self, trace: Trace, layer: int) -> torch.Tensor:
        """[1, H, T, d]: each head's output W_O,h sum_j P_h,ij v_h,j along a path, from the recorded
        attention inputs and patterns. Done here, when a step is inspected, so that generating
        costs nothing for it (the fused one-token steps never form per-head outputs)."""
        cfg, attn, prefix = self.model.cfg, self._steps.blocks[layer].attn, self._steps.prefix
        H, Hkv, dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
        x = trace[f"{prefix}blocks.{layer}.attn.input"][0]  # [T, d]
        P = trace[f"{prefix}blocks.{layer}.attn.pattern"][0]  # [H, T, T]
        T = x.shape[0]
        # (a model read layer by layer, core/streamed.py: only the values and W_O, not the whole block)
        with torch.inference_mode(), holding(self.model, layer, only={"attn.v", "attn.o"}):
            dev, dtype = self.model.device, self.model.dtype
            v = attn.v(x.to(dev, dtype)).view(T, Hkv, dh).transpose(0, 1)  # [Hkv, T, dh]
            if Hkv != H:
                v = v.repeat_interleave(H // Hkv, dim=0)
            z = P.to(dev, dtype) @ v  # [H, T, dh]: each head's output before W_O
            if self.interventions:  # an ablated or patched head shows what the edited model used
                from ..interventions import editing_trace
                z = editing_trace(self.interventions, None, 0).edit(f"{prefix}blocks.{layer}.attn.z", z[None])[0]
            out = attn.head_outputs(z)  # [H, T, d]
        return out.float().cpu()[None]

    def logit_lens(self, node: Node) -> list[LensRow]:
        """For the step that picked `node`'s token: top prediction at the embedding and after
        every layer (final norm + unembedding of that layer's residual), and the probability
        the picked token had there. The last row is the model's own distribution."""
        parent = node.parent
        if parent is None:
            raise GenerationError("the prompt was not picked by a step: select a generated token")
        rec = parent.record
        if not rec:
            raise GenerationError("this session was started without recording")
        L = self._steps.n_layers
        hs = torch.stack([rec["embed"][-1]] + [rec[f"blocks.{l}.resid_post"][-1] for l in range(L)])
        with torch.no_grad():
            probs = torch.softmax(self.model.unembed(hs.to(self.model.device, self.model.dtype)).float(), -1).cpu()
        top_p, top_i = probs.max(-1)
        return [LensRow(l - 1, int(top_i[l]), float(top_p[l]), float(probs[l, node.token]))
                for l in range(L + 1)]

    # -- internals -------------------------------------------------------------------------
    def _make_root(self) -> Node:
        root = Node(token=None, parent=None, position=len(self.prompt) - 1)
        ids = torch.tensor([self.prompt], device=self.model.device)
        logits, records = self._forward(ids, None)
        root.next_logits, root.record = logits[0], records[0]
        self._cache_nodes = [root] if self.incremental else []
        return root

    def _check_can_extend(self, node: Node) -> None:
        if node.stop:
            raise GenerationError("a stop token ends this branch: go back or choose another token")
        if node.position + 1 >= self.model.cfg.context_length:  # len(self.ids(node)), without walking the path
            raise ContextLengthReached(f"the context length ({self.model.cfg.context_length} tokens) is reached: "
                                       "go back, or reset with a shorter prompt")

    def _new_child(self, parent: Node, token: int, dist: Distribution, how: str,
                   lp: float | None = None) -> tuple[Node, bool]:
        """lp: the token's log-probability the score adds (default: from dist's model_probs)."""
        existing = parent.child(token)
        if existing is not None:
            return existing, False
        model_prob = float(dist.model_probs[token])
        if lp is None:
            lp = math.log(max(model_prob, 1e-300))
        node = Node(token=token, parent=parent, position=parent.position + 1, prob=float(dist.probs[token]),
                    model_prob=model_prob, score=parent.score + lp, how=how,
                    stop=token in self.stop_tokens)
        parent.children.append(node)
        return node, True

    def _extend(self, parent: Node, token: int, dist: Distribution, how: str, lazy: bool = False) -> Node:
        """The child `token` of `parent`, made current; its forward now, or (lazy) at the first read of its
        next_logits or record."""
        node, new = self._new_child(parent, token, dist, how)
        if new:
            self.settle()  # one node waits at a time: the cache is its parent's
        if new and lazy:
            with self._pending_lock:  # waiting before a reader can see it does
                self._pending, node.compute = node, self.settle
        elif new:  # stop tokens too: their step is inspectable like any other
            try:
                self._sync_cache([parent])
                logits, records = self._forward(torch.tensor([[token]], device=self.model.device), [parent])
            except BaseException:  # e.g. Cancelled mid-forward: leave the tree as it was
                self._undo([node])
                raise
            node.next_logits, node.record = logits[0], records[0]
            if self.incremental:
                self._cache_nodes = [node]
        self.current = node
        return node

    def settle(self) -> None:
        """Make the forward run() left for the first read (its last token's) now: called before anything
        moves the cache, which is then still as that token's step left it (the same values as made at once).
        On a failure the node still waits (the cache dropped: the next try recomputes the path, as a step
        after an interrupted one does)."""
        with self._pending_lock:  # a reader waits here while another thread makes it
            node, self._pending = self._pending, None
            if node is None:
                return
            try:
                self._sync_cache([node.parent])
                logits, records = self._forward(torch.tensor([[node.token]], device=self.model.device), [node.parent])
            except BaseException:
                self._cache, self._cache_nodes, self._pending = None, [], node
                raise
            node.next_logits, node.record = logits[0], records[0]
            node.compute = None
            if self.incremental:
                self._cache_nodes = [node]

    def _attention_rows(self, queries: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every layer's attention [B, H, T_q, T] of the new queries [B, H, T_q, dh] (after rotary), from
        the cached keys, with the model's own formula and masks (core/attention.py): the last T_q of the T
        cached positions are the queries', each sees the keys up to itself (and its window; ALiBi's bias by
        distance rides on the mask). One batched product for a one-token step; layer by layer for the
        prompt (its [T, T] patterns, a layer at a time as the forward would have recorded them)."""
        cfg = self.model.cfg
        H, Hkv = cfg.n_heads, cfg.n_kv_heads
        keys = self._cache.stacked_keys()  # [L, B, Hkv, T, dh], after rotary; a view, no copy
        Tq, T = queries[0].shape[-2], keys.shape[-2]
        slopes = alibi_slopes(cfg.n_heads, keys.device) if cfg.positions == "alibi" else None
        masks = [causal_layer_mask(Tq, T, layer_window(cfg, l), slopes, queries[0].dtype, keys.device)
                 for l in range(cfg.n_layers)]  # each [T_q, T] (boolean) or [H, T_q, T] (ALiBi), or None
        probs = lambda q, k, mask: attention_probs(q, k, cfg.attention_kind, mask, scale=attention_scale(cfg),  # noqa: E731
                                                   softcap=cfg.attn_logit_softcap, n_keys=T)
        if Tq > 1:
            return [probs(q, keys[l] if Hkv == H else keys[l].repeat_interleave(H // Hkv, dim=1), masks[l])
                    for l, q in enumerate(queries)]
        # one thread: microseconds of work, where a second thread's meeting at the end waits out a busy core
        # (the tiny Qwen2 shape on 2 threads [load 2.4]: steps of 2.0-2.6 ms against 2.2-38.8 before)
        with torch_threads(1):
            q = torch.stack(queries)  # [L, B, H, 1, dh]
            # half precision: the scores against every row of the cache's buffer (the first T kept), one product
            # shape from one step to the next until the buffer grows: oneDNN made a kernel for each new shape
            # (~0.25 ms a step at the tiny shape, a fifth of it). Same values there; not in float32 (MKL's
            # products of another width sum in another order), where the exact shape costs nothing more.
            half = keys.dtype in (torch.bfloat16, torch.float16)
            if half:
                keys = self._cache.stacked_keys(padded=True)
            mask = None
            if any(m is not None for m in masks):  # [L, 1, 1 or H, 1, T]: a mask for each layer of the batch
                everything = torch.ones(1, T, dtype=torch.bool, device=keys.device)
                mask = torch.stack([everything if m is None else m for m in masks])
                mask = mask[:, None] if mask.dim() == 4 else mask[:, None, None]
            if half and Hkv != H:
                # grouped queries: the H / Hkv query heads of a key head are the rows of one product with its keys,
                # [L, B, Hkv, H / Hkv, dh]; the cache's keys were copied H / Hkv times over for the repeated form
                # (Qwen2.5-0.5B shape, one thread: 1.5 against 0.12 ms at 64 keys, 45 against 1.0 ms at 1,024). The
                # same values in half precision (every shape tried: bfloat16 and float16, 1-8 key heads, 16-256
                # wide, 64-1,024 keys); not in float32 (MKL's products of more rows sum in another order)
                G, (L, B) = H // Hkv, q.shape[:2]
                if mask is not None and mask.shape[2] == H:  # a bias per head (ALiBi)
                    mask = mask.view(L, 1, Hkv, G, T)
                rows = probs(q.view(L, B, Hkv, G, q.shape[-1]), keys, mask)
                return list(rows.reshape(L, B, H, 1, T).unbind(0))
            k = keys if Hkv == H else keys.repeat_interleave(H // Hkv, dim=2)
            return list(probs(q, k, mask).unbind(0))

    def _undo(self, created: list[Node]) -> None:
        """Forget nodes whose forward did not finish; the cache may be half-updated: drop it."""
        for n in created:
            if n in n.parent.children:
                n.parent.children.remove(n)
        self._cache, self._cache_nodes = None, []

    def _sync_cache(self, nodes: list[Node]) -> None:
        """Make self._cache hold the K/V of the path to `nodes` (one row per node)."""
        self.settle()
        if not self.incremental or self._cache_nodes == nodes:
            return
        if len(nodes) == 1 and len(self._cache_nodes) == 1 and self._cache is not None:
            # keep the shared prefix: truncate to the common ancestor, feed the rest in one forward
            target, have = nodes[0].path(), self._cache_nodes[0].path()
            common = 0
            while common < min(len(target), len(have)) and target[common] is have[common]:
                common += 1
            if common > 0:
                keep = len(self.prompt) + common - 1  # tokens up to target[common - 1]
                self._cache.truncate(keep)
                rest = [n.token for n in target[common:]]
                if rest:
                    self._model_forward(torch.tensor([rest], device=self.model.device), self._cache, None)
                self._cache_nodes = nodes
                return
        ids = torch.tensor([self.ids(n) for n in nodes], device=self.model.device)
        self._cache = self._steps.new_cache()
        self._model_forward(ids, self._cache, None)
        self._cache_nodes = list(nodes)

    def _sync_cache_batch(self, parents: list[Node]) -> None:
        """Rows of the cache for these parents: select rows when they are all cached already."""
        self.settle()
        if not self.incremental:
            return
        rows = []
        for p in parents:
            hit = next((i for i, c in enumerate(self._cache_nodes) if c is p), None)
            if hit is None or self._cache is None:
                self._cache_nodes = []
                self._sync_cache(parents)
                return
            rows.append(hit)
        if rows != list(range(len(self._cache_nodes))):
            self._cache = self._cache.select(torch.tensor(rows, device=self.model.device))
        self._cache_nodes = list(parents)

    def _model_forward(self, ids: torch.Tensor, cache: KVCache | None, trace: Trace | None):
        self._pack_for(self.settings)  # after set_settings: here, in the thread that runs the model
        # inference_mode: less per-op bookkeeping than no_grad; what it makes (cache, records,
        # logits) is only read afterwards, never modified in place or differentiated
        with torch.inference_mode():
            hidden = self._steps.step(ids, cache, trace, self.interventions, self._between_layers)
            normed = None if trace is None else trace.tensors.get(self._steps.prefix + "final_norm.out")
            if normed is not None:  # the final norm the trace recorded (each row alone): not computed again
                return self.model.unembed(normed[:, -1], normed=True)
            return self.model.unembed(hidden[:, -1])

    def _forward(self, ids: torch.Tensor, parents: list[Node] | None) -> tuple[torch.Tensor, list[dict]]:
        """Logits [B, V] of the last position and per-row records. With parents, `ids` [B, 1]
        are new tokens after them (one forward with the cache, or a full recompute)."""
        self.settle()
        cfg = self.model.cfg
        # (an encoder-decoder records its patterns as it goes: T5's position bias is not in the rows)
        # The prompt's forward too: its attention then runs fused, as every step's, so the session
        # computes as transformers' default (SDPA) attention does, bit for bit in half precision.
        rows_after = (self.record and self.incremental and cfg.attention_kind in ("softmax", "l2")
                      and self.source is None)
        names = self._steps.names(_STEP_NAMES if rows_after else RECORD_NAMES)
        trace = _StepTrace(names) if self.record else None
        if parents is None or self.incremental:
            if parents is None and self.incremental:
                self._cache = self._steps.new_cache()
            logits = self._model_forward(ids, self._cache if self.incremental else None, trace)
            if rows_after:
                queries = [trace.tensors.pop(f"blocks.{l}.attn.q") for l in range(cfg.n_layers)]
                with torch.inference_mode():
                    rows = self._attention_rows(queries)
                for l in range(cfg.n_layers):
                    trace.tensors[f"blocks.{l}.attn.pattern"] = rows[l]
        else:
            full = torch.tensor([self.ids(p) + [int(t)] for p, t in zip(parents, ids[:, 0].tolist())],
                                device=self.model.device)
            logits = self._model_forward(full, None, trace)
        recomputed = parents is not None and not self.incremental  # keep only the new token's row
        prefix = len(self._steps.prefix)
        recorded: list[tuple[str, torch.Tensor]] = []
        for name, t in (trace.items() if trace is not None else ()):  # already detached by Trace.record
            name = name[prefix:]
            if recomputed:  # copied (a view would keep the whole sequence's tensor alive); beams' rows are below
                t = t[:, :, -1:] if name.endswith("attn.pattern") else t[:, -1:]
                t = t.clone() if ids.shape[0] == 1 else t
            recorded.append((name, t))
        # the logits and every record in one device-to-host transfer (a copy each waited on the device once each:
        # ~150 waits a step on a GPU), then CPU tensors of their own, all in the model's dtype until read
        # (Node.next_logits and Node.record make float32 then; the cast is exact, the values every reader had):
        # a bfloat16 history holds half the bytes, the logits the larger part of it (0.3 against 0.6 MB a token
        # at a 151,936-token vocabulary), and a step makes no cast for a node nothing reads
        names = [name for name, _ in recorded]
        logits, rows = _kept_rows(to_host([logits] + [t for _, t in recorded]), logits.device, ids.shape[0])
        return logits, [BatchRow(zip(names, row)) if recorded else {} for row in rows]


def _kept_rows(host: list[torch.Tensor], device: torch.device, batch: int) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    """A step's hand-off: to_host's [logits [B, V], *records [B, ...]] -> the logits and each row's records
    [1, ...] as the history keeps them, each copied once at most. One row: as they are (from another `device`, a
    copy each out of the transfer buffer: _of_their_own). Beams: each record row copied ([1, ...]: a view would
    keep the whole batch alive), from another device straight out of the buffer (it was copied out whole first,
    then each row: two copies); the logits [B, V] as one row's are, each beam's a view of them."""
    logits, records = host[0], host[1:]
    if batch == 1:  # every non-beam step
        logits, *kept = _of_their_own(host, device, n_float32=0)
        return logits, [kept]
    (logits,) = _of_their_own([logits], device, n_float32=0)
    return logits, [[t[b:b + 1].clone() for t in records] for b in range(batch)]


def _of_their_own(host: list[torch.Tensor], device: torch.device, n_float32: int) -> list[torch.Tensor]:
    """to_host's CPU copies in memory of their own when they came from another `device` (to_host's are views
    of one pinned buffer per step, which the history tree would otherwise keep pinned, a buffer per node):
    the first `n_float32` as float32 (a cast, or a clone of one in float32 already), the rest in their dtype (a
    clone each: a bfloat16 record half a float32's bytes). Nothing is copied that is on the CPU in its dtype."""
    on_cpu = device.type == "cpu"
    first = [t.float() if t.dtype != torch.float32 else t if on_cpu else t.clone() for t in host[:n_float32]]
    return first + (host[n_float32:] if on_cpu else [t.clone() for t in host[n_float32:]])


def generate(loaded_or_model, prompt_ids: Sequence[int], max_new: int, settings: GenerationSettings | None = None,
             seed: int | None = 0, stop_tokens: Sequence[int] | None = None, record: bool = False,
             job: JobControl | None = None, interventions: Sequence | None = None) -> tuple[list[int], GenerationSession]:
    """Generate up to max_new tokens; returns prompt + generated ids (beam: the best beam)."""
    max_new = in_limits("max_new", max_new)
    session = GenerationSession(loaded_or_model, prompt_ids, settings, seed, stop_tokens, record=record,
                                interventions=interventions)
    # generate(max_new_tokens=N)'s max_length: the sequence so far + N (where a forced end token comes)
    session.max_length = len(session.prompt) + max_new
    for _ in session.run(max_new, job, lazy_last=True):  # as generate: no forward for the last token
        pass
    return session.ids(), session
