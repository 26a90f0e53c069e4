"""Qwen2: q/k/v biases without o's, grouped-query attention, untied."""
import transformers

def qwen2(**kw):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**{**base, **kw}))


CASES = {"gqa-untied": qwen2()}
