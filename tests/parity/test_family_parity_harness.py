"""The shared family parity checks (family_parity.py) on the three first families."""
from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from family_parity import check_family  # noqa: E402


def test_gpt2(tmp_path):
    check_family(lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=None, eos_token_id=None)), tmp_path)


def test_llama_gqa(tmp_path):
    check_family(lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
        pad_token_id=None)), tmp_path)


def test_bert_mlm(tmp_path):
    check_family(lambda: transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32)), tmp_path)
