"""Issue 30: a run's kept checkpoints (core.training.timeline) and the per-head metrics over them.

Kept steps open as exactly the weights the run had at that step; the disk bound is honoured and said; a
resumed run goes on adding kept steps; a deleted kept step is reported in one line; the induction score of
a hand-built attention pattern is exact. The slow test trains a 2-layer GPT-2 on the induction task and
watches its induction head form as the loss drops.
"""
from __future__ import annotations

import json
import os
import shutil
import time

import numpy as np
import pytest
import torch

from desktop_app.core import analysis
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.files import MANIFEST, read_manifest
from desktop_app.core.training import TrainConfig, train
from desktop_app.core.training import trainer as trainer_mod
from desktop_app.core.training.timeline import (KeptStepError, folder_bytes, is_kept, kept_schedule, kept_steps,
                                                step_folder)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

MODEL = {"n_layers": 1, "n_heads": 2, "d_model": 16, "d_ff": 32}


def _cfg(**kw) -> TrainConfig:
    base = dict(task="induction", task_options={"length": 6, "symbols": 6}, model=dict(MODEL), lr=3e-3,
                schedule="constant", warmup_steps=0, batch_size=8, eval_every=100, checkpoint_every=100,
                log_every=2, keep_every=4)
    base.update(kw)
    return TrainConfig(**base)


def _weights(path) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in load_model_folder(path).model.state_dict().items()}


# -- the schedule ----------------------------------------------------------------------------------


@pytest.mark.parametrize("every,spacing,end,expected", [
    (4, "linear", 13, [0, 4, 8, 12]),
    (10, "log", 35, [0, 1, 2, 4, 8, 10, 20, 30]),
    (0, "log", 40, [0, 1, 2, 4, 8, 16, 32]),
    (0, "linear", 40, []),
])
def test_kept_schedule(every, spacing, end, expected):
    assert kept_schedule(every, spacing, end) == expected
    assert kept_schedule(every, spacing, end) == [s for s in range(end + 1) if is_kept(s, every, spacing)]
    assert kept_schedule(every, spacing, end, start=3) == [s for s in expected if s >= 3]


# -- kept steps on disk ----------------------------------------------------------------------------


def test_a_kept_step_opens_as_exactly_the_weights_at_that_step(tmp_path, monkeypatch):
    """The state in memory when each checkpoint was written, against the kept folder of that step."""
    at: dict[int, dict[str, torch.Tensor]] = {}
    original = trainer_mod.save_checkpoint

    def recording(out_dir, model, task, opt, cfg, step, *args, **kw):
        at[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return original(out_dir, model, task, opt, cfg, step, *args, **kw)

    monkeypatch.setattr(trainer_mod, "save_checkpoint", recording)
    run = tmp_path / "run"
    events: list[dict] = []
    train(_cfg(steps=10), run, on_event=events.append)
    tl = kept_steps(run)
    assert [k.step for k in tl.kept()] == [0, 4, 8]
    assert [k.step for k in tl.steps] == [0, 4, 8, 10] and tl.steps[-1].latest and tl.steps[-1].path == run
    assert [e["step"] for e in events if e["event"] == "checkpoint" and e.get("kept")] == [0, 4, 8]
    for step in (0, 4, 8):
        folder = step_folder(run, step)
        assert folder == run / "checkpoints" / f"step-{step:06d}"
        saved = _weights(folder)
        assert saved.keys() == at[step].keys()
        assert all(torch.equal(saved[k], at[step][k]) for k in saved), step
    assert not all(torch.equal(a, b) for a, b in zip(at[0].values(), at[8].values()))  # it did train
    # a complete model folder that opens anywhere, without the optimiser state (the run folder has it)
    moved = tmp_path / "elsewhere"
    shutil.copytree(run / "checkpoints" / "step-000004", moved)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in moved.iterdir()}
    assert not (moved / "optimizer.safetensors").exists() and (run / "optimizer.safetensors").is_file()
    assert all(torch.equal(a, at[4][k]) for k, a in _weights(moved).items())
    # listed in the manifests: the run's lists checkpoints/, which lists every kept step
    assert "checkpoints" in read_manifest(run)
    assert read_manifest(run / "checkpoints") == {"step-000000", "step-000004", "step-000008"}
    assert step_folder(run, 10) == run  # the run's own checkpoint
    # the loss curve from the run's metrics
    assert tl.curve.steps == [2, 4, 6, 8, 10] and len(tl.curve.train_loss) == 5


def test_the_disk_bound_is_honoured_and_said(tmp_path):
    probe = tmp_path / "probe"
    train(_cfg(steps=1, keep_every=100), probe)
    each = folder_bytes(probe / "checkpoints" / "step-000000")
    bound = 2.5 * each  # two kept folders fit, not three
    events: list[dict] = []
    run = tmp_path / "run"
    train(_cfg(steps=12, keep_every=2, keep_max_gb=bound / 1e9), run, on_event=events.append)
    plan = events[0]["keep"]
    assert plan["steps"] == 7 and plan["max_bytes"] == pytest.approx(bound)
    assert plan["last_within_bound"] in (0, 2)  # said before the first step (an estimate: a little above)
    assert [k.step for k in kept_steps(run).kept()] == [0, 2]
    assert folder_bytes(run / "checkpoints") <= bound
    stopped = [e for e in events if e["event"] == "keep_stopped"]
    assert len(stopped) == 1 and stopped[0]["step"] == 4
    message = stopped[0]["message"]
    assert str(run / "checkpoints") in message and "--keep-max-gb" in message and "\n" not in message
    assert events[-1]["event"] == "done" and events[-1]["step"] == 12  # training went on


def test_a_resumed_run_goes_on_adding_kept_steps(tmp_path):
    run = tmp_path / "run"
    train(_cfg(steps=8), run)
    before = {s: _weights(step_folder(run, s)) for s in (0, 4, 8)}
    (run / "checkpoints" / "notes.txt").write_text("mine")  # a user's file under checkpoints/ is never lost
    events: list[dict] = []
    train(_cfg(steps=16), run, resume=True, on_event=events.append)
    assert events[0]["keep"]["already"] == 3 and events[0]["keep"]["shown"] == "12, 16"
    assert [k.step for k in kept_steps(run).steps] == [0, 4, 8, 12, 16]
    for s, w in before.items():  # the earlier kept steps are still exactly what they were
        assert all(torch.equal(a, w[k]) for k, a in _weights(step_folder(run, s)).items())
    assert not all(torch.equal(a, before[8][k]) for k, a in _weights(step_folder(run, 16)).items())
    assert (run / "checkpoints" / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "run.old").exists() and len(list(tmp_path.iterdir())) == 1  # nothing left beside it
    # a new run over it (overwrite) starts its own kept steps; the user's file stays
    train(_cfg(steps=4, keep_every=2), run)
    assert [k.step for k in kept_steps(run).steps] == [0, 2, 4]
    assert (run / "checkpoints" / "notes.txt").read_text() == "mine"


def test_a_deleted_kept_step_is_reported_in_one_line(tmp_path):
    run = tmp_path / "run"
    train(_cfg(steps=8), run)
    shutil.rmtree(run / "checkpoints" / "step-000004")
    tl = kept_steps(run)
    assert [k.step for k in tl.missing()] == [4] and [k.step for k in tl.openable()] == [0, 8]
    with pytest.raises(KeptStepError) as exc:
        step_folder(run, 4)
    msg = str(exc.value)
    assert "step-000004" in msg and "deleted" in msg and "0, 8" in msg and "\n" not in msg
    with pytest.raises(KeptStepError, match="step 5 was not kept; the run has steps 0, 8"):
        step_folder(run, 5)
    with pytest.raises(KeptStepError, match="not a training run folder"):
        step_folder(run / "checkpoints", 0)
    with pytest.raises(KeptStepError, match="a kept step's folder .open it directly"):
        step_folder(run / "checkpoints" / "step-000000", 0)
    # a resume after the deletion still works, and still says the step was deleted
    train(_cfg(steps=12), run, resume=True)
    tl = kept_steps(run)
    assert [k.step for k in tl.missing()] == [4] and [k.step for k in tl.openable()] == [0, 8, 12]


# -- the metrics -----------------------------------------------------------------------------------


def _hand_built(t: int, period: int) -> np.ndarray:
    """[3, t, t] causal patterns: head 0 a perfect induction head in the repeat (uniform before it), head 1
    a previous-token head, head 2 uniform over the past."""
    uniform = np.tril(np.ones((t, t))) / np.arange(1, t + 1)[:, None]
    induction = uniform.copy()
    for i in range(period, t):
        induction[i] = 0.0
        induction[i, i - period + 1] = 1.0
    previous = np.zeros((t, t))
    previous[0, 0] = 1.0
    for i in range(1, t):
        previous[i, i - 1] = 1.0
    return np.stack([induction, previous, uniform])


def test_the_induction_score_of_a_hand_built_pattern_is_exact():
    t, period = 10, 5
    p = _hand_built(t, period)
    score = analysis.induction_score(p, period)
    assert score[0] == 1.0 and score[1] == 0.0
    assert score[2] == pytest.approx(np.mean([1 / (i + 1) for i in range(period, t)]), abs=1e-15)
    prev = analysis.previous_token_score(p)
    assert prev[1] == 1.0 and prev[0] == pytest.approx(np.mean([1 / (i + 1) for i in range(1, period)] + [0] * 5))
    # half an induction head, half a previous-token head: half each
    mixed = (p[0] + p[1]) / 2
    assert analysis.induction_score(mixed, period) == pytest.approx(0.5, abs=1e-15)
    with pytest.raises(ValueError, match="period"):
        analysis.induction_score(p, t)


def test_a_fixed_offset_head_scores_only_on_its_own_period():
    """The induction score on repeated_probe's repeats of several lengths (one period and start per sequence):
    a hand-built induction head scores 1, a head looking a fixed distance back scores 1 only where that
    distance is the sequence's period minus one (issue 30: such a head passed for an induction head)."""
    ids, period, start = analysis.repeated_probe(6, (3, 8), 50, 17, seed=2)
    assert period.tolist() == [3, 4, 5, 6, 7, 8] and (start == 17 - period).all()
    for row, p, st in zip(ids, period, start):
        assert torch.equal(row[st:], row[st - p: st])  # the last p tokens repeat the p before them
    t = 17
    induction = np.zeros((6, 2, t, t))
    for b, p in enumerate(period):
        for i in range(t):  # head 0: i - p + 1 in the repeat, itself elsewhere; head 1: 4 back (period 5)
            induction[b, 0, i, i - p + 1 if i >= 17 - p else i] = 1.0
            induction[b, 1, i, max(i - 4, 0)] = 1.0
    score = analysis.induction_score(induction, period, start)
    assert score.shape == (6, 2) and (score[:, 0] == 1.0).all()
    assert score[:, 1].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert analysis.induction_score(induction[2], 5, 12).tolist() == [1.0, 1.0]  # one period for all
    with pytest.raises(ValueError, match="period"):
        analysis.induction_score(induction, period[:3], start[:3])


def test_head_scores_read_the_models_own_attention(tmp_path):
    """head_scores through the model equals the scores of the patterns the model's trace records."""
    run = tmp_path / "run"
    train(_cfg(steps=2, keep_every=0), run)
    model = load_model_folder(run).model.eval()
    ids = analysis.repeated_sequences(4, 6, 6, seed=1, length=11)
    assert ids.shape == (4, 11) and torch.equal(ids[:, :5], ids[:, 6:11])
    _, trace = model.run_with_trace(ids, names=("blocks.*.attn.pattern",))
    p = trace["blocks.0.attn.pattern"].numpy()
    got = analysis.head_scores(model, ids, "induction", 6)
    assert got.shape == (1, 2)
    assert np.allclose(got[0], analysis.induction_score(p, 6).mean(0))
    assert np.allclose(analysis.head_scores(model, ids, "entropy", 6)[0], analysis.attention_entropy(p).mean(0))


# -- the run: an induction head forms as the loss drops ------------------------------------------


# The run: repeats of 8 to 16 of 64 symbols (no fixed look-back solves it), GPT-2 with rotary positions
# (learned positions formed no previous-token head within 2,000 steps here: see the README)
INDUCTION_TASK = {"length": 16, "min_length": 8, "symbols": 64}
INDUCTION_MODEL = {"n_layers": 2, "n_heads": 4, "d_model": 128, "d_ff": 128, "context_length": 31,
                   "positions": "rotary"}
INDUCTION_RUN = dict(lr=1e-3, schedule="constant", warmup_steps=200, batch_size=32, steps=600, eval_every=600,
                     checkpoint_every=600, log_every=10, keep_every=50, keep_spacing="linear", seed=0)


@pytest.mark.slow
def test_an_induction_head_forms_with_the_loss_drop(tmp_path):
    """A 2-layer GPT-2 on the induction task with repeats of 8 to 15 tokens (min_length: no fixed look-back
    solves it), measured by scrub on repeats of several lengths: a previous-token head forms in layer 0 and an
    induction head in layer 1, its score rising from below 0.3 to above 0.7 as the training loss drops."""
    from desktop_app.app.timeline import scrub

    cfg = TrainConfig(task="induction", task_options=dict(INDUCTION_TASK), family="gpt2", model=dict(INDUCTION_MODEL),
                      **INDUCTION_RUN)
    t0 = time.perf_counter()
    train(cfg, tmp_path / "run")
    seconds = time.perf_counter() - t0
    result = scrub(tmp_path / "run", "induction")
    s = result.summary()
    layer, head = s["best"]["layer"], s["best"]["head"]
    prev = scrub(tmp_path / "run", "prev-token")
    print(json.dumps({"train_seconds": round(seconds, 1), **s}))
    print("best head by step:", [(st, round(float(v), 3)) for st, v in zip(result.steps, result.values[:, layer, head])])
    print("layer 0's best previous-token score by step:", [(st, round(float(v), 3)) for st, v in
                                                           zip(prev.steps, prev.values[:, 0].max(-1))])
    curve = result.timeline.curve
    print("train loss:", [(st, round(v, 3)) for st, v in zip(curve.steps, curve.train_loss)][::5])
    assert s["period"] == [INDUCTION_TASK["min_length"], INDUCTION_TASK["length"] - 1]  # repeats of several lengths
    first, last = s["best"]["first"], s["best"]["last"]
    assert layer == 1 and first < 0.3 < 0.7 < last, s  # an induction head, in layer 1
    assert prev.values[-1, 0].max() > 0.7, prev.values[-1]  # fed by a previous-token head in layer 0
    rise, drop = s["best"]["rise_step"], s["loss_drop_step"]
    assert rise is not None and drop is not None and abs(rise - drop) <= 2 * INDUCTION_RUN["keep_every"], s


def test_overwrite_keeps_a_users_file_in_a_kept_steps_folder(tmp_path):
    """Issue 41: a note put in checkpoints/step-000008 survives a run started over the folder with --overwrite
    that keeps step 8 again (before: the step's new folder replaced the old one, note and all); the step
    opens as the new run's model."""
    run = tmp_path / "run"
    train(_cfg(steps=8), run)
    note = run / "checkpoints" / "step-000008" / "note.txt"
    note.write_text("my note")
    train(_cfg(steps=8, seed=1), run)  # (the CLI's --overwrite has checked the folder; train writes it)
    assert note.read_text() == "my note"
    assert [k.step for k in kept_steps(run).kept()] == [0, 4, 8]
    again = _weights(step_folder(run, 8))
    assert all(torch.equal(again[k], v) for k, v in _weights(run).items())


@pytest.mark.skipif(os.name == "nt", reason="symbolic links need privileges on Windows")
def test_a_kept_step_that_links_out_of_the_run_is_refused(tmp_path):
    """Issue 41: checkpoints/step-000004 replaced by a link to another model is never opened as the run's step
    4: --step refuses it in one line, scrub skips it with a word, the GUI's open of its path refuses it."""
    from desktop_app.app.timeline import check_step_path, scrub

    run, other = tmp_path / "run", tmp_path / "other"
    train(_cfg(steps=8), run)
    train(_cfg(steps=4, seed=3), other)
    step4 = step_folder(run, 4)
    shutil.rmtree(step4)
    step4.symlink_to(other)
    with pytest.raises(KeptStepError, match="outside the run") as info:
        step_folder(run, 4)
    assert "\n" not in str(info.value)
    with pytest.raises(KeptStepError, match="outside the run"):
        check_step_path(step4)
    check_step_path(step_folder(run, 8))  # a real kept step opens
    assert 4 not in scrub(run, "weight-norm").steps


def test_a_step_folder_named_in_other_digits_is_no_step():
    """_STEP_NAME's \\d took any script's digits: 'step-٠٠٠٠١٢' (Arabic-Indic) and full-width digits were step 12
    (int() reads them). Only ASCII digits name a kept step, as step_name writes them."""
    from desktop_app.core.training.timeline import step_name, step_of

    assert step_of(step_name(12)) == 12 and step_of("step-1234567") == 1234567
    for name in ("step-\u0660\u0660\u0660\u0660\u0661\u0662", "step-\uff10\uff10\uff10\uff10\uff11\uff12",
                 "step-00001\u0662"):
        assert step_of(name) is None, name


def test_a_long_runs_metrics_json_beyond_read_jsons_default_cap_is_read(tmp_path):
    """A run's history grows with its steps: 320 k logged steps (18 MB) are past read_json's 16 MB default for
    settings files, and the timeline and resuming (state.read_metrics) still read it whole."""
    from desktop_app.core.training.state import read_metrics

    events = [{"event": "step", "step": 10 * i, "train_loss": 1.0 + i % 7 / 8} for i in range(320_000)]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"step": 3_200_000}))
    (tmp_path / "metrics.json").write_text(json.dumps(events))
    assert (tmp_path / "metrics.json").stat().st_size > 1 << 24
    timeline = kept_steps(tmp_path)
    assert timeline.unread_metrics is None and len(timeline.curve.train_loss) == 320_000
    assert read_metrics(tmp_path) == events


def test_a_runs_metrics_json_beyond_read_jsons_cap_is_refused_unread_in_one_line(tmp_path):
    """The timeline (kept_steps' loss curve, grad_norm_scrub) read metrics.json whole and dropped it without a word
    when it was not JSON: a 20 MB one was read, a 2 GB one would have been. It goes through files.read_json's cap
    (files.METRICS_MAX_BYTES, 256 MB, as resuming reads it: state.read_metrics): the curve is empty and one line names
    the file and its size."""
    import tracemalloc

    from desktop_app.app.timeline import grad_norm_scrub

    (tmp_path / "trainer_state.json").write_text(json.dumps({"step": 4}))
    (tmp_path / "metrics.json").write_text(json.dumps([{"event": "step", "step": 2, "train_loss": 1.5}]))
    timeline = kept_steps(tmp_path)
    assert timeline.curve.train_loss == [1.5] and timeline.unread_metrics is None
    with open(tmp_path / "metrics.json", "wb") as fh:
        fh.truncate(300 << 20)  # sparse
    line = f"{tmp_path / 'metrics.json'}: is 314,572,800 bytes, not a settings file (at most 268,435,456 are read)"
    tracemalloc.start()
    try:
        timeline = kept_steps(tmp_path)
        with pytest.raises(ValueError) as err:
            grad_norm_scrub(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert timeline.unread_metrics == line and timeline.curve.steps == [] and timeline.latest_step == 4
    assert str(err.value) == line
    assert peak < 8 << 20, peak
