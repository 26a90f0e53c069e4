"""DistilBERT: no token types, its MLM head (vocab_transform, vocab_layer_norm, vocab_projector)."""
import transformers

VOCAB = 97


def config(**kw):
    return transformers.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                         max_position_embeddings=40, **kw)


CASES = {"mlm": lambda: transformers.DistilBertForMaskedLM(config())}
