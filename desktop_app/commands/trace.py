"""`trace`: run a text (or a vision model's image) through a model and write what it recorded as .npz:
the arrays app/tracing.py's file_arrays makes, of the names its trace policy records for a file."""
from __future__ import annotations

from ..app.images import image_pixel_values, read_image_file  # noqa: F401  (read_image_file: for the training side)
from ..app.tracing import image_trace_arrays, parse_layers, trace_arrays
from . import add_model_and_text_arguments
from .args import add_overwrite_argument


def add_parser(sub) -> None:
    p = sub.add_parser("trace", help="run a text through a model and save what it recorded as .npz")
    g = add_model_and_text_arguments(p)
    g.add_argument("--image", help="for a vision model: an image (PNG, JPEG, BMP) or a uint8 .npy array")
    t = p.add_mutually_exclusive_group()
    t.add_argument("--target-text", metavar="TGT",
                   help="for an encoder-decoder (T5, BART, Marian): the target text, the decoder's input after its "
                        "start token (default: the start token alone); --text / --ids is then the source")
    t.add_argument("--target-ids", metavar="TGT", help="the target as comma-separated token ids (encoder-decoders)")
    p.add_argument("--out", required=True, help="output .npz")
    add_overwrite_argument(p)
    p.add_argument("--ablate", help="zero-ablate: LAYER.HEAD[,LAYER.HEAD...] (also LAYER.attn, LAYER.mlp)")
    p.add_argument("--layers", type=_layers, metavar="A:B",
                   help="record only blocks A to B-1 (attn.A.., hidden.A+1..; e.g. 0:4, or 20: to the last), "
                        "for a trace whose every layer would not fit in memory")
    p.set_defaults(func=run)


def _layers(text: str):
    import argparse

    try:
        return parse_layers(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def run(args) -> int:
    import io
    from pathlib import Path

    import numpy as np

    from . import load_model
    from ..core.files import atomic_write_bytes, check_output_file
    from . import input_ids

    check_output_file(args.out, args.overwrite)  # refused or unwritable now, not after the forward pass
    from ..core.inputs import parse_token_ids
    from ..core.interventions import parse_ablations

    loaded = load_model(args.model_dir, special_tokens=args.special_tokens, dtype=args.dtype)
    ablate = parse_ablations(args.ablate, loaded.config) if args.ablate else None
    if args.image is not None or loaded.config.input_kind == "patches":
        if args.image is None:
            raise ValueError(f"{args.model_dir}: a vision model reads images: give --image FILE")
        if args.layers is not None:
            raise ValueError("--layers: a layer range is for text models' traces, not images")
        arrays = image_trace_arrays(loaded, image_pixel_values(loaded, args.image), ablate)
    elif loaded.config.is_encoder_decoder:
        if args.layers is not None:
            raise ValueError(f"--layers: {args.model_dir} is an encoder-decoder, whose trace records both stacks "
                             "whole (a layer range is for one-stack models): trace it without --layers")
        from ..app.whatif import decoder_input

        target_ids = parse_token_ids(args.target_ids, "--target-ids") if args.target_ids is not None else None
        source = input_ids(loaded, args.text, args.ids)
        target_ids = decoder_input(loaded, args.target_text or "", target_ids, cut=False)[1:]  # too long: refused
        arrays = trace_arrays(loaded, source, ablate, target_ids=target_ids)
    else:
        if args.target_text is not None or args.target_ids is not None:
            option = "--target-text" if args.target_text is not None else "--target-ids"
            raise ValueError(f"{option}: {args.model_dir} is not an encoder-decoder; it reads one text (--text / --ids)")
        arrays = trace_arrays(loaded, input_ids(loaded, args.text, args.ids), ablate, layers=args.layers)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    check_output_file(args.out, overwrite=True)  # still not a link or a special file
    atomic_write_bytes(Path(args.out), buf.getvalue())
    print(f"wrote {args.out} ({len(arrays)} arrays)")
    return 0
