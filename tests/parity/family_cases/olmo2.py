"""OLMo 2 parity cases (tests/parity/family_parity.check_family): output norms, q/k norms over all heads,
grouped-query attention, attention biases, tied and untied heads."""
from __future__ import annotations

import transformers


def olmo2(**kw):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
                pad_token_id=None)
    return lambda: transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**{**base, **kw}))


CASES = {
    "gqa-untied": olmo2(),
    "biases-mha-tied": olmo2(attention_bias=True, num_key_value_heads=4, tie_word_embeddings=True),
    "mqa-3-layers-theta": olmo2(num_hidden_layers=3, num_key_value_heads=1,
                                rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
}
