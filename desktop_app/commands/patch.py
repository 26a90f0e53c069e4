"""`python -m desktop_app patch MODEL_DIR --clean T --corrupted T --answer-id ID [--wrong-id ID] [--ablate L.H] --csv OUT.csv`

Activation patching (core.interventions.activation_patching). The CSV holds both tables, one row
per cell: table ("resid": the residual stream, row = embed or blocks.l.resid_post, at one position;
"head": one head's output at every position), layer (-1 for embed), position (-1 for heads), head
(-1 for the residual stream), recovery (corrupted = 0, clean = 1). The last line printed is a JSON
object with the clean and corrupted metrics. Under --ablate the zero-ablated model is the one patched
(in the clean, corrupted and patched runs alike), as in the What if panel under the active ablations.
An encoder-decoder's clean and corrupted texts are two sources of the same length, its decoder reading
[start] + --target-text's tokens in every run (core.analysis.seq2seq_activation_patching): the "resid"
rows are the encoder's stream (encoder.embed, encoder.blocks.l.resid_post) at each source position, the
"head" rows each head of the three kinds (component encoder.blocks.l.attn.head.h, decoder.blocks.l.attn.head.h,
decoder.blocks.l.cross_attn.head.h).
"""
from __future__ import annotations

from . import MODEL_HELP, add_dtype_argument, add_special_tokens_argument
from .args import add_overwrite_argument, count
from .attribute import add_target_arguments

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
    add_target_arguments(p)
    p.add_argument("--ablate", help="patch the zero-ablated model: LAYER.HEAD[,LAYER.HEAD...] (also LAYER.attn, "
                   "LAYER.mlp; an encoder-decoder's enc.L.H, dec.L.H, cross.L.H ...)")
    add_special_tokens_argument(p)
    p.add_argument("--csv", required=True, help="output CSV")
    add_overwrite_argument(p)
    p.set_defaults(func=run)


def patch_rows(res) -> list[tuple]:
    rows = []
    for r, name in enumerate(res.resid_rows):
        layer = -1 if name.endswith("embed") else int(name.split(".")[-2])  # (an encoder-decoder's encoder.*)
        rows += [("resid", name, layer, p, -1, float(v)) for p, v in enumerate(res.resid[r])]
    L, H = res.heads.shape
    points = getattr(res, "head_points", None)  # an encoder-decoder's rows: "decoder.blocks.1.cross_attn" ...
    if points:
        names = [(p, int(p.split(".")[2])) for p in points]
    else:
        names = [(f"blocks.{l}.attn", l) for l in range(L)]
    rows += [("head", f"{name}.head.{h}", l, -1, h, float(res.heads[r, h]))
             for r, (name, l) in enumerate(names) for h in range(H)]
    return rows


def run(args) -> int:
    import json

    from . import input_ids, load_model
    from .attribute import decoder_ids_of, write_csv
    from ..app.whatif import patch_ids, patching_problem, refuse
    from ..core.files import check_output_file
    from ..core.interventions import parse_ablations

    check_output_file(args.csv, args.overwrite)
    loaded = load_model(args.model_dir, special_tokens=args.special_tokens, dtype=args.dtype)
    refuse(patching_problem(loaded.config))  # the What if panel's line for the models it disables
    clean = input_ids(loaded, args.clean, args.clean_ids)
    corrupted = input_ids(loaded, args.corrupted, args.corrupted_ids)
    ablate = parse_ablations(args.ablate, loaded.config) if args.ablate else None
    res = patch_ids(loaded, clean, corrupted, args.answer_id, args.wrong_id, ablate, decoder_ids=decoder_ids_of(loaded, args))
    write_csv(args.csv, PATCH_COLUMNS, patch_rows(res))
    print(json.dumps({"csv": args.csv, "tokens": len(clean), "clean_metric": res.clean_metric,
                      "corrupted_metric": res.corrupted_metric, "ablated": args.ablate or None,
                      "best_head": [int(i) for i in divmod(int(res.heads.argmax()), res.heads.shape[1])],
                      **({"head_rows": res.head_rows} if getattr(res, "head_rows", None) else {})}))
    return 0
