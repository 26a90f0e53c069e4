"""What-if edits built from what the user typed: the What if panel's Steer tab and `generate --steer-*`
make the steering edit here, from the same two texts, layer and scale, with the same checks.

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

    plus, minus = text_ids(loaded, towards, "towards"), text_ids(loaded, away, "away from")
    v = steering_vector(loaded.model, plus, minus, layer)
    return steer(v, layer, scale, towards, away), float(v.norm())
