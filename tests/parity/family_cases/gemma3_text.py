"""Gemma 3 text: sliding and full layers with their own rotary bases, q/k norms, sandwich norms,
GeGLU, scaled scores and embeddings."""
import transformers

def gemma3(**kw):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                max_position_embeddings=64, rope_parameters={"full_attention": {"rope_type": "default",
                                                                                "rope_theta": 1000.0},
                                                             "sliding_attention": {"rope_type": "default",
                                                                                   "rope_theta": 50.0}},
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**{**base, **kw}))


CASES = {"pattern-tied": gemma3()}
