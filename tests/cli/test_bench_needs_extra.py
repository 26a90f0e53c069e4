"""A benchmark whose reference (Hugging Face transformers) is not installed says so in one line and names the
[bench] extra: installed from the wheel without it, `bench load` ended in a traceback and bench quick's rows
said only "ModuleNotFoundError: No module named 'transformers'"."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from desktop_app.benchmarks import BENCH_EXTRA
from desktop_app.paths import demo_model_dir

REPO = Path(__file__).resolve().parents[2]
# this process's Python as if transformers were not installed
WITHOUT = '''import runpy, sys
class Without:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "transformers":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Without())
sys.argv = ["desktop_app", *sys.argv[1:]]
runpy.run_module("desktop_app", run_name="__main__")
'''


def without_transformers(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT, *args], capture_output=True, text=True, timeout=300,
                          cwd=REPO)


def test_the_bench_extra_is_what_the_benchmarks_need():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [req.split(">")[0] for req in extras["bench"]] == list(BENCH_EXTRA)


def test_a_benchmark_without_its_reference_says_which_extra_in_one_line(tmp_path):
    r = without_transformers("bench", "load", str(demo_model_dir()), "--repeat", "1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "bench load needs transformers" in r.stderr and "transformer-explorer[bench]" in r.stderr
    r = without_transformers("bench", "quick", "--only", "load", "--recorded", str(tmp_path / "none.json"))
    assert r.returncode == 0, r.stderr
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("load speedup"))
    assert "FAILED: needs transformers" in row and "transformer-explorer[bench]" in row
