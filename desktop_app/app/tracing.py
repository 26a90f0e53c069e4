"""Tracing: the one policy for what a forward pass records, and the traces the app takes with it.

What a trace records depends on what it is for, and is decided here only (trace_names):
- VIEWS, what the panels read (AppState's trace of the text or the image, `render`): everything ("*")
  when it is cheap (vocab x tokens x layers up to TRACE_ALL_BELOW); above that VIEW_NAMES, without
  the per-layer logit lens, which the views then compute lazily from the residuals. A vision model
  always records VIEW_NAMES: its recorded logit lens reads [CLS] alone, and the Layers panel reads
  every position's residual through the final norm + classifier instead.
- FILE, what a trace file holds (`trace --out x.npz`, file_arrays): the attention patterns and the
  residual stream (Hugging Face's hidden_states), and the logits, and a mixture of experts' routing
  (ROUTING_NAMES: router logits, chosen experts and their weights per layer); FILE_NAMES is a subset of what VIEWS
  records, so the file and the app show the same numbers (tests/app/test_tracing.py).

A VIEWS trace keeps memory to what is shown (core/trace.py): it is lazy (each layer's head outputs
are derived from its attn.z when a view asks for that layer, the logit lens from the residuals), its
attention patterns are kept in float16 when a half-precision checkpoint computes in float32
(devices.pattern_dtype), and before it runs its memory is estimated (core.trace.estimate_trace_bytes)
and a trace that would not fit is refused with the number of tokens, or of layers (a layer range,
`trace --layers A:B`), that would (check_trace_memory; MemoryEstimateError, one line), never an
out-of-memory crash. On a CUDA device the records go to pinned host memory block by block as they are
made (records_to_host, Trace.hand_off): the card holds the weights and one layer's work, the host the
trace, and the estimate (trace_memory: device and host) is checked against each one's memory.

A first look that arrives in pieces: trace_input(on_layer=, job=) hands back each layer as soon as its
records are in the trace (LayersReady: the text's encoding, the trace being filled, layers done of
how many), reports "layer k / L" to the job and stops at its cancel between layers (core.jobs), all
from the model's one forward (Transformer.forward's on_layer). The GUI's AppState paints from it, and
takes the logits after the blocks (trace_input(logits=False): add_logits, a second step of the same trace).

Encoder-decoders (T5, BART, Marian; core/seq2seq.py): the input is a source text (the encoder's) and a
target text (the decoder's), either also given as ids. The decoder's input is [decoder start token] +
the target's tokens (tokenized with Tokenizer.target when the model has one, Marian's target.spm, else
with the model's tokenizer), so with T target tokens the decoder reads T + 1 positions and logits row i
predicts target token i (the last row the token after the target); no target = the start token alone.
trace_input(target=, target_ids=) traces both stacks in one forward (EncodedPair: the source's
encoding, the target's and the decoder's input ids); the trace holds the names core/seq2seq.py lists
(encoder.blocks.l.attn.pattern [B, H, S, S], decoder.blocks.l.attn.pattern [B, H, T+1, T+1],
decoder.blocks.l.cross_attn.pattern [B, H, T+1, S], ...). attention_view(trace, kind) is that trace seen
as one stack's (blocks.l.attn.* of the encoder's self-attention, the decoder's or its cross-attention),
the names every attention view reads; a trace file holds encoder_attn.l, decoder_attn.l, cross_attn.l,
encoder_hidden.i, decoder_hidden.i, logits, tokens (the source ids) and decoder_tokens (file_arrays).

Not here: what a generation step records (core/generation/session.py's RECORD_NAMES). That is the mechanism
of GenerationSession (a one-token forward records per-position tensors that step_trace concatenates
along the sequence, the attention rows are rebuilt from cached queries, head outputs from pattern and
input), not a choice a front end makes; changing it means changing that code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ..core.checkpoints import LoadedModel
    from ..core.inputs import EncodedText
    from ..core.trace import Trace

VIEWS, FILE = "views", "file"
PURPOSES = (VIEWS, FILE)

# Recording everything (the logit lens is [layers, T, vocab]) is cheap below this many
# vocab x tokens x layers values; above it only what the views read eagerly is recorded.
TRACE_ALL_BELOW = 50_000_000
# a mixture of experts' routing (core/moe.py; nothing is recorded under them by a dense model)
ROUTING_NAMES = ("blocks.*.mlp.router", "blocks.*.mlp.experts", "blocks.*.mlp.expert_weights",
                 "blocks.*.mlp.expert_norms")
VIEW_NAMES = ("embed", "final_norm.out", "logits", "blocks.*.attn.*", "blocks.*.resid_*", "blocks.*.mlp.out",
              *ROUTING_NAMES)
FILE_NAMES = ("embed", "final_norm.out", "logits", "blocks.*.attn.pattern", "blocks.*.resid_post", *ROUTING_NAMES)


def trace_names(config, n_tokens: int, final_logits: bool = True, purpose: str = VIEWS) -> list[str]:
    """What a forward pass of `config`'s model over `n_tokens` records, for `purpose` (VIEWS or FILE,
    see the module's docstring); the final logits only when asked (`final_logits`). An encoder-decoder's
    names are each stack's (encoder.*, decoder.*, the decoder's cross_attn too); `n_tokens` then counts both
    sequences."""
    if purpose not in PURPOSES:
        raise ValueError(f"trace purpose {purpose!r}: one of {', '.join(PURPOSES)}")
    if purpose == VIEWS and config.input_kind != "patches" \
            and config.vocab_size * n_tokens * total_layers(config) <= TRACE_ALL_BELOW:
        return ["*"]
    names = VIEW_NAMES if purpose == VIEWS else FILE_NAMES
    names = [n for n in names if final_logits or n != "logits"]
    if not is_seq2seq(config):
        return names
    stacks = [n if n == "logits" else f"{stack}.{n}" for n in names for stack in ("encoder", "decoder")]
    cross = [f"decoder.{n.replace('.attn.', '.cross_attn.')}" for n in names if ".attn." in n]
    return list(dict.fromkeys(stacks + cross))


def is_seq2seq(config) -> bool:
    """Whether `config` (or a LoadedModel's) is an encoder-decoder's (core/seq2seq.py)."""
    return bool(getattr(getattr(config, "config", config), "is_encoder_decoder", False))


def total_layers(config) -> int:
    """Blocks a forward pass runs: an encoder-decoder's two stacks together."""
    if not is_seq2seq(config):
        return config.n_layers
    return config.n_layers + (config.n_decoder_layers or config.n_layers)


def parse_layers(text: str) -> tuple[int, int | None]:
    """A layer range as typed, "A:B" (blocks A .. B-1; "A:" to the last, ":B" from the first), for the
    command line (argparse type): (A, B or None); checked against a model by layer_range."""
    from ..core.numbers import parse_int

    start, sep, stop = str(text).partition(":")
    try:
        if not sep:
            raise ValueError
        a = parse_int(start) if start.strip() else 0
        b = parse_int(stop) if stop.strip() else None
    except ValueError:
        raise ValueError(f"layer range {text!r}: write A:B, blocks A to B-1 (e.g. 0:4)") from None
    if a < 0 or (b is not None and b <= a):
        raise ValueError(f"layer range {text!r}: A:B with 0 <= A < B (blocks A to B-1)")
    return a, b


def layer_range(layers, n_layers: int) -> range:
    """The blocks a trace records: None (all), a count k (the first k), a range or parse_layers' (A, B);
    a range outside the model's n_layers blocks is refused in one line."""
    if layers is None:
        return range(n_layers)
    if isinstance(layers, int):
        return range(min(max(layers, 0), n_layers))
    a, b = (layers.start, layers.stop) if isinstance(layers, range) else layers
    b = n_layers if b is None else b
    if not 0 <= a < b <= n_layers:
        raise ValueError(f"layer range {a}:{b}: the model has {n_layers} layers (0:{n_layers} is all of them)")
    return range(a, b)


def _layer_names(names: list[str], layers: range, n_layers: int) -> list[str]:
    """`names` restricted to the blocks in `layers`."""
    if layers == range(n_layers):
        return names
    out = []
    for n in names:
        if n == "*":
            out += ["embed", "final_norm.out", "logits"] + [f"blocks.{l}.*" for l in layers]
        elif n.startswith("blocks.*."):
            out += [f"blocks.{l}.{n[len('blocks.*.'):]}" for l in layers]
        else:
            out.append(n)
    return out


def trace_settings(loaded: LoadedModel, n_tokens: int, purpose: str = VIEWS, layers=None) -> dict:
    """run_with_trace's keyword arguments for a trace of `n_tokens` of `loaded` for `purpose`: the names,
    lazy derivation and the patterns' dtype of a VIEWS trace (see the module's docstring); `layers`:
    the blocks recorded (layer_range's forms)."""
    from ..core.devices import pattern_dtype

    n_layers = loaded.config.n_layers
    if is_seq2seq(loaded.config):
        if layers is not None:  # (any range: n_layers counts the encoder's blocks alone)
            raise ValueError(f"{loaded.name} is an encoder-decoder, whose trace records both stacks whole "
                             "(a layer range is for one-stack models)")
        names = trace_names(loaded.config, n_tokens, purpose=purpose)
    else:
        names = _layer_names(trace_names(loaded.config, n_tokens, purpose=purpose), layer_range(layers, n_layers),
                             n_layers)
    if purpose != VIEWS:
        return {"names": names}
    model = loaded.model
    lazy = {} if is_seq2seq(loaded.config) else {"lazy": True}  # (an encoder-decoder's trace derives nothing)
    return {"names": names, **lazy,
            "pattern_dtype": pattern_dtype(model.dtype, getattr(loaded, "stored_dtype", None))}


def records_to_host(loaded: LoadedModel) -> bool:
    """Whether a trace of `loaded` hands its records to host memory layer by layer (Trace.hand_off): on a
    CUDA device, so that the card holds the weights and one layer's work; on the CPU they are made there."""
    return loaded.model.device.type == "cuda"


def trace_memory(loaded: LoadedModel, n_tokens: int, purpose: str = VIEWS, layers=None,
                 n_target: int | None = None, host_records: bool | None = None):
    """What a trace of `n_tokens` of `loaded` needs on top of its weights (core.trace.TraceBytes): on the
    model's device and, when its records are handed to host memory (`host_records`, default
    records_to_host; one-stack models), on the host; an encoder-decoder's of `n_tokens` source tokens
    and `n_target` decoder positions."""
    from ..core.trace import estimate_trace_memory

    host = records_to_host(loaded) if host_records is None else host_records
    kw = trace_settings(loaded, n_tokens + (n_target or 0), purpose, layers)
    return estimate_trace_memory(loaded.config, n_tokens, kw["names"], loaded.model.dtype, kw.get("pattern_dtype"),
                                 lazy=kw.get("lazy", False), layers=len(layer_range(layers, loaded.config.n_layers)),
                                 n_target=n_target, host_records=host, pinned=loaded.model.device.type == "cuda")


def estimated_trace_bytes(loaded: LoadedModel, n_tokens: int, purpose: str = VIEWS, layers=None,
                          n_target: int | None = None) -> int:
    """What a trace of `n_tokens` of `loaded` needs on top of its weights, device and host together
    (trace_memory)."""
    return trace_memory(loaded, n_tokens, purpose, layers, n_target).total


def check_trace_memory(loaded: LoadedModel, n_tokens: int, purpose: str = VIEWS, layers=None,
                       available: int | None = None, n_target: int | None = None, *,
                       host_records: bool | None = None, available_host: int | None = None) -> int:
    """The estimate (bytes, trace_memory's total) when it fits: on the model's device in `available`
    (default: what the device has) and, when the records go to host memory (`host_records`, default
    records_to_host), on the host in `available_host` (default: what this machine has); else
    MemoryEstimateError, one line naming which memory is short, with the choices: fewer tokens, or fewer
    layers (a layer range). An encoder-decoder's (`n_target` decoder positions) is refused with its two
    lengths, both stacks whole."""
    from ..core.devices import MemoryEstimateError, available_memory, human_bytes

    host = records_to_host(loaded) if host_records is None else host_records
    device = loaded.model.device
    have = available_memory(device) if available is None else available
    have_host = (available_memory("cpu") if available_host is None else available_host) if host else None
    on_gpu = device.type == "cuda"

    def memory(t: int, k=layers):  # (a one-stack model's: the choices below)
        return trace_memory(loaded, t, purpose, k, host_records=host)

    def short(m) -> list[str]:
        """What does not fit, each as 'X on the GPU; this GPU has Y available'."""
        if not host:  # everything where the model is
            return [] if have is None or m.device <= have else \
                [f"{human_bytes(m.device)}; {'this GPU' if on_gpu else 'this machine'} has {human_bytes(have)} available"]
        out = []
        if have is not None and m.device > have:
            out.append(f"{human_bytes(m.device)} on the {'GPU' if on_gpu else 'device'} for one layer's work "
                       f"({'this GPU' if on_gpu else 'it'} has {human_bytes(have)} available beside the weights)")
        if have_host is not None and m.host > have_host:
            out.append(f"{human_bytes(m.host)} of host memory for the records (this machine has "
                       f"{human_bytes(have_host)} available)")
        return out

    need = trace_memory(loaded, n_tokens, purpose, layers, n_target, host)
    missing = short(need)
    if not missing:
        return need.total
    what = " and ".join(missing)
    if is_seq2seq(loaded.config):
        refusal = MemoryEstimateError(f"a trace of {n_tokens} source and {n_target} target tokens through both "
                                      f"stacks of {loaded.name} needs about {what}: trace shorter texts")
        refusal.tokens, refusal.layers = 0, 0
        raise refusal
    n = loaded.config.n_layers
    L = len(layer_range(layers, n))
    tokens = _largest(lambda t: not short(memory(t)), n_tokens - 1)
    first = _largest(lambda k: not short(memory(n_tokens, k)), L - 1)
    choices = [f"at most {tokens} tokens" if tokens else "",
               f"the first {first} of {n} layers, or any range of {first} (layers A:B, e.g. "
               f"{n - first}:{n})" if first else ""]
    choices = " or ".join(c for c in choices if c)
    refusal = MemoryEstimateError(f"a trace of {n_tokens} tokens through {L} layers of {loaded.name} needs about "
                                  f"{what}" + (f": trace {choices}" if choices else ""))
    refusal.tokens, refusal.layers = tokens, first  # the choices, for a front end to offer (0: none)
    raise refusal


def _largest(fits, hi: int) -> int:
    """The largest n in 1..hi with fits(n) (fits grows false with n), 0 when none."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _resolved(loaded: LoadedModel, inputs, interventions: list | None, decoder_ids: list[int] | None = None
              ) -> list | None:
    """The what-if edits checked against the model, "mean" and "resample" resolved over `inputs`
    (token ids, or a ViT's pixel values [1, C, H, W]; an encoder-decoder's source, with `decoder_ids`
    its decoder's input); None when there are none."""
    if not interventions:
        return None
    from ..core.interventions import resolve

    return resolve(loaded.model, inputs, [iv.check(loaded.config) for iv in interventions], decoder_ids=decoder_ids)


@dataclass(frozen=True)
class LayersReady:
    """A trace arriving in pieces (trace_input's on_layer): blocks 0 .. done-1 of `total` are recorded
    in `trace` (the one being filled: read those layers only), for the text encoded as `enc`. (With a
    layer range A:B, those of A .. done-1, and `total` is B.)"""
    enc: EncodedText
    trace: Trace
    done: int
    total: int


def trace_input(loaded: LoadedModel, text: str, ids: list[int] | None,
                interventions: list | None = None, purpose: str = VIEWS,
                layers=None, *, on_layer: Callable[[LayersReady], None] | None = None,
                job=None, target: str = "", target_ids: list[int] | None = None,
                host_records: bool | None = None, logits: bool = True):
    """Encode `text` (or check the given `ids`) for `loaded` and trace them. Text longer than the
    context is cut to its first context_length tokens, and the EncodedText's notice says so;
    unknown words and ids outside the vocabulary raise InputError with a sentence naming them.
    With interventions (core/interventions.py) the trace is the edited model's (means over this text).
    `layers`: record only these blocks (layer_range: a count of first blocks, a range, (A, B)). A trace
    that would not fit in memory raises MemoryEstimateError (check_trace_memory) before it starts.
    `job` (core.jobs.JobControl): "layer k / L" reported after each block, and core.jobs.Cancelled raised
    there once it is cancelled; `on_layer`: each block's LayersReady, as soon as it is recorded.
    An encoder-decoder's input is `text` / `ids` (the source) and `target` / `target_ids` (see the module's
    docstring): an EncodedPair, and a trace of both stacks ("layer k / L" over both; a cancel stops it after
    the block where it is seen, in either stack; no on_layer pieces).
    `host_records` (default records_to_host: on CUDA): each block's records are handed to (pinned) host
    memory as soon as the block has run, before on_layer sees it (Trace.hand_off, one transfer per dtype),
    and the final ones at the end, so the card holds the weights and one layer's work and every record
    read is a CPU tensor; on the CPU they stay where they are made (no copy).
    Returns (encoding, trace); with `logits=False`, (encoding, trace, add_logits): the forward stops after
    the final norm, and add_logits() records the logits into the same trace, the values the whole forward
    records (the GUI's first look paints the blocks before the unembedding of every position against the
    whole vocabulary: 1,024 x 151,936 logits at Qwen2.5-0.5B's shape, ~1 s of two cores; an encoder-decoder's
    trace is whole at once, its add_logits does nothing)."""
    import torch

    from ..core.inputs import check_ids, encode_text_or_ids
    from ..core.jobs import report

    cfg = loaded.config
    enc = check_ids(ids, cfg.vocab_size, cfg.context_length) if ids is not None else encode_text_or_ids(loaded, text)
    if is_seq2seq(cfg):
        out = _trace_pair(loaded, encode_pair(loaded, enc, target, target_ids), interventions, purpose, layers, job)
        return out if logits else (*out, _nothing)
    if target_ids is not None or target:
        raise ValueError(f"{loaded.name} is not an encoder-decoder: it reads one text, no target")
    if not enc.ids:
        return (enc, None) if logits else (enc, None, _nothing)
    host = records_to_host(loaded) if host_records is None else host_records
    check_trace_memory(loaded, len(enc.ids), purpose, layers, host_records=host)
    total, recorded = cfg.n_layers, layer_range(layers, cfg.n_layers)
    report(job, 0, total, f"layer 0 / {total}")

    def ready(layer: int, trace: Trace) -> None:
        if host:
            trace.hand_off()  # this block's records (and the embedding's with block 0) to host memory
        report(job, layer + 1, total, f"layer {layer + 1} / {total}")  # stops here once cancelled
        if on_layer is not None and layer in recorded:  # (a layer range: of the blocks it records)
            on_layer(LayersReady(enc, trace, layer + 1, recorded.stop))

    progressive = job is not None or on_layer is not None or host
    model = loaded.model
    out, trace = model.run_with_trace(torch.tensor(enc.ids, device=model.device)[None],
                                      interventions=_resolved(loaded, enc.ids, interventions),
                                      on_layer=ready if progressive else None, compute_logits=logits,
                                      **trace_settings(loaded, len(enc.ids), purpose, layers))
    if host:
        trace.hand_off()  # the final norm's output and the logits
    if logits:
        return enc, trace

    def add_logits() -> None:
        """The logits of the last block's output, recorded as Transformer.forward records them."""
        if cfg.lm_head:
            with torch.no_grad():
                trace.record("logits", model.unembed(out.hidden))
            if host:
                trace.hand_off()

    return enc, trace, add_logits


def _nothing() -> None:
    """add_logits of a trace that is whole already (trace_input's logits=False)."""


@dataclass
class EncodedPair:
    """An encoder-decoder's input: the source's encoding (`source`; its fields are read through: `ids`,
    `notice`, `specials` are the source's), the target's (`target`), and what the decoder reads,
    [start token] + the target's ids (`decoder_ids`)."""
    source: EncodedText
    target: EncodedText
    decoder_ids: list[int] = field(default_factory=list)

    def __getattr__(self, name: str):
        if name in ("source", "target", "decoder_ids") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.source, name)


def encode_target(loaded: LoadedModel, text: str, ids: list[int] | None = None) -> EncodedText:
    """An encoder-decoder's target text (or its ids) as ids: through Tokenizer.target when the model has
    one (Marian's target.spm), else its tokenizer, with the input setting's special tokens (T5 and Marian
    end it with </s>); checked against the vocabulary and cut to the decoder's context less its start token."""
    from ..core.inputs import EncodedText, check_ids, encode, parse_token_ids

    cfg = loaded.config
    room = cfg.context_length - 1
    if ids is not None:
        return check_ids(ids, cfg.vocab_size, room, where="target")
    if not text.strip():
        return EncodedText([])
    tok = loaded.tokenizer
    if tok is None:
        return check_ids(parse_token_ids(text, "target (the model has no tokenizer, so it takes token ids)"),
                         cfg.vocab_size, room, where="target")
    return encode(tok.target or tok, text, cfg.vocab_size, room, where="target", special_tokens=tok.special_tokens)


def encode_pair(loaded: LoadedModel, source: EncodedText, target: str = "",
                target_ids: list[int] | None = None) -> EncodedPair:
    """The source's encoding with the target's (encode_target) and the decoder's input ids."""
    tgt = encode_target(loaded, target, target_ids)
    return EncodedPair(source, tgt, [loaded.model.start_token()] + list(tgt.ids))


def _trace_pair(loaded: LoadedModel, pair: EncodedPair, interventions, purpose: str, layers, job):
    """trace_input of an encoder-decoder: the encoder over the source, the decoder over [start] + target."""
    import torch

    from ..core.jobs import report
    from ..core.trace import Trace

    if not pair.ids:
        return pair, None
    model, cfg = loaded.model, loaded.config
    check_trace_memory(loaded, len(pair.ids), purpose, layers, n_target=len(pair.decoder_ids))
    kw = trace_settings(loaded, len(pair.ids) + len(pair.decoder_ids), purpose, layers)
    edits = _resolved(loaded, pair.ids, interventions, pair.decoder_ids)  # means over each stack's input
    n_enc, total = cfg.n_layers, total_layers(cfg)
    report(job, 0, total, f"layer 0 / {total}")
    trace = Trace(kw["names"], pattern_dtype=kw.get("pattern_dtype"))
    src = torch.tensor(pair.ids, device=model.device)[None]
    tgt = torch.tensor(pair.decoder_ids, device=model.device)[None]
    def after(first: int):  # each stack's on_layer: "layer k / L" over both stacks, and a cancel seen there
        return None if job is None else lambda l: report(job, first + l + 1, total, f"layer {first + l + 1} / {total}")

    with torch.no_grad():
        enc = model.encode(src, trace=trace, interventions=edits, on_layer=after(0))
        model.decode(tgt, enc, trace=trace, interventions=edits, on_layer=after(n_enc))
    trace.bind(model)
    return pair, trace


# The three kinds of attention of an encoder-decoder, and what a view calls them.
ENCODER, DECODER, CROSS = "encoder", "decoder", "cross"
ATTENTION_KINDS = {ENCODER: "Encoder self-attention", DECODER: "Decoder self-attention (causal)",
                   CROSS: "Cross-attention"}


def attention_view(trace: Trace, kind: str) -> Trace:
    """An encoder-decoder's trace seen as one stack's, under the names every attention and residual view
    reads (blocks.l.attn.pattern, blocks.l.resid_post, embed, ...): ENCODER its encoder's self-attention
    ([S, S] patterns), DECODER its decoder's causal self-attention ([T, T]), CROSS the decoder's
    cross-attention as its attn.* ([T queries, S keys]). The tensors are shared, not copied."""
    from ..core.trace import Trace as _Trace

    if kind not in ATTENTION_KINDS:
        raise ValueError(f"attention kind {kind!r}: one of {', '.join(ATTENTION_KINDS)}")
    prefix = "encoder." if kind == ENCODER else "decoder."
    view = _Trace(trace.patterns, to_cpu=trace.to_cpu, pattern_dtype=trace.pattern_dtype)
    for name, t in trace.items():
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix):]
        if kind == CROSS:
            if ".attn." in rest:
                continue  # the decoder's self-attention: not this view's
            rest = rest.replace(".cross_attn.", ".attn.")
        view.tensors[rest] = t
    if kind != ENCODER and "logits" in trace:
        view.tensors["logits"] = trace["logits"]
    return view


def tokenize_and_trace(loaded: LoadedModel, text: str, ids: list[int] | None,
                       interventions: list | None = None) -> tuple[list[int], Trace | None]:
    """trace_input without the notice (ids, trace)."""
    enc, trace = trace_input(loaded, text, ids, interventions)
    return enc.ids, trace


def image_token_ids(cfg) -> list[int]:
    """A ViT's sequence as positions 0 .. patches: [CLS] then the patches row by row (no vocabulary:
    token_strings names them "[CLS]", "p0", "p1", ...)."""
    return list(range(1 + (cfg.image_size // cfg.patch_size) ** 2))


def trace_image(loaded: LoadedModel, pixels, interventions: list | None = None,
                purpose: str = VIEWS) -> tuple[list[int], Trace]:
    """Trace a ViT on pixel values [C, H, W]: (positions of [CLS] + patches, trace), with the what-if
    edits applied as for a text (a "mean" is over this image's [CLS] and patches)."""
    import torch

    cfg = loaded.config
    ids = image_token_ids(cfg)
    x = torch.as_tensor(pixels, dtype=torch.float32, device=loaded.model.device)[None]
    _, trace = loaded.model.run_with_trace(x, interventions=_resolved(loaded, x, interventions),
                                           **trace_settings(loaded, len(ids), purpose))
    return ids, trace


def analyse_image(loaded: LoadedModel, pixels, interventions: list | None = None) -> dict:
    """One forward pass: class probabilities, every attention pattern [L, H, T, T], mean attention distance;
    with the what-if edits applied as the app's image trace applies them (a "mean" over this image)."""
    import numpy as np
    import torch

    from ..core.vit import attention_distance_of_trace

    x = torch.from_numpy(pixels)[None]
    if interventions:
        from ..core.interventions import resolve

        interventions = resolve(loaded.model, x, [iv.check(loaded.config) for iv in interventions])
    out, trace = loaded.model.run_with_trace(x, names=("blocks.*.attn.pattern",), interventions=interventions or None)
    patterns = np.stack([trace.pattern(l)[0].float().cpu().numpy() for l in range(loaded.config.n_layers)])
    probs = None if out.logits is None else torch.softmax(out.logits[0].float(), -1).cpu().numpy()
    return {"probs": probs, "patterns": patterns, "distance": attention_distance_of_trace(trace, loaded.config)}


def trace_image_or_digit(loaded: LoadedModel, pixels, source: str, interventions: list | None = None):
    """(pixels, what they are, ids, trace) of `pixels`, or of held-out digit #0 when there are none yet."""
    if pixels is None:
        from ..core.training.image_tasks import heldout_digit

        pixels, label, _ = heldout_digit(loaded, 0)
        source = f"held-out digit #0 (true label {label})"
    return (pixels, source, *trace_image(loaded, pixels, interventions))


# -- trace files -------------------------------------------------------------------------------


def file_arrays(trace: Trace, n_layers: int, layers=None) -> dict:
    """The arrays every trace file holds, from a trace of a batch of one input: attn.{l} [H, T, T],
    hidden.{i} (Hugging Face's hidden_states), logits (when the model has them); a mixture of experts'
    blocks.{l}.mlp.router [T, E], blocks.{l}.mlp.experts [T, k], blocks.{l}.mlp.expert_weights [T, k] and
    blocks.{l}.mlp.expert_norms [T, k] under their trace names. `layers`: the blocks the trace recorded (layer_range's forms): their
    attn.{l} and hidden.{l+1}, with hidden.0 (embed)."""
    blocks = layer_range(layers, n_layers)
    arrays = {f"attn.{l}": trace.pattern(l)[0].float().cpu().numpy() for l in blocks}
    if blocks == range(n_layers):
        hidden = dict(enumerate(trace.hidden_states()))
    else:  # the last is after the final norm (as Hugging Face's) only when the last block is in the range
        hidden = {0: trace["embed"], **{l + 1: trace[f"blocks.{l}.resid_post"] for l in blocks}}
        if blocks.stop == n_layers and "final_norm.out" in trace:
            hidden[n_layers] = trace["final_norm.out"]
    for i, h in hidden.items():
        arrays[f"hidden.{i}"] = h[0].float().cpu().numpy()
    if "logits" in trace:
        arrays["logits"] = trace["logits"][0].float().cpu().numpy()
    for l in blocks:
        for name in (n.replace("*", str(l)) for n in ROUTING_NAMES):
            if name in trace:
                t = trace[name][0].cpu()
                arrays[name] = (t if name.endswith(".experts") else t.float()).numpy()
    return arrays


def trace_arrays(loaded: LoadedModel, ids: list[int], interventions=None, layers=None, *,
                 target: str = "", target_ids: list[int] | None = None) -> dict:
    """tokens, attn.{l} [H, T, T], hidden.{i} (Hugging Face's hidden_states), logits [T, vocab];
    of the model with these interventions applied (core/interventions.py), if any; `layers`: only
    these blocks' attn.{l} and hidden.{l+1} (layer_range's forms). An encoder-decoder's (source `ids`,
    target `target` or `target_ids`): pair_file_arrays' keys, with decoder_tokens ([start] + target)."""
    import numpy as np

    enc, trace = trace_input(loaded, "", ids, interventions, purpose=FILE, layers=layers,
                             target=target, target_ids=target_ids)
    tokens = {"tokens": np.asarray(enc.ids, dtype=np.int64)}
    if is_seq2seq(loaded.config):
        return {**tokens, "decoder_tokens": np.asarray(enc.decoder_ids, dtype=np.int64), **pair_file_arrays(trace)}
    return {**tokens, **file_arrays(trace, loaded.config.n_layers, layers)}


def pair_file_arrays(trace: Trace) -> dict:
    """An encoder-decoder's trace file, from a trace of one source and target (Hugging Face's names in
    brackets): encoder_attn.{l} [H, S, S] (encoder_attentions), decoder_attn.{l} [H, T, T]
    (decoder_attentions), cross_attn.{l} [H, T, S] (cross_attentions), encoder_hidden.{i} [S, d] and
    decoder_hidden.{i} [T, d] for i = 0..L (encoder_ / decoder_hidden_states), logits [T, vocab]; T is
    the decoder's input, [start] + the target."""
    arrays = {}
    for kind, key in ((ENCODER, "encoder_attn"), (DECODER, "decoder_attn"), (CROSS, "cross_attn")):
        view = attention_view(trace, kind)
        arrays.update({f"{key}.{l}": view.pattern(l)[0].float().cpu().numpy() for l in range(view.n_layers)})
    for kind, key in ((ENCODER, "encoder_hidden"), (DECODER, "decoder_hidden")):
        hidden = attention_view(trace, kind).hidden_states()
        arrays.update({f"{key}.{i}": h[0].float().cpu().numpy() for i, h in enumerate(hidden)})
    if "logits" in trace:
        arrays["logits"] = trace["logits"][0].float().cpu().numpy()
    return arrays


def image_trace_arrays(loaded: LoadedModel, pixel_values, interventions=None) -> dict:
    """The keys trace_arrays writes, for an image: attn.{l} [H, 1 + P, 1 + P] ([CLS] first, patches
    row by row), hidden.{i}, logits [classes] (with a classifier); pixel_values [C, H, W] in place of
    tokens, and attention_distance [layers, heads] (mean distance in pixels, core/vit.py); of the model
    with these (zero or replace) interventions applied, if any."""
    import numpy as np

    from ..core.vit import attention_distance_of_trace

    _, trace = trace_image(loaded, pixel_values, interventions, purpose=FILE)
    arrays = {"pixel_values": np.asarray(pixel_values, dtype=np.float32), **file_arrays(trace, loaded.config.n_layers)}
    arrays["attention_distance"] = attention_distance_of_trace(trace, loaded.config).astype(np.float32)
    return arrays
