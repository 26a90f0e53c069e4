"""Qwen3: q/k norms, a head_dim of its own, grouped-query attention, tied."""
import transformers

def qwen3(**kw):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, max_position_embeddings=64, tie_word_embeddings=True,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{**base, **kw}))


CASES = {"head_dim16-gqa-tied": qwen3()}
