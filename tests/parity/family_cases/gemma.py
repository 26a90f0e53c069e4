"""Gemma: (1 + w) RMSNorm, GeGLU, sqrt(d) embeddings, a head_dim of its own, grouped-query attention, tied."""
import transformers


def gemma(**kw):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=128, bos_token_id=None,
                eos_token_id=None, pad_token_id=None)
    return lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(**{**base, **kw}))


CASES = {"head_dim16-gqa-tied": gemma(),
         "biases-untied-linear-rope": gemma(attention_bias=True, tie_word_embeddings=False, head_dim=8,
                                            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0})}
