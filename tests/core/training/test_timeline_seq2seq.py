"""Issue 41: every metric across training on an encoder-decoder run, both stacks (the per-head scores of the
encoder's and the decoder's self-attention, weight norms, Lipschitz constants, gradient norms; the logit lens
of the decoder's layers), from app.timeline.scrub and `scrub` on the command line; before, each ended in
"run_with_trace() missing 'tgt_ids'", "'blocks.0'" or "no gradient norm per block was logged"."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from desktop_app.app.timeline import METRICS, scrub
from desktop_app.core.analysis import HEAD_SCORES
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.training import TrainConfig, train
from desktop_app.core.training.timeline import step_folder

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("t5run") / "run"
    train(TrainConfig(task="sort", family="t5", model={"n_layers": 2, "n_decoder_layers": 1, "n_heads": 2,
                                                       "d_model": 16, "d_ff": 32},
                      steps=4, keep_every=2, log_every=1, eval_every=4, checkpoint_every=4, batch_size=4,
                      warmup_steps=0), out)
    return out


@pytest.mark.parametrize("metric", METRICS)
def test_every_metric_over_both_stacks(run, metric):
    sc = scrub(run, metric, sequences=2)
    cfg = load_model_folder(run).config
    if metric in ("logit-lens", "logit-lens-rank"):
        expected = [f"decoder.{l}" for l in range(cfg.n_decoder_layers)]
    else:
        expected = [f"encoder.{l}" for l in range(cfg.n_layers)] + [f"decoder.{l}" for l in range(cfg.n_decoder_layers)]
    assert sc.layer_labels == expected
    assert sc.values.shape[1] == len(expected) and np.isfinite(sc.values).all()
    assert sc.values.shape[2] == (cfg.n_heads if metric in HEAD_SCORES else 1)
    if metric != "grad-norm":
        assert sc.steps == [0, 2, 4]
    assert {row[1] for row in sc.rows()} == set(expected)
    json.dumps(sc.summary())


def test_weight_and_gradient_norms_are_each_blocks(run):
    sc = scrub(run, "weight-norm")
    model = load_model_folder(step_folder(run, 2)).model
    want = [float(torch.sqrt(sum(p.detach().double().pow(2).sum() for p in block.parameters())))
            for block in (*model.encoder.blocks, *model.decoder.blocks)]
    np.testing.assert_allclose(sc.values[1, :, 0], want, rtol=1e-9)
    logged = [ev for ev in json.loads((run / "metrics.json").read_text()) if ev.get("event") == "step"]
    g = scrub(run, "grad-norm")
    assert g.steps == [ev["step"] for ev in logged]
    assert g.values[0, 2, 0] == logged[0]["grad_norm.decoder.blocks.0"]
    assert g.values[-1, 1, 0] == logged[-1]["grad_norm.encoder.blocks.1"]


def test_scrub_on_the_command_line(run, tmp_path, capsys):
    from desktop_app.cli import main

    out = tmp_path / "entropy.csv"
    assert main(["scrub", str(run), "--metric", "entropy", "--sequences", "2", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert {r["layer"] for r in rows} == {"encoder.0", "encoder.1", "decoder.0"}
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["layer_ids"] == ["encoder.0", "encoder.1", "decoder.0"]
