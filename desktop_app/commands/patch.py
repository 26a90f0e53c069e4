"""`python -m desktop_app patch MODEL_DIR --clean T --corrupted T --answer-id ID [--wrong-id ID] [--ablate L.H] --csv OUT.csv`

Activation patching (core.interventions.activation_patching). The CSV holds both tables, one row
per cell: table ("resid": the residual stream, row = embed or blocks.l.resid_post, at one position;
"head": one head's output at every position), layer (-1 for embed), position (-1 for heads), head
(-1 for the residual stream), recovery (corrupted = 0, clean = 1). The last line printed is a JSON
object with the clean and corrupted metrics. Under --ablate the zero-ablated model is the one patched
(in the clean, corrupted and patched runs alike), as in the What if panel under the active ablations.
"""
from __future__ import annotations

from . import MODEL_HELP, add_dtype_argument, add_special_tokens_argument
from .args import add_overwrite_argument, count

PATCH_COLUMNS = ("table", "component", "layer", "position", "head", "recovery")


def add_parser(sub) -> None:
    p = sub.add_parser("patch", help="activation patching: which layer x position and which heads restore a "
                       "clean answer (CSV)")
    p.add_argument("model_dir", help=MODEL_HELP)
    add_dtype_argument(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--clean", help="clean text")
    g.add_argument("--clean-ids", help="clean token ids")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--corrupted", help="corrupted text (same length in tokens)")
    g.add_argument("--corrupted-ids", help="corrupted token ids")
    p.add_argument("--answer-id", type=count, required=True, help="the clean answer's token id")
    p.add_argument("--wrong-id", type=count, help="metric: logit(answer) - logit(wrong) (default: logit(answer))")
    p.add_argument("--ablate", help="patch the zero-ablated model: LAYER.HEAD[,LAYER.HEAD...] (also LAYER.attn, "
                   "LAYER.mlp)")
    add_special_tokens_argument(p)
    p.add_argument("--csv", required=True, help="output CSV")
    add_overwrite_argument(p)
    p.set_defaults(func=run)


def patch_rows(res) -> list[tuple]:
    rows = []
    for r, name in enumerate(res.resid_rows):
        layer = -1 if name == "embed" else int(name.split(".")[1])
        rows += [("resid", name, layer, p, -1, float(v)) for p, v in enumerate(res.resid[r])]
    L, H = res.heads.shape
    rows += [("head", f"blocks.{l}.attn.head.{h}", l, -1, h, float(res.heads[l, h])) for l in range(L) for h in range(H)]
    return rows


def run(args) -> int:
    import json

    from . import input_ids, load_model
    from .attribute import write_csv
    from ..app.whatif import patching_problem, refuse
    from ..core.files import check_output_file
    from ..core.interventions import activation_patching, parse_ablations

    check_output_file(args.csv, args.overwrite)
    loaded = load_model(args.model_dir, special_tokens=args.special_tokens, dtype=args.dtype)
    refuse(patching_problem(loaded.config))  # the What if panel's line for the models it disables
    clean = input_ids(loaded, args.clean, args.clean_ids)
    corrupted = input_ids(loaded, args.corrupted, args.corrupted_ids)
    ablate = parse_ablations(args.ablate, loaded.config) if args.ablate else None
    res = activation_patching(loaded, clean, corrupted, args.answer_id, args.wrong_id, interventions=ablate)
    write_csv(args.csv, PATCH_COLUMNS, patch_rows(res))
    print(json.dumps({"csv": args.csv, "tokens": len(clean), "clean_metric": res.clean_metric,
                      "corrupted_metric": res.corrupted_metric, "ablated": args.ablate or None,
                      "best_head": [int(i) for i in divmod(int(res.heads.argmax()), res.heads.shape[1])]}))
    return 0
