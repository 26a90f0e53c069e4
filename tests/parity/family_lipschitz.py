"""The Lipschitz lab and model.head_matrices on a folder of one family, against the model's REAL
attention sublayer (its own module with the layer's mask, window and rotary, checked first against
the sublayer output a forward pass records) and against transformers' q/k projections.

check_lipschitz_and_heads returns the measured relative differences between the lab's estimate
and the exact Jacobian norm, per (layer, head or None), so each family's test can assert them (or
mark precisely which feature the lab does not follow yet).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from desktop_app.core import lipschitz as lip
from desktop_app.core.attention import causal_mask
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.model import layer_rotary, layer_window


def real_sublayer(model, layer: int, head: int | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """X [B, n, d] -> model.blocks[layer].attn exactly as the forward pass calls it (window mask,
    the layer's rotary, q/k norms, score scale, then the sandwich norm if any); with `head`, only
    that head's share W_O,h y_h."""
    cfg = model.cfg
    attn = model.blocks[layer].attn
    params = dict(attn.named_parameters())
    if head is not None:
        keep = torch.zeros(cfg.n_heads, cfg.d_head, dtype=attn.o.weight.dtype)
        keep[head] = 1
        params["o.weight"] = attn.o.weight * keep.reshape(1, -1)
        if attn.o.bias is not None:
            params["o.bias"] = torch.zeros_like(attn.o.bias)

    # Gemma 3's sandwich norm belongs to the sublayer: its output, not attn's, is what the residual
    # adds (blocks.{l}.attn.out); one head's share is taken before it (the norm mixes the heads)
    post_norm = model.blocks[layer].post_attn_norm if cfg.sandwich_norms and head is None else None

    def f(X: torch.Tensor) -> torch.Tensor:
        n = X.shape[1]
        mask = causal_mask(n, n, X.device, layer_window(cfg, layer))[None, None]
        rot = layer_rotary(cfg, layer, torch.arange(n, device=X.device))
        with sdpa_kernel(SDPBackend.MATH):
            out = torch.func.functional_call(attn, params, (X, mask, rot))
        return out if post_norm is None else post_norm(out)

    return f


def exact_norm(f, x: torch.Tensor) -> float:
    """||D_x f||_2 from the full Jacobian (torch.autograd.functional.jacobian), x [n, d]."""
    jac = torch.autograd.functional.jacobian(lambda y: f(y[None])[0], x)
    n, d = x.shape
    return torch.linalg.matrix_norm(jac.reshape(-1, n * d), ord=2).item()


def check_lipschitz_and_heads(make_hf, tmp_path: Path, *, bilinear: bool, n: int = 7, layer: int = 1,
                              heads=(0, 3)) -> dict:
    torch.manual_seed(0)
    hf = make_hf().eval()
    hf.save_pretrained(tmp_path / "hf")
    model = load_model_folder(tmp_path / "hf").model.double().eval()
    cfg = model.cfg
    ids = torch.randint(3, cfg.vocab_size, (1, n))
    _, trace = model.run_with_trace(ids, names=(f"blocks.{layer}.attn.*",))
    X = trace[f"blocks.{layer}.attn.input"]

    # the reference function is the sublayer the forward pass runs: what it records as attn.out
    # (the recording path takes its softmax in float32: ~1e-9 apart on this float64 model)
    torch.testing.assert_close(real_sublayer(model, layer)(X), trace[f"blocks.{layer}.attn.out"],
                               atol=1e-7, rtol=1e-6)

    differences = {}
    for head in (None, *heads):
        exact = exact_norm(real_sublayer(model, layer, head), X[0])
        est = lip.spectral_norm(lip.layer_map(model, layer, head=head), X, tol=1e-8)
        differences[(layer, head)] = abs(est.sigma[0].item() - exact) / exact

    # V_h: each head's recorded share is P_h X V_h^T plus W_O,h b_V (the rows of P_h sum to 1)
    pattern, head_out = trace[f"blocks.{layer}.attn.pattern"][0], trace[f"blocks.{layer}.attn.head_out"][0]
    for head in heads:
        hm = model.head_matrices(layer, head)
        want = pattern[head] @ X[0] @ hm.V.double().T
        if hm.b_V is not None:
            want = want + hm.W_O.double() @ hm.b_V.double()
        torch.testing.assert_close(head_out[head], want, atol=1e-7, rtol=1e-6)

    if bilinear:  # A_h against transformers' own projections and score scale (before rotary)
        hf = hf.double()
        hf_attn = hf.model.layers[layer].self_attn
        dh, group = cfg.d_head, cfg.n_heads // cfg.n_kv_heads
        with torch.no_grad():
            q_all, k_all = hf_attn.q_proj(X[0]), hf_attn.k_proj(X[0])
        for head in heads:
            hm = model.head_matrices(layer, head)
            q = q_all[:, head * dh:(head + 1) * dh]
            k = k_all[:, (head // group) * dh:(head // group + 1) * dh]
            scores = hf_attn.scaling * q @ k.T
            x = X[0]
            bilinear_part = x @ hm.A.double().T @ x.T
            bias_part = 0.0
            W_Q, W_K = hm.W_Q.double(), hm.W_K.double()
            if hm.b_Q is not None:
                b_Q, b_K = hm.b_Q.double(), hm.b_K.double()
                bias_part = hf_attn.scaling * ((x @ W_Q.T @ b_K)[:, None] + (b_Q @ W_K @ x.T)[None, :] + b_Q @ b_K)
            # head_matrices are float32 (analysis matrices of any model dtype): ~1e-7 relative
            torch.testing.assert_close(bilinear_part + bias_part, scores, atol=1e-6, rtol=1e-5)
    return differences


def check_preset_opens_in_transformers(family: str, tmp_path: Path, **over) -> None:
    """A model built from the family's preset (as the Train panel builds one), perturbed and saved
    here, opens with transformers' AutoModelForCausalLM under the family's class with the same logits."""
    import transformers

    from desktop_app.core.checkpoints import new_model, save_model_folder
    from desktop_app.core.families import REGISTRY

    cfg = REGISTRY[family].preset(**{**dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                                            context_length=32), **over})
    model = new_model(cfg, seed=0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    save_model_folder(model, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(hf).__name__ == REGISTRY[family].architectures[1]
    ids = torch.randint(0, cfg.vocab_size, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, atol=1e-4, rtol=0)
