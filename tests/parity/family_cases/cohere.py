"""Cohere (Command R): parallel attention and MLP from one weight-only LayerNorm, interleaved rotary,
the logit scale, q/k/v/o biases, grouped-query attention, tied."""
import torch
import transformers


def with_biases(hf):
    """transformers starts the biases at zero: given values, a bias read into the wrong rows shows. Returns hf."""
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return hf


def cohere(**kw):
    base = dict(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, logit_scale=0.5, attention_bias=True,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return lambda: with_biases(transformers.CohereForCausalLM(transformers.CohereConfig(**{**base, **kw})))


CASES = {"interleaved-rope-biases-gqa": cohere()}
