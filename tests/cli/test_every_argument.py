"""Issue 25 §5: every bad argument is one line, before any work.

One generated test walks every subcommand's parser (desktop_app.cli.build_parser) and every benchmark's,
and feeds each numeric option 0, -1, nan, inf and an absurd size: the command must refuse in one line
(exit 2, no traceback) or run to the end, quickly. Beside it, the refusals that need an estimate (memory,
array headers, overflow) and the top-level command line (--help, a mistyped command, --device).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from desktop_app.cli import COMMANDS, build_parser, main
from desktop_app.commands import args as cli_args
from desktop_app.commands.bench import BENCHMARKS
from tiny_models import save_tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VALUES = ("0", "-1", "nan", "inf", "1000000000000")
SECONDS = 60  # a value that is accepted runs the tiny command to its end within this


def _numeric(action: argparse.Action) -> bool:
    return isinstance(action.type, cli_args.Number) or action.type in (int, float)


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [a.option_strings[-1] for a in parser._actions if a.option_strings and _numeric(a)]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


class _Parsed(Exception):
    def __init__(self, parser):
        self.parser = parser


def _parse_only():
    """OneLineParser.parse_args that stops right after a benchmark's successful parse (its work is not run)."""
    original = cli_args.OneLineParser.parse_args

    def parse_args(self, args=None, namespace=None):
        parsed = original(self, args, namespace)
        if self.prog.startswith(("bench ", "python -m desktop_app bench ")):
            raise _Parsed(self)
        return parsed
    return parse_args


def _bench_parser(name: str) -> argparse.ArgumentParser:
    module = importlib.import_module(f"desktop_app.benchmarks.{name}")
    saved = cli_args.OneLineParser.parse_args
    cli_args.OneLineParser.parse_args = _parse_only()
    try:
        module.main(["model"] if name in ("lipschitz",) else [])
    except _Parsed as parsed:
        return parsed.parser
    finally:
        cli_args.OneLineParser.parse_args = saved
    raise AssertionError(f"bench {name} did not parse its arguments")


def _cases() -> list[tuple[str, str, str]]:
    cases = []
    for name, parser in _subparsers().items():
        cases += [(name, option, value) for option in _options(parser) for value in VALUES]
    for name in BENCHMARKS:
        cases += [(f"bench {name}", option, value) for option in _options(_bench_parser(name)) for value in VALUES]
    return cases


CASES = _cases()


def test_every_subcommand_is_walked():
    walked = {c.split()[0] for c, _, _ in CASES}
    assert set(_subparsers()) == set(COMMANDS)
    # the commands with numeric options, and every benchmark with one
    assert {"generate", "render", "lipschitz", "train", "dynamics", "attribute", "patch", "bench", "scrub",
            "features", "graph"} <= walked
    assert len(CASES) > 300


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("every")
    save_tiny_model(root / "model", "abcdefgh ", d_model=8, n_layers=1, n_heads=2, d_ff=16, context_length=16)
    from desktop_app.core.training import TrainConfig, train  # a run with kept steps, for scrub
    train(TrainConfig(task="induction", task_options={"length": 3, "symbols": 3}, steps=1, batch_size=2,
                      model={"n_layers": 1, "n_heads": 1, "d_model": 4, "d_ff": 8}, eval_every=1, log_every=1,
                      checkpoint_every=1, keep_every=1), root / "run")
    return root


def _tiny_dictionary(root: Path) -> str:
    """A small SAE folder for the 8-wide model (features --sae)."""
    folder = root / "sae"
    if not folder.exists():
        import torch

        from desktop_app.core.features import SparseDictionary, save_dictionary
        save_dictionary(SparseDictionary(torch.ones(8, 4), torch.zeros(4), torch.ones(4, 8), torch.zeros(8),
                                         hook="blocks.0.hook_resid_post"), folder)
    return str(folder)


def _tiny_transcoders(root: Path) -> str:
    """Random per-layer transcoders for the 8-wide one-layer model (graph --transcoders)."""
    folder = root / "transcoders"
    if not folder.exists():
        from desktop_app.core.graphs.transcoders import random_transcoders
        random_transcoders(folder, n_layers=1, d_model=8, n_features=6)
    return str(folder)


def _base(command: str, root: Path) -> list[str]:
    model, out = str(root / "model"), str(root / "out")
    return {
        "generate": [model, "--prompt-ids", "1,2", "--max-new", "1"],
        "render": [model, "--ids", "1,2", "--view", "attention", "--size", "200x150", "--out", out + ".png",
                   "--overwrite"],
        "lipschitz": ["--synthetic", "--d", "2", "--lengths", "2,3", "--samples", "1", "--csv", out + ".csv",
                      "--overwrite"],
        "train": ["--task", "modadd", "--p", "3", "--layers", "1", "--heads", "1", "--d-model", "4", "--steps", "1",
                  "--eval-every", "1", "--batch-size", "2", "--device", "cpu", "--out", out + "-run", "--overwrite"],
        "dynamics": ["--n", "3", "--d", "2", "--steps", "1", "--csv", out + ".csv", "--overwrite"],
        "attribute": [model, "--ids", "1,2", "--token-id", "1", "--csv", out + ".csv", "--overwrite"],
        "patch": [model, "--clean-ids", "1,2", "--corrupted-ids", "2,1", "--answer-id", "1", "--csv", out + ".csv",
                  "--overwrite"],
        "features": [model, "--sae", _tiny_dictionary(root), "--ids", "1,2", "--out", out + ".npz", "--overwrite"],
        "export": [model, "--format", "hf", "--out", out + "-export", "--overwrite"],
        "info": [model],  # (their one numeric option: --step, on every command taking a model)
        "trace": [model, "--ids", "1,2", "--out", out + ".npz", "--overwrite"],
        "scrub": [str(root / "run"), "--metric", "induction", "--csv", out + ".csv", "--overwrite"],
        "graph": [model, "--transcoders", _tiny_transcoders(root), "--ids", "1,2,3", "--out", out + ".json",
                  "--overwrite"],
    }[command]


# what an option needs beside it to be used at all
_BESIDE = {
    ("generate", "--beams"): ["--strategy", "beam"],
    ("generate", "--top-k"): ["--strategy", "top-k"],
    ("generate", "--top-p"): ["--strategy", "top-p"],
    ("generate", "--steer-layer"): ["--steer-towards", "1", "--steer-away", "2", "--steer-scale", "1"],
    ("generate", "--steer-scale"): ["--steer-towards", "1", "--steer-away", "2", "--steer-layer", "0"],
    ("lipschitz", "--layer"): ["--no-masked"],
    ("scrub", "--layer"): ["--metric", "weight-norm"],  # a per-layer metric (--layer is refused for per-head ones)
    ("train", "--vocab-size"): [],
    ("train", "--d-ff"): [],
}


def _assert_refused_or_ran(code: int, err: str, elapsed: float, what: str) -> None:
    assert "Traceback" not in err, f"{what}: {err}"
    if code == 0:
        assert elapsed < SECONDS, f"{what} ran {elapsed:.0f} s"
        return
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, f"{what}: exit {code}, stderr {err!r}"
    assert lines[0].startswith(("python -m desktop_app", "bench ", "error:")) and "error:" in lines[0], \
        f"{what}: {lines[0]!r}"


@pytest.mark.parametrize("command,option,value", CASES, ids=[" ".join(c) for c in CASES])
def test_each_numeric_argument_is_refused_in_one_line_or_runs(command, option, value, files, capsys, monkeypatch):
    if command.startswith("bench "):  # a benchmark is a timing tool: parsed here, not run
        name = command.split()[1]
        monkeypatch.setattr(cli_args.OneLineParser, "parse_args", _parse_only())
        argv = ["bench", name] + (["model"] if name == "lipschitz" else []) + [option, value]
        t0 = time.perf_counter()
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        except _Parsed:
            code = 0
        _assert_refused_or_ran(code, capsys.readouterr().err, time.perf_counter() - t0, " ".join(argv))
        return
    argv = [command, *_base(command, files), *_BESIDE.get((command, option), []), option, value]
    monkeypatch.chdir(files)
    t0 = time.perf_counter()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's refusal
        code = exc.code
    err = capsys.readouterr().err
    # a run's own progress lines are not refusals
    _assert_refused_or_ran(code, err if code else "", time.perf_counter() - t0, " ".join(argv))


# -- the issue's probes, by name ---------------------------------------------------------------


@pytest.mark.parametrize("argv,expected", [
    (["generate", "M", "--prompt-ids", "1", "--top-p", "2"], "argument --top-p: must be in (0, 1], got 2"),
    (["generate", "M", "--prompt-ids", "1", "--top-p", "nan"], "argument --top-p"),
    (["generate", "M", "--prompt-ids", "1", "--top-k", "-5"], "argument --top-k"),
    (["generate", "M", "--prompt-ids", "1", "--steer-scale", "nan"], "argument --steer-scale"),
    (["train", "--task", "modadd", "--steps", "-1", "--out", "R"], "argument --steps"),
    (["train", "--task", "text", "--vocab-size", "0", "--steps", "1", "--out", "R"], "argument --vocab-size"),
    (["train", "--task", "modadd", "--steps", "1", "--grad-clip", "-1", "--out", "R"], "argument --grad-clip"),
    (["train", "--task", "modadd", "--steps", "1", "--warmup", "-1", "--out", "R"], "argument --warmup"),
    (["train", "--task", "modadd", "--steps", "1", "--eval-every", "0", "--out", "R"], "argument --eval-every"),
    (["train", "--task", "modadd", "--steps", "1", "--checkpoint-every", "0", "--out", "R"], "--checkpoint-every"),
    (["train", "--task", "modadd", "--steps", "1", "--log-every", "0", "--out", "R"], "argument --log-every"),
    (["lipschitz", "--synthetic", "--d", "0", "--csv", "x.csv"], "argument --d"),
    (["lipschitz", "--synthetic", "--tol", "0", "--csv", "x.csv"], "argument --tol"),
    (["lipschitz", "--synthetic", "--tol", "nan", "--csv", "x.csv"], "argument --tol"),
    (["lipschitz", "--synthetic", "--radius", "-1", "--csv", "x.csv"], "argument --radius"),
    (["dynamics", "--dt", "1e300", "--csv", "x.csv"], "argument --dt"),
    (["dynamics", "--init-radius", "nan", "--csv", "x.csv"], "argument --init-radius"),
    (["bench", "load", "--repeat", "-3"], "argument --repeat"),
    (["generate", "M", "--prompt-ids", "1", "--device", "tpu"], "argument --device: must be cpu, cuda, cuda:N or mps"),
    (["generate", "M", "--prompt-ids", "1", "--device", "meta"], "(this machine has: cpu"),
    (["train", "--task", "modadd", "--steps", "1", "--device", "meta", "--out", "R"], "argument --device"),
])
def test_the_issues_probes_are_one_line(argv, expected, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and expected in err, err


@pytest.mark.parametrize("argv,expected", [
    (["generate", "{model}", "--prompt-ids", "1,2", "--strategy", "beam", "--beams", "1000000", "--max-new", "14"],
     "--beams 1000000 needs about"),
    (["dynamics", "--n", "1000000", "--steps", "1", "--csv", "{out}"], "--n 1000000 needs about"),
    (["lipschitz", "--synthetic", "--lengths", "200000", "--samples", "1", "--csv", "{out}"],
     "--lengths up to 200000 needs about"),
    (["train", "--task", "modadd", "--p", "3", "--steps", "1", "--batch-size", "1000000000", "--device", "cpu",
      "--out", "{run}"], "--batch-size 1000000000"),
])
def test_allocations_beyond_memory_are_refused_with_the_estimate(argv, expected, files, tmp_path, capsys,
                                                                 monkeypatch):
    """Estimated before any allocation, against what this machine has (here said to be 100 MB)."""
    from desktop_app.core import devices

    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": 10**8)
    argv = [a.format(model=files / "model", out=tmp_path / "x.csv", run=tmp_path / "run") for a in argv]
    t0 = time.perf_counter()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert expected in err and "this machine has 100 MB available" in err, err
    assert time.perf_counter() - t0 < 20 and not (tmp_path / "x.csv").exists() and not (tmp_path / "run").exists()


def _fake_npy_header(shape, dtype="<f8") -> bytes:
    import io

    from numpy.lib import format as npy

    buf = io.BytesIO()
    npy.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue()  # a header claiming the array, and none of its data


@pytest.mark.parametrize("command", ["dynamics", "lipschitz"])
def test_an_npz_claiming_a_huge_array_is_refused_unread(command, tmp_path, capsys):
    path = tmp_path / "big.npz"
    with zipfile.ZipFile(path, "w") as z:
        for name in ("A", "Q", "K", "V"):
            z.writestr(f"{name}.npy", _fake_npy_header((100000, 100000)))
    argv = (["dynamics", "--matrices", str(path), "--steps", "1", "--csv", str(tmp_path / "x.csv")]
            if command == "dynamics" else
            ["lipschitz", "--synthetic", "--matrices", str(path), "--csv", str(tmp_path / "x.csv")])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(path) in err and "(100000, 100000)" in err, err


def test_an_npy_image_claiming_a_huge_array_is_refused_unread(tmp_path):
    from desktop_app.app.images import read_image_file

    path = tmp_path / "big.npy"
    path.write_bytes(_fake_npy_header((100000, 100000, 3), "|u1"))
    with pytest.raises(ValueError, match=r"big\.npy.*\(100000, 100000, 3\)"):
        read_image_file(path, 3)
    path.write_bytes(_fake_npy_header((2, 2), "|O"))
    with pytest.raises(ValueError, match="Python objects"):
        read_image_file(path, 3)


def test_a_radius_bound_that_would_overflow_is_refused(tmp_path, capsys):
    assert main(["dynamics", "--dt", "50", "--steps", "100", "--csv", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err
    assert "overflows" in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "x.csv").exists()


def test_a_long_dynamics_run_shows_progress(tmp_path, capsys, monkeypatch):
    from desktop_app.commands import dynamics

    monkeypatch.setattr(dynamics.Progress, "EVERY_S", 0.0)
    assert main(["dynamics", "--attention", "sinkhorn", "--n", "8", "--steps", "3", "--csv",
                 str(tmp_path / "x.csv")]) == 0
    err = capsys.readouterr().err
    assert "step 1/3" in err and "steps/s" in err, err


@pytest.mark.parametrize("content,expected", [
    ({"task": "modadd", "steps": 1, "eval_every": 0}, "setting 'eval_every' must be"),
    ({"task": "modadd", "steps": 1, "lr": float("nan")}, "setting 'lr' must be"),
    (None, "nested too deeply"),
])
def test_a_config_file_meets_the_flags_limits(content, expected, tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text("[" * 100000 + "]" * 100000 if content is None else json.dumps(content))
    assert main(["train", "--config", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and expected in err and str(path) in err, err


# -- the top-level command line -----------------------------------------------------------------


def _python_m(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, "-m", "desktop_app", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=cwd)


def test_top_level_help_lists_every_command():
    r = _python_m("--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    for name in COMMANDS:
        assert f" {name}," in text or f" {name}." in text, (name, r.stdout)


def test_a_mistyped_command_is_refused_not_opened(tmp_path):
    r = _python_m("generat", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == \
        "python -m desktop_app: error: unknown command 'generat' (did you mean generate?)", r.stderr


def test_an_existing_folder_named_like_a_word_still_opens_in_the_gui(tmp_path, monkeypatch):
    from desktop_app.__main__ import unknown_command

    monkeypatch.chdir(tmp_path)
    assert unknown_command("generat") is not None and unknown_command("mymodel") is not None
    (tmp_path / "generat").mkdir()
    (tmp_path / "mymodel").mkdir()
    assert unknown_command("generat") is None and unknown_command("mymodel") is None
    assert unknown_command("org/name") is None and unknown_command("./x") is None
