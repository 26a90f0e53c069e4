"""BART: learned positions offset by 2, post-LN with embedding norms, scaled embeddings, final_logits_bias."""
import transformers

from family_parity import randomise_biases

VOCAB = 60


def bart():
    return transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=40,
        scale_embedding=True, dropout=0.0, attention_dropout=0.0, forced_eos_token_id=None))


CASES = {"scaled-embeddings": lambda: randomise_biases(bart())}
