"""`python -m desktop_app features MODEL_DIR --sae DIR (--text T | --ids I) --out F.npz`
`python -m desktop_app features MODEL_DIR --sae DIR --top-contexts FILE --feature K --csv OUT.csv`

A sparse dictionary's features (core.features) on a text: --out writes an .npz with `acts` [T, d_sae]
(float32, every feature, dense), `recon` [T, d_out] and `ids`; the last line printed is one JSON object
with hook, l0 (mean active features per token), variance_explained and tokens. With --top-contexts the
feature --feature's top-activating contexts over a text file are written to --csv (rank, activation,
token_index, token, left, right); its last line is a JSON object with the feature, tokens seen and density;
a long file's progress and the time left go to stderr every few seconds.

An encoder-decoder's dictionary names its stack (encoder.blocks.L.*, decoder.blocks.L.*): --text is the source;
a decoder hook reads [start] + --target-text (the start token alone without it), and its rows are those tokens.
"""
from __future__ import annotations

from . import MODEL_HELP, Progress, add_special_tokens_argument
from .args import add_overwrite_argument, count, int_in, positive_int


def add_parser(sub) -> None:
    p = sub.add_parser("features", help="a sparse dictionary's (SAE, transcoder) features on a text (.npz) or a "
                                        "feature's top contexts over a file (CSV)")
    p.add_argument("model_dir", help=MODEL_HELP)
    p.add_argument("--sae", required=True, metavar="DIR",
                   help="dictionary folder: SAELens' cfg.json + sae_weights.safetensors, or Gemma Scope's params.npz")
    p.add_argument("--hook", help="the activation it reads, when its files do not say (e.g. blocks.2.hook_resid_post)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--text")
    g.add_argument("--ids", help="comma-separated token ids")
    g.add_argument("--top-contexts", metavar="FILE", help="a UTF-8 text file: write --feature's top contexts in it")
    p.add_argument("--target-text", metavar="TGT", help="an encoder-decoder: the target its decoder reads after its "
                                                        "start token (decoder hooks; default: none)")
    add_special_tokens_argument(p)
    p.add_argument("--out", help="output .npz (with --text / --ids)")
    p.add_argument("--feature", type=count, help="the feature (with --top-contexts)")
    p.add_argument("--top", type=int_in(1, 100_000), default=20, help="how many contexts (default 20)")
    p.add_argument("--window", type=positive_int, help="tokens per window read (default: the model's context, "
                                                       "at most 256)")
    p.add_argument("--csv", help="output CSV (with --top-contexts)")
    add_overwrite_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import json

    from . import load_model
    from ..app.features import open_dictionary
    from ..core.files import check_output_file

    if args.top_contexts is not None:
        if args.feature is None or not args.csv:
            raise ValueError("--top-contexts needs --feature K and --csv OUT.csv")
        if args.out:
            raise ValueError("--out goes with --text / --ids; --top-contexts writes --csv")
        check_output_file(args.csv, args.overwrite)
    else:
        if not args.out:
            raise ValueError("give --out F.npz for the features of --text / --ids")
        if args.csv or args.feature is not None:
            raise ValueError("--csv and --feature go with --top-contexts")
        check_output_file(args.out, args.overwrite)
    loaded = load_model(args.model_dir, special_tokens=args.special_tokens)
    if args.target_text is not None:
        if not loaded.config.is_encoder_decoder:
            raise ValueError(f"--target-text: {args.model_dir} is not an encoder-decoder; it reads one text "
                             "(--text / --ids)")
        if args.top_contexts is not None:
            raise ValueError("--target-text goes with --text / --ids (--top-contexts reads its file as sources)")
    attached = open_dictionary(args.sae, loaded, hook=args.hook)
    if args.top_contexts is not None:
        from ..app.features import dashboard
        from .attribute import write_csv
        from ..core.features.contexts import CONTEXT_COLUMNS

        if args.window is not None and args.window > loaded.config.context_length:
            raise ValueError(f"--window {args.window}: the model reads at most {loaded.config.context_length} tokens")
        tc = dashboard(loaded, attached, args.top_contexts, args.feature, top=args.top, window=args.window,
                       job=Progress("window"))  # a long file says how far it is and how long is left
        write_csv(args.csv, CONTEXT_COLUMNS, tc.rows)
        print(json.dumps({"csv": args.csv, "hook": attached.hook, "feature": tc.feature, "tokens": tc.tokens_seen,
                          "active_tokens": tc.active_tokens, "density": tc.density, "rows": len(tc.rows)}))
        return 0
    from . import input_ids
    from ..app.features import features_on
    from ..core.files import atomic_write_bytes
    import io
    from pathlib import Path

    import numpy as np

    ids = input_ids(loaded, args.text, args.ids)
    decoder_ids = None
    if loaded.config.is_encoder_decoder:
        from ..app.whatif import decoder_input

        decoder_ids = decoder_input(loaded, args.target_text or "", None, cut=False)
    run_ = features_on(loaded, ids, [attached], decoder_ids=decoder_ids)[0]
    if attached.read.stack == "decoder":
        ids = decoder_ids  # the rows are the decoder's input
    buf = io.BytesIO()
    np.savez(buf, acts=run_.acts.cpu().numpy().astype(np.float32), recon=run_.recon.cpu().numpy().astype(np.float32),
             ids=np.asarray(ids, dtype=np.int64))
    check_output_file(args.out, overwrite=True)  # checked at the start; still not a link or a special file
    atomic_write_bytes(Path(args.out), buf.getvalue())
    print(json.dumps({"out": args.out, "hook": attached.hook, "tokens": len(ids), "d_sae": attached.dictionary.d_sae,
                      "l0": run_.mean_l0, "variance_explained": run_.variance_explained}))
    return 0


def run_train_sae(args) -> int:
    """`train --task sae|transcoder|clt --model MODEL_DIR [--hook H] --text-file T --out DIR ...`: core.training.sae, printing
    its events (every one as a JSON line with --jsonl); the last line is one JSON object with the held-out
    step, mse, l0, variance_explained and dead features. Driven as model runs are (commands.train.take_control:
    --control-stdin's pause / resume / stop, SIGTERM and Ctrl-C stop with a checkpoint); `--resume` goes on
    from the checkpoint in --out with its own settings and the flags given here on top."""
    import json
    import signal
    import threading

    from . import load_model
    from .control import take_control
    from ..core.files import check_output_folder
    from ..core.training import TrainControl
    from ..core.training.sae import SAE_STATE_FILE, resumed_sae_config, sae_config_from, train_sae

    if getattr(args, "precision", None) not in (None, "float32"):  # not silently ignored
        raise ValueError(f"--precision {args.precision}: a sparse dictionary trains in float32 here (its weights "
                         "and the model's activations read in float32); drop --precision")
    values = dict(vars(args))
    if values.get("device") in (None, "auto"):
        values["device"] = "cpu"
    check_output_folder(args.out, overwrite=args.overwrite, resume=args.resume, marker=SAE_STATE_FILE,
                        what="dictionary")
    if args.resume:
        model_dir, cfg = resumed_sae_config(args.out, values, set(getattr(args, "given", None) or ()))
    else:
        model_dir, cfg = sae_config_from(values)
    loaded = load_model(model_dir, device=cfg.device)
    loaded.model.eval()
    lock = threading.Lock()
    control = TrainControl()

    def on_event(ev: dict) -> None:
        with lock:
            if args.jsonl:
                print(json.dumps(ev), flush=True)
            elif ev["event"] == "eval":
                line = (f"step {ev['step']}: held-out variance_explained {ev['variance_explained']:.4f} "
                        f"l0 {ev['l0']:.1f} mse {ev['mse']:.4g} dead {ev['dead']}")
                if "variance_explained_per_layer" in ev:  # a transcoder at every layer
                    line += (" | per layer: variance_explained "
                             + " ".join(f"{v:.3f}" for v in ev["variance_explained_per_layer"])
                             + ", l0 " + " ".join(f"{v:.1f}" for v in ev["l0_per_layer"]))
                    if ev.get("replacement_score") is not None:
                        line += f" | replacement_score {ev['replacement_score']:.4f}"
                print(line, flush=True)
            elif ev["event"] == "start":
                what = {"transcoder": "per-layer transcoder", "clt": "cross-layer transcoder"}.get(ev["task"])
                what = f"{what} of {ev['d_sae']} features per layer" if what else f"dictionary of {ev['d_sae']} features"
                print("".join(f"{note}\n" for note in ev.get("notes", ())) +
                      f"{'resuming' if ev.get('resumed') else 'training'} a {ev['architecture']} {what} "
                      f"on {ev['hook']} from step {ev['step']} ({ev['tokens']:,} tokens, "
                      f"{ev['heldout_tokens']:,} held out), to {ev['out']}", flush=True)
            elif ev["event"] == "stopped":
                print(f"stopped at step {ev['step']}; go on with --resume --out {ev.get('out') or args.out}",
                      flush=True)

    previous = take_control(args, control)
    try:
        summary, _ = train_sae(cfg, loaded, args.out, on_event=on_event, control=control, resume=args.resume)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    layered = {k: summary[k] for k in ("variance_explained_per_layer", "l0_per_layer", "replacement_score")
               if k in summary}  # a transcoder at every layer (--task transcoder, clt)
    print(json.dumps({"step": summary.get("step"), "mse": summary.get("mse"), "l0": summary.get("l0"),
                      "variance_explained": summary.get("variance_explained"), "dead": summary.get("dead"),
                      **layered, "out": args.out}), flush=True)
    return 0
