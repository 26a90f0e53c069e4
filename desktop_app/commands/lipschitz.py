"""`python -m desktop_app lipschitz`: local Lipschitz constants of attention against sequence length.

    lipschitz MODEL_DIR --layer L [--head H] [--masked|--no-masked] --data real|adversarial|search
              [--text-file F] [--radius R] --lengths 8,16,32 --samples K --csv OUT.csv
    lipschitz --synthetic --d D --attention softmax|l2|sinkhorn [--norm-a a] [--norm-v v] [--radius R]
              [--adversarial] [--masked] --lengths ... --samples K --csv OUT.csv
    lipschitz --synthetic --matrices AV.npz [--attention ...] [...]   (user A and V instead of random ones)
    lipschitz T5_OR_MARIAN_DIR --stack encoder|decoder|cross [--source-text SRC] [--target-text TGT] --layer L ...

An encoder-decoder's layer names its stack: encoder (its self-attention, on windows of --text-file),
decoder (the decoder's causal self-attention) or cross (its cross-attention, a function of the decoder's
input with the encoder's output on --source-text held fixed); the decoder's windows come from --target-text
([start] + its tokens) or else --text-file, and it reads the encoder's output on --source-text.

One CSV row per input (columns core.lipschitz.CSV_COLUMNS), written atomically; one summary line
per n; the last line printed is a JSON object (strict JSON: null where a number is undefined, e.g.
the CI of a fit through two points) with the fitted exponent and its 95% CI.
"""
from __future__ import annotations

import argparse

from . import MODEL_HELP, add_dtype_argument
from .args import DEVICES_HELP, Number, add_overwrite_argument, device, devices


def add_parser(sub) -> None:
    # the --data choices and the defaults are the core's: the input-source registry and sweep.py
    from ..core.lipschitz import (ATTENTION_KINDS, DEFAULT_SEARCH_STEPS, DEFAULT_SEED, DEFAULT_TOL, MODEL,
                                  source_names)
    from ..core.lipschitz.sweep import LIMITS  # each number's range, declared once (SweepSpec checks them too)

    def limit(name):
        return Number.of(LIMITS[name])

    p = sub.add_parser("lipschitz", help="local Lipschitz constant of attention against sequence length (CSV + JSON)")
    p.add_argument("model_dir", nargs="?", help=MODEL_HELP + "; omit with --synthetic")
    add_dtype_argument(p)
    p.add_argument("--synthetic", action="store_true", help="a standalone random attention head instead of a model")
    p.add_argument("--layer", type=limit("layer"), default=0)
    p.add_argument("--head", type=limit("head"), default=None, help="one head (default: the whole attention sublayer)")
    p.add_argument("--masked", action=argparse.BooleanOptionalAction, default=None,
                   help="causal mask (default: as the model applies it; unmasked for --synthetic)")
    p.add_argument("--stack", choices=("encoder", "decoder", "cross"),
                   help="an encoder-decoder's: encoder or decoder self-attention, or cross-attention (a function of "
                        "the decoder's input, the encoder's output on --source-text held fixed)")
    p.add_argument("--source-text", help="encoder-decoders, --stack decoder or cross: the source the decoder reads")
    p.add_argument("--target-text", help="encoder-decoders, --stack decoder or cross: the decoder's windows come from "
                   "[start] + this target's tokens (default: --text-file's)")
    p.add_argument("--data", choices=source_names(MODEL), default="real")
    p.add_argument("--text-file", help="UTF-8 text for real data (default: the bundled demo text)")
    p.add_argument("--radius", type=limit("radius"), default=None,
                   help="R for adversarial/search/synthetic inputs (default: observed on real data; 1 for synthetic)")
    p.add_argument("--search-steps", type=limit("search_steps"), default=DEFAULT_SEARCH_STEPS)
    p.add_argument("--search-start", choices=("random", "real"), default="random")
    p.add_argument("--d", type=limit("d"), default=None, help="synthetic: token dimension (default 16, or A's with --matrices)")
    p.add_argument("--attention", choices=ATTENTION_KINDS, default="softmax")
    p.add_argument("--norm-a", type=limit("norm_A"), default=None, help="synthetic: ||A||_2 of the random A (default 1)")
    p.add_argument("--norm-v", type=limit("norm_V"), default=None, help="synthetic: ||V||_2 of the random V (default 1)")
    p.add_argument("--matrices", metavar="FILE.npz",
                   help="synthetic: use these A and V (an .npz with arrays named A and V, both [d, d]) "
                        "instead of random ones")
    p.add_argument("--adversarial", action="store_true", help="synthetic: the lower-bound construction")
    p.add_argument("--lengths", default="8,16,32,64", help="comma-separated, or geom:LO:HI:COUNT")
    p.add_argument("--samples", type=limit("samples"), default=5)
    p.add_argument("--tol", type=limit("tol"), default=DEFAULT_TOL,
                   help="relative tolerance of the estimator, in (0, 1)")
    p.add_argument("--seed", type=limit("seed"), default=DEFAULT_SEED)
    p.add_argument("--csv", required=True, help="output CSV")
    p.add_argument("--device", type=device, default="cpu",
                   help="a model's sweep: cpu, cuda, cuda:N or mps (default cpu); a synthetic head runs on the CPU")
    p.add_argument("--devices", type=devices, dest="device", help=DEVICES_HELP)
    add_overwrite_argument(p)
    p.set_defaults(func=run)


def read_text_ids(loaded, text_file: str | None) -> list[int]:
    """Token ids of a UTF-8 text file (default: the bundled demo text) with the model's tokenizer."""
    from ..core.inputs import text_file_ids
    from ..paths import demo_text_path

    return text_file_ids(loaded, text_file or demo_text_path())


def stack_options(loaded, args) -> dict:
    """SweepSpec's stack and source_ids from --stack / --source-text: required for an encoder-decoder
    (--source-text for the decoder's stacks), refused in one line for other models."""
    if not loaded.config.is_encoder_decoder:
        for given, option in ((args.stack, "--stack"), (args.source_text, "--source-text"),
                              (args.target_text, "--target-text")):
            if given is not None:
                raise ValueError(f"{option}: {args.model_dir} is not an encoder-decoder; it has one stack of layers")
        return {}
    if args.stack is None:
        raise ValueError(f"{args.model_dir} is an encoder-decoder: choose --stack encoder, decoder or cross")
    if args.stack == "encoder":
        if args.source_text is not None or args.target_text is not None:
            raise ValueError("--stack encoder measures windows of --text-file through the encoder: --source-text "
                             "and --target-text are for --stack decoder or cross")
        return {"stack": "encoder"}
    if args.source_text is None:
        raise ValueError(f"--stack {args.stack}: give --source-text, the source whose encoder output the decoder reads")
    from ..app.whatif import text_ids  # only here: the other runs need none of What if's imports (~40 ms)

    return {"stack": args.stack, "source_ids": text_ids(loaded, args.source_text, "source")}


def check_sweep_memory(spec, lengths: list[int]) -> None:
    """core.lipschitz.check_sweep_memory in the option's words (before the model's inputs are read)."""
    from ..core.lipschitz.sweep import check_sweep_memory as check

    check(spec, lengths, what="--lengths")


# how the CLI's notes name its options (app.lipschitz.plan_lengths words the panel's controls otherwise)
CLI_WORDS = dict(samples_said="--samples {k}", one_each="one input at each length")


def run(args) -> int:
    import json
    import sys
    from pathlib import Path

    from ..app.lipschitz import plan_lengths
    from ..core import lipschitz as lip
    from ..core.files import check_output_file

    lengths = lip.parse_lengths(args.lengths)
    check_output_file(args.csv, args.overwrite)  # refused or unwritable now, not after the sweep
    if args.matrices and not args.synthetic:
        raise ValueError("--matrices gives the A and V of a synthetic head: use it with --synthetic")
    common = dict(lengths=lengths, samples=args.samples, radius=args.radius, tol=args.tol, seed=args.seed)
    if args.synthetic and args.device != "cpu":
        raise ValueError(f"--device {args.device}: a synthetic head runs on the CPU; --device is for a model's sweep")
    if args.synthetic:
        notes = plan_lengths(None, "adversarial" if args.adversarial else "random", lengths, None, args.samples,
                             function=lip.SYNTHETIC, **CLI_WORDS).notes
        matrices = None
        if args.matrices:
            if args.norm_a is not None or args.norm_v is not None:
                raise ValueError("--norm-a and --norm-v scale random matrices; they do not apply with --matrices")
            matrices = lip.load_matrices(args.matrices)
            d = matrices[0].shape[0]
            if args.d is not None and args.d != d:
                raise ValueError(f"{args.matrices}: A and V are {d}x{d} but --d is {args.d}")
        options = dict(function=lip.SYNTHETIC, data="adversarial" if args.adversarial else "random", d=args.d,
                       norm_A=args.norm_a, norm_V=args.norm_v, matrices=matrices,
                       matrices_name=Path(args.matrices).name if args.matrices else "", attention=args.attention,
                       masked=bool(args.masked), **common)
    else:
        if not args.model_dir:
            raise ValueError("give a MODEL_DIR, or --synthetic")
        from . import load_model

        loaded = load_model(args.model_dir, dtype=args.dtype, device=args.device)
        model = loaded.model.float().eval()
        stack = stack_options(loaded, args)
        ids = None
        if stack.get("stack") in ("decoder", "cross") and args.target_text is not None:
            from ..app.whatif import decoder_input

            ids = decoder_input(loaded, args.target_text, cut=False)  # too long: refused, as trace does
        elif args.data == "real" or args.text_file or (args.data == "search" and args.search_start == "real"):
            ids = read_text_ids(loaded, args.text_file)
        elif loaded.tokenizer is not None:
            try:
                ids = read_text_ids(loaded, None)  # the demo text sets the default radius
            except (OSError, ValueError):
                ids = None
        # what real windows are read from, named in the label as the panel names it (sweep_label)
        data_name = Path(args.text_file).name if args.text_file else "demo text"
        target = stack.get("stack") in ("decoder", "cross") and args.target_text is not None
        if target:
            data_name = "target"
        # the lengths this text can fill, as the panel decides them (app.lipschitz.plan_lengths)
        where = "the target" if target else Path(args.text_file).name if args.text_file else "the demo text"
        plan = plan_lengths(loaded.config, args.data, lengths, ids, args.samples, search_start=args.search_start,
                            where=where, **CLI_WORDS, longer=f"give a longer {'--target-text' if target else '--text-file'}")
        lengths, notes = plan.lengths, plan.notes
        options = dict(function=lip.MODEL, data=args.data, model=model, layer=args.layer, head=args.head,
                       masked=args.masked, token_ids=ids, data_name=data_name, search_steps=args.search_steps,
                       search_start=args.search_start, **stack, **common)
    options["lengths"] = lengths
    spec = lip.build_sweep_spec(options)
    for note in notes:  # said, as the panel says them
        print(f"note: {note}", file=sys.stderr)

    def show(res, _result) -> None:
        import statistics  # np.median imports numpy.ma (~40 ms of the run's start-up)

        print(f"n={res.n}: median {statistics.median(res.lipschitz.tolist()):.6g} over {len(res.lipschitz)} inputs, "
              f"radius {res.radius.max():.4g}, iterations {int(res.iterations.max())}", flush=True)

    check_sweep_memory(spec, lengths)
    result = lip.run_sweep(spec, on_length=show)
    check_output_file(args.csv, overwrite=True)  # checked at the start; still not a link or a special file
    lip.save_csv(args.csv, result)
    sys.stdout.flush()
    summary = {"exponent": float(result.exponent), "exponent_ci": [float(x) for x in result.exponent_ci],
               "prefactor": float(result.prefactor), "function": result.function, "label": result.label,
               "csv": args.csv, "rows": len(result.rows())}
    from ..core.files import strict_json

    print(json.dumps(strict_json(summary), allow_nan=False))
    return 0
