"""One module per CLI subcommand (see desktop_app/cli.py)."""
from __future__ import annotations

from ..app.images import set_image_codec
from ..image_codec import decode_image

set_image_codec(decode_image)  # image files other than .npy are decoded by Qt's QImage (app/ never imports Qt)


def input_ids(loaded, text: str | None, ids: str | None) -> list[int]:
    """Token ids from --text (needs the model's tokenizer) or --ids (spaces and/or commas), checked
    against the model's vocabulary; longer than the context is refused (not silently cut)."""
    from ..core.inputs import check_ids, encode, parse_token_ids

    cfg = loaded.config
    if ids is not None:
        out = check_ids(parse_token_ids(ids, "--ids"), cfg.vocab_size, cfg.context_length, cut=False).ids
    elif text is not None:
        if loaded.tokenizer is None:
            raise ValueError(f"{loaded.path}: {loaded.tokenizer_missing}; pass --ids instead of --text")
        out = encode(loaded, text, cut=False).ids
    else:
        raise ValueError("give --text or --ids")
    if not out:
        raise ValueError("the input is empty")
    return out


MODEL_HELP = "model folder, or org/name[@revision] from the local Hugging Face cache (nothing is downloaded)"


def add_model_and_text_arguments(p):
    """The model folder and one of --text / --ids (input_ids reads them) that the commands running a
    text take; returns the --text / --ids group, for a command taking another kind of input too."""
    p.add_argument("model_dir", help=MODEL_HELP)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--text")
    g.add_argument("--ids", help="comma-separated token ids")
    add_special_tokens_argument(p)
    add_dtype_argument(p)
    return g


def add_dtype_argument(p):
    """--dtype, for every command that loads a model: load_model(dtype=...) reads it."""
    from ..core.devices import DTYPE_CHOICES

    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="the dtype to compute in (default auto: float32 on a CPU without bfloat16 matrix units "
                        "when it fits in memory, else the checkpoint's own dtype)")


def add_special_tokens_argument(p):
    """--no-special-tokens, for every command that encodes a text: load_model(special_tokens=...) reads it."""
    p.add_argument("--no-special-tokens", dest="special_tokens", action="store_false",
                   help="encode text without the tokenizer's special tokens ([CLS] ... [SEP], <s> ... </s>, "
                        "BOS), which are added by default as transformers adds them")


def load_model(model_ref: str, special_tokens: bool = True, dtype: str | None = "auto", **kwargs):
    """Every command's model argument: a folder, or a repository id resolved in the local Hugging Face
    cache only (NotInCacheError, one line, when it is not there); then load_model_folder(**kwargs).
    `special_tokens`: whether text encoded for it gets the tokenizer's special tokens (--no-special-tokens);
    `dtype`: --dtype ("auto": what suits the device, core.devices.choose_compute_dtype)."""
    from ..core.checkpoints import load_model_folder
    from ..core.hf_cache import resolve_model_ref

    loaded = load_model_folder(resolve_model_ref(model_ref), dtype=dtype, **kwargs)
    if loaded.tokenizer is not None:
        loaded.tokenizer.special_tokens = special_tokens
    return loaded
