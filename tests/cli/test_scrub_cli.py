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


def _csv_body(path) -> list[tuple[int, int, int, float]]:
    with open(path, newline="") as f:
        return [(int(r[0]), int(r[1]), int(r[2]), float(r[3])) for r in list(csv.reader(f))[1:]]


def _probe(run, n):
    from desktop_app.app.timeline import probe_sequences
    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.core.training.trainer import read_run_config

    return probe_sequences(load_model_folder(run).config, read_run_config(run), n, 0)


def test_scrub_lipschitz_of_a_chosen_layer_is_the_exact_jacobian_norm_at_each_step(run, tmp_path, capsys):
    """--metric lipschitz --layer 1: one row per kept step (head -1), the mean over the first probe
    sequences of ||D_X f||_2 of layer 1's attention module, here from the full Jacobian of the model's own
    module (not the estimator the app uses)."""
    import torch

    from desktop_app.app.timeline import LIPSCHITZ_SEQUENCES
    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.core.lipschitz.estimator import exact_jacobian_norm
    from desktop_app.core.lipschitz.measured import module_function
    from desktop_app.core.training.timeline import step_folder

    out = tmp_path / "l.csv"
    assert main(["scrub", str(run), "--metric", "lipschitz", "--layer", "1", "--csv", str(out)]) == 0
    summary = _last_json(capsys.readouterr().out)
    body = _csv_body(out)
    assert [(s, l, h) for s, l, h, _ in body] == [(s, 1, -1) for s in (0, 4, 8, 10)]
    ids = _probe(run, 32)[0][:LIPSCHITZ_SEQUENCES]
    for step, _, _, value in body:
        model = load_model_folder(step_folder(run, step)).model.double().eval()
        _, trace = model.run_with_trace(ids, names=("blocks.1.attn.input",))
        exact = exact_jacobian_norm(module_function(model, 1), trace["blocks.1.attn.input"].double())
        assert value == pytest.approx(float(exact.mean()), rel=1e-3)
    assert summary["metric"] == "lipschitz" and summary["layer_ids"] == [1] and summary["best"]["layer"] == 1
    assert summary["heads"] is None and summary["best"]["head"] == -1


def test_scrub_logit_lens_is_the_models_own_next_token_probability_at_its_last_layer(run, tmp_path, capsys,
                                                                                   monkeypatch):
    """--metric logit-lens / logit-lens-rank: one row per kept step and layer; at the last layer the lens is
    the model's own output, so the value is the mean probability (rank) the model gives the correct next
    token over the repeats' predictable positions; --text measures a text of one's own at every position."""
    import numpy as np
    import torch

    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.core.training.timeline import step_folder

    ids, _, start, _ = _probe(run, 32)
    prob_csv, rank_csv = tmp_path / "p.csv", tmp_path / "r.csv"
    assert main(["scrub", str(run), "--metric", "logit-lens", "--csv", str(prob_csv)]) == 0
    assert main(["scrub", str(run), "--metric", "logit-lens-rank", "--csv", str(rank_csv)]) == 0
    capsys.readouterr()
    probs, ranks = _csv_body(prob_csv), _csv_body(rank_csv)
    assert [(s, l, h) for s, l, h, _ in probs] == [(s, l, -1) for s in (0, 4, 8, 10) for l in range(2)]
    for step in (0, 4, 8, 10):
        model = load_model_folder(step_folder(run, step)).model.eval()
        with torch.no_grad():
            p = torch.softmax(model(ids).logits.float(), -1)
        pick, rank = [], []
        for i in range(len(ids)):
            for t in range(int(start[i]), ids.shape[1] - 1):
                target = int(ids[i, t + 1])
                pick.append(float(p[i, t, target]))
                rank.append(int((p[i, t] > p[i, t, target]).sum()))
        assert dict(((s, l), v) for s, l, _, v in probs)[(step, 1)] == pytest.approx(np.mean(pick), rel=1e-4)
        assert dict(((s, l), v) for s, l, _, v in ranks)[(step, 1)] == pytest.approx(np.mean(rank), abs=1e-9)
    import desktop_app.app.timeline as timeline

    one_at_a_time = tmp_path / "p1.csv"  # a large vocabulary's lenses are traced a sequence at a time: the same
    monkeypatch.setattr(timeline, "LENS_BYTES", 1)
    assert main(["scrub", str(run), "--metric", "logit-lens", "--csv", str(one_at_a_time)]) == 0
    capsys.readouterr()
    assert [v for *_, v in _csv_body(one_at_a_time)] == pytest.approx([v for *_, v in probs], rel=1e-6)
    text = "0 1 2 3 0 1 2 3"
    assert main(["scrub", str(run), "--metric", "logit-lens", "--text", text, "--csv", str(prob_csv),
                 "--overwrite"]) == 0
    assert _last_json(capsys.readouterr().out)["text"] == text
    model = load_model_folder(run).model.eval()
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]])).logits.float(), -1)[0]
    expected = np.mean([float(p[t, [1, 2, 3, 0, 1, 2, 3][t]]) for t in range(7)])
    assert dict(((s, l), v) for s, l, _, v in _csv_body(prob_csv))[(10, 1)] == pytest.approx(expected, rel=1e-4)


def test_scrub_gradient_norms_are_the_ones_the_trainer_logged(run, tmp_path, capsys):
    out = tmp_path / "g.csv"
    assert main(["scrub", str(run), "--metric", "grad-norm", "--csv", str(out)]) == 0
    capsys.readouterr()
    logged = [ev for ev in json.loads((run / "metrics.json").read_text()) if ev.get("event") == "step"]
    assert logged and _csv_body(out) == [(ev["step"], l, -1, pytest.approx(ev[f"grad_norm.blocks.{l}"]))
                                         for ev in logged for l in range(2)]


@pytest.mark.parametrize("args, message", [
    (["--metric", "lipschitz", "--layer", "2"], "layer 2 is not a layer of this model (0 to 1)"),
    (["--metric", "induction", "--layer", "0"], "--layer chooses the layer of a per-layer metric"),
    (["--metric", "weight-norm", "--text", "0 1"], "--text is measured by lipschitz, logit-lens"),
    (["--metric", "logit-lens", "--text", "0"], "the text is 1 token long"),
])
def test_scrub_refuses_a_layer_or_text_it_cannot_measure_in_one_line(run, tmp_path, capsys, args, message):
    out = tmp_path / "x.csv"
    assert main(["scrub", str(run), *args, "--csv", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and not out.exists()


def test_scrub_measures_a_cached_models_step_revisions(tmp_path, capsys, monkeypatch):
    """A Hugging Face cache repository whose refs name training steps (Pythia's step1000 ...): scrub measures
    each step's snapshot, the repository folder or one of its snapshots given; a step whose snapshot the
    cache lacks is named and skipped."""
    from desktop_app.app.timeline import probe_sequences
    from desktop_app.core.analysis import head_scores
    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.core.hf_cache import step_snapshot
    from fake_hf_cache import add_step_revisions, point_at

    cache = tmp_path / "hf-cache"
    point_at(monkeypatch, cache, tmp_path / "home")
    repo = add_step_revisions(cache, tmp_path, missing=(512,))  # steps 0, 512 (not in the cache), 1000
    out = tmp_path / "p.csv"
    for where in (repo, step_snapshot(repo, 1000)):
        assert main(["scrub", str(where), "--metric", "prev-token", "--csv", str(out), "--overwrite"]) == 0
        captured = capsys.readouterr()
        summary = _last_json(captured.out)
        assert summary["steps"] == [0, 1000] and summary["deleted"] == [512] and "step 512" in captured.err
        body = _csv_body(out)
        for step in (0, 1000):
            loaded = load_model_folder(step_snapshot(repo, step))
            ids, period, start, _ = probe_sequences(loaded.config, None, 32, 0)
            expected = head_scores(loaded.model.eval(), ids, "prev-token", period, start)
            assert [v for s, _, _, v in body if s == step] == pytest.approx(expected.reshape(-1).tolist())
    assert main(["scrub", str(repo), "--metric", "logit-lens", "--csv", str(out), "--overwrite"]) == 0
    assert [(s, l) for s, l, _, _ in _csv_body(out)] == [(0, 0), (1000, 0)]


def test_a_corrupt_checkpoints_manifest_is_named_by_step_and_scrub(run, tmp_path, capsys):
    # the step folders are there but the manifest listing them is damaged: `--step 4` says the manifest is
    # corrupt (not "step 4 was not kept"), and scrub says it measures only the run's own checkpoint
    from desktop_app.core.files import MANIFEST

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "checkpoints" / MANIFEST).write_text("{not json", encoding="utf-8")
    assert main(["info", str(copy), "--step", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "corrupt" in err[0] and MANIFEST in err[0] and "not kept" not in err[0]
    assert main(["scrub", str(copy), "--metric", "prev-token", "--csv", str(tmp_path / "m.csv")]) == 0
    captured = capsys.readouterr()
    assert _last_json(captured.out)["steps"] == [10]
    assert "corrupt" in captured.err and "measuring only what can be read" in captured.err
