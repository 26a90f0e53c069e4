"""GPT-NeoX (Pythia) against transformers: parity, config refusals, and the Lipschitz panel's layer."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from family_cases.gpt_neox import neox  # noqa: E402
from family_parity import check_family  # noqa: E402

from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.core.families import ModelLoadError  # noqa: E402
from desktop_app.core.families.gpt_neox import FAMILY  # noqa: E402


@pytest.mark.parametrize("rotary_pct, parallel", [(0.25, False), (1.0, True), (1.0, False)])  # (0.25, True): family_cases
def test_gpt_neox_parity(tmp_path, rotary_pct, parallel):
    loaded = check_family(neox(rotary_pct, parallel), tmp_path)
    assert loaded.config.rotary_fraction == rotary_pct and loaded.config.parallel_residual == parallel
    assert loaded.config.family == "gpt_neox" and not loaded.config.tie_embeddings


def test_gpt_neox_tied_without_attention_bias_and_linear_rope_scaling(tmp_path):
    loaded = check_family(neox(0.5, True, tied=True, bias=False, scaling={"rope_type": "linear", "factor": 2.0}),
                          tmp_path, seq_len=20)
    assert loaded.config.tie_embeddings and not loaded.config.attention_bias
    assert loaded.config.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_unembedding_is_written_as_embed_out_and_read_under_either_name(tmp_path):
    """Pythia folders and transformers 5 both write `embed_out`; a folder saying `lm_head` opens too."""
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    hf = neox(0.25, True)().eval()
    hf.save_pretrained(tmp_path / "hf")
    names = set(load_file(tmp_path / "hf" / "model.safetensors"))
    assert "embed_out.weight" in names and "lm_head.weight" not in names
    sd = load_file(tmp_path / "hf" / "model.safetensors")
    sd["lm_head.weight"] = sd.pop("embed_out.weight")
    save_file(sd, tmp_path / "hf" / "model.safetensors")
    loaded = load_model_folder(tmp_path / "hf")
    torch.testing.assert_close(loaded.model.lm_head.weight, hf.lm_head.weight)  # transformers 5 calls it lm_head


def pythia_style_config(**kw) -> dict:
    """A config.json as the Pythia checkpoints ship it (transformers 4 field names)."""
    d = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "vocab_size": 97, "hidden_size": 32,
         "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "hidden_act": "gelu",
         "max_position_embeddings": 64, "rotary_pct": 0.25, "rotary_emb_base": 10000, "rope_scaling": None,
         "use_parallel_residual": True, "layer_norm_eps": 1e-5, "tie_word_embeddings": False,
         "bos_token_id": 0, "eos_token_id": 0, "torch_dtype": "float16"}
    return {**d, **kw}


def test_pythia_config_fields():
    cfg = FAMILY.config_from_hf(pythia_style_config(), "pythia/config.json")
    assert (cfg.rotary_fraction, cfg.rope_theta, cfg.parallel_residual, cfg.activation, cfg.dtype) == (
        0.25, 10000.0, True, "gelu", "float16")


@pytest.mark.parametrize("fields, message", [
    ({"hidden_act": "silu"}, "hidden_act 'silu'"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling type 'dynamic' is not supported"),
    ({"hidden_size": 30}, "hidden_size 30 is not a multiple of num_attention_heads 4"),
])
def test_unsupported_fields_are_refused_by_name(tmp_path, fields, message):
    (tmp_path / "config.json").write_text(json.dumps(pythia_style_config(**fields)))
    with pytest.raises(ModelLoadError, match=message) as info:
        load_model_folder(tmp_path)
    assert "config.json" in str(info.value) and "\n" not in str(info.value)


# -- the Lipschitz panel on a loaded folder ---------------------------------------------------
# Shared with test_family_gpt_neo.py and test_family_opt.py (imported from here).

LIPSCHITZ_RTOL = 1e-4


def real_attention(model, layer: int, head: int | None = None):
    """X [1, n, d] -> model.blocks[layer].attn as the model's forward pass calls it (its causal mask
    with this layer's window, this layer's rotary), or one head's share W_O,h P_h v_h of it.
    Built from the model's own module and helpers, not from core.lipschitz: the reference."""
    import copy

    from desktop_app.core.attention import causal_mask
    from desktop_app.core.model import layer_rotary, layer_window

    cfg = model.cfg
    attn = model.blocks[layer].attn
    if head is not None:  # the same module with every other head's output columns and the bias zeroed
        attn = copy.deepcopy(attn)
        with torch.no_grad():
            keep = torch.zeros_like(attn.o.weight)
            keep[:, head * cfg.d_head:(head + 1) * cfg.d_head] = 1.0
            attn.o.weight.mul_(keep)
            if attn.o.bias is not None:
                attn.o.bias.zero_()

    def f(X: torch.Tensor) -> torch.Tensor:
        n = X.shape[1]
        mask = causal_mask(n, n, X.device, layer_window(cfg, layer))[None, None]
        rotary = layer_rotary(cfg, layer, torch.arange(n, device=X.device))
        if rotary is not None:
            rotary = tuple(t.to(X.dtype) for t in rotary)
        return attn(X, mask, rotary)

    return f


def exact_norm(f, X: torch.Tensor) -> float:
    """Largest singular value of the full Jacobian of f at X [1, n, d] (torch.autograd.functional)."""
    jac = torch.autograd.functional.jacobian(lambda x: f(x[None])[0], X[0])
    n, d = X.shape[1:]
    return torch.linalg.matrix_norm(jac.reshape(-1, n * d), ord=2).item()


def check_lipschitz(folder, ids: list[int], layer: int, head: int) -> None:
    """Open the folder as the app does, take the layer's real input on `ids` from a trace, and compare
    core.lipschitz's local constant of the layer and of one head with the exact Jacobian of the
    real layer / head; the reference itself is checked against the model's trace first."""
    from desktop_app.core import lipschitz as lip

    model = load_model_folder(folder).model.double().eval()
    _, trace = model.run_with_trace(torch.tensor([ids]), names=(f"blocks.{layer}.attn.*",))
    X = trace[f"blocks.{layer}.attn.input"]
    layer_fn, head_fn = real_attention(model, layer), real_attention(model, layer, head)
    with torch.no_grad():  # the reference is the layer the model ran (apply_rotary rounds through float32)
        torch.testing.assert_close(layer_fn(X), trace[f"blocks.{layer}.attn.out"], rtol=1e-6, atol=1e-8)
        torch.testing.assert_close(head_fn(X), trace[f"blocks.{layer}.attn.head_out"][:, head], rtol=1e-6,
                                   atol=1e-8)
    for what, fmap, reference in (("layer", lip.layer_map(model, layer), layer_fn),
                                  ("head", lip.layer_map(model, layer, head=head).to(torch.float64), head_fn)):
        estimate = lip.spectral_norm(fmap, X, tol=1e-6).sigma.item()
        exact = exact_norm(reference, X)
        assert abs(estimate - exact) <= LIPSCHITZ_RTOL * exact, (
            f"{model.cfg.family} layer {layer} {what}: core.lipschitz {estimate:.6g}, exact Jacobian of the real "
            f"{what} {exact:.6g} (relative difference {abs(estimate - exact) / exact:.2e})")


def test_lipschitz_of_a_gpt_neox_layer_and_head(tmp_path):
    torch.manual_seed(0)
    hf = neox(0.25, True)()
    hf.save_pretrained(tmp_path / "hf")
    check_lipschitz(tmp_path / "hf", list(range(5, 15)), layer=1, head=2)
