"""Training throughput: our trainer vs a plain PyTorch loop over transformers' GPT2LMHeadModel.

    python -m desktop_app bench training [--steps 30] [--layers 4 --d-model 128 --context 128 --batch 16]

Both sides train the same GPT-2-shaped model (same sizes, vocabulary, initial weights) on the same
batches (the text task on resources/demo-text.txt, drawn by the same seeded generator) with AdamW and
gradient clipping at 1.0. Ours is the real `train()` loop; the reference is the textbook loop:
model(input_ids, labels) -> loss.backward() -> clip -> step with torch's default AdamW. The two take turns
in one run: after each of our step events (every `--window` steps) the reference takes `--window` steps,
so each window of ours and the reference's window after it meet the same load (`--rounds` such runs; the
first pair of each is warm-up and skipped; one short untimed run warms the process first). `speedup` is
the median over the pairs of the reference's time over ours: on a machine shared with others' work
a window's time is its own plus whatever ran beside it, and whole runs of each side taken in turn, each
side's best window compared, gave anything from 0.82x to 1.44x in two runs a minute apart (load 5-8,
2 threads). With one torch thread (`--threads 1`) `cpu` adds the same figures in the calling thread's CPU
time, which others' load barely moves. bfloat16 autocast figures are added when the CPU has native
bfloat16 matrix products (or on CUDA).

`--profile` adds where one steady step of each side goes (float32): torch.profiler's self CPU time over the
second window of each side in one more paired run, per step, by kind of op (PROFILE_KINDS), with the step's wall time,
its aten ops and what no op accounts for (Python, the autograd engine, our events); run it with --threads 1
for figures a busy machine leaves alone.
"""
from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from ..commands.args import OneLineParser, int_in
from ..commands.args import device as device_name


def _bf16_supported(device: str) -> bool:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # older torch without the probe
        return False


# the kinds of op a profiled step is split into: (kind, the ops' names or name stems); the first match wins, an op
# inside an optimizer's step or zero_grad is "optimizer" whatever its name, the rest is "other"
PROFILE_KINDS = (
    ("products", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")),
    ("attention", ("aten::_scaled_dot_product",)),
    ("gelu", ("aten::gelu", "aten::tanh", "aten::pow")),  # F.gelu; gelu_new: its tanh and pow (its mul, add: elementwise)
    ("layer norm", ("aten::native_layer_norm",)),
    ("loss", ("aten::_log_softmax", "aten::nll_loss", "aten::amax", "aten::gather")),
    ("elementwise", ("aten::mul", "aten::add", "aten::sum", "aten::div", "aten::sub")),
    ("copies and fills", ("aten::copy_", "aten::cat", "aten::fill_", "aten::clone", "aten::zero_")),
    ("gradient norm", ("aten::linalg_vector_norm", "aten::_foreach_norm", "aten::_foreach_mul", "aten::stack")),
)


class _StepProfile:
    """torch.profiler over steps window+1 .. 2*window of one run (start() after step `window`, stop() after
    step 2*window), summarised per step by `summary`."""

    def __init__(self, window: int) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.window, self.prof, self.t0, self.wall = window, profile(activities=[ProfilerActivity.CPU]), 0.0, 0.0

    def start(self) -> None:
        self.prof.start()
        self.t0 = time.perf_counter()

    def stop(self) -> None:
        self.wall = time.perf_counter() - self.t0
        self.prof.stop()

    def summary(self) -> dict:
        ms = {kind: 0.0 for kind, _ in PROFILE_KINDS} | {"optimizer": 0.0, "other": 0.0}
        ops = 0
        for ev in self.prof.events():
            if not ev.name.startswith("aten::"):
                continue
            ops += 1
            parent, kind = ev.cpu_parent, None
            while parent is not None and kind is None:
                kind = "optimizer" if parent.name.startswith("Optimizer.") else None
                parent = parent.cpu_parent
            kind = kind or next((k for k, stems in PROFILE_KINDS if ev.name.startswith(stems)), "other")
            ms[kind] += ev.self_cpu_time_total / 1e3
        per_step = {k: round(v / self.window, 2) for k, v in ms.items()}
        wall = self.wall * 1e3 / self.window
        return {"step_ms": round(wall, 2), "aten_ops": round(ops / self.window),
                "self_cpu_ms": per_step, "outside_ops_ms": round(wall - sum(per_step.values()), 2)}


class _Reference:
    """The textbook loop over transformers' GPT2LMHeadModel (same sizes, the same initial weights, the same
    seeded batches, torch's default AdamW, clipping at 1.0): `steps(n)` takes its next n steps."""

    def __init__(self, cfg, precision: str) -> None:
        import torch
        import transformers

        transformers.logging.set_verbosity_error()
        from ..core.checkpoints import new_model, to_hf_state_dict
        from ..core.training.trainer import model_config_for, task_for

        self.cfg, self.task = cfg, task_for(cfg, causal=True)
        mcfg = model_config_for(cfg, self.task)
        hf_cfg = transformers.GPT2Config(vocab_size=mcfg.vocab_size, n_positions=mcfg.context_length,
                                         n_embd=mcfg.d_model, n_layer=mcfg.n_layers, n_head=mcfg.n_heads,
                                         n_inner=mcfg.d_ff, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                         bos_token_id=None, eos_token_id=None)
        self.hf = transformers.GPT2LMHeadModel(hf_cfg).to(cfg.device)
        self.hf.load_state_dict(to_hf_state_dict(new_model(mcfg, seed=cfg.seed)), strict=False)  # same start
        self.hf.train()
        self.opt = torch.optim.AdamW(self.hf.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.dtype = {"bfloat16": torch.bfloat16}.get(precision)
        self.device_type = torch.device(cfg.device).type

    def steps(self, n: int) -> None:
        import torch

        cfg, hf, opt = self.cfg, self.hf, self.opt
        for _ in range(n):
            b = self.task.train_batch(cfg.batch_size, self.gen)
            x = b.inputs.to(cfg.device)
            labels = torch.cat([x[:, :1], b.targets.to(cfg.device)], dim=1)[:, :-1]  # HF shifts labels itself
            with torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None):
                loss = hf(input_ids=x, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
            opt.step()


def _paired(cfg, precision: str, tmp: Path, profilers: dict | None = None) -> list[tuple[float, ...]]:
    """One run of our train() with a window of the reference taken after each of its "step" events (every
    cfg.log_every steps), so each window of ours and the reference's after it run under the same load:
    per pair (ours' wall, the reference's wall, ours' CPU, the reference's CPU) seconds per step, the first
    pair (warm-up) left out. Ours' window is everything from the end of the reference's window before it to
    its event: the steps, their batches and our loop between them (events, pause checks). CPU: the calling
    thread's (all of a step's with one torch thread). With profilers, ours' second window and the
    reference's second are profiled."""
    from ..core.training import train

    ref = _Reference(cfg, precision)
    pairs: list[tuple[float, ...]] = []
    last = {"step": 0, "wall": time.perf_counter(), "cpu": time.thread_time()}

    def on_event(ev: dict) -> None:
        if ev["event"] != "step":
            return
        wall, cpu = time.perf_counter(), time.thread_time()
        n = ev["step"] - last["step"]
        if profilers is not None and len(pairs) == 1:
            profilers["ours"].stop()
            profilers["reference"].start()
        ref.steps(n)
        wall2, cpu2 = time.perf_counter(), time.thread_time()
        if profilers is not None and len(pairs) == 1:
            profilers["reference"].stop()
        pairs.append(((wall - last["wall"]) / n, (wall2 - wall) / n, (cpu - last["cpu"]) / n, (cpu2 - cpu) / n))
        if profilers is not None and len(pairs) == 1:
            profilers["ours"].start()
        last.update(step=ev["step"], wall=time.perf_counter(), cpu=time.thread_time())

    train(cfg, tmp / f"ours-{time.monotonic_ns()}", on_event=on_event)
    return pairs[1:]


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def _figures(pairs: list[tuple[float, ...]], tokens_per_step: int, cpu: bool) -> dict:
    """speedup: the median over pairs of the reference's time over ours (wall); ours_s, reference_s: each
    side's median seconds per step; with `cpu` (one torch thread) the same in the calling thread's CPU time,
    which other processes' load barely moves."""
    out = {"ours_s": round(_median([p[0] for p in pairs]), 6), "reference_s": round(_median([p[1] for p in pairs]), 6),
           "speedup": round(_median([p[1] / p[0] for p in pairs]), 2), "pairs": len(pairs)}
    out.update(ours_tokens_per_s=round(tokens_per_step / out["ours_s"]),
               reference_tokens_per_s=round(tokens_per_step / out["reference_s"]))
    if cpu:
        out["cpu"] = {"ours_s": round(_median([p[2] for p in pairs]), 6),
                      "reference_s": round(_median([p[3] for p in pairs]), 6),
                      "speedup": round(_median([p[3] / p[2] for p in pairs]), 2)}
    return out


def main(argv: list[str]) -> dict:
    import torch

    from ..core.training import TrainConfig
    from ..core.training.optim import fused_step_available
    from ..paths import demo_text_path

    ap = OneLineParser(prog="bench training")
    ap.add_argument("--steps", type=int_in(1, 10**6), default=12, help="steps per round and side")
    ap.add_argument("--window", type=int_in(1, 10**6), default=4)
    ap.add_argument("--rounds", type=int_in(1, 1000), default=2)
    ap.add_argument("--layers", type=int_in(1, 1000), default=4)
    ap.add_argument("--heads", type=int_in(1, 1024), default=4)
    ap.add_argument("--d-model", type=int_in(1, 65536), default=128)
    ap.add_argument("--context", type=int_in(1, 10**6), default=128)
    ap.add_argument("--batch", type=int_in(1, 10**6), default=16)
    ap.add_argument("--device", type=device_name, default="cpu")
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--profile", action="store_true", help="add where a steady step of each side goes (torch.profiler, "
                                                               "float32; needs --steps >= 2 windows)")
    ap.add_argument("--threads", type=int_in(1, 1024), help="torch CPU threads (default: torch's choice); 1 gives steady "
                                                 "figures on a machine shared with other work")
    args = ap.parse_args(argv)
    if args.profile and args.steps < 2 * args.window:
        ap.error(f"--profile needs --steps of at least two windows ({2 * args.window}), not {args.steps}")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    def config(precision: str) -> TrainConfig:
        return TrainConfig(task="text", task_options={"text_file": str(demo_text_path()), "tokenizer": "bpe",
                                                      "vocab_size": 512},
                           family="gpt2", model={"n_layers": args.layers, "n_heads": args.heads,
                                                 "d_model": args.d_model, "d_ff": 4 * args.d_model,
                                                 "context_length": args.context},
                           lr=1e-3, steps=args.steps, warmup_steps=0, batch_size=args.batch,
                           log_every=args.window, eval_every=10**9, checkpoint_every=10**9,
                           device=args.device, precision=precision)

    result: dict = {"name": "training", "device": args.device, "threads": torch.get_num_threads(),
                    "model": f"gpt2 {args.layers}x{args.d_model}, context {args.context}, batch {args.batch}",
                    "tokens_per_step": args.batch * args.context,
                    # ours steps with PyTorch's fused AdamW where available; the reference keeps torch's default
                    "fused_optimizer_step": fused_step_available([torch.zeros(1, device=args.device)])}
    with tempfile.TemporaryDirectory() as tmp:
        # one short untimed paired run first: the process's own warm-up (each kernel's first use, the allocator
        # growing) made the first 3 steps of its first run 1.2-1.8x slower (1 thread, 4x128), past the skipped
        # first window at bench quick's size
        warm = dataclasses.replace(config("float32"), steps=2, log_every=1)
        _paired(warm, "float32", Path(tmp))
        cpu = torch.get_num_threads() == 1 and args.device == "cpu"
        precisions = ["float32"] + ([] if args.no_bf16 or not _bf16_supported(args.device) else ["bfloat16"])
        for precision in precisions:
            pairs = [p for _ in range(args.rounds) for p in _paired(config(precision), precision, Path(tmp))]
            figures = _figures(pairs, result["tokens_per_step"], cpu)
            if precision == "float32":
                result.update(figures)
            else:
                result["bfloat16"] = {**figures, "ours_vs_our_float32": round(result["ours_s"] / figures["ours_s"], 2)}
        if args.profile:  # one more paired run, profiled (the profiler slows what it watches: not timed)
            profilers = {"ours": _StepProfile(args.window), "reference": _StepProfile(args.window)}
            _paired(config("float32"), "float32", Path(tmp), profilers)
            result["profile"] = {side: p.summary() for side, p in profilers.items()}
        if "bfloat16" not in result:
            result["bfloat16"] = "not supported natively on this device" if not args.no_bf16 else "skipped"
    return result
