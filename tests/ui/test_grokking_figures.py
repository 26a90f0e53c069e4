"""Issue 30, the README's modular-addition (grokking) figures: packaging/make_grokking_figures.py shows a run in the
Train panel and its Across-training window offscreen and writes their own exports; the numbers exported are the
run's own (its logged accuracies, each kept step's block weight norm)."""
from __future__ import annotations

import csv
import json

import pytest

from desktop_app.app.timeline import block_norms
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.training import TrainConfig, train
from desktop_app.core.training.timeline import kept_steps

from .figure_scripts import load_script

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # about 25 s on a loaded core: a 20-step run, the window's 7 kept steps measured
def test_the_grokking_figures_export_the_runs_own_curves_and_weight_norms(tmp_path, qapp, isolated_user_files):
    run = tmp_path / "modadd"
    train(TrainConfig(task="modadd", task_options={"p": 7, "train_fraction": 0.5},
                      model={"n_layers": 1, "n_heads": 2, "d_model": 16, "d_ff": 32, "context_length": 4},
                      lr=1e-2, weight_decay=1.0, schedule="constant", warmup_steps=0, batch_size=24, steps=20,
                      eval_every=5, log_every=5, checkpoint_every=20, keep_every=10, keep_spacing="log"), run)
    script = load_script("make_grokking_figures")
    assert script.main(["--run", str(run), "--docs", str(tmp_path / "docs")]) == 0
    figures = tmp_path / "docs" / "figures"
    for name in ("modadd_train.png", "modadd_across.png"):
        assert (figures / name).stat().st_size > 10_000, name

    evals = [e for e in json.loads((run / "metrics.json").read_text()) if e["event"] == "eval"]
    shown = {int(r["step"]): r for r in _rows(figures / "modadd_train.csv") if r["val_accuracy"]}
    assert sorted(shown) == [e["step"] for e in evals] == [5, 10, 15, 20]
    for e in evals:
        assert float(shown[e["step"]]["val_accuracy"]) == pytest.approx(e["val_accuracy"])
        assert float(shown[e["step"]]["train_accuracy"]) == pytest.approx(e["train_accuracy"])

    norms = {int(r["step"]): float(r["value"]) for r in _rows(figures / "modadd_across.csv")
             if r["metric"] == "weight-norm"}
    kept = kept_steps(run).openable()
    assert sorted(norms) == [k.step for k in kept] == [0, 1, 2, 4, 8, 10, 20]
    for k in kept:
        assert norms[k.step] == pytest.approx(float(block_norms(load_model_folder(k.path).model)[0]))
