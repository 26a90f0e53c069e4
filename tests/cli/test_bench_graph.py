"""`bench graph` output contract on the tiny shape, ours only (the figures themselves are not asserted)."""
from __future__ import annotations

import json

import pytest

from desktop_app.cli import main


@pytest.mark.slow
def test_bench_graph_on_the_tiny_shape_prints_its_figures_as_one_json_line(tmp_path, capsys):
    assert main(["bench", "graph", "--shape", "tiny", "--tokens", "12", "--inputs", str(tmp_path / "in"),
                 "--max-feature-nodes", "8", "--no-reference"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["name"] == "graph" and result["tokens"] == 12 and result["features_per_layer"] == 1024
    assert result["ours_s"] > 0 and result["ours_peak_gib"] > 0.05 and result["active_features"] > 0
    assert 0 < result["replacement_score"] <= 1 and result["reference"].startswith("not run")
    assert {p.name for p in (tmp_path / "in").iterdir()} >= {"model", "clt", "prompt.json"}  # kept for the reference


@pytest.mark.slow
def test_bench_graph_streamed_reads_less_per_batch_for_the_same_graph(tmp_path, capsys):
    assert main(["bench", "graph", "--streamed", "--shape", "tiny", "--tokens", "12", "--inputs", str(tmp_path / "in"),
                 "--max-feature-nodes", "8", "--runs", "1"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["mode"] == "streamed" and result["shape"] == "tiny-streamed" and result["same_graph"]
    (parts,), (whole,) = result["parts"], result["whole"]
    assert parts["batches"] == whole["batches"] > 0 and parts["mb_per_batch"] < whole["mb_per_batch"] / 3
    assert parts["freeze_mb"] < whole["freeze_mb"] and len(result["graph_speedup_vs_before"]) == 1
