"""Qwen3-MoE parity cases (tests/parity/test_every_family.py): tiny random Qwen3MoeForCausalLM models."""
import transformers

BASE = dict(vocab_size=97, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64, num_experts=6,
            num_experts_per_tok=2, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def qwen3_moe(**kw):
    return lambda: transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**{**BASE, **kw}))


CASES = {
    "6-experts-top2-softmax-weights": qwen3_moe(),
    "8-experts-top4-renormalised-biases": qwen3_moe(num_experts=8, num_experts_per_tok=4, norm_topk_prob=True,
                                                    attention_bias=True, head_dim=8),
}
