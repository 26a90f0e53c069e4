"""Qwen2-MoE parity cases (tests/parity/test_every_family.py): tiny random Qwen2MoeForCausalLM models with
their shared expert and its sigmoid gate."""
import transformers

BASE = dict(vocab_size=97, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
            shared_expert_intermediate_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64, num_experts=6, num_experts_per_tok=2, bos_token_id=None, eos_token_id=None,
            pad_token_id=None)


def qwen2_moe(**kw):
    return lambda: transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(**{**BASE, **kw}))


CASES = {
    "6-experts-top2-shared-qkv-bias": qwen2_moe(),
    "4-experts-top3-renormalised-no-bias": qwen2_moe(num_experts=4, num_experts_per_tok=3, norm_topk_prob=True,
                                                     qkv_bias=False),
}
