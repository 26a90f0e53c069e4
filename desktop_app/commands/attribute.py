"""`python -m desktop_app attribute MODEL_DIR (--text T | --ids I) [--target-text T | --target-ids I] [--position P] --token-id ID --csv OUT.csv`

Direct logit attribution (app.whatif.attribute_ids): one CSV row per component (columns component,
layer, head, contribution; -1 where a layer or head does not apply), written atomically; the last line
printed is a JSON object with the logit and the components' sum. An encoder-decoder's (pre-norm, T5-style):
--text is the source, the decoder reads [start] + the --target-text's tokens, --position is a position of
that decoder input, and its cross-attention heads are rows `cross_head` (core.analysis.seq2seq_logit_attribution).
"""
from __future__ import annotations

from . import add_model_and_text_arguments
from .args import add_overwrite_argument, count, index


def add_parser(sub) -> None:
    p = sub.add_parser("attribute", help="each head's and MLP's direct contribution to one token's logit (CSV)")
    add_model_and_text_arguments(p)
    p.add_argument("--position", type=index, default=-1, help="which position's logit (default: the last; "
                   "negative counts from the end)")
    p.add_argument("--token-id", type=count, required=True, help="the token whose logit is attributed")
    add_target_arguments(p)
    p.add_argument("--ablate", help="zero-ablate first: LAYER.HEAD[,LAYER.HEAD...] (also LAYER.attn, LAYER.mlp; an "
                   "encoder-decoder's enc.L.H, dec.L.H, cross.L.H, enc.L.mlp ...)")
    p.add_argument("--csv", required=True, help="output CSV")
    add_overwrite_argument(p)
    p.set_defaults(func=run)


def add_target_arguments(p) -> None:
    """--target-text / --target-ids: an encoder-decoder's target (the decoder reads [start] + its tokens)."""
    t = p.add_mutually_exclusive_group()
    t.add_argument("--target-text", metavar="TGT", help="for an encoder-decoder (T5, BART, Marian): the target text, "
                   "the decoder's input after its start token (default: the start token alone); the text is the source")
    t.add_argument("--target-ids", metavar="TGT", help="the target as comma-separated token ids (encoder-decoders)")


def decoder_ids_of(loaded, args) -> list[int] | None:
    """The decoder's input an encoder-decoder reads for --target-text / --target-ids (None for other
    models, which refuse either option in one line)."""
    from ..app.whatif import decoder_input
    from ..core.inputs import parse_token_ids

    given = args.target_text is not None or args.target_ids is not None
    if not loaded.config.is_encoder_decoder:
        if given:
            option = "--target-text" if args.target_text is not None else "--target-ids"
            raise ValueError(f"{option}: {args.model_dir} is not an encoder-decoder; it reads one text")
        return None
    ids = parse_token_ids(args.target_ids, "--target-ids") if args.target_ids is not None else None
    return decoder_input(loaded, args.target_text or "", ids, cut=False)


def write_csv(path, header, rows) -> None:
    """header + rows as CSV, written atomically (the app's own output)."""
    import csv
    import io
    from pathlib import Path

    from ..core.files import atomic_write_bytes, check_output_file

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    check_output_file(path, overwrite=True)  # checked at the start; still not a link or a special file
    atomic_write_bytes(Path(path), buf.getvalue().encode("utf-8"))


def run(args) -> int:
    import json

    from . import input_ids, load_model
    from ..app.whatif import attribute_ids, attribution_problem, refuse
    from ..core.files import check_output_file
    from ..core.interventions import ATTRIBUTION_COLUMNS, parse_ablations

    check_output_file(args.csv, args.overwrite)  # refused or unwritable now, not after the forward pass
    loaded = load_model(args.model_dir, special_tokens=args.special_tokens, dtype=args.dtype)
    refuse(attribution_problem(loaded.config))  # the What if panel's line for the models it disables
    ablate = parse_ablations(args.ablate, loaded.config) if args.ablate else None
    ids = input_ids(loaded, args.text, args.ids)
    att, _ = attribute_ids(loaded, ids, args.position, args.token_id, ablate, decoder_ids_of(loaded, args))
    write_csv(args.csv, ATTRIBUTION_COLUMNS, att.rows())
    print(json.dumps({"csv": args.csv, "rows": len(att.components), "position": att.position,
                      "token_id": att.token_id, "logit": att.logit, "sum": att.sum}))
    return 0
