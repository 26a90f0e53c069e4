"""OLMo: non-parametric LayerNorms, q/k/v clipped (at 0.05: random projections reach past it, so a missing
clamp changes the logits), biases, grouped-query attention."""
import transformers


def olmo(**kw):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, clip_qkv=0.05, attention_bias=True,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return lambda: transformers.OlmoForCausalLM(transformers.OlmoConfig(**{**base, **kw}))


CASES = {"clip-biases-gqa": olmo(), "no-clip-tied": olmo(clip_qkv=None, attention_bias=False,
                                                         tie_word_embeddings=True)}
