"""The Generate panel's settings as data (no Qt): what a workspace saves of it and brings back.

The settings, not the generation: a workspace reopens the panel with the same prompt and sampling
choices, ready to Step. Read back with core.views.state_from_dict (unknown keys ignored, missing or
ill-typed ones keep their defaults); a strategy this version lacks keeps the panel's current one.
The sliders' units are the ones the panel shows (temperature 1.0, top-p 1.0 = off), not slider ticks.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GenerationViewState:
    prompt: str = ""  # "": the panel fills in the start of the current text when a model opens
    strategy: str = "greedy"  # one of core.generation.STRATEGIES
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    beams: int = 4
    seed: int = 0
    run_n: int = 20  # how many tokens Run N generates
