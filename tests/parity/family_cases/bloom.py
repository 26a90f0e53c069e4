"""Bloom: ALiBi (6 heads: slopes beyond a power of two), per-head fused q|k|v, the embedding LayerNorm,
biases (LayerNorm biases given values: transformers starts them at zero), tied."""
import transformers

from family_cases.stablelm import with_norm_biases


def bloom(**kw):
    base = dict(vocab_size=97, hidden_size=48, n_layer=2, n_head=6, bos_token_id=None, eos_token_id=None,
                pad_token_id=None)
    return lambda: with_norm_biases(transformers.BloomForCausalLM(transformers.BloomConfig(**{**base, **kw})))


CASES = {"alibi-6-heads": bloom()}
