"""OLMoE parity cases (tests/parity/test_every_family.py): tiny random OlmoeForCausalLM models (q/k norms
over the whole projections)."""
import transformers

BASE = dict(vocab_size=97, hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, num_experts=6, num_experts_per_tok=2,
            bos_token_id=None, eos_token_id=None, pad_token_id=None)


def olmoe(**kw):
    return lambda: transformers.OlmoeForCausalLM(transformers.OlmoeConfig(**{**BASE, **kw}))


CASES = {
    "6-experts-top2-gqa": olmoe(),
    "4-experts-top2-renormalised-biases-mha": olmoe(num_experts=4, norm_topk_prob=True, attention_bias=True,
                                                    num_key_value_heads=4),
}
