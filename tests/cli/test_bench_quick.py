"""bench quick: one table of every benchmark's figures at a small size, the recorded values, the README section."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from desktop_app.benchmarks import quick

REPO = Path(__file__).resolve().parents[2]


def _bench_quick(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "desktop_app", "bench", "quick", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def _rows(stdout: str) -> dict[str, str]:
    lines = stdout.splitlines()
    assert lines[0].split() == ["figure", "value", "target", "recorded"]
    return {f.name: next(ln for ln in lines[1:] if ln.startswith(f.name + " ")) for f in quick.FIGURES
            if any(ln.startswith(f.name + " ") for ln in lines[1:])}


def test_one_benchmark_prints_its_row_and_a_figure_much_worse_than_recorded_is_marked(tmp_path):
    recorded = tmp_path / "benchmarks.json"
    recorded.write_text(json.dumps({"figures": {"load speedup": {"value": 1000.0}}}))  # unreachably good
    r = _bench_quick("--only", "load", "--recorded", str(recorded))
    assert r.returncode == 0, r.stderr
    rows = _rows(r.stdout)
    assert list(rows) == ["load speedup"]
    cells = rows["load speedup"][len("load speedup"):].split()
    assert cells[0].endswith("x") and float(cells[0][:-1]) > 0  # the value, a ratio
    assert cells[1:4] == ["≥", "1x", "1e+03x"]  # target, recorded
    assert "WORSE" in rows["load speedup"]
    assert "1 benchmarks in" in r.stdout


def test_an_unknown_benchmark_is_refused_in_one_line():
    r = _bench_quick("--only", "lod")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "'lod'" in r.stderr


def test_the_marks(tmp_path):
    up = quick.Figure("up", "load", "x", 1.0, True)
    down = quick.Figure("down", "startup", "x", 1.3, False)
    assert up.worse_than(0.84, 1.0) and not up.worse_than(0.86, 1.0)
    assert down.worse_than(1.16, 1.0) and not down.worse_than(1.14, 1.0)
    assert up.meets(1.0) and not up.meets(0.99) and down.meets(1.3) and not down.meets(1.31)


def test_a_figure_the_benchmark_did_not_measure_says_why_and_is_not_recorded(tmp_path):
    """bfloat16 training on a CPU without bfloat16 instructions: the benchmark puts its reason where the figure
    would be; the table says it, not FAILED, and --record keeps the recorded value."""
    bf16 = next(f for f in quick.FIGURES if f.name == "training speedup, bfloat16")
    reason = "not supported natively on this device"
    assert bf16.value({"bfloat16": reason}) == reason and bf16.value({"bfloat16": {"speedup": 1.6}}) == 1.6
    rows = quick.table({bf16.name: None}, {bf16.name: {"value": 1.5}}, {"training": ""}, {bf16.name: reason})
    row = rows.splitlines()[1]
    assert row.startswith(bf16.name) and row.endswith(f"not measured: {reason}") and "FAILED" not in row
    path = tmp_path / "benchmarks.json"
    quick.record({bf16.name: 1.5}, path)
    quick.record({bf16.name: None}, path)
    assert quick.read_recorded(path)[bf16.name]["value"] == 1.5


def test_record_then_readme_section(tmp_path):
    path = tmp_path / "benchmarks.json"
    quick.record({"load speedup": 1.234, "training speedup": None}, path)  # a failed figure is not recorded
    figures = quick.read_recorded(path)
    assert list(figures) == ["load speedup"] and figures["load speedup"]["value"] == 1.234
    assert figures["load speedup"]["benchmark"].startswith("bench load ")
    quick.record({"training speedup": 1.6}, path)  # the others keep their values
    assert set(quick.read_recorded(path)) == {"load speedup", "training speedup"}
    assert not [p for p in tmp_path.iterdir() if p.name != "benchmarks.json"]  # no temporary file left

    readme = tmp_path / "README.md"
    readme.write_text(f"# X\n\n## Performance\n\n{quick.SECTION_START}\nold\n{quick.SECTION_END}\n\n## Next\nkept\n")
    quick.write_readme_section(readme, quick.read_recorded(path))
    text = readme.read_text()
    assert text.startswith("# X\n\n## Performance\n\n") and text.endswith(f"{quick.SECTION_END}\n\n## Next\nkept\n")
    assert "old" not in text and "| load speedup | 1.23x | ≥ 1x |" in text and "| training speedup | 1.6x | ≥ 1.5x |" in text

    readme.write_text("# no markers\n")
    with pytest.raises(ValueError, match="README.md: needs one"):
        quick.write_readme_section(readme, {})


def test_the_readmes_performance_section_is_the_recorded_values():
    """README.md's section is what `bench quick --readme` writes from docs/benchmarks.json (never edited by hand)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split(quick.SECTION_START)[1].split(quick.SECTION_END)[0]
    assert section.strip() == quick.performance_section(quick.read_recorded(quick.RECORDED)).strip()
    assert set(quick.read_recorded(quick.RECORDED)) == {f.name for f in quick.FIGURES}


@pytest.mark.slow  # every benchmark at its small size: about 90 s on a quiet 2-core machine
def test_bench_quick_prints_every_figure(tmp_path):
    r = _bench_quick("--recorded", str(tmp_path / "none.json"))
    assert r.returncode == 0, r.stderr
    assert set(_rows(r.stdout)) == {f.name for f in quick.FIGURES}
    assert "FAILED" not in r.stdout
