"""Mixtral parity cases (tests/parity/test_every_family.py): tiny random MixtralForCausalLM models."""
import transformers

BASE = dict(vocab_size=97, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2,
            bos_token_id=None, eos_token_id=None, pad_token_id=None)


def mixtral(**kw):
    return lambda: transformers.MixtralForCausalLM(transformers.MixtralConfig(**{**BASE, **kw}))


CASES = {
    "4-experts-top2-gqa": mixtral(),
    "8-experts-top3-window-tied": mixtral(num_local_experts=8, num_experts_per_tok=3, sliding_window=5,
                                          tie_word_embeddings=True),
}
