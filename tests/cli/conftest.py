"""Fixtures shared by the CLI tests."""
from __future__ import annotations

import pytest

from tiny_models import save_tiny_model

TEXT = "the quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat. " * 4


@pytest.fixture(scope="module")
def char_gpt2_dir(tmp_path_factory):
    """A random 2-layer GPT-2 (d_model 16) on a character tokenizer, saved as a model folder, with the
    text its tokenizer was built from beside it as text.txt (for --text-file)."""
    path = save_tiny_model(tmp_path_factory.mktemp("m") / "model", TEXT, seed=1, d_model=16, n_heads=2, d_ff=32,
                           init_std=0.3)
    (path.parent / "text.txt").write_text(TEXT, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def one_layer_gpt2_dir(tmp_path_factory):
    """A random 1-layer GPT-2 (d_model 8, context 16) on the characters of "abcdefgh ", saved as a model
    folder: the smallest model a command runs on (the output-file tests)."""
    return save_tiny_model(tmp_path_factory.mktemp("m") / "model", "abcdefgh ", d_model=8, n_layers=1, n_heads=2,
                           d_ff=16, context_length=16)
