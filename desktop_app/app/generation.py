"""What the CLI's `generate` and the Generate panel both decide about a generation, written once.

The generation itself (the history tree, the one beam search, masked filling) is core/generation/;
here: which session a model gets, the model's logits as trained beside the edited ones.
"""
from __future__ import annotations


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
