"""AppState's what-if edits: every text trace is the edited model's, and clearing them restores it."""
from __future__ import annotations

import torch

from desktop_app.core.interventions import Intervention
from desktop_app.ui.state import AppState
from tiny_models import tiny_model

TEXT = "the cat sat on a mat"


def _a_trace(trace) -> bool:
    """The trace of the text, not the clearing that announces a new trace (trace_changed(None) comes first)."""
    return trace is not None


def test_text_traces_apply_the_interventions(qtbot):
    state = AppState()
    state.loaded = tiny_model(TEXT, d_model=36, n_heads=3, init_std=0.3)
    tok, model = state.loaded.tokenizer, state.loaded.model
    ids = tok.encode(TEXT)
    plain = model(torch.tensor([ids])).logits[0].detach()
    ablate = [Intervention("blocks.1.attn.head.2"), Intervention("blocks.0.mlp.out", "mean")]
    with qtbot.waitSignal(state.trace_changed, timeout=10_000, check_params_cb=_a_trace):
        state.text = TEXT
        state.set_interventions(ablate)
    from desktop_app.core.interventions import resolve
    with torch.no_grad():
        ref = model(torch.tensor([ids]), interventions=resolve(model, ids, ablate)).logits[0]
    assert torch.allclose(state.trace["logits"][0], ref, atol=1e-5)
    assert not torch.allclose(ref, plain, atol=1e-3)
    with qtbot.waitSignal(state.trace_changed, timeout=10_000, check_params_cb=_a_trace):
        state.set_interventions([])
    assert torch.allclose(state.trace["logits"][0], plain, atol=1e-5)
