"""Step-by-step generation: a history tree of choices, a KV cache, strategies, recording.

GenerationSession(model, prompt_ids, settings, seed, stop_tokens) runs the prompt once, then:
    step()           pick the next token with the strategy and move there (one token's forward)
    choose(token)    force a token (starts a branch when another child exists)
    back()           go to the parent (the cache is truncated, nothing is recomputed)
    goto(node)       jump to any node of the tree (the cache keeps the shared prefix)
    with_interventions(edits)  the same tree on the edited model (the tokens kept, the rest recomputed)
    run(n, job)      iterator of step() results; stops at stop tokens, the context length or cancel
    reset()          forget the tree, keep the prompt's forward

Every node holds the token, its probability, the logits of the next-token distribution (so views
can re-process them with other temperature/top-k/top-p without running the model) and what the
forward that consumed the token recorded: each layer's attention row of the new query
[H, 1, T] and the new token's residual streams. `step_trace(node)` assembles a Trace of the whole
path for the attention panel; `logit_lens(node)` gives the top prediction at every layer.

Decoding facts (SOURCES.md): p_i ~ exp(logit_i / T); top-k keeps the k most probable tokens; top-p
keeps the smallest set whose mass reaches p. Temperature never changes top-k's set (ranking is
preserved) but can change top-p's. Ties at a boundary are all kept, so a set depends only on the
probabilities, never on token order.

Encoder-decoders (T5, BART, Marian; core/seq2seq.py) run through the same session: the prompt given
is then the source, encoded once; the session's sequence is the target, from the decoder's start
token (session.prompt is [start]), each step one decode() with the cache. Every record is the
decoder's, under the decoder-only names (blocks.l.attn.pattern, embed, ...), plus each layer's
cross-attention of the new token over the source, blocks.l.cross_attn.pattern [H, 1, S]:
cross_attention(node) gives [L, H, S] for the step that produced node's next-token distribution.
_Steps is the one place that knows which kind of model runs a step.

Encoder (BERT-family) models cannot continue a text; MaskedFillSession fills [MASK] positions
instead, most confident first or left to right, with the same distribution processing.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from .jobs import JobControl
from .attention import alibi_mask, alibi_slopes, attention_probs, causal_mask
from .devices import to_host
from .generation_rules import GenerationRules
from .model import KVCache, Transformer, attention_scale, layer_window
from .streamed import holding
from .trace import Trace

STRATEGIES = ("greedy", "sample", "top-k", "top-p", "beam")

# What a one-token forward records: everything per position, cheap for one new token. Not the
# per-layer logit lens (a vocab-sized matmul per layer): logit_lens() computes it on demand.
RECORD_NAMES = ("embed", "blocks.*.attn.input", "blocks.*.attn.pattern", "blocks.*.attn.out",
                "blocks.*.resid_mid", "blocks.*.mlp.out", "blocks.*.resid_post", "final_norm.out")
# A step (and the prompt's forward) asks the model for everything but the attention pattern, so its
# attention runs fused, as transformers' default attention; it keeps each layer's query instead, and
# the new queries' attention rows are then computed from the cached keys (_attention_rows).
_STEP_NAMES = tuple(n for n in RECORD_NAMES if n != "blocks.*.attn.pattern") + ("blocks.*.attn.q",)


class _StepTrace(Trace):
    """Trace whose name matching is shared by every step with the same names (a step makes a
    new Trace; matching ~150 names against the patterns each time is wasted work)."""
    _shared_wants: dict[tuple, dict[str, bool]] = {}

    def __init__(self, names: tuple[str, ...] = RECORD_NAMES) -> None:
        super().__init__(names)
        self._wants = _StepTrace._shared_wants.setdefault(names, {})


class _Steps:
    """How a session runs its model: a decoder-only Transformer reads its sequence; the session's
    records carry the names of trace.py."""
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

    def hidden(self, ids: torch.Tensor, cache, trace: Trace | None, interventions) -> torch.Tensor:
        """The last block's output [B, T, d] for `ids` [B, T] after the cache."""
        return self.model(ids, cache=cache, trace=trace, compute_logits=False, interventions=interventions).hidden


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
        self.encoder_records = dict(zip([n for n, _ in recorded], _float32_of_its_own(host, model.device)))

    def new_cache(self):
        return self.model.new_cache()

    def names(self, names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(self.prefix + n for n in names) + (self.prefix + "blocks.*.cross_attn.pattern",)

    def hidden(self, ids, cache, trace, interventions) -> torch.Tensor:
        enc = self.encoded.expand(ids.shape[0], -1, -1)
        return self.model.decode(ids, enc, cache=cache, trace=trace, compute_logits=False,
                                 interventions=interventions).hidden


def _is_encoder_decoder(model) -> bool:
    return bool(getattr(model.cfg, "is_encoder_decoder", False))


class GenerationError(ValueError):
    """Generation cannot go on (bad settings, wrong kind of model); the message says why."""


class ContextLengthReached(GenerationError):
    """The sequence fills the model's context: no further token can be appended."""


# -- the distribution ------------------------------------------------------------------------


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
    temperature == 0 means greedy: all mass on the most probable token(s)."""
    if temperature < 0 or math.isnan(temperature):
        raise GenerationError(f"temperature must be >= 0, got {temperature}")
    if top_k < 0:
        raise GenerationError(f"top-k must be >= 0 (0 = off), got {top_k}")
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


# -- settings and the tree -------------------------------------------------------------------


@dataclass
class GenerationSettings:
    strategy: str = "greedy"  # greedy | sample | top-k | top-p | beam
    temperature: float = 1.0
    top_k: int = 0  # 0: off ("top-k" strategy defaults to 40)
    top_p: float = 1.0  # 1: off ("top-p" strategy defaults to 0.9)
    beams: int = 4

    def validated(self) -> "GenerationSettings":
        if self.strategy not in STRATEGIES:
            raise GenerationError(f"unknown strategy {self.strategy!r} (known: {', '.join(STRATEGIES)})")
        s = GenerationSettings(**self.__dict__)
        if s.strategy == "top-k" and s.top_k <= 0:
            s.top_k = 40
        if s.strategy == "top-p" and s.top_p >= 1.0:
            s.top_p = 0.9
        if s.strategy == "beam" and s.beams < 1:
            raise GenerationError(f"beam search needs at least 1 beam, got {s.beams}")
        process_logits(torch.zeros(2), s.temperature, s.top_k, s.top_p)  # validates the numbers
        return s


@dataclass(eq=False)
class Node:
    """One token of the history tree (the root is the prompt)."""
    token: int | None  # None for the root
    parent: "Node | None"
    position: int  # index of this token in the sequence (root: prompt length - 1)
    prob: float = 1.0  # probability it had in the distribution it was picked from (as processed)
    model_prob: float = 1.0  # probability the model gave it (T = 1, no filtering)
    score: float = 0.0  # cumulative log model-probability of the generated tokens (beam score)
    how: str = ""  # greedy, sampled, chosen, beam
    next_logits: torch.Tensor | None = None  # [V] float32 CPU: the distribution after this token
    record: dict[str, torch.Tensor] = field(default_factory=dict)  # this token's forward, batch dim dropped
    stop: bool = False  # a stop token: nothing follows
    children: list["Node"] = field(default_factory=list)

    def path(self) -> list["Node"]:
        out, n = [], self
        while n is not None:
            out.append(n)
            n = n.parent
        return out[::-1]

    def child(self, token: int) -> "Node | None":
        for c in self.children:
            if c.token == token:
                return c
        return None

    @property
    def depth(self) -> int:
        """Generated tokens from the root to here."""
        d, n = 0, self
        while n.parent is not None:
            d, n = d + 1, n.parent
        return d


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


class GenerationSession:
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
            from .interventions import resolve
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
        self.model.pack_for_decoding()  # faster one-token steps (same values; see the method)
        self.settings = (settings or GenerationSettings()).validated()
        self.seed = seed
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
        self.root = self._make_root()
        self.reset()

    # -- public API ------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> None:
        """Forget every generated token (the prompt's forward is kept) and reseed."""
        if seed is not None:
            self.seed = seed
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
        self.settings = new

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

    def ids(self, node: Node | None = None) -> list[int]:
        """Prompt + generated ids up to `node` (default: the current node)."""
        node = self.current if node is None else node
        return self.prompt + [n.token for n in node.path()[1:]]

    def generated(self, node: Node | None = None) -> list[Node]:
        return (self.current if node is None else node).path()[1:]

    @property
    def finished(self) -> bool:
        if self.settings.strategy == "beam":
            if self.source is not None and (self._beam_done or not self.beams):
                return True
            return all(b.stop or b.position + 1 >= self.model.cfg.context_length for b in self.beams)
        return self.current.stop

    def step(self) -> Node:
        """Advance one token with the current strategy; returns the new current node."""
        if self.settings.strategy == "beam":
            return self._beam_step()
        node = self.current
        self._check_can_extend(node)
        dist = self.distribution(node)
        if self.settings.strategy == "greedy":
            token, how = int(torch.argmax(dist.logits)), "greedy"
        else:
            token, how = int(torch.multinomial(dist.probs, 1, generator=self._generator)), "sampled"
        return self._extend(node, token, dist, how)

    def choose(self, token_id: int) -> Node:
        """Force `token_id` after the current node (a new branch if that child is not there yet)."""
        token_id = int(token_id)
        if not 0 <= token_id < self.model.cfg.vocab_size:
            raise GenerationError(f"token id {token_id} is outside the vocabulary (0..{self.model.cfg.vocab_size - 1})")
        node = self.current
        self._check_can_extend(node)
        self._leave_beam_mode()
        return self._extend(node, token_id, self.distribution(node), "chosen")

    def back(self) -> Node:
        """Go to the previous token (beam search: the previous set of beams)."""
        if self.settings.strategy == "beam" and self._beam_history:
            self.beams = self._beam_history.pop()
            self.finished_beams, self._beam_done = self._finished_history.pop()
            self.current = self._best_beam()
        elif self.current.parent is not None:
            self.current = self.current.parent
        self.stop_reason = None
        return self.current

    def goto(self, node: Node) -> Node:
        """Make any node of this tree current (e.g. another branch)."""
        if node.path()[0] is not self.root:
            raise GenerationError("that node belongs to another generation")
        self.current = node
        self._start_beams(node)
        self.stop_reason = None
        return node

    def node_at(self, tokens: Sequence[int]) -> Node | None:
        """The node reached from the root by these generated tokens (None if the tree has no such path)."""
        node = self.root
        for t in tokens:
            node = node.child(int(t))
            if node is None:
                return None
        return node

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

    def run(self, n: int, job: JobControl | None = None) -> Iterator[Node]:
        """Up to n steps, yielding each new current node; stops early (setting stop_reason) at a
        stop token or the context length. With a job, cancel() is seen between tokens and also
        between layers of a forward (a slow model still stops within about one layer's time);
        an interrupted step leaves the tree as it was."""
        hooks = []
        if job is not None:
            owner = threading.get_ident()

            def check(module, args) -> None:
                if threading.get_ident() == owner:  # other threads may share this model
                    job.check()
            hooks = [b.register_forward_pre_hook(check) for b in self._steps.blocks]
        try:
            yield from self._run(n, job)
        finally:
            for h in hooks:
                h.remove()

    def _run(self, n: int, job: JobControl | None) -> Iterator[Node]:
        for i in range(n):
            if job is not None:
                job.progress(i, n, f"token {i + 1}/{n}")
            if self.finished:
                self.stop_reason = self._finished_reason()
                return
            try:
                node = self.step()
            except ContextLengthReached as exc:
                self.stop_reason = str(exc)
                return
            yield node
        if job is not None:
            job.progress(n, n, "done")

    def _finished_reason(self) -> str:
        # beams that did not end on a stop token have filled the context: say so, not "stop token"
        if self.settings.strategy == "beam" and self.source is not None and (self._beam_done or not self.beams):
            return "beam search is done: no running beam can beat the finished ones"
        ended = self.beams if self.settings.strategy == "beam" else [self.current]
        if all(b.stop for b in ended):
            return "a stop token was generated"
        return f"the context length ({self.model.cfg.context_length} tokens) is reached"

    def branches(self) -> list[Node]:
        """Leaves of the tree (each is the end of one branch), oldest first."""
        out: list[Node] = []

        def walk(n: Node) -> None:
            if not n.children:
                out.append(n)
            for c in n.children:
                walk(c)
        walk(self.root)
        return out

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
        for name in self.root.record:
            if name.endswith("cross_attn.pattern"):  # every row sees the whole source
                trace.tensors[prefix + name] = torch.cat([n.record[name] for n in path], dim=1)[None]
            elif name.endswith("attn.pattern"):
                rows = []
                for n in path:
                    p = n.record[name]  # [H, t_q, t_k]
                    rows.append(torch.nn.functional.pad(p, (0, T - p.shape[-1])))
                trace.tensors[prefix + name] = torch.cat(rows, dim=1)[None]
            else:
                trace.tensors[prefix + name] = torch.cat([n.record[name] for n in path], dim=0)[None]
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
        with torch.inference_mode(), holding(self.model, layer):  # (a model read layer by layer: core/streamed.py)
            dev, dtype = self.model.device, self.model.dtype
            v = attn.v(x.to(dev, dtype)).view(T, Hkv, dh).transpose(0, 1)  # [Hkv, T, dh]
            if Hkv != H:
                v = v.repeat_interleave(H // Hkv, dim=0)
            z = P.to(dev, dtype) @ v  # [H, T, dh]: each head's output before W_O
            if self.interventions:  # an ablated or patched head shows what the edited model used
                from .interventions import editing_trace
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

    def _leave_beam_mode(self) -> None:
        if self.settings.strategy == "beam":
            self._start_beams(self.current)

    def _start_beams(self, node: Node) -> None:
        """Beam search from `node`: its only beam, no history. finished_beams: an encoder-decoder's
        hypotheses ended by a stop token (best first, by score / generated length), set aside as
        transformers' generate does; a decoder's ended beams stay among self.beams."""
        self.beams: list[Node] = [node]
        self._beam_history: list[list[Node]] = []
        self.finished_beams: list[Node] = []
        self._finished_history: list[tuple[list[Node], bool]] = []
        self._beam_done = False

    def _best_beam(self) -> Node:
        """The best beam: an encoder-decoder's best of the finished and running hypotheses by score /
        generated length (what generate returns when it stops here); a decoder's by score."""
        if self.source is None:
            return max(self.beams, key=lambda b: b.score)
        return max(self.finished_beams + self.beams, key=lambda b: b.score / max(b.depth, 1))

    def _new_child(self, parent: Node, token: int, dist: Distribution, how: str,
                   lp: float | None = None) -> tuple[Node, bool]:
        """lp: the token's log-probability the score adds (default: from dist's model_probs)."""
        existing = parent.child(token)
        if existing is not None:
            return existing, False
        if lp is None:
            lp = math.log(max(float(dist.model_probs[token]), 1e-300))
        node = Node(token=token, parent=parent, position=parent.position + 1, prob=float(dist.probs[token]),
                    model_prob=float(dist.model_probs[token]), score=parent.score + lp, how=how,
                    stop=token in self.stop_tokens)
        parent.children.append(node)
        return node, True

    def _extend(self, parent: Node, token: int, dist: Distribution, how: str) -> Node:
        node, new = self._new_child(parent, token, dist, how)
        if new:  # stop tokens too: their step is inspectable like any other
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

    def _beam_step(self) -> Node:
        if self.source is not None:
            return self._beam_step_as_generate()
        width = self.settings.beams
        live = [b for b in self.beams if not b.stop and b.position + 1 < self.model.cfg.context_length]
        if not live:
            if any(not b.stop for b in self.beams):
                raise ContextLengthReached(f"the context length ({self.model.cfg.context_length} tokens) is reached")
            raise GenerationError("every beam has ended with a stop token")
        cand_scores, cand_src = [], []
        for b in self.beams:  # ended beams compete with their fixed score
            if b not in live:
                cand_scores.append(torch.tensor([b.score], dtype=torch.float64))
                cand_src.append((b, None))
        for b in live:
            logp = self._ruled(b, torch.log_softmax(b.next_logits.double(), 0))
            cand_scores.append(b.score + logp)
            cand_src.append((b, logp))
        flat = torch.cat(cand_scores)
        k = min(width, flat.numel())
        top = torch.topk(flat, k).indices.tolist()
        offsets, o = [], 0
        for s in cand_scores:
            offsets.append(o)
            o += s.numel()
        chosen: list[Node] = []
        created: list[Node] = []
        to_forward: list[tuple[Node, Node]] = []  # (parent, child)
        for idx in top:
            g = max(i for i, off in enumerate(offsets) if off <= idx)
            b, row = cand_src[g]
            if row is None:
                chosen.append(b)
                continue
            token = idx - offsets[g]
            dist = process_logits(b.next_logits)
            child, new = self._new_child(b, token, dist, "beam",
                                          lp=float(row[token]) if self.rules.changes_logits else None)
            if new:
                created.append(child)
            chosen.append(child)
            to_forward.append((b, child))
        if to_forward:
            self._forward_children(to_forward, created)
        self._beam_history.append(self.beams)
        self._finished_history.append((self.finished_beams, self._beam_done))
        self.beams = chosen
        self.current = max(chosen, key=lambda n: n.score)
        return self.current

    def _forward_children(self, pairs: list, created: list) -> None:
        """One batched decoder step for each (parent, child) pair of a beam step: the children's tokens on
        their parents' caches, their next logits and records kept (a child that has them keeps them); a
        failure undoes the children this step created."""
        parents = [p for p, _ in pairs]
        try:
            self._sync_cache_batch(parents)
            tokens = torch.tensor([[c.token] for _, c in pairs], device=self.model.device)
            logits, records = self._forward(tokens, parents)
        except BaseException:
            self._undo(created)
            raise
        for i, (_, c) in enumerate(pairs):
            if c.next_logits is None:
                c.next_logits, c.record = logits[i], records[i]
        if self.incremental:
            self._cache_nodes = [c for _, c in pairs]

    def _beam_step_as_generate(self) -> Node:
        """An encoder-decoder's beam step as transformers' generate takes it (its _beam_search with
        length_penalty 1 and early_stopping False; core.seq2seq.beam_decode): the 2 x width best
        continuations of the running beams; those among the best `width` that end with a stop token
        join the finished hypotheses (the best `width` kept, scored log p / generated length), the
        best `width` others run on; the search is done when no running beam can beat the worst
        finished one (once `width` have finished)."""
        width = self.settings.beams
        live = [b for b in self.beams if not b.stop]
        if self._beam_done or not live:
            raise GenerationError("beam search is done: no running beam can beat the finished ones")
        ctx = self.model.cfg.context_length
        if any(b.position + 1 >= ctx for b in live):
            raise ContextLengthReached(f"the context length ({ctx} tokens) is reached")
        # generate's processors on each beam's log-probabilities (its _beam_search), then the beam's score
        ruled = [self._ruled(b, torch.log_softmax(b.next_logits.double(), 0)) for b in live]
        logp = torch.stack([b.score + r for b, r in zip(live, ruled)])
        V = logp.shape[1]
        top = torch.topk(logp.reshape(-1), min(2 * width, logp.numel())).indices.tolist()
        picked: list[tuple[int, int]] = []  # (live beam, token)
        running = ended = 0
        for rank, idx in enumerate(top):
            token = idx % V
            if token in self.stop_tokens:
                if rank < width:  # generate: a stop among the best `width` finishes a hypothesis
                    picked.append((idx // V, token))
                    ended += 1
            elif running < width:
                picked.append((idx // V, token))
                running += 1
        created: list[Node] = []
        children: list[tuple[Node, Node]] = []
        for i, token in picked:
            b = live[i]
            child, new = self._new_child(b, token, process_logits(b.next_logits), "beam",
                                          lp=float(ruled[i][token]) if self.rules.changes_logits else None)
            if new:
                created.append(child)
            children.append((b, child))
        to_forward = [(b, c) for b, c in children if c.next_logits is None]
        if to_forward:
            self._forward_children(to_forward, created)
        self._beam_history.append(self.beams)
        self._finished_history.append((self.finished_beams, self._beam_done))
        norm = lambda n: n.score / max(n.depth, 1)  # noqa: E731 (generate's length_penalty 1)
        finished = sorted(self.finished_beams + [c for _, c in children if c.stop], key=norm, reverse=True)[:width]
        self.beams = [c for _, c in children if not c.stop]
        self.finished_beams = finished
        if not self.beams:
            self._beam_done = True
        elif len(finished) == width:  # generate's "improvable": the best running beam against the worst finished
            best = max(b.score for b in self.beams) / self.beams[0].depth
            self._beam_done = not best > norm(finished[-1])
        self.current = self._best_beam()
        return self.current

    def _attention_rows(self, queries: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every layer's attention [B, H, T_q, T] of the new queries [B, H, T_q, dh] (after rotary), from
        the cached keys, with the model's own formula (attention_probs): the last T_q of the T cached
        positions are the queries', each sees the keys up to itself (and its window). One batched
        product for a one-token step; layer by layer for the prompt (its [T, T] patterns, a layer at a
        time as the forward would have recorded them)."""
        cfg = self.model.cfg
        H, Hkv = cfg.n_heads, cfg.n_kv_heads
        keys = self._cache.stacked_keys()  # [L, B, Hkv, T, dh], after rotary; a view, no copy
        Tq, T = queries[0].shape[-2], keys.shape[-2]
        windows = [layer_window(cfg, l) for l in range(cfg.n_layers)]
        # ALiBi (Bloom): the bias by distance rides on the mask, as in the forward pass
        slopes = alibi_slopes(cfg.n_heads, keys.device) if cfg.positions == "alibi" else None
        if Tq > 1:
            rows = []
            for l, q in enumerate(queries):
                k = keys[l] if Hkv == H else keys[l].repeat_interleave(H // Hkv, dim=1)
                mask = causal_mask(Tq, T, k.device, windows[l])[None, None]
                if slopes is not None:
                    mask = alibi_mask(slopes, mask, q.dtype)
                rows.append(attention_probs(q, k, cfg.attention_kind, mask, scale=attention_scale(cfg),
                                            softcap=cfg.attn_logit_softcap))
            return rows
        q = torch.stack(queries)  # [L, B, H, 1, dh]
        k = keys if Hkv == H else keys.repeat_interleave(H // Hkv, dim=2)
        mask = None
        if any(w is not None and w < T for w in windows):  # sliding layers: the new query sees its window only
            mask = torch.stack([causal_mask(1, T, k.device, w) for w in windows])[:, None, None]  # [L, 1, 1, 1, T]
        if slopes is not None:
            seen = mask if mask is not None else torch.ones(1, 1, 1, 1, T, dtype=torch.bool, device=k.device)
            mask = alibi_mask(slopes, seen, q.dtype)
        return list(attention_probs(q, k, cfg.attention_kind, mask, scale=attention_scale(cfg),
                                   softcap=cfg.attn_logit_softcap).unbind(0))

    def _undo(self, created: list[Node]) -> None:
        """Forget nodes whose forward did not finish; the cache may be half-updated: drop it."""
        for n in created:
            if n in n.parent.children:
                n.parent.children.remove(n)
        self._cache, self._cache_nodes = None, []

    def _sync_cache(self, nodes: list[Node]) -> None:
        """Make self._cache hold the K/V of the path to `nodes` (one row per node)."""
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
        # inference_mode: less per-op bookkeeping than no_grad; what it makes (cache, records,
        # logits) is only read afterwards, never modified in place or differentiated
        with torch.inference_mode():
            hidden = self._steps.hidden(ids, cache, trace, self.interventions)
            return self.model.unembed(hidden[:, -1])

    def _forward(self, ids: torch.Tensor, parents: list[Node] | None) -> tuple[torch.Tensor, list[dict]]:
        """Logits [B, V] of the last position and per-row records. With parents, `ids` [B, 1]
        are new tokens after them (one forward with the cache, or a full recompute)."""
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
            if recomputed:
                t = t[:, :, -1:] if name.endswith("attn.pattern") else t[:, -1:]
            recorded.append((name, t))
        # the logits and every record in one device-to-host transfer (a copy each waited on the
        # device once each: ~150 waits a step on a GPU), then float32 CPU tensors of their own
        host = _float32_of_its_own(to_host([logits] + [t for _, t in recorded]), logits.device)
        logits = host[0]
        records: list[dict] = [{} for _ in range(ids.shape[0])]
        for (name, _), t in zip(recorded, host[1:]):
            if t.shape[0] == 1:  # the one-row case (every non-beam step): no copies, no slicing
                records[0][name] = t[0]
                continue
            for b in range(t.shape[0]):  # beams: copy rows, a view would keep the whole batch alive
                records[b][name] = t[b].clone()
        return logits, records


def _float32_of_its_own(host: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """to_host's CPU copies as float32 tensors, in memory of their own when they came from another
    device (to_host's are views of one pinned buffer per step, which the history tree would otherwise
    keep pinned, a buffer per node): all cast in one operation, views of one buffer (a cast each took
    ~2 us, ~150 a step), nothing copied for float32 tensors already on the CPU."""
    if not host or (device.type == "cpu" and all(t.dtype == torch.float32 for t in host)):
        return host
    flat = torch.cat([t.reshape(-1) for t in host]).float()  # a copy even where it is float32 already
    return [part.view(t.shape) for part, t in zip(flat.split([t.numel() for t in host]), host)]


def generate(loaded_or_model, prompt_ids: Sequence[int], max_new: int, settings: GenerationSettings | None = None,
             seed: int | None = 0, stop_tokens: Sequence[int] | None = None, record: bool = False,
             job: JobControl | None = None, interventions: Sequence | None = None) -> tuple[list[int], GenerationSession]:
    """Generate up to max_new tokens; returns prompt + generated ids (beam: the best beam)."""
    session = GenerationSession(loaded_or_model, prompt_ids, settings, seed, stop_tokens, record=record,
                                interventions=interventions)
    # generate(max_new_tokens=N)'s max_length: the sequence so far + N (where a forced end token comes)
    session.max_length = len(session.prompt) + max_new
    for _ in session.run(max_new, job):
        pass
    return session.ids(), session


# -- encoder models: fill masked positions ---------------------------------------------------


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
        self.seed = seed
        self._generator = torch.Generator(device="cpu")
        # what-if edits (core/interventions.py) every forward applies; "mean" is over the masked text
        self.interventions = None
        if interventions:
            from .interventions import resolve
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
            self.seed = seed
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
        if self.settings.strategy == "greedy":
            token, how = int(torch.argmax(dist.logits)), "greedy"
        else:
            token, how = int(torch.multinomial(dist.probs, 1, generator=self._generator)), "sampled"
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
