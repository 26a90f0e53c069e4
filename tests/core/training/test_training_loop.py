"""The training loop: overfitting, events, divergence, exact resume, transformers parity of checkpoints."""
from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
from pathlib import Path

import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.training import TrainConfig, TrainControl, TrainingDiverged, checkpoint_step, train

SMALL = {"n_layers": 2, "n_heads": 2, "d_model": 32, "d_ff": 64}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _random_text(tmp_path, n=200, seed=0):
    rng = random.Random(seed)
    path = tmp_path / "noise.txt"
    path.write_text("".join(rng.choice("abcdefghij") for _ in range(n)), encoding="utf-8")
    return path


def test_tiny_model_overfits_a_tiny_dataset(tmp_path):
    # 180 training characters of noise: only memorising them lowers the loss below ln(10) = 2.30
    text = _random_text(tmp_path)
    cfg = TrainConfig(task="text", task_options={"text_file": str(text)}, family="gpt2",
                      model={**SMALL, "d_model": 64, "d_ff": 256, "context_length": 16}, lr=3e-3, steps=300,
                      warmup_steps=20, batch_size=16, eval_every=300, checkpoint_every=1000, log_every=10)
    events = []
    summary = train(cfg, tmp_path / "run", on_event=events.append)
    steps = [e for e in events if e["event"] == "step"]
    assert steps[0]["train_loss"] > 2.0
    assert summary["train_loss"] < 0.6, summary
    assert summary["val_loss"] > 2.0  # the held-out noise cannot be predicted: overfitting, not learning
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "done" and "checkpoint" in kinds
    last = steps[-1]
    for key in ("step", "train_loss", "train_accuracy", "lr", "grad_norm", "tokens_per_s", "elapsed", "eta"):
        assert key in last
    # one evaluation interval (300 steps): the running training accuracy climbs as the noise is memorised
    assert steps[0]["train_accuracy"] < 0.3 and last["train_accuracy"] > 0.5 and summary["val_accuracy"] < 0.3
    assert summary["train_accuracy"] == last["train_accuracy"]
    assert set(last["grad_norms"]) == {"embed", "blocks.0", "blocks.1", "head"}
    total = math.sqrt(sum(v * v for v in last["grad_norms"].values()))
    assert total == pytest.approx(last["grad_norm"], rel=1e-4)  # per-layer norms add up to the clipped one
    hist = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [h["step"] for h in hist if h["event"] == "step"] == [e["step"] for e in steps]
    csv_head = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0]
    assert "train_loss" in csv_head and "train_accuracy" in csv_head and "grad_norm.blocks.0" in csv_head
    assert [h["train_accuracy"] for h in hist if h["event"] == "step"] == [e["train_accuracy"] for e in steps]


def test_train_accuracy_counts_the_training_batches_since_the_last_evaluation(tmp_path):
    # lr 0: the model never changes, so the reported training accuracy must be its accuracy on the
    # very batches the run drew (same seed, same generator), interval by interval
    from desktop_app.core.training.tasks import IGNORE
    from desktop_app.core.training.trainer import task_for

    cfg = TrainConfig(task="sort", task_options={"length": 4, "symbols": 5}, model=SMALL, lr=0.0,
                      schedule="constant", warmup_steps=0, steps=6, batch_size=8, log_every=1, eval_every=3)
    events = []
    summary = train(cfg, tmp_path / "run", on_event=events.append)
    model = load_model_folder(tmp_path / "run").model
    task = task_for(cfg, causal=True)
    gen = torch.Generator().manual_seed(cfg.seed)
    hits = []
    with torch.no_grad():
        for _ in range(cfg.steps):
            b = task.train_batch(cfg.batch_size, gen)
            scored = b.targets != IGNORE
            hits.append(((model(b.inputs).logits.argmax(-1) == b.targets)[scored].sum().item(), scored.sum().item()))
    steps = [e for e in events if e["event"] == "step"]
    evals = [e for e in events if e["event"] == "eval"]
    for e in steps:  # running since the last evaluation
        start = (e["step"] - 1) // 3 * 3
        part = hits[start:e["step"]]
        assert e["train_accuracy"] == pytest.approx(sum(c for c, _ in part) / sum(n for _, n in part))
    assert [e["step"] for e in evals] == [3, 6]
    for e in evals:
        part = hits[e["step"] - 3:e["step"]]
        assert e["train_accuracy"] == pytest.approx(sum(c for c, _ in part) / sum(n for _, n in part))
    assert summary["train_accuracy"] == evals[-1]["train_accuracy"]
    hist = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [h["train_accuracy"] for h in hist if h["event"] == "eval"] == [e["train_accuracy"] for e in evals]


def test_bfloat16_autocast_on_cpu_trains_and_saves_float32_weights(tmp_path):
    from safetensors import safe_open

    cfg = TrainConfig(task="copy", task_options={"length": 4, "symbols": 5}, model=SMALL, lr=3e-3,
                      warmup_steps=0, schedule="constant", steps=30, batch_size=16, log_every=5, eval_every=30,
                      precision="bfloat16")
    events = []
    summary = train(cfg, tmp_path / "run", on_event=events.append)
    losses = [e["train_loss"] for e in events if e["event"] == "step"]
    assert all(math.isfinite(v) for v in losses) and math.isfinite(summary["val_loss"])
    assert losses[-1] < losses[0]
    with safe_open(str(tmp_path / "run" / "model.safetensors"), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}
    assert load_model_folder(tmp_path / "run").config.dtype == "float32"


def test_resume_restores_the_cuda_rng_state(tmp_path, monkeypatch):
    # no GPU needed: torch.cuda is faked just enough for the trainer's save and restore of its RNG state
    saved_state = torch.arange(16, dtype=torch.uint8)
    restored = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [saved_state.clone()])
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device=0: restored.update({device: state}))
    cfg = TrainConfig(task="copy", model=SMALL, steps=2, log_every=1, eval_every=2, checkpoint_every=2)
    train(cfg, tmp_path / "run")
    assert not restored
    train(TrainConfig(**{**cfg.to_dict(), "steps": 3}), tmp_path / "run", resume=True)
    assert set(restored) == {0} and torch.equal(restored[0], saved_state)


def test_a_checkpoint_keeps_the_float16_loss_scale(tmp_path):
    """float16 runs (CUDA only) scale the loss; the checkpoint keeps the scaler's state so a resumed run
    goes on from its scale and growth count, not from 65536 again. The CPU's GradScaler stands in here."""
    from desktop_app.core.checkpoints import new_model
    from desktop_app.core.training.trainer import STATE_FILE, model_config_for, save_checkpoint, task_for

    cfg = TrainConfig(task="copy", model=SMALL, steps=1)
    task = task_for(cfg, causal=True)
    model = new_model(model_config_for(cfg, task), seed=0)
    opt = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=7)
    scaler.scale(torch.ones(()))  # the scale exists once a loss was scaled
    scaler.update(new_scale=512.0)
    save_checkpoint(tmp_path / "run", model, task, opt, cfg, 1, torch.Generator(), [], 0.0, scaler)
    saved = json.loads((tmp_path / "run" / STATE_FILE).read_text())["scaler"]
    assert saved["scale"] == 512.0 and saved["growth_interval"] == 7
    fresh = torch.amp.GradScaler("cpu")
    fresh.load_state_dict(saved)  # what the trainer does on resume
    assert fresh.get_scale() == 512.0
    save_checkpoint(tmp_path / "run2", model, task, opt, cfg, 1, torch.Generator(), [], 0.0)
    assert "scaler" not in json.loads((tmp_path / "run2" / STATE_FILE).read_text())  # float32/bfloat16: none


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    cfg = TrainConfig(task="copy", family="gpt2", model=SMALL, optimizer="sgd", lr=1e4, momentum=0.0,
                      schedule="constant", warmup_steps=0, grad_clip=None, steps=50, checkpoint_every=1,
                      eval_every=1000, log_every=1)
    events = []
    with pytest.raises(TrainingDiverged) as err:
        train(cfg, tmp_path / "run", on_event=events.append)
    msg = str(err.value)
    assert "nan" in msg.lower() or "inf" in msg.lower() or "non-finite" in msg
    assert events[-1]["event"] == "error" and events[-1]["message"] == msg
    bad_step = int(re.search(r"(?:at|by) step (\d+)", msg).group(1))  # the step that went non-finite
    assert bad_step >= 2  # (lr chosen so that the first steps are still finite)
    good = checkpoint_step(tmp_path / "run")
    assert good == bad_step - 1  # checkpoint_every=1: the last good checkpoint is the step just before
    assert f"last good checkpoint (step {good})" in msg
    assert [e["step"] for e in events if e["event"] == "checkpoint"][-1] == good
    loaded = load_model_folder(tmp_path / "run")
    assert all(torch.isfinite(p).all() for p in loaded.model.parameters())
    hist = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert hist[-1]["step"] == good and all(math.isfinite(h["train_loss"]) for h in hist if "train_loss" in h)


def _weights(path):
    return {k: v.clone() for k, v in load_model_folder(path).model.state_dict().items()}


def test_stop_then_resume_equals_an_uninterrupted_run(tmp_path):
    cfg = TrainConfig(task="motif", family="bert", model={"n_layers": 1, "n_heads": 1, "d_model": 16, "d_ff": 32,
                                                          "dropout": 0.1},
                      steps=30, batch_size=16, log_every=5, eval_every=10, checkpoint_every=10)
    full = train(cfg, tmp_path / "full")

    control = TrainControl()

    def stop_at_15(ev):
        if ev["event"] == "step" and ev["step"] == 15:
            control.cancel()

    stopped = train(cfg, tmp_path / "split", on_event=stop_at_15, control=control)
    assert stopped["step"] == 15 and checkpoint_step(tmp_path / "split") == 15
    events = []
    resumed = train(cfg, tmp_path / "split", resume=True, on_event=events.append)
    assert events[0]["event"] == "start" and events[0]["step"] == 15
    assert [e["step"] for e in events if e["event"] == "step"] == [20, 25, 30]
    assert resumed["val_loss"] == pytest.approx(full["val_loss"], abs=1e-6)
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "split")
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k
    hist = json.loads((tmp_path / "split" / "metrics.json").read_text())
    assert [h["step"] for h in hist if h["event"] == "step"] == [5, 10, 15, 20, 25, 30]


def test_pause_holds_the_loop(tmp_path, start_thread):
    import threading

    cfg = TrainConfig(task="copy", model=SMALL, steps=10_000, log_every=1, eval_every=10_000,
                      checkpoint_every=10_000)
    control = TrainControl()
    seen = []
    result = {}
    paused, stepped = threading.Event(), threading.Event()

    def on_event(e):
        seen.append(e)
        {"paused": paused, "step": stepped}.get(e["event"], threading.Event()).set()

    control.pause()
    # the fixture cancels and joins the thread whatever happens here (a failed assertion included)
    thread = start_thread(lambda: result.update(train(cfg, tmp_path / "run", on_event=on_event, control=control)),
                          stop=control.cancel)
    assert paused.wait(60), "no 'paused' event within 60 s"
    assert not [e for e in seen if e["event"] == "step"]  # paused before the first step
    control.resume()
    assert stepped.wait(60), "no step within 60 s of resuming"
    control.cancel()
    thread.join(60)
    assert not thread.is_alive()
    assert result["step"] >= 1 and checkpoint_step(tmp_path / "run") == result["step"]


HANGING_TEST = """
import threading
from desktop_app.core.training import TrainConfig, TrainControl, train


def test_fails_while_a_training_thread_is_paused(tmp_path):
    control = TrainControl()
    control.pause()
    paused = threading.Event()
    cfg = TrainConfig(task="copy", model={"n_layers": 1, "n_heads": 2, "d_model": 16, "d_ff": 32},
                      steps=10_000, log_every=1, eval_every=10_000, checkpoint_every=10_000)
    # the old test's shape: a plain (non-daemon) thread, no teardown, never resumed nor cancelled
    threading.Thread(target=train, args=(cfg, tmp_path / "run"),
                     kwargs={"control": control, "on_event": lambda e: e["event"] == "paused" and paused.set()}).start()
    assert paused.wait(60)
    assert False, "the assertion that fails while the loop is paused"
"""


def test_a_failing_test_that_leaves_a_paused_training_thread_does_not_hang_pytest(tmp_path):
    """Issue 25 §1: a test that failed while its training thread was paused kept Python from exiting
    (it waits for non-daemon threads). A paused or running job now ends at its next check once the
    main thread has ended, so the session below exits with its failure instead of hanging."""
    import subprocess
    import sys
    import time

    (tmp_path / "test_left_paused.py").write_text(HANGING_TEST, encoding="utf-8")
    repo = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                            "-p", "no:timeout", "--basetemp", str(tmp_path / "inner-tmp"),  # not the shared
                            "test_left_paused.py"], cwd=tmp_path, env=env,  # /tmp/pytest-of-USER numbering
                           capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as exc:  # run() kills the child on timeout
        pytest.fail(f"pytest did not exit within 240 s after its test failed: {exc.stdout!r}")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "1 failed" in r.stdout and "the assertion that fails while the loop is paused" in r.stdout
    assert time.monotonic() - t0 < 200


def test_checkpoint_loads_in_transformers_with_the_same_outputs(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = TrainConfig(task="induction", family="gpt2", model=SMALL, steps=5, log_every=5, eval_every=5)
    train(cfg, tmp_path / "run")
    ours = load_model_folder(tmp_path / "run")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "run")
    hf.eval()
    ids = torch.randint(0, ours.config.vocab_size, (2, 20))
    with torch.no_grad():
        a = ours.model(ids).logits
        b = hf(ids).logits
    assert (a - b).abs().max().item() < 1e-4


@pytest.mark.slow
@pytest.mark.timeout(2400)  # ~1.5 min on a free core; 879 s at load 7-9 (2 Dec), near the suite's 900
def test_motif_reaches_95_percent_with_the_lectures_configuration(tmp_path):
    """Lectures: embedding 32, learned positions, 1 head, 3 encoder blocks, ~39k parameters: 95.6%.

    Here (pre-LN, lr 1e-3, 8,000 steps of 64 fresh samples, 2,000 held-out samples, 40,165
    parameters): seed 0 reaches 100%, seeds 1 and 2 93.25% and 94.9% (2 Dec; 97.15%, 94.65% and 94.9%
    before a run stopped depending on its log interval). At lr 3e-3 (this test's setting until it failed) training is unsteady:
    seed 0 ended at 97.05%, 89.1% and 79.25% after 8,000 steps as small numeric changes came in
    (an [UNK] token in the vocabulary, the fused AdamW step), and 97.2% after 16,000.
    About 1.5 minutes on one free CPU core.
    """
    cfg = TrainConfig(task="motif", task_options={"val_size": 2000}, family="bert",
                      model={"n_layers": 3, "n_heads": 1, "d_model": 32, "d_ff": 128, "type_vocab_size": 0,
                             "norm_placement": "pre"},
                      lr=1e-3, steps=8000, warmup_steps=100, batch_size=64, eval_every=1000,
                      checkpoint_every=8000, seed=0)
    events = []
    summary = train(cfg, tmp_path / "motif", on_event=events.append)
    params = events[0]["parameters"]
    assert 35_000 < params < 42_000
    print(f"motif: {params} parameters, test accuracy {summary['val_accuracy']:.4f}")
    assert summary["val_accuracy"] >= 0.95


def test_encoder_family_trains_masked_language_modelling(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat and the dog sat on the log. " * 20, encoding="utf-8")
    cfg = TrainConfig(task="text", task_options={"text_file": str(text)}, family="bert",
                      model={**SMALL, "context_length": 32}, steps=40, lr=3e-3, warmup_steps=5, batch_size=16,
                      log_every=10, eval_every=40)
    events = []
    summary = train(cfg, tmp_path / "mlm", on_event=events.append)
    assert events[0]["task"]["objective"] == "mlm"
    loaded = load_model_folder(tmp_path / "mlm")
    assert not loaded.config.causal and loaded.tokenizer.mask_token_id is not None
    first = [e for e in events if e["event"] == "step"][0]["train_loss"]
    assert summary["train_loss"] < first


@pytest.mark.slow
def test_mlp_baseline_on_the_lectures_data(tmp_path):
    """Lectures: MLP 20*32 -> 64 -> 4, 1,500 training samples, 300 epochs: 56.4% test accuracy."""
    from desktop_app.core.training.baselines import train_motif_mlp

    result = train_motif_mlp(steps=14_000, batch_size=32, lr=1e-3, n_train=1500)  # ~300 epochs
    print(f"MLP baseline: {result}")
    assert 41_000 < result["parameters"] < 42_000
    assert result["train_loss"] < 0.01  # it memorises its 1,500 samples...
    assert result["val_accuracy"] < 0.9  # ...and stays well below the transformer on held-out ones


class _Killed(BaseException):
    """A kill -9 at some instant of a checkpoint save (no cleanup runs after it)."""


def _crashing_save(monkeypatch, folder, version, crash_at):
    """save_model_folder of model `version`, dying at the crash_at-th file-system step of the swap.

    The steps counted are os.fsync, os.replace and shutil.rmtree. An interrupted rmtree first deletes
    the folder's weights (a half-removed folder); after the "kill" nothing runs at all (no cleanup).
    Returns whether the save was interrupted.
    """
    from desktop_app.core.checkpoints import new_model, save_model_folder
    from desktop_app.core.config import ModelConfig

    model = new_model(ModelConfig.gpt2(vocab_size=11, d_model=8, n_layers=1, n_heads=1, d_ff=16, context_length=8),
                      seed=version)
    real = {"fsync": os.fsync, "replace": os.replace, "rmtree": shutil.rmtree}
    calls = {"n": 0, "dead": False}

    def step(name):
        def f(*args, **kwargs):
            if calls["dead"]:
                return None
            calls["n"] += 1
            if calls["n"] == crash_at:
                calls["dead"] = True
                if name == "rmtree" and (Path(args[0]) / "model.safetensors").exists():
                    (Path(args[0]) / "model.safetensors").unlink()
                raise _Killed
            return real[name](*args, **kwargs)
        return f

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", step("fsync"))
        m.setattr(os, "replace", step("replace"))
        m.setattr(shutil, "rmtree", step("rmtree"))
        try:
            save_model_folder(model, folder, extra_files={"trainer_state.json": json.dumps({"step": version}).encode()})
        except _Killed:
            return True
    return False


def _loadable_version(folder):
    from desktop_app.core.checkpoints import new_model

    loaded = load_model_folder(folder)
    step = checkpoint_step(folder)
    expected = new_model(loaded.config, seed=step).state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in loaded.model.state_dict().items())  # complete, intact
    return step


@pytest.mark.parametrize("start", ["current", "old only", "current and old"])
def test_checkpoint_swap_survives_a_kill_at_every_step(tmp_path, monkeypatch, start):
    """At every instant of a save, one complete checkpoint is loadable (the previous one or the new)."""
    crash_at = 1
    while True:
        root = tmp_path / f"{start}-{crash_at}"
        root.mkdir()
        folder = root / "run"
        assert not _crashing_save(monkeypatch, folder, 1, crash_at=0)
        if start != "current":
            folder.rename(root / "run.old")  # as an interrupted swap (or a resume from .old) leaves it
        if start == "current and old":
            assert not _crashing_save(monkeypatch, folder, 2, crash_at=0)
        before = _loadable_version(folder)
        interrupted = _crashing_save(monkeypatch, folder, 3, crash_at=crash_at)
        after = _loadable_version(folder)
        assert after in (before, 3) if interrupted else after == 3
        # the next save after the "kill" works and leaves no temporary folder or .old behind
        assert not _crashing_save(monkeypatch, folder, 4, crash_at=0)
        assert _loadable_version(folder) == 4
        assert sorted(p.name for p in root.iterdir()) == ["run"]
        if not interrupted:
            break
        crash_at += 1
    assert crash_at > 4  # every step of the swap was tried


def test_resume_from_the_old_twin_after_an_interrupted_swap(tmp_path):
    cfg = TrainConfig(task="copy", model=SMALL, steps=4, log_every=2, eval_every=4, checkpoint_every=2)
    train(cfg, tmp_path / "run")
    (tmp_path / "run").rename(tmp_path / "run.old")
    (tmp_path / ".run.abcd1234.tmp").mkdir()  # a temporary folder a kill mid-write left behind
    events = []
    train(TrainConfig(**{**cfg.to_dict(), "steps": 6}), tmp_path / "run", resume=True, on_event=events.append)
    assert events[0]["step"] == 4 and checkpoint_step(tmp_path / "run") == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
