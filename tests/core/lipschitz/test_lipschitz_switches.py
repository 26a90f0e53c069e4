"""The Lipschitz lab under every attention switch of ModelConfig (head_dim, GQA, partial rotary,
rope_scaling, Gemma 3's local rotary base, qk_norm, sliding windows, attn_scale, sandwich norms,
attention_out_bias, parallel residual): the lab's local constant of a layer and of a head equals the
largest singular value of the exact Jacobian of the model's own attention module, called here the
way Transformer.forward and Block call it (never through the lab's formulas)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from desktop_app.core import lipschitz as lip
from desktop_app.core.attention import causal_mask
from desktop_app.core.checkpoints import new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.model import layer_rotary, layer_window

D = 16
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8}

SWITCHES = {
    "partial_rotary": dict(rotary_fraction=0.5),
    "rope_scaling_linear": dict(rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "rope_scaling_llama3": dict(rope_scaling=LLAMA3),
    "qk_norm_head_dim": dict(qk_norm=True, head_dim=6),
    "qk_norm_offset_norm": dict(qk_norm=True, head_dim=6, norm="rmsnorm_offset"),
    "sliding_window": dict(sliding_window=3),
    "attn_scale": dict(attn_scale=0.7),
    "gqa_one_kv_head": dict(n_kv_heads=1),
    "sandwich_norms": dict(sandwich_norms=True),
    "out_bias_only": dict(attention_bias=False, attention_out_bias=True),
    "parallel_residual_partial_rotary": dict(parallel_residual=True, rotary_fraction=0.5, head_dim=8, norm="layernorm",
                                             attention_bias=True),
    # Gemma 3: every quirk at once; layer 0 slides (local rotary base, no scaling), layer 1 is full
    "gemma3_like": dict(norm="rmsnorm_offset", qk_norm=True, sandwich_norms=True, head_dim=6, attn_scale=0.45,
                        sliding_window=3, layer_types=["sliding_attention", "full_attention"], rope_theta=1000.0,
                        rope_local_theta=50.0, rope_scaling={"rope_type": "linear", "factor": 2.0}),
}


def _model(**switches):
    base = dict(vocab_size=23, d_model=D, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=32, context_length=64,
                init_std=0.4)
    model = new_model(ModelConfig.llama(**{**base, **switches}), seed=5).eval().double()
    # every norm weight and bias off its initial value (ones / zeros would hide a missing norm)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model


def sublayer(model, layer: int, head: int | None = None, masked: bool | None = None):
    """The attention sublayer of the model, called as Transformer.forward and Block.forward call it:
    the layer's causal mask (with its window) and rotary, block.attn, then the post-attention norm
    with sandwich_norms (what Block adds to the residual stream). One head: the module with the other
    heads' output columns and the output bias zeroed (its share W_O,h y_h, before the shared norm).
    masked: the causal mask or not (default: the config's causal, as the model)."""
    cfg = model.cfg
    masked = cfg.causal if masked is None else masked
    block = model.blocks[layer]
    attn = block.attn
    if head is not None:
        attn = copy.deepcopy(attn)
        with torch.no_grad():
            keep = torch.zeros(cfg.n_heads * cfg.d_head, dtype=torch.bool)
            keep[head * cfg.d_head:(head + 1) * cfg.d_head] = True
            attn.o.weight[:, ~keep] = 0.0
            if attn.o.bias is not None:
                attn.o.bias.zero_()

    def f(X: torch.Tensor) -> torch.Tensor:
        n = X.shape[1]
        window = layer_window(cfg, layer)
        mask = causal_mask(n, n, X.device, window)[None, None] if masked else None
        with sdpa_kernel(SDPBackend.MATH):  # the fused CPU kernel has no forward-mode derivative
            out = attn(X, mask, layer_rotary(cfg, layer, torch.arange(n)))
        if head is None and cfg.sandwich_norms:
            out = block.post_attn_norm(out)
        return out

    return f


def exact_norm(f, X: torch.Tensor) -> torch.Tensor:
    """[B] largest singular value of the full Jacobian of f at each X[b] (torch.autograd.functional)."""
    out = []
    for x in X:
        jac = torch.autograd.functional.jacobian(lambda y: f(y[None])[0], x)
        out.append(torch.linalg.matrix_norm(jac.reshape(x.numel(), x.numel()), ord=2))
    return torch.stack(out)


def _rel(a, b):
    return ((a - b).abs() / b.abs()).max().item()


def test_the_reference_is_what_the_model_runs():
    """The test's reference reproduces the trace of a real forward pass (layer and head outputs)."""
    model = _model(**SWITCHES["gemma3_like"])
    ids = torch.tensor([[1, 4, 9, 2, 2, 7, 11, 3]])
    _, trace = model.run_with_trace(ids, names=("blocks.*.attn.*",))
    for layer in range(2):
        X = trace[f"blocks.{layer}.attn.input"]
        torch.testing.assert_close(sublayer(model, layer)(X), trace[f"blocks.{layer}.attn.out"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lip.layer_map(model, layer)(X), trace[f"blocks.{layer}.attn.out"],
                                   rtol=1e-5, atol=1e-6)
        for h in (0, 3):
            head_out = trace[f"blocks.{layer}.attn.head_out"][:, h]
            torch.testing.assert_close(sublayer(model, layer, h)(X), head_out, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(lip.layer_map(model, layer, head=h)(X), head_out, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_layer_and_head_constants_match_the_module_jacobian(switch):
    model = _model(**SWITCHES[switch])
    n = 7  # longer than the window (3): keys really are masked out
    X = 1.5 * torch.randn(2, n, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for layer in range(2):
        fmap = lip.layer_map(model, layer)
        torch.testing.assert_close(fmap(X), sublayer(model, layer)(X), rtol=1e-5, atol=1e-6)
        est = lip.spectral_norm(fmap, X, tol=1e-5)
        assert bool(est.converged.all())
        assert _rel(est.sigma, exact_norm(sublayer(model, layer), X)) <= 1e-4, (switch, layer)
        for h in (0, 3):
            head = lip.layer_map(model, layer, head=h)
            est = lip.spectral_norm(head, X, tol=1e-5)
            assert _rel(est.sigma, exact_norm(sublayer(model, layer, h), X)) <= 1e-4, (switch, layer, h)


def test_sliding_window_masks_keys_outside_it():
    """With the window the constant differs from the full causal layer's (the window is applied)."""
    model = _model(sliding_window=3)
    X = torch.randn(1, 8, D, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    fmap = lip.layer_map(model, 0)
    assert fmap.window == 3
    full = copy.copy(fmap)
    full.window = None
    assert float(lip.spectral_norm(fmap, X).sigma[0]) != pytest.approx(float(lip.spectral_norm(full, X).sigma[0]),
                                                                       rel=1e-3)


# (layer 0's whole map, layer 1's head 0): is a norm inside the map (q/k norm; the sandwich's post-attention
# norm wraps the whole layer's output, not one head's)? Every map here rotates (llama), so none has the theorem.
NORM_INSIDE = {"qk_norm_head_dim": (True, True), "sandwich_norms": (True, False), "gemma3_like": (True, True)}


@pytest.mark.parametrize("switch", list(NORM_INSIDE))
def test_nonbilinear_maps_use_autograd_and_have_no_theorem_bounds(switch):
    model = _model(**SWITCHES[switch])
    X = torch.randn(1, 5, D, dtype=torch.float64)
    maps = (lip.layer_map(model, 0, masked=False), lip.layer_map(model, 1, head=0, masked=False))
    for fmap, norm_inside in zip(maps, NORM_INSIDE[switch]):
        assert (fmap.q_norm is not None or fmap.out_norm is not None) == norm_inside
        assert isinstance(lip.linearize(fmap, X), lip._AutogradLinearization) == norm_inside
        assert fmap.has_rotary and not fmap.theorem_applies()
        up, lo = lip.map_bounds(fmap, [4, 8], [1.0, 1.0])
        assert np.isnan(up).all() and np.isnan(lo).all()


def test_partial_rotary_and_scale_keep_the_closed_form_exact():
    model = _model(rotary_fraction=0.5, attn_scale=0.3)
    fmap = lip.layer_map(model, 1)
    X = torch.randn(2, 6, D, dtype=torch.float64)
    lin = lip.linearize(fmap, X)
    assert isinstance(lin, lip._SoftmaxLinearization)
    ref = sublayer(model, 1)
    dX, G = torch.randn_like(X), torch.randn_like(X)
    jv, vj = torch.func.jvp(ref, (X,), (dX,))[1], torch.func.vjp(ref, X)[1](G)[0]
    torch.testing.assert_close(lin.jvp(dX), jv, rtol=1e-5, atol=1e-5 * jv.abs().max().item())
    torch.testing.assert_close(lin.vjp(G), vj, rtol=1e-5, atol=1e-5 * vj.abs().max().item())


def test_theorem_bounds_use_the_configured_score_scale():
    """attn_scale without rotary: A_h is model.head_matrices' A (scaled by attn_scale), and the upper
    bound covers the exact constant of the module's head at inputs in the ball."""
    model = _model(positions="none", attention_bias=False, attn_scale=0.9, head_dim=6)
    for h in (0, 3):
        fmap = lip.layer_map(model, 0, head=h, masked=False)
        assert fmap.theorem_applies()
        torch.testing.assert_close(fmap.A[0].float(), model.head_matrices(0, h).A, rtol=1e-5, atol=1e-6)
        X = lip.ball_inputs(2, 6, D, 2.0, seed=h)
        radius = torch.linalg.vector_norm(X, dim=-1).amax(-1).numpy()
        exact = exact_norm(sublayer(model, 0, h, masked=False), X).numpy()
        up, _ = lip.map_bounds(fmap, 6, radius)
        assert (exact <= up).all()
        assert _rel(lip.spectral_norm(fmap, X).sigma, torch.as_tensor(exact)) <= 1e-4

