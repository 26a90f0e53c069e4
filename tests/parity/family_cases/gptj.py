"""GPT-J parity cases (tests/parity/family_parity.check_family): the parallel block with one input norm,
partial interleaved rotary (rotary_dim below and at the head width), the biased unembedding, tied too."""
from __future__ import annotations

import transformers


def gptj(**kw):
    base = dict(vocab_size=97, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_inner=64, n_positions=64,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return lambda: transformers.GPTJForCausalLM(transformers.GPTJConfig(**{**base, **kw}))


CASES = {
    "rotary4-of-8": gptj(),
    "full-rotary-tied": gptj(rotary_dim=8, tie_word_embeddings=True),
    "3-layers-gelu": gptj(n_layer=3, rotary_dim=6, activation_function="gelu", n_inner=None),
    # 30 / 44 * 44 is 29.999... in floating point: the rotating dims must still be 30
    "rotary30-of-44": gptj(n_embd=88, n_head=2, rotary_dim=30),
}
