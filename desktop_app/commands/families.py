"""`families`: the model families this app reads, writes and trains (core/families' REGISTRY)."""
from __future__ import annotations

import json


def family_rows() -> list[dict]:
    """One row a family; kind: "encoder-decoder" (T5, BART, Marian), "decoder" (a causal LM) or "encoder"."""
    from ..core.families import REGISTRY
    return [{"model_type": f.model_type, "title": f.title, "kind": family_kind(f), "moe": f.moe,
             "architectures": list(f.architectures), "trainable": f.trainable} for f in REGISTRY.values()]


def family_kind(family) -> str:
    """encoder-decoder (T5, BART, Marian: both stacks), decoder or encoder."""
    if getattr(family, "encoder_decoder", False):
        return "encoder-decoder"
    return "decoder" if family.decoder else "encoder"


def add_parser(sub) -> None:
    p = sub.add_parser("families", help="list the model families (Hugging Face model_type) this app supports")
    p.add_argument("--json", action="store_true", help="one JSON list instead of one line per family")
    p.set_defaults(func=run)


def run(args) -> int:
    rows = family_rows()
    if args.json:
        print(json.dumps(rows))
        return 0
    width = max(len(r["model_type"]) for r in rows)
    for r in rows:
        trained = "trainable here" if r["trainable"] else "load only"
        experts = "experts" if r["moe"] else "dense"
        print(f"{r['model_type']:<{width}}  {r['kind']:<15}  {experts:<7}  {trained:<14}  {r['title']}")
    return 0
