"""LLaMA: Llama 3's rotary scaling, a head_dim of its own, grouped-query attention, untied."""
import transformers

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16, "rope_theta": 500000.0}


def llama(**kw):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**base, **kw}))


CASES = {"llama3-head_dim16-gqa": llama(rope_parameters=LLAMA3_ROPE, head_dim=16)}
