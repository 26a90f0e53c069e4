"""The Image panel's choices as data (no Qt): what a workspace saves of it and brings back.

Which held-out digit, which layer's heads, which query (a patch or [CLS]) and which tab; the panel
recomputes what they show once its ViT is open. An image opened from a file is not saved (the
workspace names no image files). Read back with core.views.state_from_dict (unknown keys ignored,
missing or ill-typed ones keep their defaults); a layer or patch beyond the open model is clamped
or dropped by the panel.
"""
from __future__ import annotations

from dataclasses import dataclass

TABS = ("heads", "filters", "position_similarity", "attention_distance")  # the panel's tabs, in order


@dataclass
class ImageViewState:
    digit: int = 0  # index of a held-out digit of the digits task
    layer: int = 0
    patch: int | None = None  # the query patch, row by row; None: [CLS]
    tab: str = "heads"  # one of TABS
