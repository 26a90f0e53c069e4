"""Gemma 2: sliding (window 4, shorter than the text) and full layers alternating, soft-capped scores and
logits, sandwich norms, query_pre_attn_scalar, GeGLU, (1 + w) RMSNorm, sqrt(d) embeddings."""
import transformers

from family_parity import sharpened


def gemma2(**kw):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
                attn_logit_softcapping=2.0, final_logit_softcapping=0.3, max_position_embeddings=128,
                bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return lambda: sharpened(transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**{**base, **kw})))


CASES = {"alternating-softcaps-tied": gemma2(),
         "no-caps-untied-mqa": gemma2(attn_logit_softcapping=None, final_logit_softcapping=None,
                                      tie_word_embeddings=False, num_key_value_heads=1,
                                      layer_types=["full_attention", "sliding_attention", "sliding_attention"])}
