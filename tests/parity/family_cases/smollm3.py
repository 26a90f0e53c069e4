"""SmolLM3: "NoPE" layers (no positions) among rotary ones, grouped-query attention, tied."""
import transformers


def smollm3(**kw):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, no_rope_layers=[1, 0, 1, 0],
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return lambda: transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(**{**base, **kw}))


CASES = {"nope-layers-gqa-tied": smollm3(),
         "default-interval-windows-biases": smollm3(no_rope_layers=None, use_sliding_window=True, sliding_window=4,
                                                    attention_bias=True, mlp_bias=True)}
