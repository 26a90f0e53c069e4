"""Phi-3: fused q|k|v with grouped-query attention (unequal parts) and fused gate|up; longrope with an
original context (8) shorter than the 12 tokens and the 32 greedy steps, so the short factors are
used for the prompt's first positions in generation and the long ones after; partial rotary."""
import transformers


def phi3(**kw):
    n = 8 // 2  # rotating frequencies: head 16 x partial rotary 0.5 / 2
    base = dict(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, original_max_position_embeddings=8,
                rope_parameters={"rope_type": "longrope", "rope_theta": 500.0, "partial_rotary_factor": 0.5,
                                 "short_factor": [1.0 + 0.5 * i for i in range(n)],
                                 "long_factor": [2.0 + 3.0 * i for i in range(n)]},
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(**{**base, **kw}))


CASES = {"gqa-longrope-partial": phi3(),
         "mha-default-rope-tied": phi3(num_key_value_heads=4, tie_word_embeddings=True,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1e4})}
