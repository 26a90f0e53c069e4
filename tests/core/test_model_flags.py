"""Each ModelConfig switch against the transformers module of a family that needs it.

A tiny random transformers model is built, its weights are copied by name into our Transformer
(a small mapping per family, here in the test; the app's own family mapping lives elsewhere),
and the logits and every attention pattern must agree on float32. transformers is the reference:
nobody here wrote it.
"""
from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from desktop_app.core.config import ConfigError, ModelConfig  # noqa: E402
from desktop_app.core.generation import GenerationSession, GenerationSettings  # noqa: E402
from desktop_app.core.model import KVCache, Transformer  # noqa: E402

VOCAB, T = 61, 11


def randomize(hf_model: torch.nn.Module, seed: int = 0) -> None:
    """Every parameter off its default (norms at 1 or 0, zero biases would hide mistakes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)


def decoder_cfg(**kw) -> ModelConfig:
    """A LLaMA-like decoder written out field by field (not through a family preset)."""
    base = dict(family="llama", vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=64,
                norm="rmsnorm", norm_placement="pre", activation="swiglu", positions="rotary", causal=True,
                attention_bias=False, mlp_bias=False, final_norm=True, tie_embeddings=False, norm_eps=1e-6)
    return ModelConfig(**{**base, **kw})


def load(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> Transformer:
    model = Transformer(cfg).eval()
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if cfg.tie_embeddings else set()
    assert set(missing) <= tied and not unexpected, (missing, unexpected)
    return model


def llama_style_weights(sd: dict[str, torch.Tensor], n_layers: int, prefix: str = "model.") -> dict:
    """HF LlamaForCausalLM-style names (Qwen2, Qwen3, Mistral, Gemma 3) -> ours."""
    w = {"tok_embed.weight": sd[prefix + "embed_tokens.weight"], "final_norm.weight": sd[prefix + "norm.weight"]}
    if "lm_head.weight" in sd:
        w["lm_head.weight"] = sd["lm_head.weight"]
    names = {"attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj", "attn.v": "self_attn.v_proj",
             "attn.o": "self_attn.o_proj", "attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm",
             "mlp.gate": "mlp.gate_proj", "mlp.up": "mlp.up_proj", "mlp.down": "mlp.down_proj",
             "norm1": "input_layernorm", "norm2": "post_attention_layernorm"}
    for l in range(n_layers):
        for ours, theirs in names.items():
            for kind in ("weight", "bias"):
                key = f"{prefix}layers.{l}.{theirs}.{kind}"
                if key in sd:
                    w[f"blocks.{l}.{ours}.{kind}"] = sd[key]
    return w


def compare(hf_model, model: Transformer, ids: torch.Tensor, logits_tol: float = 1e-4, pattern_tol: float = 1e-5,
            **hf_kw) -> None:
    with torch.no_grad():
        ref = hf_model(ids, output_attentions=True, **hf_kw)
    out, trace = model.run_with_trace(ids, names=("blocks.*.attn.pattern", "logits"))
    torch.testing.assert_close(out.logits, ref.logits, atol=logits_tol, rtol=0)
    assert len(ref.attentions) == model.cfg.n_layers
    for l, p in enumerate(ref.attentions):
        torch.testing.assert_close(trace[f"blocks.{l}.attn.pattern"], p, atol=pattern_tol, rtol=0)
    # the fused path (no recording) gives the same logits
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref.logits, atol=logits_tol, rtol=0)


def ids_of(n: int = T, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


# -- GPT-NeoX / Pythia: parallel residual, partial rotary, fused per-head qkv ------------------


@pytest.mark.parametrize("parallel", [True, False])
def test_gpt_neox_parallel_residual_and_partial_rotary(parallel):
    hf_cfg = transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, rotary_pct=0.5, use_parallel_residual=parallel,
                                        max_position_embeddings=64, hidden_act="gelu", tie_word_embeddings=False,
                                        attn_implementation="eager")
    assert hf_cfg.rope_parameters["partial_rotary_factor"] == 0.5  # 4 of each head's 8 dims rotate
    hf = transformers.GPTNeoXForCausalLM(hf_cfg).eval()
    randomize(hf)
    sd = hf.state_dict()
    H, dh, d = 4, 8, 32
    # (transformers 5 names the unembedding lm_head; Pythia checkpoints on disk call it embed_out)
    w = {"tok_embed.weight": sd["gpt_neox.embed_in.weight"], "lm_head.weight": sd["lm_head.weight"],
         "final_norm.weight": sd["gpt_neox.final_layer_norm.weight"],
         "final_norm.bias": sd["gpt_neox.final_layer_norm.bias"]}
    for l in range(2):
        p = f"gpt_neox.layers.{l}."
        # query_key_value rows are laid out per head: [H, (q, k, v), dh]
        qkv_w = sd[p + "attention.query_key_value.weight"].view(H, 3, dh, d)
        qkv_b = sd[p + "attention.query_key_value.bias"].view(H, 3, dh)
        for i, name in enumerate("qkv"):
            w[f"blocks.{l}.attn.{name}.weight"] = qkv_w[:, i].reshape(H * dh, d)
            w[f"blocks.{l}.attn.{name}.bias"] = qkv_b[:, i].reshape(H * dh)
        for ours, theirs in {"attn.o": "attention.dense", "mlp.up": "mlp.dense_h_to_4h", "mlp.down": "mlp.dense_4h_to_h",
                             "norm1": "input_layernorm", "norm2": "post_attention_layernorm"}.items():
            w[f"blocks.{l}.{ours}.weight"] = sd[p + theirs + ".weight"]
            w[f"blocks.{l}.{ours}.bias"] = sd[p + theirs + ".bias"]
    cfg = ModelConfig(family="llama", vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=64,
                      norm="layernorm", norm_eps=1e-5, activation="gelu", positions="rotary", rotary_fraction=0.5,
                      parallel_residual=parallel, attention_bias=True, mlp_bias=True, tie_embeddings=False)
    compare(hf, load(cfg, w), ids_of())


# -- GPT-Neo (TinyStories): local layers, no score scaling, out-projection bias only ----------


def test_gpt_neo_local_window_and_unscaled_scores():
    window = 3
    hf_cfg = transformers.GPTNeoConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                                       attention_types=[[["global", "local"], 1]], window_size=window,
                                       intermediate_size=64, max_position_embeddings=64,
                                       activation_function="gelu_new", attn_implementation="eager")
    hf = transformers.GPTNeoForCausalLM(hf_cfg).eval()
    randomize(hf)
    sd = hf.state_dict()
    w = {"tok_embed.weight": sd["transformer.wte.weight"], "pos_embed.weight": sd["transformer.wpe.weight"],
         "final_norm.weight": sd["transformer.ln_f.weight"], "final_norm.bias": sd["transformer.ln_f.bias"]}
    for l in range(2):
        p = f"transformer.h.{l}."
        for ours, theirs in {"attn.q": "attn.attention.q_proj", "attn.k": "attn.attention.k_proj",
                             "attn.v": "attn.attention.v_proj", "attn.o": "attn.attention.out_proj",
                             "mlp.up": "mlp.c_fc", "mlp.down": "mlp.c_proj", "norm1": "ln_1", "norm2": "ln_2"}.items():
            for kind in ("weight", "bias"):
                if p + theirs + "." + kind in sd:
                    w[f"blocks.{l}.{ours}.{kind}"] = sd[p + theirs + "." + kind]
    cfg = ModelConfig(family="gpt2", vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=64,
                      activation="gelu_tanh", positions="learned", attention_bias=False, attention_out_bias=True,
                      attn_scale=1.0, sliding_window=window, layer_types=["full_attention", "sliding_attention"],
                      tie_embeddings=True)
    model = load(cfg, w)
    compare(hf, model, ids_of())
    # the local layer really is local: key 0 is out of reach of the last query
    _, trace = model.run_with_trace(ids_of(), names=("blocks.1.attn.pattern",))
    assert (trace["blocks.1.attn.pattern"][..., -1, : T - window] == 0).all()


# -- Qwen2 / Qwen2.5: q, k, v biases but no output bias ---------------------------------------


def test_qwen2_qkv_bias_without_output_bias():
    hf_cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      rms_norm_eps=1e-6, tie_word_embeddings=False, attn_implementation="eager")
    hf = transformers.Qwen2ForCausalLM(hf_cfg).eval()
    randomize(hf)
    assert hf.model.layers[0].self_attn.q_proj.bias is not None and hf.model.layers[0].self_attn.o_proj.bias is None
    cfg = decoder_cfg(n_kv_heads=2, attention_bias=True, attention_out_bias=False)
    model = load(cfg, llama_style_weights(hf.state_dict(), 2))
    assert model.blocks[0].attn.o.bias is None
    compare(hf, model, ids_of())


# -- Qwen3: q/k norm, head_dim != d_model / n_heads --------------------------------------------


def test_qwen3_qk_norm_and_explicit_head_dim():
    hf_cfg = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                      attn_implementation="eager")
    hf = transformers.Qwen3ForCausalLM(hf_cfg).eval()
    randomize(hf)
    cfg = decoder_cfg(n_kv_heads=2, head_dim=16, qk_norm=True, tie_embeddings=True)
    assert cfg.d_head == 16 != cfg.d_model // cfg.n_heads
    compare(hf, load(cfg, llama_style_weights(hf.state_dict(), 2)), ids_of())


# -- Mistral: sliding window on every layer, GQA ------------------------------------------------


def mistral_pair(window: int = 4):
    hf_cfg = transformers.MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        sliding_window=window, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                        attn_implementation="eager")
    hf = transformers.MistralForCausalLM(hf_cfg).eval()
    randomize(hf)
    cfg = decoder_cfg(n_kv_heads=2, sliding_window=window)
    return hf, load(cfg, llama_style_weights(hf.state_dict(), 2))


def test_mistral_sliding_window_and_gqa():
    hf, model = mistral_pair(window=4)
    compare(hf, model, ids_of())
    # the window counts the query itself: the last query sees exactly `window` keys
    _, trace = model.run_with_trace(ids_of(), names=("blocks.0.attn.pattern",))
    assert int((trace["blocks.0.attn.pattern"][0, 0, -1] > 0).sum()) == 4


# -- Gemma 3 (gemma3_text): every quirk at once -------------------------------------------------


def gemma3_pair(rope_scaling: dict | None = None):
    window = 4
    layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
    full = {"rope_type": "default", "rope_theta": 1000.0}
    if rope_scaling is not None:
        full = {**rope_scaling, "rope_theta": 1000.0}
    hf_cfg = transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=window,
        layer_types=layer_types, max_position_embeddings=64, rms_norm_eps=1e-6, final_logit_softcapping=3.0,
        rope_parameters={"full_attention": full, "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}},
        attn_implementation="eager")
    hf = transformers.Gemma3ForCausalLM(hf_cfg).eval()
    randomize(hf)
    sd = hf.state_dict()
    w = llama_style_weights(sd, 3)
    for l in range(3):  # Gemma's post_attention_layernorm is the sandwich norm; pre_feedforward is norm2
        p = f"model.layers.{l}."
        w[f"blocks.{l}.post_attn_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
        w[f"blocks.{l}.norm2.weight"] = sd[p + "pre_feedforward_layernorm.weight"]
        w[f"blocks.{l}.post_mlp_norm.weight"] = sd[p + "post_feedforward_layernorm.weight"]
    cfg = decoder_cfg(n_layers=3, n_kv_heads=2, head_dim=16, norm="rmsnorm_offset", activation="geglu",
                      qk_norm=True, sandwich_norms=True, attn_scale=24 ** -0.5, embed_scale=math.sqrt(32),
                      sliding_window=window, layer_types=layer_types, rope_theta=1000.0, rope_local_theta=50.0,
                      rope_scaling=rope_scaling, final_logit_softcap=3.0, tie_embeddings=True)
    return hf, load(cfg, w)


@pytest.mark.parametrize("rope_scaling", [None, {"rope_type": "linear", "factor": 4.0}])
def test_gemma3_text(rope_scaling):
    hf, model = gemma3_pair(rope_scaling)
    ids = ids_of()
    compare(hf, model, ids)
    # the soft cap is in force: every logit within (-3, 3)
    assert model(ids).logits.abs().max() < 3.0


def test_llama3_rope_scaling_matches_transformers():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    hf_cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                      rms_norm_eps=1e-6, rope_parameters={**scaling, "rope_theta": 10000.0},
                                      tie_word_embeddings=False, attn_implementation="eager")
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    randomize(hf)
    cfg = decoder_cfg(n_heads=2, rope_scaling=scaling)
    compare(hf, load(cfg, llama_style_weights(hf.state_dict(), 2)), ids_of(n=40))


def test_unsupported_rope_scaling_is_refused():
    with pytest.raises(ConfigError, match="yarn"):
        decoder_cfg(rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ConfigError, match="low_freq_factor"):
        decoder_cfg(rope_scaling={"rope_type": "llama3", "factor": 8.0})


# -- OPT: learned positions offset by 2, ReLU ---------------------------------------------------


def test_opt_position_offset_and_relu():
    hf_cfg = transformers.OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                                    num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32,
                                    do_layer_norm_before=True, activation_function="relu", pad_token_id=1,
                                    attn_implementation="eager")
    hf = transformers.OPTForCausalLM(hf_cfg).eval()
    randomize(hf)
    sd = hf.state_dict()
    p0 = "model.decoder."
    w = {"tok_embed.weight": sd[p0 + "embed_tokens.weight"], "pos_embed.weight": sd[p0 + "embed_positions.weight"],
         "final_norm.weight": sd[p0 + "final_layer_norm.weight"], "final_norm.bias": sd[p0 + "final_layer_norm.bias"]}
    for l in range(2):
        p = f"{p0}layers.{l}."
        for ours, theirs in {"attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj", "attn.v": "self_attn.v_proj",
                             "attn.o": "self_attn.out_proj", "mlp.up": "fc1", "mlp.down": "fc2",
                             "norm1": "self_attn_layer_norm", "norm2": "final_layer_norm"}.items():
            w[f"blocks.{l}.{ours}.weight"] = sd[p + theirs + ".weight"]
            w[f"blocks.{l}.{ours}.bias"] = sd[p + theirs + ".bias"]
    cfg = ModelConfig(family="gpt2", vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=64,
                      activation="relu", positions="learned", position_offset=2, tie_embeddings=True)
    model = load(cfg, w)
    assert model.pos_embed.weight.shape[0] == 66
    compare(hf, model, ids_of(), attention_mask=torch.ones(2, T, dtype=torch.long))


# -- encoders: RoBERTa (offset padding_idx + 1, lm_head) and DistilBERT (no token types) ----------


def bert_layer_weights(sd, prefix: str, l: int) -> dict:
    p = f"{prefix}encoder.layer.{l}."
    w = {}
    for ours, theirs in {"attn.q": "attention.self.query", "attn.k": "attention.self.key",
                         "attn.v": "attention.self.value", "attn.o": "attention.output.dense",
                         "norm1": "attention.output.LayerNorm", "mlp.up": "intermediate.dense",
                         "mlp.down": "output.dense", "norm2": "output.LayerNorm"}.items():
        w[f"blocks.{l}.{ours}.weight"] = sd[p + theirs + ".weight"]
        w[f"blocks.{l}.{ours}.bias"] = sd[p + theirs + ".bias"]
    return w


def encoder_cfg(**kw) -> ModelConfig:
    base = dict(family="bert", vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=62,
                norm="layernorm", norm_placement="post", activation="gelu", positions="learned", causal=False,
                embed_norm=True, final_norm=False, tie_embeddings=True, norm_eps=1e-12, lm_head_kind="mlm")
    return ModelConfig(**{**base, **kw})


def test_roberta_position_offset_and_mlm_head():
    pad = 1
    hf_cfg = transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=64, type_vocab_size=1,
                                        pad_token_id=pad, layer_norm_eps=1e-12, attn_implementation="eager")
    hf = transformers.RobertaForMaskedLM(hf_cfg).eval()
    randomize(hf)
    sd = hf.state_dict()
    e = "roberta.embeddings."
    w = {"tok_embed.weight": sd[e + "word_embeddings.weight"], "pos_embed.weight": sd[e + "position_embeddings.weight"],
         "type_embed.weight": sd[e + "token_type_embeddings.weight"], "embed_norm.weight": sd[e + "LayerNorm.weight"],
         "embed_norm.bias": sd[e + "LayerNorm.bias"], "mlm_dense.weight": sd["lm_head.dense.weight"],
         "mlm_dense.bias": sd["lm_head.dense.bias"], "mlm_norm.weight": sd["lm_head.layer_norm.weight"],
         "mlm_norm.bias": sd["lm_head.layer_norm.bias"], "lm_bias": sd["lm_head.bias"]}
    for l in range(2):
        w.update(bert_layer_weights(sd, "roberta.", l))
    cfg = encoder_cfg(type_vocab_size=1, position_offset=pad + 1, pad_token_id=pad)
    model = load(cfg, w)
    assert model.lm_head.weight is model.tok_embed.weight
    compare(hf, model, ids_of())  # ids_of never draws the pad id: HF's positions are pad + 1 + t


def test_distilbert_mlm_head():
    hf_cfg = transformers.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                           max_position_embeddings=62, activation="gelu", attn_implementation="eager")
    hf = transformers.DistilBertForMaskedLM(hf_cfg).eval()
    randomize(hf)
    sd = hf.state_dict()
    e = "distilbert.embeddings."
    w = {"tok_embed.weight": sd[e + "word_embeddings.weight"], "pos_embed.weight": sd[e + "position_embeddings.weight"],
         "embed_norm.weight": sd[e + "LayerNorm.weight"], "embed_norm.bias": sd[e + "LayerNorm.bias"],
         "mlm_dense.weight": sd["vocab_transform.weight"], "mlm_dense.bias": sd["vocab_transform.bias"],
         "mlm_norm.weight": sd["vocab_layer_norm.weight"], "mlm_norm.bias": sd["vocab_layer_norm.bias"],
         "lm_bias": sd["vocab_projector.bias"]}
    for l in range(2):
        p = f"distilbert.transformer.layer.{l}."
        for ours, theirs in {"attn.q": "attention.q_lin", "attn.k": "attention.k_lin", "attn.v": "attention.v_lin",
                             "attn.o": "attention.out_lin", "norm1": "sa_layer_norm", "mlp.up": "ffn.lin1",
                             "mlp.down": "ffn.lin2", "norm2": "output_layer_norm"}.items():
            w[f"blocks.{l}.{ours}.weight"] = sd[p + theirs + ".weight"]
            w[f"blocks.{l}.{ours}.bias"] = sd[p + theirs + ".bias"]
    cfg = encoder_cfg(type_vocab_size=0)
    compare(hf, load(cfg, w), ids_of())


# -- KV-cached decoding with sliding windows shorter than the sequence ------------------------------


@pytest.mark.parametrize("pair", [mistral_pair, gemma3_pair])
def test_cached_steps_match_the_full_forward_with_a_sliding_window(pair):
    hf, model = pair()
    ids = ids_of(n=14, batch=1)
    with torch.no_grad():
        full = model(ids).logits[0]
        cache = KVCache(model.cfg.n_layers)
        prompt = 3
        steps = [model(ids[:, :prompt], cache=cache).logits[0, -1]]
        for t in range(prompt, ids.shape[1]):
            steps.append(model(ids[:, t:t + 1], cache=cache).logits[0, -1])
        ref = hf(ids).logits[0]
    torch.testing.assert_close(torch.stack(steps), full[prompt - 1:], atol=1e-5, rtol=0)
    torch.testing.assert_close(full, ref, atol=1e-4, rtol=0)


def test_generation_session_records_windowed_attention_rows():
    """GenerationSession's one-token steps: the recorded attention rows (computed from the cache)
    equal the rows of a full traced forward of the same ids, window and scale included."""
    _, model = gemma3_pair()
    prompt = ids_of(n=3, batch=1)[0].tolist()
    session = GenerationSession(model, prompt, GenerationSettings(strategy="greedy"), record=True)
    for _ in range(8):
        node = session.step()
    ids = torch.tensor([session.ids(node)])
    assert ids.shape[1] > model.cfg.sliding_window + 2
    out, trace = model.run_with_trace(ids, names=("blocks.*.attn.pattern",))
    for l in range(model.cfg.n_layers):
        row = node.record[f"blocks.{l}.attn.pattern"]  # [H, 1, T]: the forward that consumed node's token
        torch.testing.assert_close(row, trace[f"blocks.{l}.attn.pattern"][0, :, -1:], atol=1e-5, rtol=0)
    torch.testing.assert_close(node.next_logits, out.logits[0, -1], atol=1e-5, rtol=0)


# -- config checks --------------------------------------------------------------------------------


def test_defaults_keep_existing_models_and_mlm_head_follows_the_flag():
    assert ModelConfig(family="bert").lm_head_kind == "mlm"
    assert ModelConfig(family="gpt2").lm_head_kind == "linear"
    gpt2 = ModelConfig(family="gpt2")
    assert gpt2.attention_out_bias is True and gpt2.d_head == gpt2.d_model // gpt2.n_heads
    # an MLM head on a model whose family is not bert: the flag decides, not the name
    model = Transformer(ModelConfig(family="gpt2", lm_head_kind="mlm", causal=False))
    assert hasattr(model, "mlm_dense")
    with pytest.raises(ConfigError, match="sliding_window"):
        decoder_cfg(layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(ConfigError, match="layer_types"):
        decoder_cfg(sliding_window=4, layer_types=["sliding_attention"])
    with pytest.raises(ConfigError, match="rotating dims"):
        decoder_cfg(rotary_fraction=0.1)


def test_head_matrices_with_head_dim_gqa_and_score_scale():
    """A_h reproduces the head's scores q.k * scale (no rotary, no q/k norm): head_dim != d/h, GQA."""
    cfg = decoder_cfg(positions="none", n_kv_heads=2, head_dim=16, attn_scale=0.3)
    model = Transformer(cfg).eval()
    _, trace = model.run_with_trace(torch.zeros(1, 5, dtype=torch.long), names=("blocks.1.attn.input",))
    x = trace["blocks.1.attn.input"][0]
    for head in (0, 3):
        hm = model.head_matrices(1, head)
        assert hm.W_Q.shape == (16, 32) and hm.W_O.shape == (32, 16)
        attn = model.blocks[1].attn
        q = attn.q(x).view(5, 4, 16)[:, head]
        k = attn.k(x).view(5, 2, 16)[:, head // 2]
        torch.testing.assert_close(x @ hm.A.T @ x.T, q @ k.T * 0.3, atol=1e-5, rtol=1e-5)
