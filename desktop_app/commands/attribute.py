"""`python -m desktop_app attribute MODEL_DIR (--text T | --ids I) [--position P] --token-id ID --csv OUT.csv`

Direct logit attribution (core.interventions.direct_logit_attribution): one CSV row per component
(columns component, layer, head, contribution; -1 where a layer or head does not apply), written
atomically; the last line printed is a JSON object with the logit and the components' sum.
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
    p.add_argument("--ablate", help="zero-ablate first: LAYER.HEAD[,LAYER.HEAD...] (also LAYER.attn, LAYER.mlp)")
    p.add_argument("--csv", required=True, help="output CSV")
    add_overwrite_argument(p)
    p.set_defaults(func=run)


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
    from ..app.whatif import attribution_problem, refuse
    from ..core.files import check_output_file
    from ..core.interventions import ATTRIBUTION_COLUMNS, direct_logit_attribution, parse_ablations

    check_output_file(args.csv, args.overwrite)  # refused or unwritable now, not after the forward pass
    loaded = load_model(args.model_dir, special_tokens=args.special_tokens, dtype=args.dtype)
    refuse(attribution_problem(loaded.config))  # the What if panel's line for the models it disables
    ablate = parse_ablations(args.ablate, loaded.config) if args.ablate else None
    ids = input_ids(loaded, args.text, args.ids)
    att = direct_logit_attribution(loaded, ids, args.position, args.token_id, interventions=ablate)
    write_csv(args.csv, ATTRIBUTION_COLUMNS, att.rows())
    print(json.dumps({"csv": args.csv, "rows": len(att.components), "position": att.position,
                      "token_id": att.token_id, "logit": att.logit, "sum": att.sum}))
    return 0
