"""Issue 30 (CLI): `scrub RUN_DIR --metric M --csv OUT.csv` and `RUN_DIR --step N` on the commands taking a model."""
from __future__ import annotations

import csv
import json
import shutil

import pytest

from desktop_app.cli import main
from desktop_app.core.training import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-layer, 2-head run of 8 steps keeping steps 0, 4 and 8 (its own checkpoint at 10)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("scrub") / "run"
    train(TrainConfig(task="induction", task_options={"length": 6, "symbols": 6},
                      model={"n_layers": 2, "n_heads": 2, "d_model": 16, "d_ff": 32}, steps=10, batch_size=8,
                      eval_every=5, checkpoint_every=100, log_every=2, keep_every=4), folder)
    torch.set_num_threads(n)
    return folder


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("metric", ["induction", "prev-token", "entropy", "distance"])
def test_scrub_writes_one_row_per_kept_step_layer_and_head(run, tmp_path, capsys, metric):
    out = tmp_path / "m.csv"
    assert main(["scrub", str(run), "--metric", metric, "--csv", str(out)]) == 0
    summary = _last_json(capsys.readouterr().out)
    with open(out, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", "layer", "head", "value"]
    body = rows[1:]
    assert len(body) == 4 * 2 * 2  # steps 0, 4, 8 and the run's checkpoint at 10; 2 layers; 2 heads
    assert [(int(r[0]), int(r[1]), int(r[2])) for r in body] == \
        [(s, l, h) for s in (0, 4, 8, 10) for l in range(2) for h in range(2)]
    values = [float(r[3]) for r in body]
    assert all(v >= 0 for v in values) and len(set(values)) > 1
    if metric in ("induction", "prev-token"):
        assert all(v <= 1 for v in values)
    assert summary["steps"] == [0, 4, 8, 10] and summary["rows"] == 16 and summary["metric"] == metric
    best = summary["best"]
    last = [float(r[3]) for r in body if int(r[0]) == 10]
    assert best["last"] == pytest.approx(max(last))


def test_scrub_refuses_an_existing_csv_and_a_folder_that_is_no_run(run, tmp_path, capsys):
    out = tmp_path / "m.csv"
    out.write_text("mine")
    assert main(["scrub", str(run), "--metric", "induction", "--csv", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--overwrite" in err[0] and out.read_text() == "mine"
    assert main(["scrub", str(tmp_path), "--metric", "induction", "--csv", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a training run folder" in err[0]


def test_scrub_skips_a_deleted_step_and_says_so(run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "checkpoints" / "step-000004")
    assert main(["scrub", str(copy), "--metric", "prev-token", "--csv", str(tmp_path / "m.csv")]) == 0
    captured = capsys.readouterr()
    assert _last_json(captured.out)["steps"] == [0, 8, 10] and _last_json(captured.out)["deleted"] == [4]
    assert "kept step 4 has been deleted" in captured.err
    assert main(["info", str(copy), "--step", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "deleted" in err[0] and "step-000004" in err[0]


def test_every_model_command_opens_a_runs_step(run, tmp_path, capsys):
    assert main(["info", str(run), "--step", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["n_layers"] == 2
    out = tmp_path / "t.npz"
    assert main(["trace", str(run), "--step", "8", "--ids", "1,2,3", "--out", str(out)]) == 0
    assert out.is_file()
    capsys.readouterr()
    assert main(["generate", str(run), "--step", "0", "--prompt-ids", "1,2", "--max-new", "1"]) == 0
    capsys.readouterr()
    assert main(["info", str(run / "checkpoints" / "step-000008")]) == 0  # a kept step's folder, directly
    capsys.readouterr()
    assert main(["info", str(run), "--step", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "step 5 was not kept; the run has steps 0, 4, 8, 10" in err[0]


def test_every_command_taking_a_model_has_step():
    from desktop_app.cli import build_parser
    import argparse

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    with_model = {name for name, p in sub.choices.items()
                  if any(a.dest == "model_dir" and not a.option_strings for a in p._actions)}
    assert {"info", "trace", "generate", "render", "lipschitz", "attribute", "patch"} <= with_model
    for name in with_model:
        assert any("--step" in a.option_strings for a in sub.choices[name]._actions), name


def test_scrub_weight_norms_one_row_per_step_and_layer(run, tmp_path, capsys):
    import torch

    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.core.training.timeline import step_folder

    out = tmp_path / "w.csv"
    assert main(["scrub", str(run), "--metric", "weight-norm", "--csv", str(out)]) == 0
    summary = _last_json(capsys.readouterr().out)
    with open(out, newline="") as f:
        body = list(csv.reader(f))[1:]
    assert [(int(r[0]), int(r[1]), int(r[2])) for r in body] == [(s, l, -1) for s in (0, 4, 8, 10) for l in range(2)]
    for r in body:
        model = load_model_folder(step_folder(run, int(r[0]))).model
        block = [p for n, p in model.named_parameters() if n.startswith(f"blocks.{r[1]}.")]
        assert float(r[3]) == pytest.approx(float(torch.sqrt(sum((p.detach().double() ** 2).sum() for p in block))), rel=1e-9)
    assert summary["heads"] is None and summary["best"]["head"] == -1
