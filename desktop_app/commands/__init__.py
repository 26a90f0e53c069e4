"""One module per CLI subcommand (see desktop_app/cli.py)."""
from __future__ import annotations


def parse_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ValueError(f"--ids must be comma-separated integers, got {text!r}") from None


def input_ids(loaded, text: str | None, ids: str | None) -> list[int]:
    """Token ids from --text (needs the model's tokenizer) or --ids."""
    if ids is not None:
        out = parse_ids(ids)
    elif text is not None:
        if loaded.tokenizer is None:
            raise ValueError(f"{loaded.path}: this model has no tokenizer.json; pass --ids instead of --text")
        out = loaded.tokenizer.encode(text)
    else:
        raise ValueError("give --text or --ids")
    if not out:
        raise ValueError("the input is empty")
    bad = [i for i in out if not 0 <= i < loaded.config.vocab_size]
    if bad:
        raise ValueError(f"token ids out of range for a vocabulary of {loaded.config.vocab_size}: {bad[:5]}")
    if len(out) > loaded.config.context_length:
        raise ValueError(f"{len(out)} tokens exceed the model's context length {loaded.config.context_length}")
    return out
