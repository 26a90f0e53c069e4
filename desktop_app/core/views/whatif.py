"""The What if panel's inputs as data (no Qt): what a workspace saves of it and brings back.

The inputs, not the results: a workspace reopens the panel with the same position, token, texts and
tab, ready to Attribute, Run or Apply again. Read back with core.views.state_from_dict (unknown keys
ignored, missing or ill-typed ones keep their defaults).
"""
from __future__ import annotations

from dataclasses import dataclass

TABS = ("attribution", "patching", "steer", "ablate")  # the panel's tabs, in order: direct logit attribution,
# activation patching, steering, ablation (of a head of any kind, a layer's attention or an MLP)


@dataclass
class WhatIfViewState:
    tab: str = "attribution"  # one of TABS
    # direct logit attribution
    position: int | None = None  # None: the text's last position
    token: str = ""  # "": the model's top next token; else a token or #id as typed
    # activation patching
    clean: str = ""  # "": the panel starts from the current text when a model opens
    corrupted: str = ""
    answer: str = ""
    wrong: str = ""
    # steering: scale x (mean residual of `towards` - mean residual of `away`) added after a layer
    steer_towards: str = ""
    steer_away: str = ""
    steer_layer: int | None = None  # None: the model's middle layer
    steer_scale: float = 4.0
