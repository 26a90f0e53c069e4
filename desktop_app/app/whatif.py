"""What-if edits built from what the user typed: the What if panel's Steer tab and `generate --steer-*`
make the steering edit here, from the same two texts, layer and scale, with the same checks. Which
models the analyses read (attribution_problem, patching_problem, steering_problem) is said here too:
the panel disables its controls with these lines, `attribute` and `patch` refuse with them.

(Ablations need no building here: the CLI's --ablate is parsed by core.interventions.parse_ablations,
and the Attention panel's menu makes each Intervention directly.)
"""
from __future__ import annotations


def text_ids(loaded, text: str, what: str) -> list[int]:
    """The token ids of a text typed for `what` (the text through the model's tokenizer, or ids typed
    as '1, 2, 3' without one); ValueError "the {what} text is empty" for an empty or blank text."""
    from ..core.inputs import encode_text_or_ids

    if not text.strip():
        raise ValueError(f"the {what} text is empty")
    return encode_text_or_ids(loaded, text).ids


def steering_edit(loaded, towards: str, away: str, layer: int, scale: float):
    """(the steer edit (core.interventions.steer) from the two texts as typed, |v|): v is the mean
    residual stream after block `layer` on `towards` minus that on `away`; the edit adds scale x v
    there at every position."""
    from ..core.interventions import steer, steering_vector

    refuse(steering_problem(loaded.config))
    plus, minus = text_ids(loaded, towards, "towards"), text_ids(loaded, away, "away from")
    v = steering_vector(loaded.model, plus, minus, layer)
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
    return VISION_PROBLEM if cfg.input_kind == "patches" else ""


def refuse(problem: str) -> None:
    """ValueError(problem) when there is one: what a front end does with the lines above before any work."""
    if problem:
        raise ValueError(problem)
