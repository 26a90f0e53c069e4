"""`python -m desktop_app bench lipschitz MODEL_DIR [--layer L] [--text-file F] [--lengths ...] [--samples K]`

A real-data sweep (default n = 8..256, 5 windows each, one layer): our estimator (core.lipschitz.
run_sweep: batched Golub-Kahan-Lanczos, closed-form products, tol 1e-4) against the
paper's procedure re-implemented here through core.lipschitz.power_iteration (each input
separately, power iteration on J^T J through the layer's attention module, one jvp and one vjp
per iteration, stop when the estimate changes by less than 1e-4, at most 100 iterations), on the
same inputs. The reference is made as fast as that procedure allows, so as not to flatter ours:
per input, torch.func.vjp builds J^T u once and a vjp of it gives J v, so no iteration repeats the
forward pass (see power_iteration). ours_s includes building the inputs (model forward passes);
reference_s does not. Numbers that are undefined (e.g. no input small enough for the exact check)
are null in the JSON.
"""
from __future__ import annotations

import argparse
import time


RANDOM_GPT2 = "gpt2-small-random"


def _load(model_dir: str):
    from ..core.checkpoints import LoadedModel, load_model_folder, new_model
    from ..core.config import ModelConfig
    from ..paths import demo_model_dir

    if model_dir != RANDOM_GPT2:
        return load_model_folder(model_dir)
    tokenizer = load_model_folder(demo_model_dir()).tokenizer  # its ids (< 768) are valid GPT-2 ids
    cfg = ModelConfig.gpt2(vocab_size=50257, d_model=768, n_layers=12, n_heads=12, d_ff=3072, context_length=1024)
    return LoadedModel(new_model(cfg, seed=0).eval(), cfg, tokenizer, None, RANDOM_GPT2)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench lipschitz")
    p.add_argument("model_dir", help=f"model folder, or {RANDOM_GPT2!r}: a randomly initialised GPT-2-small-sized "
                                       "model (124M; the paper measures a random GPT-2 layer 6) with the demo tokenizer")
    p.add_argument("--layer", type=int, default=0)
    p.add_argument("--text-file", help="UTF-8 text (default: the bundled demo text)")
    p.add_argument("--lengths", default="8,16,32,64,128,256")
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    p.add_argument("--accuracy-matched", action="store_true",
                   help="also time power iteration run to a 1e-7 change (up to 3000 iterations), i.e. to an "
                        "accuracy comparable with ours, and report that speedup too")
    return p


def main(argv: list[str]) -> dict:
    import numpy as np
    import torch

    from ..core import lipschitz as lip
    from ..core.lipschitz import strict_json
    from ..core.inputs import text_file_ids
    from ..paths import demo_text_path

    args = _parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = _load(args.model_dir)
    model = loaded.model.float().eval()
    ids = text_file_ids(loaded, args.text_file or demo_text_path())
    lengths = lip.parse_lengths(args.lengths)
    spec = lip.SweepSpec(data="real", model=model, layer=args.layer, token_ids=ids, lengths=lengths,
                         samples=args.samples, tol=1e-4)

    with torch.no_grad():
        lip.run_sweep(lip.SweepSpec(data="real", model=model, layer=args.layer, token_ids=ids,
                                    lengths=lengths[:1], samples=1))  # warm-up, not timed
        t0 = time.perf_counter()
        ours = lip.run_sweep(spec)
        ours_s = time.perf_counter() - t0

    fn = lip.module_function(model, args.layer)
    starts = lip.window_starts(len(ids), lengths[-1], args.samples)
    # warm-up, not timed (as for ours): the first torch.func transform of a session costs ~1-2 s once
    lip.power_iteration(fn, lip.real_inputs(model, ids, args.layer, lengths[0], 1, starts[:1])[0], max_iter=2)
    ref_vals, ref_iters, ref_s = [], [], 0.0
    for n in lengths:
        X = lip.real_inputs(model, ids, args.layer, n, args.samples, starts)
        for x in X:
            t0 = time.perf_counter()
            sigma, it = lip.power_iteration(fn, x, tol=1e-4, max_iter=100)
            ref_s += time.perf_counter() - t0
            ref_vals.append(sigma)
            ref_iters.append(it)
    # Both procedures return lower estimates of sigma_max (Rayleigh quotients), so where they differ
    # the larger is the closer; where the Jacobian is small enough, compare both with the exact norm.
    exact_rel_ours, exact_rel_ref = [], []
    i = 0
    for n in lengths:
        X = lip.real_inputs(model, ids, args.layer, n, args.samples, starts)
        if n * model.cfg.d_model <= 2048:
            exact = lip.exact_jacobian_norm(fn, X).double().numpy()
            ours_n = np.array([r[2] for r in ours.rows() if r[0] == n])
            exact_rel_ours += list(np.abs(ours_n - exact) / exact)
            exact_rel_ref += list(np.abs(np.array(ref_vals[i:i + len(X)]) - exact) / exact)
        i += len(X)
    our_vals = np.array([row[2] for row in ours.rows()])
    extra = {}
    if args.accuracy_matched:
        tight_vals, tight_s = [], 0.0
        for n in lengths:
            for x in lip.real_inputs(model, ids, args.layer, n, args.samples, starts):
                t0 = time.perf_counter()
                tight_vals.append(lip.power_iteration(fn, x, tol=1e-7, max_iter=3000)[0])
                tight_s += time.perf_counter() - t0
        tight_vals = np.array(tight_vals)
        extra = {"reference_tight_s": round(tight_s, 4), "speedup_at_matched_accuracy": round(tight_s / ours_s, 2),
                 "max_rel_diff_vs_tight_reference": float(np.max(np.abs(our_vals - tight_vals) / tight_vals))}
    our_iters = np.array([row[6] for row in ours.rows()])
    ref_vals = np.array(ref_vals)
    rel = np.abs(our_vals - ref_vals) / np.abs(ref_vals)
    out = {"name": "lipschitz", "ours_s": round(ours_s, 4), "reference_s": round(ref_s, 4),
           "speedup": round(ref_s / ours_s, 2), "max_rel_diff": float(rel.max()),
           "inputs": int(len(ref_vals)), "lengths": lengths, "layer": args.layer,
           "ours_mean_iterations": float(our_iters.mean()), "reference_mean_iterations": float(np.mean(ref_iters)),
           "reference_hit_max_iter": int(np.sum(np.array(ref_iters) >= 100)),
           "ours_above_reference": int(np.sum(our_vals > ref_vals)),
           "exact_checked_inputs": len(exact_rel_ours),
           "exact_max_rel_err_ours": float(max(exact_rel_ours, default=float("nan"))),
           "exact_max_rel_err_reference": float(max(exact_rel_ref, default=float("nan"))),
           "exponent": ours.exponent, "exponent_ci": list(ours.exponent_ci), **extra}
    return strict_json(out)

