"""Falcon: Falcon-7B's multi-query layout with one norm for the parallel block; the new decoder
architecture's grouped key/value layout with two norms (ln_attn, ln_mlp); per-head q|k|v, sequential, biases
(LayerNorm biases given values: transformers starts them at zero)."""
import transformers

from family_cases.stablelm import with_norm_biases


def falcon(**kw):
    base = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=128, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return lambda: with_norm_biases(transformers.FalconForCausalLM(transformers.FalconConfig(**{**base, **kw})))


CASES = {"7b-multi-query-one-norm": falcon(),
         "new-architecture-grouped-two-norms": falcon(new_decoder_architecture=True, num_kv_heads=2, bias=True),
         "per-head-sequential-untied": falcon(multi_query=False, parallel_attn=False, bias=True,
                                              tie_word_embeddings=False)}
