"""What the CLI's `generate` and the Generate panel both decide about a generation, written once.

The generation itself (the history tree, the one beam search, masked filling) is core/generation/;
here: the settings from the options both front ends show (the beam search's length penalty and early
stopping among them), whether a model can generate at all, which positions an encoder fills, whether the
history tree fits in memory, and the model's logits as trained beside the edited ones.
"""
from __future__ import annotations

from ..core.numbers import GENERATION

# Beam search's length penalty (transformers' length_penalty), its range declared with the generation's numbers
LENGTH_PENALTY = GENERATION["length_penalty"]
# Beam search's early stopping as `generate --early-stopping` and the panel name it -> transformers' modes
# (core/generation/search.py): stop once `beams` hypotheses have finished (true), once the best running one
# cannot beat them at its length (false), or at the longest it may become (never).
EARLY_STOPPING = {"false": False, "true": True, "never": "never"}


def generation_settings(strategy: str, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, beams: int = 4,
                        length_penalty: float = 1.0, early_stopping: str = "false"):
    """The GenerationSettings of the options as the CLI and the panel take them (early_stopping as a word of
    EARLY_STOPPING); refused in one line (GenerationError) when out of range."""
    from ..core.generation import GenerationError, GenerationSettings

    if (problem := LENGTH_PENALTY.problem(length_penalty)):
        raise GenerationError(f"the length penalty {problem}")
    if early_stopping not in EARLY_STOPPING:
        raise GenerationError(f"early stopping must be one of {', '.join(EARLY_STOPPING)}, got {early_stopping!r}")
    return GenerationSettings(strategy, temperature, top_k, top_p, beams, length_penalty=float(length_penalty),
                              early_stopping=EARLY_STOPPING[early_stopping])


def why_cannot_generate(loaded) -> str | None:
    """Why this model cannot generate at all (one sentence), or None: a vision transformer, a model without a
    language-model head, an encoder without a [MASK] token to fill."""
    enc = not loaded.config.causal
    if loaded.config.input_kind == "patches":
        return ("this is a vision transformer: it classifies images and does not generate text. Its "
                "prediction, attention on the image and figures are in the Image panel.")
    if not loaded.config.lm_head:
        return ("this encoder has no masked-language-model head, so it cannot predict tokens: Generate "
                "needs a model with an MLM head (Attention and Layers still work)." if enc else
                "this model has no language-model head, so it cannot predict tokens: Generate needs a "
                "model with one (Attention and Layers still work).")
    if enc and loaded.tokenizer is None:
        return ("this encoder has no tokenizer (its text box takes token ids), so it has no [MASK] token "
                "to fill: Generate needs a tokenizer.json with a [MASK] token.")
    if enc and loaded.tokenizer.mask_token_id is None:
        return "this encoder's tokenizer has no [MASK] token, so there is nothing to fill."
    return None


def mask_positions(loaded, ids: list[int], extra=()) -> list[int]:
    """The positions an encoder fills: every [MASK] token of `ids`, and the positions inside the text that the
    user masked besides (the panel's Mask button)."""
    mask_id = loaded.tokenizer.mask_token_id
    return sorted({i for i, t in enumerate(ids) if t == mask_id} | {q for q in extra if q < len(ids)})


def generation_bytes(cfg, dtype, prompt_length: int, max_new: int, beams: int, record: bool = False,
                     source_length: int = 0) -> dict[str, int]:
    """The bytes a generation's history tree holds at its end, by part, all in the model's `dtype` (as the nodes
    keep them until read: a bfloat16 generation holds half a float32 one's): "logits", every node's next-token
    logits [V] (the prompt's too); "records" (record: what each forward recorded, core/generation RECORD_NAMES:
    the embedding, five residual-width vectors a layer and the final norm's (where the model has one) a token,
    and each layer's attention row [H, T] of a step, the prompt's [H, P, P]); "kv cache", the keys and values of
    the longest path, a row a beam. Beam search adds up to `beams` nodes a step (fewer while vocabulary^step is
    smaller). An encoder-decoder (`source_length` S: its source's tokens; `prompt_length` its decoder's start):
    each token's cross-attention rows [H, S] a layer among its records, each beam row's cross-attention keys and
    values [S] a layer in the cache, and "encoder records", what the session keeps of the source's one encoder
    pass when it records (encoder_record_values, float32)."""
    V, P, b = cfg.vocab_size, prompt_length, dtype.itemsize
    new = max(0, min(P + max_new, cfg.context_length) - P)
    widths, width = [], 1  # the nodes each step adds
    for _ in range(new):
        width = min(beams, width * V)
        widths.append(width)
    seq2seq = bool(cfg.is_encoder_decoder)
    S = source_length if seq2seq else 0
    layers = (cfg.n_decoder_layers or cfg.n_layers) if seq2seq else cfg.n_layers
    held = {"logits": b * V * (1 + sum(widths)),
            "kv cache": b * max(widths, default=1) * (P + new + S) * layers * 2 * cfg.n_kv_heads * cfg.d_head,
            "records": 0, "encoder records": 0}
    if record:
        # a token's residual-width records. (A block without a norm before its attention, post-norm or output
        # norms, records the residual it reads as its attention input: a one-row step's two records are then one
        # tensor, held once; counted twice here, an upper bound)
        vectors = (5 * layers + 1 + bool(cfg.final_norm)) * cfg.d_model
        rows = layers * cfg.n_heads  # a token's attention rows, one a head and layer, over the keys before it
        held["records"] = b * (P * vectors + rows * P * P + sum(w * (vectors + rows * (P + i + 1))
                                                                 for i, w in enumerate(widths)))
        if seq2seq:
            held["records"] += b * rows * S * (P + sum(widths))  # cross-attention rows [H, S] a token and layer
            held["encoder records"] = 4 * encoder_record_values(cfg, S)
    return held


def encoder_record_values(cfg, source_length: int) -> int:
    """The values an encoder-decoder's session keeps of its source's encoder pass (Trace("encoder.*"): the
    embedding; a layer's attention input, output, residual after attention, MLP input and output and residual
    after the layer [S, d], its q and z [H, S, d_head], pattern [H, S, S] and per-head outputs [H, S, d]; the final
    norm's output where the model has one)."""
    S, d, H = source_length, cfg.d_model, cfg.n_heads
    layer = 6 * S * d + 2 * H * S * cfg.d_head + H * S * S + H * S * d
    return S * d * (1 + bool(cfg.final_norm)) + cfg.n_layers * layer


def check_generation_memory(loaded, prompt_length: int, max_new: int, beams: int, what: str,
                            record: bool = False, source_length: int = 0) -> None:
    """Refuse, before the first token, a generation whose history tree cannot fit (generation_bytes, in the
    model's dtype; record: a session that records, as the Generate panel's, not generate()'s, the CLI's;
    source_length: an encoder-decoder's source tokens). `what` names the setting to lower (a command-line
    option, a panel's control). Counted too: the weights' copies the session's start makes for one-token steps
    where they are not made yet (core.model.decoding_copy_bytes: float32 on the CPU, in huge pages where they fit;
    half precision's prepacked copy where it fits, unless `beams` > 1: beam steps never read it, so a beam
    session does not make it, GenerationSession._pack_for by its search_width)."""
    from ..core.devices import check_memory
    from ..core.model import decoding_copy_bytes

    held = generation_bytes(loaded.config, loaded.model.dtype, prompt_length, max_new, beams, record, source_length)
    # (an encoder fills masks: no steps)
    copy = decoding_copy_bytes(loaded.model, prepack=beams == 1) if loaded.config.causal else 0
    purpose = ("for the generated tokens' distributions, records and KV cache" if record
               else "for the generated tokens' distributions and KV cache")
    check_memory(float(sum(held.values()) + copy), what,
                 purpose + (", and the weights laid out for one-token steps" if copy else ""), loaded.model.device)


def check_start_memory(loaded, ids: list[int], what: str, settings) -> None:
    """check_generation_memory for the start of a session that records (the Generate panel's, before its job): the
    prompt's forward and the weights' copies for one-token steps that a decoder's session with these `settings`
    makes as it starts (a beam search's: no prepacked copy; `ids`: an encoder-decoder's source). An encoder's
    masked fill is not checked."""
    from ..core.generation import GenerationSession

    if not loaded.config.causal:
        return
    seq2seq = bool(getattr(loaded.config, "is_encoder_decoder", False))
    check_generation_memory(loaded, 1 if seq2seq else len(ids), 0, GenerationSession.search_width(settings), what,
                            record=True, source_length=len(ids) if seq2seq else 0)


def check_session_memory(loaded, session, n: int, what: str) -> None:
    """check_generation_memory for `n` more tokens of a session (the Generate panel's Run N, before its job
    starts): from the tokens it has, its beams, whether it records, an encoder-decoder's source. A masked fill
    (no history tree) is not checked."""
    from ..core.generation import GenerationSession

    if not isinstance(session, GenerationSession):
        return
    source = len(session.source) if session.source is not None else 0
    check_generation_memory(loaded, len(session.ids()), n, session.search_width(session.settings), what,
                            record=session.record, source_length=source)


def plain_logits_at(loaded, ids: list[int], position: int, source: list[int] | None = None):
    """The unedited model's logits [V] (float32, CPU) at `position` of `ids` (-1: the next token); an
    encoder-decoder's `ids` are its target, read with `source`."""
    import torch

    dev = loaded.model.device
    with torch.no_grad():
        if source is not None:
            out = loaded.model(torch.tensor([source], device=dev), torch.tensor([ids], device=dev))
        else:
            out = loaded.model(torch.tensor([ids], device=dev))
    return out.logits[0, position].float().cpu()
