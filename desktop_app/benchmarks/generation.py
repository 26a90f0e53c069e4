"""Per-token latency of greedy generation with full recording vs transformers' generate.

    python -m desktop_app bench generation [--new 64] [--prompt 8] [--repeat 2] [--dtype float32|bfloat16]
                                           [--device cpu] [--no-record] [--threads N] [--host]

Both sides run the same randomly initialised GPT-2-small-sized model (124M parameters, written by
transformers and loaded here), greedy, with a KV cache, batch 1. Ours records every step (each
layer's attention row and the new token's residuals) so that each step can be inspected later.
Both timings include the prompt's forward; per-token = total / new tokens; fastest of `repeat`
alternating runs (and the median of the paired ratios). Both make the prompt's forward and N - 1
one-token forwards: generate never feeds its last token, and the session makes that forward (its
records and next-token logits) only when something reads them (GenerationSession.settle), which here
nothing does.

Batch-1 decoding reads every weight once per token, so weight bytes / memory bandwidth is a lower
bound on the time per token; the bandwidth is measured here with a large tensor copy (in 4 KB pages and in
huge pages, the faster kept: a float32 step's weights are in huge pages) and the fraction of that bound
reached is printed (1.0 would be perfect). bfloat16 halves the bytes.
Where the rest goes: the step's matrix products alone (step_products) are timed alongside, so the
report splits the gap into what the BLAS kernels reach (products_alone_fraction_of_bandwidth_bound)
and what everything else adds (ours_over_products_alone, one ratio per repeat).

--host measures the step's host overhead instead (the Python and dispatch work per token that a GPU
exposes: on the first GPU run the card was busy 2.2 ms of a 24 ms step): two models of real depth and
tiny width, whose products cost next to nothing, so a step's time is its host work: the Qwen2.5-0.5B
shape's 24 layers with its 14 query and 2 key/value heads, and GPT-2 small's 12 layers, both at d_model
64, d_ff 128, a vocabulary of 256. For each, against transformers' generate in the same process: ms per
token (alternating runs, least of each), top-level aten ops per token (torch.profiler: each is a dispatch,
on a GPU a launch) and Python per token (cProfile: function calls, and the time spent in Python code
itself, not in the C functions it calls; profiled, so slower than unprofiled, the same for both sides).
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from ..commands.args import OneLineParser, int_in
from ..commands.args import device as device_name


def measure_bandwidth(n_bytes: int = 512 << 20, repeat: int = 5, device: str = "cpu", huge_pages: bool = False) -> float:
    """Bytes per second of a large copy on `device` (each byte read once and written once): the
    bound a batch-1 decoding step is measured against is the memory of the device that runs it
    (on CUDA the card's, ~2.8 TB/s on an H100, not the host's). huge_pages: on the CPU, both buffers in
    transparent huge pages where the system gives them (core/model.huge_page_buffer, where a float32 step's
    weights are: the same copy ran 1.3-1.8x faster there than in 4 KB pages, 2-core AMD EPYC [load 4-6])."""
    import torch

    from ..core.model import huge_page_buffer

    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    on_cpu = torch.device(device).type == "cpu"
    src = huge_page_buffer(n_bytes // 4, torch.float32) if huge_pages and on_cpu else None
    if src is None:
        src = torch.ones(n_bytes // 4, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
    else:
        src.fill_(1)
        dst = huge_page_buffer(n_bytes // 4, torch.float32)
    dst.copy_(src)  # touch the pages first
    sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        dst.copy_(src)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n_bytes / best


def weight_bytes_per_token(model) -> int:
    """Bytes one decoding step must read: every weight matrix once; of the token and position
    tables only one row each (a tied unembedding still reads the whole table once)."""
    total = 0
    seen = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    cfg = model.cfg
    if not (cfg.lm_head and cfg.tie_embeddings):
        total -= model.tok_embed.weight.numel() * model.tok_embed.weight.element_size()
    if cfg.positions == "learned":
        total -= model.pos_embed.weight.numel() * model.pos_embed.weight.element_size()
    return total


def step_products(model):
    """A function doing only the matrix products of one decoding step (every block's Q/K/V, output,
    MLP weights and the unembedding, each times one row): the time a step would take with no
    norms, attention, cache writes, recording or Python around them. Ours over this is the
    step's overhead; this over the bandwidth bound is what the BLAS kernels themselves reach."""
    import torch

    from ..core import model as model_module

    groups = []  # (owner, the nn.Linear layers multiplied as one): each as the step does (model.products)
    for block in model.blocks:
        attn = block.attn
        groups += [(attn, (attn.q, attn.k, attn.v)), (attn.o, (attn.o,))]
        mlps = [block.mlp]
        if hasattr(block.mlp, "router"):  # a mixture: the router and as many experts as a token runs (core/moe.py)
            groups.append((block.mlp.router, (block.mlp.router,)))
            mlps = block.mlp.mlps()[:block.mlp.k] + ([block.mlp.shared_expert] if block.mlp.shared_expert else [])
        for mlp in mlps:
            groups.append((mlp, (mlp.gate, mlp.up)) if hasattr(mlp, "gate") else (mlp.up, (mlp.up,)))
            groups.append((mlp.down, (mlp.down,)))
    if model.cfg.lm_head:
        groups.append((model.lm_head, (model.lm_head,)))
    rows = {lin.in_features: torch.randn(1, lin.in_features, dtype=lin.weight.dtype, device=lin.weight.device)
            for _, linears in groups for lin in linears}

    def run() -> None:
        with torch.inference_mode():
            for owner, linears in groups:
                model_module.products(owner, rows[linears[0].in_features], linears)
    return run


def greedy_runs(ours, ref, prompt: list[int], new: int, record: bool, device):
    """(ours, transformers'): functions generating `new` greedy tokens after `prompt` with a KV cache, batch 1,
    each returning the ids. Ours records every step unless told not to, and leaves the forward of its last
    token for a read that never comes (GenerationSession.run(lazy_last=True)): both sides make the prompt's
    forward and new - 1 one-token ones."""
    import torch

    from ..core.generation import GenerationSession, GenerationSettings

    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)

    def run_ours() -> list[int]:
        s = GenerationSession(ours, prompt, GenerationSettings("greedy"), stop_tokens=[], record=record)
        for _ in s.run(new, lazy_last=True):  # generate's forwards: none for the last token
            pass
        sync()
        return s.ids()

    def run_ref() -> list[int]:
        with torch.no_grad():
            out = ref.generate(torch.tensor([prompt], device=device), max_new_tokens=new,
                               min_new_tokens=new, do_sample=False, num_beams=1, use_cache=True,
                               pad_token_id=0)
        sync()
        return out[0].tolist()
    return run_ours, run_ref


def alternating(fns, repeat: int) -> list[list[float]]:
    """Seconds of each of `fns` over `repeat` rounds, run in turn within each round (both sides see the same
    load); warm them up first."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, kept in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            kept.append(time.perf_counter() - t0)
    return times


def median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


def aten_ops(fn) -> int:
    """Top-level aten ops (each a dispatch; on a GPU, one launch at most) that fn() calls, by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.cpu_parent is None and e.name.startswith("aten::"))


def python_work(fn) -> tuple[int, float]:
    """(function calls, seconds in Python code itself) of fn() under cProfile: the calls of Python functions
    and C functions alike; the time of Python functions' own lines, not of the C functions they call
    (tensor ops: aten_ops counts those)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (primitive calls, calls, own time, cumulative, callers)
    calls = sum(v[1] for v in stats.values())
    own = sum(v[2] for (file, _, _), v in stats.items() if file != "~")  # "~": built-in (C) functions
    return calls, own


# --host: the real depths and head counts at a width that makes the products free (module docstring)
HOST_WIDTH = dict(d_model=64, d_ff=128, vocab=256)


def host_models(width: dict = HOST_WIDTH) -> dict:
    """name -> (transformers' config, its causal-LM class) of the host-overhead models."""
    import transformers

    d, ff, vocab = width["d_model"], width["d_ff"], width["vocab"]
    no_specials = dict(bos_token_id=None, eos_token_id=None)
    return {
        # Qwen2.5-0.5B: 24 layers, 14 query heads over 2 key/value heads (head_dim 8 here: the heads' count is
        # what costs host work, not their width)
        "qwen2.5-0.5b-depth": (transformers.Qwen2Config(vocab_size=vocab, hidden_size=d, intermediate_size=ff,
                                                        num_hidden_layers=24, num_attention_heads=14,
                                                        num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
                                                        pad_token_id=None, **no_specials),
                               transformers.Qwen2ForCausalLM),
        # GPT-2 small: 12 layers (4 heads of 16 here)
        "gpt2-depth": (transformers.GPT2Config(vocab_size=vocab, n_embd=d, n_inner=ff, n_layer=12, n_head=4,
                                               **no_specials),
                       transformers.GPT2LMHeadModel),
    }


def host_overhead(args, device, dtype) -> dict:
    """--host (module docstring): per model, ours against transformers' generate in the same process."""
    import torch

    from ..core.checkpoints import load_model_folder

    results = {}
    for name, (config, causal_lm) in host_models().items():
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / name
            torch.manual_seed(0)
            causal_lm(config).save_pretrained(folder)
            ours = load_model_folder(folder, device=device, dtype=args.dtype)
            ref = causal_lm.from_pretrained(folder, dtype=dtype).to(device).eval()
        prompt = torch.randint(0, config.vocab_size, (args.prompt,),
                               generator=torch.Generator().manual_seed(1)).tolist()
        run_ours, run_ref = greedy_runs(ours, ref, prompt, args.new, not args.no_record, device)
        same_ids = run_ours() == run_ref()
        ours_times, ref_times = alternating([run_ours, run_ref], args.repeat)
        n = args.new  # forwards a run makes: the prompt's and new - 1 one-token ones, on both sides
        ours_ops, ref_ops = aten_ops(run_ours) / n, aten_ops(run_ref) / n
        (ours_calls, ours_py), (ref_calls, ref_py) = python_work(run_ours), python_work(run_ref)
        results[name] = {
            "layers": config.num_hidden_layers,
            "ours_ms_per_token": round(min(ours_times) / n * 1e3, 4),
            "reference_ms_per_token": round(min(ref_times) / n * 1e3, 4),
            "speedup": round(min(ref_times) / min(ours_times), 3),
            "speedup_median_of_pairs": round(median([r / o for o, r in zip(ours_times, ref_times)]), 3),
            "ours_aten_ops_per_token": round(ours_ops, 1),
            "reference_aten_ops_per_token": round(ref_ops, 1),
            "ours_python_calls_per_token": round(ours_calls / n, 1),
            "reference_python_calls_per_token": round(ref_calls / n, 1),
            "ours_python_ms_per_token": round(ours_py / n * 1e3, 4),
            "reference_python_ms_per_token": round(ref_py / n * 1e3, 4),
            "same_ids_as_reference": same_ids,
        }
    return {
        "name": "generation_host",
        "unit": "per token (prompt forward included, total / new tokens); speedup = transformers' time / ours",
        "models": results,
        "speedup": min(r["speedup"] for r in results.values()),  # the worse of the two models
        "repeats": args.repeat, "new_tokens": args.new, "prompt_tokens": args.prompt, "dtype": args.dtype,
        "device": str(device), "recording": not args.no_record, "width": HOST_WIDTH,
        "torch_threads": torch.get_num_threads(),
    }


def main(argv: list[str]) -> dict:
    import torch
    import transformers

    from ..core.checkpoints import load_model_folder
    from ..core.devices import resolve_device, resolve_dtype

    ap = OneLineParser(prog="bench generation")
    ap.add_argument("--new", type=int_in(1, 10**5), default=64, help="tokens to generate (default 64)")
    ap.add_argument("--prompt", type=int_in(1, 10**5), default=8, help="prompt length (default 8)")
    ap.add_argument("--repeat", type=int_in(1, 1000), default=3, help="alternating timed runs of each side (default 3)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--device", type=device_name, default="cpu")
    ap.add_argument("--no-record", action="store_true", help="ours without recording")
    ap.add_argument("--threads", type=int_in(0, 1024), default=0,
                    help="torch CPU threads for both sides (0: torch's default). On a loaded machine every "
                         "op that enters a parallel region waits for a free core; 1 thread avoids that")
    ap.add_argument("--host", action="store_true",
                    help="the step's host overhead: 24- and 12-layer models of tiny width against transformers "
                         "(ms, aten ops and Python per token)")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    if args.host:
        return host_overhead(args, device, dtype)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "gpt2-small-random"
        torch.manual_seed(0)
        hf_cfg = transformers.GPT2Config(bos_token_id=None, eos_token_id=None)
        transformers.GPT2LMHeadModel(hf_cfg).save_pretrained(folder)
        ours = load_model_folder(folder, device=device, dtype=args.dtype)
        ref = transformers.GPT2LMHeadModel.from_pretrained(folder, dtype=dtype).to(device).eval()
    prompt = torch.randint(0, hf_cfg.vocab_size, (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    run_ours, run_ref = greedy_runs(ours, ref, prompt, args.new, not args.no_record, device)

    one_step_products = step_products(ours.model)

    def run_products() -> None:  # the products of as many forwards as a run makes (the prompt's counted as one)
        for _ in range(args.new):
            one_step_products()
        sync()

    # Warm up both, then alternate them so that both see the same machine load; keep the fastest
    # run of each and also the median of the paired ratios (robust on a shared machine).
    ours_ids, ref_ids = run_ours(), run_ref()
    ours_times, ref_times, products_times = alternating([run_ours, run_ref, run_products], args.repeat)
    ours_total, ref_total = min(ours_times), min(ref_times)
    paired = median([r / o for o, r in zip(ours_times, ref_times)])

    ours_s, reference_s = ours_total / args.new, ref_total / args.new
    # the machine's bandwidth: the faster of 4 KB and huge pages (where the steps' float32 weights are, and where
    # the copy runs faster: a bound from 4 KB pages alone would be one the steps can beat)
    bw_pages = {"4k": measure_bandwidth(device=str(device)), "huge": measure_bandwidth(device=str(device), huge_pages=True)}
    bw = max(bw_pages.values())
    wbytes = weight_bytes_per_token(ours.model)
    bound_s = wbytes / bw
    products_s = min(products_times) / args.new
    overhead = sorted(o / p for o, p in zip(ours_times, products_times))
    return {
        "name": "generation",
        "ours_s": round(ours_s, 5),
        "reference_s": round(reference_s, 5),
        "speedup": round(reference_s / ours_s, 3),
        "speedup_median_of_pairs": round(paired, 3),
        "repeats": args.repeat,
        "unit": "seconds per token (prompt forward included, total / new tokens)",
        "model": "gpt2-small-random (124M), greedy, KV cache, batch 1",
        "new_tokens": args.new, "prompt_tokens": args.prompt, "dtype": args.dtype, "device": str(device),
        "recording": not args.no_record,
        "same_ids_as_reference": ours_ids == ref_ids,
        "memory_bandwidth_GBps": round(bw / 1e9, 2),
        "memory_bandwidth_by_pages_GBps": {k: round(v / 1e9, 2) for k, v in bw_pages.items()},
        "weight_bytes_per_token": wbytes,
        "bandwidth_bound_s": round(bound_s, 5),
        "fraction_of_bandwidth_bound": round(bound_s / ours_s, 3),
        "reference_fraction_of_bandwidth_bound": round(bound_s / reference_s, 3),
        # where the time goes: the matrix products alone (same weights, one row each, nothing
        # else) against the bound, and ours against them (the norms, attention, cache, recording,
        # Python); paired per repeat like the speedup
        "products_alone_s": round(products_s, 5),
        "products_alone_fraction_of_bandwidth_bound": round(bound_s / products_s, 3),
        "ours_over_products_alone": [round(r, 3) for r in overhead],
        "torch_threads": torch.get_num_threads(),
    }
