"""RoBERTa: positions offset from the pad id, the MLM head."""
import transformers

VOCAB = 97


def config(**kw):
    return transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=40, **kw)


CASES = {"mlm": lambda: transformers.RobertaForMaskedLM(config())}
