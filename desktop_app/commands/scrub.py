"""`python -m desktop_app scrub RUN_DIR --metric METRIC [--layer L] [--text TEXT] --csv OUT.csv`

A metric at every step a training run kept (`train --keep-every K`; app.timeline.scrub): one CSV row per
kept step, layer and head (columns step, layer, head, value; head -1 for a per-layer metric: weight-norm,
lipschitz, logit-lens, logit-lens-rank, grad-norm), written atomically, the run's own latest checkpoint
included; a kept step whose folder was deleted is named on stderr and skipped. `--layer L` keeps one layer
of a per-layer metric; `--text` measures lipschitz and the logit lens on a text of one's own instead of
the probe's repeated sequences. grad-norm is what the trainer logged, at its logged steps. The last line
printed is a JSON summary: the steps, the best head or layer (highest at the last step; lowest for
logit-lens-rank) with its first and last values and the step where it rose past halfway, and the step
where the training loss fell past halfway.
"""
from __future__ import annotations

from .args import add_overwrite_argument, int_in, layer_or_head, seed


def add_parser(sub) -> None:
    from ..app.timeline import METRICS

    p = sub.add_parser("scrub", help="a per-head metric (induction, previous-token, entropy, distance) or a per-layer "
                                     "one (weight norm, Lipschitz constant, logit lens, gradient norm) at every "
                                     "step a training run kept (CSV)")
    p.add_argument("run_dir", help="a training run's folder (trained with --keep-every K), or a Hugging Face cache "
                                   "repository folder (models--org--name, or one of its snapshots) whose revisions "
                                   "are training steps (Pythia's step1000 ...)")
    p.add_argument("--metric", choices=METRICS, required=True,
                   help="induction: attention to the token after the earlier occurrence of the current one, on "
                        "a random half repeated; prev-token: attention to the previous token; entropy (nats); "
                        "distance: mean attention distance (tokens); per layer (head -1): weight-norm: the "
                        "Frobenius norm of each block's parameters; lipschitz: the local Lipschitz constant of the "
                        "layer's attention on fixed sequences; logit-lens: the probability of the correct next "
                        "token through the layer's logit lens; logit-lens-rank: its rank there (0 = top); "
                        "grad-norm: each block's gradient norm at the steps the trainer logged")
    p.add_argument("--layer", type=layer_or_head, default=None,
                   help="the one layer of a per-layer metric to measure (default: every layer)")
    p.add_argument("--text", default=None,
                   help="lipschitz and logit lens: measure on this text (the run's tokenizer; token ids '1, 2, 3' "
                        "for a run without one) instead of the repeated random sequences")
    p.add_argument("--csv", required=True, help="output CSV (columns step, layer, head, value)")
    p.add_argument("--sequences", type=int_in(1, 4096), default=32, help="random sequences averaged over (default 32)")
    p.add_argument("--seed", type=seed, default=0, help="seed of the sequences (the same at every step)")
    add_overwrite_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    import sys

    from ..app.timeline import COLUMNS, TEXT_METRICS, scrub, timeline_at
    from ..core.analysis import HEAD_SCORES
    from ..core.files import check_output_file, strict_json
    from .attribute import write_csv

    if args.layer is not None and args.metric in HEAD_SCORES:
        raise ValueError(f"--layer chooses the layer of a per-layer metric, not of {args.metric} (one row per head)")
    if args.text is not None and args.metric not in TEXT_METRICS:
        raise ValueError(f"--text is measured by {', '.join(TEXT_METRICS)} only, not {args.metric}")
    check_output_file(args.csv, args.overwrite)  # refused or unwritable now, not after the steps
    timeline = timeline_at(args.run_dir)
    if timeline.unlisted:
        print(f"note: {timeline.unlisted}; measuring only what can be read: the run's checkpoint at step "
              f"{timeline.latest_step}", file=sys.stderr)
    if timeline.unread_metrics:
        print(f"note: {timeline.unread_metrics}; no loss curve", file=sys.stderr)
    for k in timeline.missing():
        print(f"note: {k.path}: kept step {k.step} " + (f"is {k.refused}" if k.refused else "has been deleted")
              + "; skipped", file=sys.stderr)
    result = scrub(args.run_dir, args.metric, sequences=args.sequences, seed=args.seed,
                   layers=None if args.layer is None else [args.layer], text=args.text)
    write_csv(args.csv, COLUMNS, result.rows())
    print(json.dumps(strict_json({"csv": args.csv, **result.summary()})))
    return 0
