"""BERT: post-LN encoder, token types, embedding LayerNorm, the MLM head."""
import transformers

CASES = {"mlm": lambda: transformers.BertForMaskedLM(transformers.BertConfig(
    vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
    max_position_embeddings=32))}
