"""Every benchmark at a small size, one table: the guard against the next regression (issue 38).

    python -m desktop_app bench quick [--only NAMES] [--record] [--recorded FILE]
    python -m desktop_app bench quick --readme

Every benchmark runs in this one process (`main(argv)` at the small size given in RUNS), saving each a
fresh interpreter's imports of torch, transformers and Qt (5-10 s apiece on a shared machine): honest,
since each figure is a ratio of two sides measured alike in the same process, and what a process's
history could bias is measured in fresh processes by the benchmarks themselves (start-up, peak memory,
the whole Lipschitz CLI run, the busy run, bench scale's two sides). Torch's thread count is put back
after each benchmark (some set their own). --separate runs each as `python -m desktop_app bench NAME ...`
in a fresh process instead. Its result gives one or more figures (FIGURES). The table prints each figure, its value, the target, the value last recorded
in docs/benchmarks.json, and "WORSE" where it is more than 15% worse than that (installed from a wheel there is
no docs/benchmarks.json, the source checkout's record: it says so in one line and leaves that column out). A figure's value is a
ratio against the benchmark's own reference in the same run (fps and milliseconds where the target is one).

--record writes this run's values to docs/benchmarks.json (atomically), with the date, the commit and the
load average: commit it with a message that says why the figures changed. --readme writes README.md's
"Performance" section from docs/benchmarks.json (between its two marker lines), nothing run.
The small sizes are not the README's full-size figures: they catch a regression, they do not state a result.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..commands.args import OneLineParser
from ..paths import package_on_path

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "docs" / "benchmarks.json"
README = REPO / "README.md"
SECTION_START = "<!-- performance: written by `python -m desktop_app bench quick --readme` from docs/benchmarks.json -->"
SECTION_END = "<!-- performance: end -->"
WORSE_BY = 0.15  # a figure more than 15% worse than recorded is marked
DEMO = "{demo}"  # the demo model's folder, filled in at run time

# benchmark -> its arguments at the small size
RUNS = {
    "startup": ["--repeat", "1"],
    "load": [DEMO, "--repeat", "2"],
    "generation": ["--new", "8", "--repeat", "1", "--threads", "1"],
    # 5 timed windows a side over 2 alternating rounds: at 2 windows and 1 round the ratio spread 0.8-5.1x on a
    # busy machine (one window hit by a neighbour decided it), at this size 1.16-1.32x, for ~5 s more
    "training": ["--steps", "12", "--window", "2", "--rounds", "2", "--layers", "2"],
    # accuracy against the float64 Lanczos reference at the smallest length only (at every length it cost
    # more than the rest of the benchmark); the speedups are the same figures
    "lipschitz": [DEMO, "--lengths", "8,16,32", "--samples", "2", "--repeat", "1", "--accuracy", "smallest"],
    "render": ["--tokens", "256", "--repeat", "5"],
    "dynamics": ["--seconds", "1.5"],
    "memory": [DEMO],
    # 10 timed generations a side, alternating between the two processes, the least of each kept: timed once
    # each, seconds apart, a slow step decided the generation speedup (0.46-2.15x over runs of unchanged code)
    "scale": ["--shape", "tiny", "--tokens", "64", "--new", "8", "--repeat", "1", "--gen-runs", "10"],
    "busy": ["--steps", "60"],
    "firstlook": ["--shape", "tiny", "--tokens", "128"],
}


@dataclass(frozen=True)
class Figure:
    name: str  # the table's row and the key in docs/benchmarks.json
    bench: str
    field: str  # dotted path into the benchmark's JSON line
    target: float | None  # None: no target at this size (the demo model's memory is mostly the baseline's...)
    higher_is_better: bool
    unit: str = "x"

    def value(self, result: dict) -> float | str:
        """The figure, or the benchmark's line saying why it was not measured here (a string in its place:
        bfloat16 on a CPU without bfloat16 instructions)."""
        v = result
        for part in self.field.split("."):
            if isinstance(v, str):
                break
            v = v[part]
        return v if isinstance(v, str) else float(v)

    def meets(self, value: float) -> bool:
        if self.target is None:
            return True
        return value >= self.target if self.higher_is_better else value <= self.target

    def worse_than(self, value: float, recorded: float) -> bool:
        """More than WORSE_BY worse than the recorded value."""
        if self.higher_is_better:
            return value < recorded * (1 - WORSE_BY)
        return value > recorded * (1 + WORSE_BY)


FIGURES = [
    Figure("startup / bare imports", "startup", "paired_ratio", 1.3, False),
    Figure("load speedup", "load", "speedup", 1.0, True),
    Figure("generation speedup", "generation", "speedup", 1.0, True),
    Figure("generation of bandwidth bound", "generation", "fraction_of_bandwidth_bound", 0.85, True, ""),
    Figure("training speedup", "training", "speedup", 1.5, True),
    # bfloat16 autocast on both sides, where the CPU multiplies bfloat16 natively (elsewhere not measured)
    Figure("training speedup, bfloat16", "training", "bfloat16.speedup", 1.5, True),
    # the 10x target is the full sweep's (lengths to 256, 5 samples); at this size process start-up is most of it
    Figure("lipschitz whole run speedup", "lipschitz", "speedup_whole_run.median", None, True),
    Figure("lipschitz sweep speedup", "lipschitz", "speedup", 10.0, True),
    Figure("render head switch", "render", "ours_s", 0.1, False, "s"),
    Figure("dynamics panel", "dynamics", "panel_fps", 30.0, True, "fps"),
    Figure("memory: demo model's peak", "memory", "peak_mb", None, False, "MB"),
    Figure("scale trace speedup", "scale", "trace_speedup", 1.0, True),
    Figure("scale memory ratio", "scale", "memory_ratio", 1.0, False),
    Figure("scale generation speedup", "scale", "generation_speedup", 1.2, True),
    Figure("busy / quiet", "busy", "ratio", 2.5, False),
    # the targets are the Qwen2.5-0.5B shape's at 1,024 tokens; at the tiny shape both processes are mostly imports
    Figure("first look speedup", "firstlook", "speedup", 1.5, True),
    Figure("first look memory ratio", "firstlook", "memory_ratio", 1.0, False),
]


def _argv(args: list[str]) -> list[str]:
    from ..paths import demo_model_dir

    return [str(demo_model_dir()) if a == DEMO else a for a in args]


def run_in_process(name: str, args: list[str]) -> tuple[dict | None, float, str]:
    """(its result, or None if it failed; seconds; the failure's one line), run here."""
    import contextlib
    import importlib

    import torch

    threads = torch.get_num_threads()
    t0 = time.perf_counter()
    try:  # its prints go to stderr, as a fresh process's progress does: stdout is the table's
        with contextlib.redirect_stdout(sys.stderr):
            result = importlib.import_module(f"desktop_app.benchmarks.{name}").main(_argv(args))
        error = ""
    except (Exception, SystemExit) as exc:  # a benchmark's argument error exits: one line, the others go on
        result, error = None, (f"{type(exc).__name__}: {exc}".strip().splitlines() or [""])[-1][:200]
        if isinstance(exc, ModuleNotFoundError):
            from . import needs_extra

            error = needs_extra(exc) or error
    finally:
        torch.set_num_threads(threads)
    return result, time.perf_counter() - t0, error


def run_benchmark(name: str, args: list[str]) -> tuple[dict | None, float, str]:
    """(its JSON line, or None if it failed; seconds; the last line of its error output), in a fresh process."""
    argv = _argv(args)
    env = package_on_path(dict(os.environ), REPO)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "desktop_app", "bench", name, *argv], capture_output=True,
                          text=True, env=env, cwd=REPO)
    seconds = time.perf_counter() - t0
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return None, seconds, last[:200]
    return json.loads(lines[-1]), seconds, ""


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children: steadier than wall time on a
    shared machine (another process's work is not counted, only the contention's cache and spin costs)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def in_checkout() -> bool:
    """Whether this package runs from its source checkout (docs/benchmarks.json and README.md beside it); not
    when installed, where REPO is site-packages (the wheel ships neither: they are the checkout's record)."""
    return (REPO / "pyproject.toml").is_file() and (REPO / "desktop_app").is_dir()


def read_recorded(path: Path) -> dict:
    """docs/benchmarks.json's figures {name: {"value": ...}}; {} when there is none yet."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))["figures"]
    except FileNotFoundError:
        return {}


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value * 1000:.1f} ms"
    return f"{value:.3g}{'x' if unit == 'x' else (' ' + unit if unit else '')}"


def _target(f: Figure) -> str:
    if f.target is None:
        return "-"
    return ("≥ " if f.higher_is_better else "≤ ") + _fmt(f.target, f.unit)


def table(values: dict[str, float | None], recorded: dict | None, errors: dict[str, str],
          not_measured: dict[str, str] | None = None) -> str:
    """The printed table: one row per figure asked for; without the recorded column when there is no record
    (None). not_measured: figure -> the benchmark's reason (its value is None)."""
    rows = [("figure", "value", "target", "recorded", "")]
    for f in FIGURES:
        if f.name not in values:
            continue
        v = values[f.name]
        rec = (recorded or {}).get(f.name, {}).get("value")
        mark = ""
        if v is None and f.name in (not_measured or {}):
            mark = f"not measured: {not_measured[f.name]}"
        elif v is None:
            mark = f"FAILED: {errors.get(f.bench, '')}"
        elif rec is not None and f.worse_than(v, rec):
            mark = f"WORSE (>{WORSE_BY:.0%} worse than recorded)"
        elif not f.meets(v):
            mark = "target not met"
        rows.append((f.name, _fmt(v, f.unit), _target(f), _fmt(rec, f.unit), mark))
    if recorded is None:
        rows = [(*r[:3], r[4]) for r in rows]
    n = len(rows[0]) - 1
    widths = [max(len(r[i]) for r in rows) for i in range(n)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:n], widths)) + ("  " + r[n] if r[n] else "")
                     for r in rows).rstrip()


def record(values: dict[str, float | None], path: Path) -> None:
    """This run's values become the recorded ones (figures not run, or failed, keep theirs)."""
    from ..core.files import atomic_write_text

    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        old = {"figures": {}}
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    stamp = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit,
             "load_average": round(os.getloadavg()[0], 2), "cpu_count": os.cpu_count()}
    figures = dict(old.get("figures", {}))
    for f in FIGURES:
        if values.get(f.name) is not None:
            figures[f.name] = {"value": round(values[f.name], 4), "target": f.target,
                               "higher_is_better": f.higher_is_better, "unit": f.unit,
                               "benchmark": f"bench {f.bench} " + " ".join("resources/demo-model" if a == DEMO else a
                                                                           for a in RUNS[f.bench]), **stamp}
    atomic_write_text(path, json.dumps({"about": "bench quick's last recorded values (small sizes); "
                                                 "python -m desktop_app bench quick --record",
                                        "figures": figures}, indent=1, ensure_ascii=False) + "\n")


def performance_section(recorded: dict) -> str:
    """README's "Performance" section body (between the markers) from the recorded figures."""
    lines = ["`python -m desktop_app bench quick` runs every benchmark at a small size (aiming at 90 s on a quiet "
             "2-core machine) and "
             "compares each figure with the value recorded here (`--record` updates docs/benchmarks.json; this "
             "section is written from it by `bench quick --readme`). Small sizes catch regressions; the full-size "
             "figures are under Benchmarks below.", "",
             "| Figure | Recorded | Target | Benchmark at the small size | When (load average) |", "|---|---|---|---|---|"]
    for f in FIGURES:
        r = recorded.get(f.name)
        if r is None:
            continue
        lines.append(f"| {f.name} | {_fmt(r['value'], f.unit)} | {_target(f)} | `{r['benchmark']}` | "
                     f"{r['date']}, {r['commit']} ({r['load_average']} on {r['cpu_count']} cores) |")
    return "\n".join(lines)


def write_readme_section(readme: Path, recorded: dict) -> None:
    from ..core.files import atomic_write_text

    text = readme.read_text(encoding="utf-8")
    if text.count(SECTION_START) != 1 or text.count(SECTION_END) != 1:
        raise ValueError(f"{readme}: needs one {SECTION_START!r} line and one {SECTION_END!r} line")
    head, rest = text.split(SECTION_START)
    _, tail = rest.split(SECTION_END)
    atomic_write_text(readme, f"{head}{SECTION_START}\n{performance_section(recorded)}\n{SECTION_END}{tail}")


def main(argv: list[str]) -> None:
    p = OneLineParser(prog="python -m desktop_app bench quick")
    p.add_argument("--only", help="comma-separated benchmarks (default: all: " + ", ".join(RUNS) + ")")
    p.add_argument("--record", action="store_true", help="write this run's values to docs/benchmarks.json")
    p.add_argument("--recorded", help="the recorded values' file (default: the source checkout's "
                                       "docs/benchmarks.json; an installed package has none)")
    p.add_argument("--separate", action="store_true", help="each benchmark in a fresh process (slower: each "
                                                           "imports torch and the rest again)")
    p.add_argument("--readme", action="store_true", help="write README.md's Performance section from the recorded "
                                                         "values and exit (nothing run)")
    args = p.parse_args(argv)
    recorded_path = Path(args.recorded) if args.recorded else RECORDED if in_checkout() else None
    if args.readme and not in_checkout():
        p.error("--readme writes the source checkout's README.md: run it there (this package is installed)")
    if args.record and recorded_path is None:
        p.error("--record: no docs/benchmarks.json here (it is the source checkout's; this package is installed): "
                "name a file with --recorded FILE")
    if args.readme:
        write_readme_section(README, read_recorded(recorded_path))
        print(f"wrote {README}'s Performance section from {recorded_path}")
        return None
    names = list(RUNS) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        raise ValueError(f"--only: unknown benchmark {unknown[0]!r} (benchmarks: {', '.join(RUNS)})")
    if recorded_path is None:
        print("bench quick: no recorded values to compare with (docs/benchmarks.json is the source checkout's, "
              "not installed; --recorded FILE names one)", file=sys.stderr)
    recorded = read_recorded(recorded_path) if recorded_path is not None else None
    values: dict[str, float | None] = {}
    errors: dict[str, str] = {}
    not_measured: dict[str, str] = {}
    total, cpu = time.perf_counter(), _cpu_seconds()
    for name in names:
        result, seconds, error = (run_benchmark if args.separate else run_in_process)(name, RUNS[name])
        errors[name] = error
        print(f"bench {name}: {seconds:.1f} s" + (f" FAILED ({error})" if result is None else ""), file=sys.stderr,
              flush=True)
        for f in FIGURES:
            if f.bench == name:
                value = f.value(result) if result is not None else None
                if isinstance(value, str):
                    value, not_measured[f.name] = None, value
                values[f.name] = value
    total, cpu = time.perf_counter() - total, _cpu_seconds() - cpu
    print(table(values, recorded, errors, not_measured))
    print(f"{len(names)} benchmarks in {total:.0f} s ({cpu:.0f} CPU s, this process and its children); "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    if args.record:
        record(values, recorded_path)
        print(f"recorded in {recorded_path}")
    return None
