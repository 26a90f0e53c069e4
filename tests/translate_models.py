"""Tiny encoder-decoders for the tests: random weights (seed 0) and the translate task's word tokenizer
(<pad> 0, [START] 1, [END] 2: the model's pad, decoder start and end ids), saved as a model folder."""
from __future__ import annotations

from pathlib import Path

from desktop_app.core.checkpoints import new_model, save_model_folder
from desktop_app.core.families import REGISTRY
from desktop_app.core.training.tasks import make_task


def save_translate_model(folder, family: str = "marian", **settings) -> Path:
    """A `family` model with `settings` (sizes, init_std, ...) and the translate task's tokenizer at `folder`."""
    task = make_task("translate", encoder_decoder=True)
    cfg = REGISTRY[family].preset(vocab_size=task.tokenizer.vocab_size, pad_token_id=0, eos_token_id=2,
                                  decoder_start_token_id=1, **settings)
    save_model_folder(new_model(cfg, seed=0), folder, tokenizer=task.tokenizer)
    return Path(folder)
