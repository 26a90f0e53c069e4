"""Phi (Phi-2): attention and MLP in parallel from one LayerNorm, partial rotary (0.5), biases everywhere
(the head's too; LayerNorm and head biases given values: transformers starts them at zero)."""
import torch
import transformers

from family_cases.stablelm import with_norm_biases


def with_head_bias(hf):
    with torch.no_grad():
        hf.lm_head.bias.normal_(0.0, 0.5)
    return hf


def phi(**kw):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=128, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return lambda: with_head_bias(with_norm_biases(transformers.PhiForCausalLM(transformers.PhiConfig(**{**base,
                                                                                                         **kw}))))


CASES = {"parallel-one-norm-partial-rotary": phi()}
