"""export: write a model (a folder, a training run, a GGUF file) as a Hugging Face safetensors folder or
as a GGUF file for llama.cpp, Ollama and LM Studio."""
from __future__ import annotations

import sys

from . import MODEL_HELP
from .args import OVERWRITE_HELP

HF_TYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


# a GGUF is one file (the file rule); an HF folder is replaced only when it is one the app wrote
EXPORT_OVERWRITE_HELP = (OVERWRITE_HELP + "; --format hf: an existing folder is replaced only when the app wrote it "
                         "(a folder holding anything else is refused and kept)")

def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write a model as a Hugging Face folder or a GGUF file")
    p.add_argument("model_dir", help=MODEL_HELP)
    p.add_argument("--format", choices=("hf", "gguf"), required=True,
                   help="hf: config.json + model.safetensors + tokenizer (transformers opens it); gguf: one .gguf file "
                        "(llama.cpp, Ollama, LM Studio)")
    p.add_argument("--out", required=True, help="the folder (hf) or .gguf file (gguf) to write")
    p.add_argument("--type", choices=("f32", "f16", "bf16", "q8_0"), default=None,
                   help="the weights' type: gguf default f16 (vectors stay f32; q8_0 quantizes the matrices), hf "
                        "default the model's own dtype (q8_0 is GGUF only)")
    p.add_argument("--overwrite", action="store_true", help=EXPORT_OVERWRITE_HELP)
    p.set_defaults(func=run)


def tokenizer_settings(loaded) -> dict[str, bytes]:
    """tokenizer_config.json for a GGUF's tokenizer (its special tokens, add_bos_token, chat template),
    which tokenizer.json alone does not carry; nothing for a folder's (its own files travel with it)."""
    import json

    tok = loaded.tokenizer
    if loaded.gguf is None or tok is None:
        return {}
    config = {f"{name}_token": text for name, text in tok.declared_specials.items()}
    config["add_bos_token"] = tok.bos_prepended
    if loaded.gguf.chat_template:
        config["chat_template"] = loaded.gguf.chat_template
    return {"tokenizer_config.json": json.dumps(config, indent=2).encode("utf-8")}


def run(args) -> int:
    import torch

    from ..core.checkpoints import save_model_folder
    from ..core.files import check_output_file, check_output_folder
    from . import load_model

    if args.format == "hf" and args.type == "q8_0":
        raise ValueError("--type q8_0 is a GGUF type; a Hugging Face folder holds f32, f16 or bf16")
    # the output is checked before the model is read: a refusal costs nothing
    if args.format == "gguf":
        out = check_output_file(args.out, overwrite=args.overwrite)
    else:
        out = check_output_folder(args.out, overwrite=args.overwrite, what="export")
    loaded = load_model(args.model_dir, dtype=None)  # the weights as stored (a quantized GGUF: dequantized)
    if args.format == "gguf":
        from ..core.formats.gguf_export import ExportError, save_gguf

        check_output_file(out, overwrite=True)  # again just before the write: the link rule
        try:
            save_gguf(loaded.model, out, loaded.tokenizer, kind=args.type or "f16", name=loaded.name,
                      on_note=lambda note: print(f"note: {note}", file=sys.stderr))
        except ExportError as exc:
            raise ValueError(f"{loaded.path}: {exc}") from None
    else:
        model = loaded.model
        if args.type is not None:
            model = model.to(getattr(torch, HF_TYPES[args.type]))
        save_model_folder(model, out, loaded.tokenizer, extra_files=tokenizer_settings(loaded))
    print(f"wrote {out}", file=sys.stderr)
    return 0
