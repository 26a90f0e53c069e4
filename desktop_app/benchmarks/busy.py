"""A run beside other work: the lectures' motif training quiet and beside two CPU-bound neighbours.

    python -m desktop_app bench busy [--steps 200] [--neighbours 2] [--repeat 1] [--unfair]

The `train` command as a person runs it (`--task motif --family bert --layers 3 --heads 1 --d-model 32
--d-ff 128 --norm-placement pre --lr 1e-3 --batch-size 64 --seed 0`, fewer steps) in a fresh process,
once with nothing added and once while `--neighbours` processes each spin a core (started before it,
killed after). The figure is the training loop's own time ("elapsed" of its done event), busy over quiet
(ratio; target <= 2.5: with two neighbours on two cores a fair share costs about 2x); the whole process
(imports included) is given too. Quiet and busy alternate `--repeat` times; the least of each is kept.
--unfair adds a busy run with the old settings (OpenMP threads spinning while they wait, one thread per
core: OMP_WAIT_POLICY=ACTIVE, OMP_NUM_THREADS = the cores), the settings desktop_app.threads replaced.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..commands.args import OneLineParser, int_in

MOTIF = ["--task", "motif", "--family", "bert", "--layers", "3", "--heads", "1", "--d-model", "32", "--d-ff", "128",
         "--norm-placement", "pre", "--lr", "1e-3", "--batch-size", "64", "--seed", "0"]
SPIN = "while True: pass"


def _train(steps: int, out: Path, env: dict) -> tuple[float, float]:
    """(training loop seconds, whole process seconds) of one motif run."""
    cmd = [sys.executable, "-m", "desktop_app", "train", *MOTIF, "--steps", str(steps),
           "--warmup", str(min(100, steps // 4)), "--log-every", str(steps), "--out", str(out), "--jsonl"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    whole = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"the motif run failed ({done.returncode}): {done.stderr.strip()[-1000:]}")
    events = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith('{"event"')]
    return next(e["elapsed"] for e in events if e["event"] == "done"), whole


def _beside_neighbours(n: int, run):
    """run() while n processes spin a core each."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)]
    try:
        time.sleep(0.3)  # let them take their cores
        return run()
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait()


def main(argv: list[str]) -> dict:
    p = OneLineParser(prog="python -m desktop_app bench busy")
    p.add_argument("--steps", type=int_in(1, 10**6), default=200)
    p.add_argument("--neighbours", type=int_in(0, 1024), default=2, help="CPU-bound processes beside the busy run")
    p.add_argument("--repeat", type=int_in(1, 100), default=1)
    p.add_argument("--unfair", action="store_true", help="also a busy run with spinning waits and a thread per core")
    args = p.parse_args(argv)

    from ..threads import available_cores

    from ..paths import package_on_path

    env = package_on_path(dict(os.environ))
    unfair_env = dict(env, OMP_WAIT_POLICY="ACTIVE", OMP_NUM_THREADS=str(available_cores()))
    quiet, busy, unfair = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-busy-") as tmp:
        for r in range(args.repeat):
            quiet.append(_train(args.steps, Path(tmp) / f"quiet-{r}", env))
            busy.append(_beside_neighbours(args.neighbours, lambda: _train(args.steps, Path(tmp) / f"busy-{r}", env)))
            if args.unfair:
                unfair.append(_beside_neighbours(args.neighbours,
                                                 lambda: _train(args.steps, Path(tmp) / f"unfair-{r}", unfair_env)))
    q, b = min(quiet), min(busy)
    out = {"name": "busy", "steps": args.steps, "neighbours": args.neighbours, "cores": available_cores(),
           "quiet_train_s": round(q[0], 3), "busy_train_s": round(b[0], 3), "ratio": round(b[0] / q[0], 3),
           "target_ratio": 2.5, "quiet_process_s": round(q[1], 3), "busy_process_s": round(b[1], 3),
           "process_ratio": round(b[1] / q[1], 3), "load_average": round(os.getloadavg()[0], 2)}
    if unfair:
        u = min(unfair)
        out.update(unfair_train_s=round(u[0], 3), unfair_ratio=round(u[0] / q[0], 3))
    return out
