"""`python -m desktop_app dynamics`: tokens as particles under attention (core.dynamics).

    dynamics --attention softmax|l2|sinkhorn --d D --n N [--sphere] [--init sphere|ball|gaussian|clusters]
             [--variances 4,1,1] [--qkv identity|random [--norm-qk a] [--norm-v v]] [--matrices QKV.npz]
             [--integrator euler|rk4] --dt DT --steps S --seed K --csv OUT.csv [--positions OUT.npz]
    dynamics --model MODEL_DIR --layer L --head H [--stack encoder|decoder] ...   (a head of a model)

--model takes Q, K, V from one head of a model (A = W_K^T W_Q / sqrt(d_head), V = W_O W_V; d is its width).
An encoder-decoder's head names its stack: --stack encoder (its self-attention) or decoder (its causal
self-attention); cross-attention has no dynamics of its own (its keys are the encoder's output, fixed).

One CSV row per recorded time (columns core.dynamics.CSV_COLUMNS: t, clusters, radius,
radius_bound, mean_cosine, w2), written atomically; the last line printed is one JSON object with
final_clusters and max_radius_over_bound (and the final mean cosine and W2).
"""
from __future__ import annotations

from . import MODEL_HELP, Progress
from .args import Number, add_overwrite_argument, int_in, positive_int


def add_parser(sub) -> None:
    from ..core.dynamics import ATTENTION_KINDS, INTEGRATORS, LIMITS, STACKS

    def limit(name):  # each number's range, declared once (DynamicsConfig checks them too)
        return Number.of(LIMITS[name])

    p = sub.add_parser("dynamics", help="tokens as particles: simulate the attention flow (CSV + JSON)")
    p.add_argument("--attention", choices=ATTENTION_KINDS, default="softmax")
    p.add_argument("--d", type=limit("d"), default=None, help="dimension of the tokens (default 3, or V's with --matrices)")
    p.add_argument("--n", type=limit("n"), default=256, help="number of particles (default 256)")
    p.add_argument("--sphere", action="store_true", help="LayerNorm variant: particles on the unit sphere")
    p.add_argument("--init", choices=("sphere", "ball", "gaussian", "clusters"), default="sphere")
    p.add_argument("--init-radius", type=limit("init_radius"), default=1.0, help="radius of the initial sphere/ball (gaussian: std)")
    p.add_argument("--variances", metavar="V1,V2,...",
                   help="--init gaussian: the covariance's diagonal (one number: the same on every axis), "
                        "or its d rows separated by ';' (\"2 0.5 0; 0.5 1 0; 0 0 1\")")
    p.add_argument("--clusters-k", type=limit("n_clusters"), default=3, help="--init clusters: how many")
    p.add_argument("--qkv", choices=("identity", "random"), default="identity")
    p.add_argument("--norm-qk", type=limit("norm_qk"), default=1.0, help="--qkv random: ||Q||_2 = ||K||_2")
    p.add_argument("--norm-v", type=limit("norm_v"), default=1.0, help="--qkv random: ||V||_2")
    p.add_argument("--matrices", metavar="FILE.npz",
                   help="Q, K, V (or A and V, softmax only) from numpy.savez(path, Q=Q, K=K, V=V) instead of --qkv")
    p.add_argument("--model", metavar="MODEL_DIR", help="Q, K, V from a head of this model (" + MODEL_HELP + ")")
    p.add_argument("--layer", type=int_in(0, 10**6), default=0, help="--model: the head's layer (default 0)")
    p.add_argument("--head", type=int_in(0, 10**6), default=0, help="--model: the head (default 0)")
    p.add_argument("--stack", choices=STACKS,
                   help="--model an encoder-decoder: the encoder's or the decoder's self-attention (required there)")
    p.add_argument("--time-dependent", type=limit("amplitude"), default=0.0, metavar="AMPLITUDE",
                   help="V(t) = (1 + a sin t) V, Q(t), K(t) = (1 + a cos t) Q, K (a in [0, 1]; default 0: off)")
    p.add_argument("--renormalise", action="store_true", help="measure clusters on z = exp(-tV) x")
    p.add_argument("--integrator", choices=INTEGRATORS, default="euler")
    p.add_argument("--dt", type=limit("dt"), default=0.1)
    p.add_argument("--steps", type=int_in(0, 10**7), default=100)
    p.add_argument("--record-every", type=positive_int, default=1, help="a CSV row every this many steps (and the last)")
    p.add_argument("--cluster-tol", type=limit("cluster_tol"), default=0.05,
                   help="same cluster when closer than this times the largest |position| (default 0.05)")
    p.add_argument("--perturbation", type=limit("perturbation"), default=1e-3,
                   help="noise of the twin run for the W2 curve (0: no twin, w2 empty)")
    p.add_argument("--seed", type=limit("seed"), default=0)
    p.add_argument("--csv", required=True, help="output CSV")
    p.add_argument("--positions", metavar="OUT.npz", help="also write the initial and final positions (x0, x, t)")
    add_overwrite_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import io
    import os
    import json
    import sys
    from pathlib import Path

    import numpy as np

    from ..app.dynamics import dynamics_setup
    from ..core import dynamics as dy
    from ..core.files import atomic_write_bytes, atomic_write_text, check_output_file, strict_json

    model = None
    if args.model:
        from . import load_model

        loaded = load_model(args.model)
        if loaded.config.is_encoder_decoder and args.stack is None:
            raise ValueError(f"{args.model} is an encoder-decoder: choose --stack encoder or decoder (its "
                             "self-attention; cross-attention has no dynamics of its own)")
        if args.stack is not None and not loaded.config.is_encoder_decoder:
            raise ValueError(f"--stack: {args.model} is not an encoder-decoder; it has one stack of layers")
        model = loaded.model.float().eval()
    elif args.layer or args.head:
        raise ValueError("--layer and --head pick a head of --model: give --model too")
    cfg, head = dynamics_setup(args.attention, args.d, args.n, args.init, matrices=args.matrices, model=model,
                               model_layer=args.layer, model_head=args.head, stack=args.stack,
                               variances=args.variances or None, steps=args.steps, qkv=args.qkv,
                               norm_v=args.norm_v, amplitude=args.time_dependent, dt=args.dt,
                               perturbation=args.perturbation, integrator=args.integrator,
                               init_radius=args.init_radius, n_clusters=args.clusters_k, norm_qk=args.norm_qk,
                               sphere=args.sphere, renormalise=args.renormalise, seed=args.seed,
                               cluster_tol=args.cluster_tol)
    d = cfg.d
    if args.positions and os.path.abspath(args.positions) == os.path.abspath(args.csv):
        raise ValueError(f"--positions {args.positions} is the --csv file too; give two names")
    check_output_file(args.csv, args.overwrite)  # refused or unwritable now, not after the run
    if args.positions:
        check_output_file(args.positions, args.overwrite)
    sim = dy.run(cfg, args.steps, head=head, record_every=args.record_every,
                 job=Progress("step", args.steps, counts_checks=True))
    check_output_file(args.csv, overwrite=True)  # checked at the start; still not a link or a special file
    atomic_write_text(Path(args.csv), dy.csv_text(sim.records))
    if args.positions:
        buf = io.BytesIO()
        np.savez(buf, x0=sim.x0.double().numpy(), x=sim.x.double().numpy(), shown=sim.shown().numpy(),
                 t=np.array(sim.t))
        check_output_file(args.positions, overwrite=True)
        atomic_write_bytes(Path(args.positions), buf.getvalue())
    last = sim.records[-1]
    print(f"{sim.head.name}, {cfg.attention} attention, n = {sim.config.n}, d = {d}, {cfg.integrator} dt = {cfg.dt}: "
          f"t = {last.t:g}, {last.clusters} cluster(s), mean cosine {last.mean_cosine:.4f}, "
          f"radius {last.radius:.4g} <= R(t) = {last.radius_bound:.4g}", flush=True)
    sys.stdout.flush()
    summary = {"final_clusters": last.clusters,
               "max_radius_over_bound": max(r.radius / r.radius_bound for r in sim.records),
               "final_mean_cosine": last.mean_cosine, "final_w2": last.w2,  # NaN without the twin run: null
               "t": last.t, "rows": len(sim.records), "csv": args.csv}
    print(json.dumps(strict_json(summary), allow_nan=False))
    return 0
