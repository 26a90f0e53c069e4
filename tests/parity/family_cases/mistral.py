"""Mistral: a sliding window (5) shorter than the text, grouped-query attention, untied."""
import transformers

def mistral(**kw):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, sliding_window=5, tie_word_embeddings=False,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**{**base, **kw}))


CASES = {"window5-gqa-untied": mistral()}
