"""The Dynamics panel's form as data (no Qt): what a workspace saves of it and brings back.

The form, not the run: a restored form is not simulated (Reset builds the particles), so opening a
workspace never starts minutes of work. Read back with core.views.state_from_dict (unknown keys
ignored, missing or ill-typed ones keep their defaults); a name this version lacks (an attention
kind, an initial condition, an integrator) keeps the panel's current choice. Values mirror the
panel's controls: `time_dependent` is the a = 0.5 switch, `twin` the W2 twin run.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DynamicsViewState:
    attention: str = "softmax"  # a key of core.dynamics.ATTENTION_KINDS
    d: int = 3
    n: int = 400
    init: str = "sphere"  # one of core.dynamics.INITS
    covariance: str = "1"  # as typed: one number, d numbers, or d rows separated by ';'
    n_clusters: int = 3
    token_layer: int = 0  # init "tokens": 0 the embeddings, l + 1 after layer l's attention
    qkv: str = "identity"  # one of core.dynamics.QKV_SOURCES
    norm_qk: float = 1.0
    norm_v: float = 1.0
    matrices_file: str = ""  # qkv "file": the .npz
    model_layer: int = 0  # qkv "model": the head's layer and index
    model_head: int = 0
    stack: str = "encoder"  # an encoder-decoder's: "encoder" or "decoder" (core.dynamics.STACKS)
    time_dependent: bool = False
    sphere: bool = True
    renormalise: bool = False
    twin: bool = False
    integrator: str = "euler"  # one of core.dynamics.INTEGRATORS
    dt: float = 0.1
    steps_per_frame: int = 1
    record_every: int = 10  # curves every this many steps
    cluster_tol: float = 0.05
    seed: int = 0
    view_3d: bool = True
    trails: bool = False
