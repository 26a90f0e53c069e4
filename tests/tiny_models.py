"""Tiny random models for the tests: a character tokenizer over a text and a small model of any family
(random weights from a fixed seed), as a LoadedModel or saved as a model folder.

The sizes default to TINY (2 layers, d_model 32); a test passes what differs or what its values depend on
(init_std, seed, context_length...), so the call says the model it tests."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from desktop_app.core.checkpoints import LoadedModel, new_model, save_model_folder
from desktop_app.core.families import REGISTRY
from desktop_app.core.tokenizer import Tokenizer, char_tokenizer

TINY = dict(d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=64)


def tiny_model(text: str, family: str = "gpt2", *, specials: Iterable[str] = (), seed: int = 0,
               name: str = "test", **config) -> LoadedModel:
    """A random `family` model on char_tokenizer(text, specials): TINY's sizes, overridden by `config`."""
    return tiny_model_on(char_tokenizer(text, specials=specials), family, seed=seed, name=name, **config)


def tiny_model_on(tokenizer: Tokenizer | None, family: str = "gpt2", *, seed: int = 0, name: str = "test",
                  **config) -> LoadedModel:
    """The same on `tokenizer` (None: a model that takes token ids; then `config` gives vocab_size)."""
    if tokenizer is not None:
        config.setdefault("vocab_size", tokenizer.vocab_size)
    cfg = REGISTRY[family].preset(**{**TINY, **config})
    return LoadedModel(new_model(cfg, seed=seed).eval(), cfg, tokenizer, None, name)


def save_tiny_model(folder, text: str, family: str = "gpt2", *, specials: Iterable[str] = (), seed: int = 0,
                    **config) -> Path:
    """tiny_model(text, family, ...) saved as a model folder (weights, config, tokenizer) at `folder`."""
    loaded = tiny_model(text, family, specials=specials, seed=seed, **config)
    save_model_folder(loaded.model, folder, tokenizer=loaded.tokenizer)
    return Path(folder)
