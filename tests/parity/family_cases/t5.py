"""T5 v1.0 (relu, tied head rescaled by d_model ** -0.5) and v1.1 (gated-GELU, untied, d_kv * heads != d_model)."""
import transformers

from family_parity import randomise_biases

VOCAB = 60


def t5_v10():
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        # (more decoder than encoder layers breaks transformers' own T5 cache in generate: not here)
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=3, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, feed_forward_proj="relu",
        dropout_rate=0.0, decoder_start_token_id=0))


def t5_v11():
    # gated-gelu, an untied head (tie_word_embeddings false: no rescaling), d_kv * heads != d_model
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=6, d_ff=48, num_layers=3, num_decoder_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, feed_forward_proj="gated-gelu",
        tie_word_embeddings=False, dropout_rate=0.0, decoder_start_token_id=0))


CASES = {"v1_1-gated-untied": lambda: randomise_biases(t5_v11())}
