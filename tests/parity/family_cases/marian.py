"""Marian: sinusoidal positions in halves, swish, scaled embeddings, pad as the decoder's start token."""
import transformers

from family_parity import randomise_biases

VOCAB = 60


def marian():
    return transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=40,
        activation_function="swish", scale_embedding=True, dropout=0.0, attention_dropout=0.0,
        pad_token_id=VOCAB - 1, decoder_start_token_id=VOCAB - 1, eos_token_id=0, forced_eos_token_id=None))


CASES = {"swish": lambda: randomise_biases(marian())}
