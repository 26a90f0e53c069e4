"""Every TransformerLens hook name the app maps (features.hooks.TL_HOOKS, at every layer) against
TransformerLens' own HookedTransformer on the same weights (test-only reference: transformer_lens,
installed with sae-lens): random GPT-2, LLaMA and GPT-NeoX (parallel block) models saved by transformers
are loaded by the app and converted by TransformerLens' own weight conversions (no fold_ln, no centring:
the same numbers as transformers), and the app's value of each hook equals TransformerLens' cache.

ln*.hook_normalized is the norm's input before its gain and bias (x / scale; centred for a LayerNorm),
distinct from the sublayer's input after them (the app's mlp.input, circuit-tracer's mlp.hook_in)."""
from __future__ import annotations

import pytest
import torch

transformer_lens = pytest.importorskip("transformer_lens")
transformers = pytest.importorskip("transformers")

from transformer_lens import HookedTransformer, HookedTransformerConfig  # noqa: E402

from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.core.features.activations import read_point, record_points  # noqa: E402
from desktop_app.core.features.hooks import TL_HOOKS, hook_point  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
N_LAYERS = 3
IDS = [1, 5, 9, 30, 2, 7, 60, 11, 44, 3]


def _gpt2():
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=48,
                                                              n_layer=N_LAYERS, n_head=4))
    tc = HookedTransformerConfig(n_layers=N_LAYERS, d_model=48, n_ctx=32, d_head=12, n_heads=4, d_mlp=192,
                                 d_vocab=97, act_fn="gelu_new", normalization_type="LN", eps=1e-5,
                                 original_architecture="GPT2LMHeadModel")
    return hf, tc, convert_gpt2_weights


def _llama():
    from transformer_lens.pretrained.weight_conversions.llama import convert_llama_weights
    c = transformers.LlamaConfig(vocab_size=97, hidden_size=48, num_hidden_layers=N_LAYERS, num_attention_heads=4,
                                 num_key_value_heads=2, intermediate_size=80, max_position_embeddings=64)
    tc = HookedTransformerConfig(n_layers=N_LAYERS, d_model=48, n_ctx=64, d_head=12, n_heads=4, d_mlp=80,
                                 d_vocab=97, n_key_value_heads=2, act_fn="silu", gated_mlp=True,
                                 normalization_type="RMS", eps=c.rms_norm_eps, positional_embedding_type="rotary",
                                 rotary_dim=12, rotary_adjacent_pairs=False, final_rms=True,
                                 original_architecture="LlamaForCausalLM")
    return transformers.LlamaForCausalLM(c), tc, convert_llama_weights


def _neox():
    from transformer_lens.pretrained.weight_conversions.neox import convert_neox_weights
    c = transformers.GPTNeoXConfig(vocab_size=97, hidden_size=48, num_hidden_layers=N_LAYERS, num_attention_heads=4,
                                   intermediate_size=80, max_position_embeddings=64, rotary_pct=0.5,
                                   use_parallel_residual=True)
    tc = HookedTransformerConfig(n_layers=N_LAYERS, d_model=48, n_ctx=64, d_head=12, n_heads=4, d_mlp=80,
                                 d_vocab=97, act_fn="gelu", normalization_type="LN", eps=c.layer_norm_eps,
                                 positional_embedding_type="rotary", rotary_dim=6, rotary_adjacent_pairs=False,
                                 parallel_attn_mlp=True, original_architecture="GPTNeoXForCausalLM")
    return transformers.GPTNeoXForCausalLM(c), tc, convert_neox_weights


MODELS = {"gpt2": _gpt2, "llama": _llama, "neox": _neox}


def _random_norms(hf) -> None:
    """Gains and biases away from 1 and 0 (a fresh model's are exactly those, where before and after the
    gain would read alike)."""
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or ".ln_" in name:
                p.copy_((1 + 0.5 * torch.randn_like(p)) if name.endswith("weight") else 0.2 * torch.randn_like(p))


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """name -> (the app's loaded model, TransformerLens' cache of IDS)."""
    out = {}
    for name, make in MODELS.items():
        torch.manual_seed(0)
        hf, tc, convert = make()
        _random_norms(hf.eval())
        folder = tmp_path_factory.mktemp(name)
        hf.save_pretrained(folder, safe_serialization=True)
        tl = HookedTransformer(tc)
        tl.load_and_process_state_dict(convert(hf, tc), fold_ln=False, center_writing_weights=False,
                                       center_unembed=False, fold_value_biases=False)
        tl.eval()
        with torch.no_grad():
            _, cache = tl.run_with_cache(torch.tensor([IDS]))
        out[name] = (load_model_folder(folder), cache)
    return out


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("layer", range(N_LAYERS))
@pytest.mark.parametrize("what", TL_HOOKS)
def test_every_mapped_hook_is_transformer_lens_point(pairs, model, layer, what):
    loaded, cache = pairs[model]
    hook = f"blocks.{layer}.{what}"
    tl_key = hook.replace(".hook_z", ".attn.hook_z") if what == "hook_z" else hook
    if tl_key not in cache:  # TransformerLens has no such point here (hook_resid_mid on a parallel block)
        with pytest.raises(ValueError, match="TransformerLens has no"):
            hook_point(hook, loaded.config)
        return
    point = hook_point(hook, loaded.config)
    got = read_point(record_points(loaded.model, IDS, [point]), point).float()
    want = cache[tl_key][0].float()
    want = want.reshape(want.shape[0], -1)  # hook_z [T, H, d_head] -> [T, H * d_head]
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_normalized_is_before_the_gain_and_mlp_input_after(pairs, model):
    """ln2.hook_normalized (before the gain) and the app's mlp.input (after it, circuit-tracer's
    mlp.hook_in) are different points; the latter is TransformerLens' normalised value times the gain."""
    loaded, cache = pairs[model]
    normalized = hook_point("blocks.1.ln2.hook_normalized", loaded.config)
    mlp_in = hook_point("blocks.1.mlp.input", loaded.config)
    trace = record_points(loaded.model, IDS, [normalized, mlp_in])
    a, b = read_point(trace, normalized), read_point(trace, mlp_in)
    assert not torch.allclose(a, b, atol=1e-3)
    norm2 = loaded.model.blocks[1].norm2
    bias = norm2.bias.detach() if getattr(norm2, "bias", None) is not None else 0
    torch.testing.assert_close(b, cache["blocks.1.ln2.hook_normalized"][0] * norm2.weight.detach() + bias,
                               rtol=1e-5, atol=2e-5)


def test_normalized_hooks_refused_on_post_norm_and_without_a_model():
    from desktop_app.core.config import ModelConfig
    bert = ModelConfig(family="bert", norm_placement="post", n_layers=2, d_model=16, n_heads=2, vocab_size=20,
                       context_length=8)
    with pytest.raises(ValueError, match="post-norm"):
        hook_point("blocks.0.ln2.hook_normalized", bert)
    with pytest.raises(ValueError, match="needs the model"):
        hook_point("blocks.0.ln1.hook_normalized")
