"""`info MODEL`: a model's architecture and sizes as JSON (a GGUF file's tensor types too), without tracing it."""
from __future__ import annotations

import json

from . import MODEL_HELP, add_dtype_argument


def model_info(loaded) -> dict:
    cfg = loaded.config
    return {"family": cfg.family, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "d_model": cfg.d_model,
            "vocab_size": cfg.vocab_size, "context_length": cfg.context_length,
            "parameters": loaded.model.num_parameters(),
            **({"is_encoder_decoder": True, "n_decoder_layers": cfg.n_decoder_layers or cfg.n_layers}
               if cfg.is_encoder_decoder else {}),
            **({"image_size": cfg.image_size, "patch_size": cfg.patch_size, "num_channels": cfg.num_channels,
                "patches": (cfg.image_size // cfg.patch_size) ** 2} if cfg.input_kind == "patches" else {}),
            **({"gguf": gguf_info(loaded.gguf)} if loaded.gguf is not None else {})}


def gguf_info(summary) -> dict:
    """A GGUF file's architecture, file type, tensor types per kind and chat template (formats.gguf_file)."""
    return {"architecture": summary.architecture, "name": summary.model_name, "file_type": summary.file_type,
            "quantization": {kind: dict(counts.most_common()) for kind, counts in summary.types.items()},
            "dequantized": summary.dequantized, "chat_template": summary.chat_template}


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="print a model's architecture as JSON (a GGUF file's tensor types "
                                         "and chat template too)")
    p.add_argument("model_dir", help=MODEL_HELP)
    add_dtype_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    from . import load_model
    loaded = load_model(args.model_dir, dtype=args.dtype)
    print(json.dumps(model_info(loaded)))
    if loaded.dtype_reason:  # --dtype auto: what it computes in, and why (devices.choose_compute_dtype)
        print(f"compute dtype {loaded.dtype_reason}", file=sys.stderr)
    if loaded.tokenizer is None and loaded.config.input_kind == "tokens":  # said, not in the JSON
        print(f"note: {loaded.path}: {loaded.tokenizer_missing}; the model opens with token ids", file=sys.stderr)
    return 0
