"""StableLM: LayerNorms with biases, partial rotary (0.25), q/k/v biases without o's, grouped-query attention."""
import torch
import transformers


def with_norm_biases(hf):
    """transformers starts LayerNorm biases at zero: given values, a bias read wrong shows. Returns hf."""
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name and name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return hf


def stablelm(**kw):
    base = dict(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, use_qkv_bias=True,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return lambda: with_norm_biases(transformers.StableLmForCausalLM(transformers.StableLmConfig(**{**base, **kw})))


CASES = {"qkv-bias-gqa-partial-rotary": stablelm()}
