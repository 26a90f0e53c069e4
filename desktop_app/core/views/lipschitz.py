"""The Lipschitz panel's form as data (no Qt): what a workspace saves of it and brings back.

The form, not the results: a workspace reopens the panel ready to run the same sweep again. Read
back with core.views.state_from_dict (unknown keys ignored, missing or ill-typed ones keep their
defaults); names that no longer exist (an input source, an attention kind) keep the panel's current
choice. The estimator's tolerance and the search's steps have no controls (defaults), so they are
not part of the form.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..lipschitz.sources import MODEL


@dataclass
class LipschitzViewState:
    function: str = MODEL  # lipschitz.MODEL (a model's layer or head) or lipschitz.SYNTHETIC
    # a model's layer
    layer: int = 0
    stack: str = ""  # an encoder-decoder's: "encoder", "decoder" or "cross" (lipschitz.measured.STACKS); "": one stack
    head: int | None = None  # None: the whole attention sublayer
    data: str = "real"  # an input source's name (lipschitz.sources_for(MODEL))
    search_start: str = "random"  # the gradient-ascent search starts from random inputs or real windows
    text_file: str = ""  # real windows come from this file; "": from the current text
    # a synthetic head
    d: int = 16
    norm_A: float = 1.0
    norm_V: float = 1.0
    matrices_file: str = ""  # an .npz with A and V; "": random matrices of the d and norms above
    attention: str = "softmax"  # a key of lipschitz.ATTENTION_KINDS
    synthetic_data: str = "random"  # an input source's name (lipschitz.sources_for(SYNTHETIC))
    seed: int = 0
    # both
    masked: bool = False
    radius: float = 0.0  # 0: auto
    lengths: str = "4,8,16,32,64,128"
    samples: int = 5
