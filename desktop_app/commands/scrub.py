"""`python -m desktop_app scrub RUN_DIR --metric induction|prev-token|entropy|distance|weight-norm --csv OUT.csv`

A per-head metric at every step a training run kept (`train --keep-every K`; app.timeline.scrub): one CSV
row per kept step, layer and head (columns step, layer, head, value), written atomically, the run's own
latest checkpoint included; a kept step whose folder was deleted is named on stderr and skipped. The last
line printed is a JSON summary: the steps, the best head (highest at the last step) with its first and
last values and the step where it rose past halfway, and the step where the training loss fell past
halfway.
"""
from __future__ import annotations

from .args import add_overwrite_argument, int_in, seed


def add_parser(sub) -> None:
    from ..app.timeline import METRICS

    p = sub.add_parser("scrub", help="a per-head metric (induction, previous-token, entropy, distance) at every "
                                     "step a training run kept (CSV)")
    p.add_argument("run_dir", help="a training run's folder (trained with --keep-every K)")
    p.add_argument("--metric", choices=METRICS, required=True,
                   help="induction: attention to the token after the earlier occurrence of the current one, on "
                        "a random half repeated; prev-token: attention to the previous token; entropy (nats); "
                        "distance: mean attention distance (tokens); weight-norm: the Frobenius norm of each "
                        "block's parameters (one row per layer, head -1)")
    p.add_argument("--csv", required=True, help="output CSV (columns step, layer, head, value)")
    p.add_argument("--sequences", type=int_in(1, 4096), default=32, help="random sequences averaged over (default 32)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the sequences (the same at every step)")
    add_overwrite_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    import sys

    from ..app.timeline import COLUMNS, scrub
    from ..core.files import check_output_file, strict_json
    from ..core.training.timeline import kept_steps
    from .attribute import write_csv

    check_output_file(args.csv, args.overwrite)  # refused or unwritable now, not after the steps
    for k in kept_steps(args.run_dir).missing():
        print(f"note: {k.path}: kept step {k.step} has been deleted; skipped", file=sys.stderr)
    result = scrub(args.run_dir, args.metric, sequences=args.sequences, seed=args.seed)
    write_csv(args.csv, COLUMNS, result.rows())
    print(json.dumps(strict_json({"csv": args.csv, **result.summary()})))
    return 0
