"""Granite: embedding, attention and residual multipliers and the logits' scaling, all away from 1 (Granite 3's
own are of this kind: 12, 1/64, 0.22, 8), q and k sharpened so that the score scale counts, grouped-query
attention, biases."""
import transformers

from family_parity import sharpened


def granite(**kw):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, embedding_multiplier=12.0,
                attention_multiplier=2.0, residual_multiplier=0.22, logits_scaling=2.0,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return lambda: sharpened(transformers.GraniteForCausalLM(transformers.GraniteConfig(**{**base, **kw})))


CASES = {"multipliers-gqa": granite(), "biases-tied": granite(attention_bias=True, mlp_bias=True,
                                                              tie_word_embeddings=True)}
