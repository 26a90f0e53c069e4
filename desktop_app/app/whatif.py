"""What-if edits built from what the user typed: the What if panel's Steer tab and `generate --steer-*`
make the steering edit here, from the same two texts, layer and scale, with the same checks. Which
models the analyses read (attribution_problem, patching_problem, steering_problem) is said here too:
the panel disables its controls with these lines, `attribute` and `patch` refuse with them.

Ablations: the CLI's --ablate is parsed by core.interventions.parse_ablations, the Attention panel's
menu makes each Intervention directly, and the What if panel's Ablate tab names one with
ablation_choices / ablation (the same spellings as --ablate: "dec.1.2", "cross.0.1", "enc.1.mlp").

Encoder-decoders (T5, BART, Marian): the text is the source, and the decoder reads decoder_input
([start] + the target's tokens, app.tracing's convention); attribute_ids and patch_ids read the decoder's
logits there (core.analysis.seq2seq_logit_attribution, seq2seq_activation_patching: patching runs two
source texts with the same target).
"""
from __future__ import annotations

from .tracing import is_seq2seq  # (re-exported: the What if panel reads it here)


def text_ids(loaded, text: str, what: str) -> list[int]:
    """The token ids of a text typed for `what` (the text through the model's tokenizer, or ids typed
    as '1, 2, 3' without one); ValueError "the {what} text is empty" for an empty or blank text."""
    from ..core.inputs import encode_text_or_ids

    if not text.strip():
        raise ValueError(f"the {what} text is empty")
    return encode_text_or_ids(loaded, text).ids


def steering_edit(loaded, towards: str, away: str, layer: int, scale: float, job=None):
    """(the steer edit (core.interventions.steer) from the two texts as typed, |v|): v is the mean
    residual stream after block `layer` on `towards` minus that on `away`; the edit adds scale x v
    there at every position. `job` (core.jobs) is checked after each block: Cancel lands within one."""
    from ..core.interventions import steer, steering_vector

    refuse(steering_problem(loaded.config))
    plus, minus = text_ids(loaded, towards, "towards"), text_ids(loaded, away, "away from")
    v = steering_vector(loaded.model, plus, minus, layer, job=job)
    return steer(v, layer, scale, towards, away), float(v.norm())


VISION_PROBLEM = ("a vision transformer: attribution, patching and steering work on text models for now; "
                  "ablations from the Attention panel apply to the image's trace")


def attribution_problem(cfg) -> str:
    """Why direct logit attribution cannot read this model ("" when it can), one line."""
    from ..core.interventions import check_additive

    if cfg.input_kind == "patches":
        return VISION_PROBLEM
    if not cfg.lm_head:
        return "this model has no language-model head: direct logit attribution needs one"
    try:
        check_additive(cfg, "direct logit attribution")
    except ValueError as exc:
        return str(exc)
    return ""


def patching_problem(cfg) -> str:
    """Why activation patching cannot run on this model ("" when it can): its measure is a logit of a text."""
    if cfg.input_kind == "patches":
        return VISION_PROBLEM
    if not cfg.lm_head:
        return "this model has no language-model head: activation patching measures a logit, it needs one"
    return ""


def steering_problem(cfg) -> str:
    """Why a steering vector cannot be built from texts for this model ("" when it can)."""
    if getattr(cfg, "is_encoder_decoder", False):
        return "an encoder-decoder: steering works on one-stack models for now; ablate and patch instead"
    return VISION_PROBLEM if cfg.input_kind == "patches" else ""


def refuse(problem: str) -> None:
    """ValueError(problem) when there is one: what a front end does with the lines above before any work."""
    if problem:
        raise ValueError(problem)


# -- encoder-decoders and the analyses' entry points (the What if panel and `attribute` / `patch`) --------


def decoder_input(loaded, target: str = "", target_ids: list[int] | None = None, *, cut: bool = True) -> list[int]:
    """What an encoder-decoder's decoder reads for this target: [start token] + its tokens (app.tracing).
    A target longer than the decoder's context (less its start token) is cut to it, or refused in one
    line when not `cut` (the commands, which refuse a source that long too)."""
    from ..core.inputs import InputError
    from .tracing import encode_target

    tgt = encode_target(loaded, target, target_ids)
    if not cut and tgt.total > len(tgt.ids):
        raise InputError(f"target: {tgt.total} tokens exceed the decoder's context length "
                         f"{loaded.config.context_length} with its start token (at most "
                         f"{loaded.config.context_length - 1})")
    return [loaded.model.start_token()] + list(tgt.ids)


def _decoder_ids(loaded, decoder_ids) -> list[int] | None:
    """decoder_ids checked: given exactly for an encoder-decoder (never empty), None for other models."""
    if not is_seq2seq(loaded):
        if decoder_ids is not None:
            raise ValueError(f"{loaded.name} is not an encoder-decoder: it reads one text, no target")
        return None
    return list(decoder_ids) if decoder_ids else [loaded.model.start_token()]


def top_token(loaded, ids: list[int], position: int, interventions=None, decoder_ids=None) -> int:
    """The (edited) model's most likely next token at `position` (an encoder-decoder's: of its decoder)."""
    import torch

    dec = _decoder_ids(loaded, decoder_ids)
    n = len(dec) if dec is not None else len(ids)
    if not -n <= position < n:
        raise ValueError(f"position {position} is outside the {'decoder input' if dec else 'text'} (0..{n - 1})")
    model, dev = loaded.model, loaded.model.device
    with torch.no_grad():
        if dec is not None:
            logits = model(torch.tensor([ids], device=dev), torch.tensor([dec], device=dev),
                           interventions=interventions).logits
        else:
            logits = model(torch.tensor([ids], device=dev), interventions=interventions).logits
    return int(logits[0, position].argmax())


def attribute_ids(loaded, ids: list[int], position: int, token_id: int | None, interventions=None,
                  decoder_ids=None, job=None):
    """(Attribution, token id): direct logit attribution of `token_id` (None: the edited model's top
    token there) at `position`; an encoder-decoder's over its decoder, reading decoder_ids, with
    cross-attention heads (core.analysis.seq2seq_logit_attribution). `job` (core.jobs): a decoder-only
    model's forward checks it after each block (Cancel lands within one), the others between forwards."""
    from ..core.analysis import seq2seq_logit_attribution
    from ..core.interventions import direct_logit_attribution, resolve

    refuse(attribution_problem(loaded.config))
    if not ids:
        raise ValueError("no text: type a text in the Model panel")
    dec = _decoder_ids(loaded, decoder_ids)
    ivs = [iv.check(loaded.config) for iv in interventions] if interventions else None
    if ivs:  # (an encoder-decoder's means: over each stack's own input)
        ivs = resolve(loaded.model, ids, ivs, decoder_ids=dec)
    token = top_token(loaded, ids, position, ivs, dec) if token_id is None else token_id
    if job is not None:
        job.check()
    if dec is not None:
        return seq2seq_logit_attribution(loaded, ids, dec, position, token, ivs), token
    return direct_logit_attribution(loaded, ids, position, token, ivs, job=job), token


def patch_ids(loaded, clean: list[int], corrupted: list[int], answer_id: int, wrong_id: int | None = None,
              interventions=None, job=None, decoder_ids=None):
    """Activation patching on the edited model; an encoder-decoder's between two source texts, its decoder
    reading decoder_ids in every run (core.analysis.seq2seq_activation_patching)."""
    from ..core.analysis import seq2seq_activation_patching
    from ..core.interventions import activation_patching

    refuse(patching_problem(loaded.config))
    if len(clean) != len(corrupted):
        which = "source texts" if is_seq2seq(loaded) else "texts"
        raise ValueError(f"the clean text is {len(clean)} tokens and the corrupted text {len(corrupted)}: the "
                         f"{which} must have the same length in tokens")
    dec = _decoder_ids(loaded, decoder_ids)
    ivs = list(interventions) or None if interventions else None
    if dec is not None:
        return seq2seq_activation_patching(loaded, clean, corrupted, dec, answer_id, wrong_id, job=job,
                                           interventions=ivs)
    return activation_patching(loaded, clean, corrupted, answer_id, wrong_id, job=job, interventions=ivs)


# -- ablations named from a list (the What if panel's Ablate tab) --------------------------------------

HEAD, LAYER_ATTN, MLP, EXPERT = "head", "attn", "mlp", "expert"


def ablation_choices(cfg) -> list[tuple[str, str, str, int]]:
    """(what the list says, its --ablate prefix, HEAD / LAYER_ATTN / MLP / EXPERT, how many layers) of every kind
    of ablation this model has: an encoder-decoder's heads of the three kinds and each stack's MLPs; a mixture
    of experts' experts (the head box then counts experts)."""
    if getattr(cfg, "is_encoder_decoder", False):
        enc, dec = cfg.n_layers, cfg.n_decoder_layers
        return [("Encoder self-attention head", "enc.", HEAD, enc), ("Decoder self-attention head", "dec.", HEAD, dec),
                ("Cross-attention head", "cross.", HEAD, dec), ("Encoder MLP", "enc.", MLP, enc),
                ("Decoder MLP", "dec.", MLP, dec), ("Encoder attention layer", "enc.", LAYER_ATTN, enc),
                ("Decoder self-attention layer", "dec.", LAYER_ATTN, dec),
                ("Cross-attention layer", "cross.", LAYER_ATTN, dec)]
    return [("Attention head", "", HEAD, cfg.n_layers), ("MLP", "", MLP, cfg.n_layers),
            ("Attention layer", "", LAYER_ATTN, cfg.n_layers)] + (
        [("Expert", "", EXPERT, cfg.n_layers)] if getattr(cfg, "num_experts", 0) else [])


def forced_routing(cfg, layer: int, position: int, experts: str):
    """The token at `position` routed to `experts` ("3,5": experts_per_token distinct ids) in block `layer`
    (core.interventions.force_routing, checked against the model); ValueError in one line otherwise."""
    from ..core.interventions import force_routing

    try:
        chosen = [int(e) for e in experts.replace(" ", ",").split(",") if e]
    except ValueError:
        raise ValueError(f"experts {experts!r}: give {cfg.experts_per_token} expert numbers, e.g. "
                         f"{','.join(map(str, range(cfg.experts_per_token)))}") from None
    return force_routing(layer, [position], chosen).check(cfg)


def ablation(cfg, prefix: str, what: str, layer: int, head: int = 0):
    """The zero ablation a choice of ablation_choices names (core.interventions.parse_ablations' spelling,
    checked against the model)."""
    from ..core.interventions import parse_ablations

    which = {HEAD: f"{head}", EXPERT: f"expert.{head}"}.get(what, what)  # an expert: its number in `head`
    (iv,) = parse_ablations(f"{prefix}{layer}.{which}", cfg)
    return iv
