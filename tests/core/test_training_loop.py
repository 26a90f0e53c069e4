"""The training loop: overfitting, events, divergence, exact resume, transformers parity of checkpoints."""
from __future__ import annotations

import json
import math
import random

import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.training import TrainConfig, TrainControl, TrainingDiverged, checkpoint_step, train

SMALL = {"n_layers": 2, "n_heads": 2, "d_model": 32, "d_ff": 64}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread; several threads on a shared 2-core machine crawl."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


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
    for key in ("step", "train_loss", "lr", "grad_norm", "tokens_per_s", "elapsed", "eta"):
        assert key in last
    assert set(last["grad_norms"]) == {"embed", "blocks.0", "blocks.1", "head"}
    total = math.sqrt(sum(v * v for v in last["grad_norms"].values()))
    assert total == pytest.approx(last["grad_norm"], rel=1e-4)  # per-layer norms add up to the clipped one
    hist = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [h["step"] for h in hist if h["event"] == "step"] == [e["step"] for e in steps]
    csv_head = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0]
    assert "train_loss" in csv_head and "grad_norm.blocks.0" in csv_head


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
    good = checkpoint_step(tmp_path / "run")
    if good is None:
        assert "no checkpoint" in msg
    else:
        assert f"step {good})" in msg
        loaded = load_model_folder(tmp_path / "run")
        assert all(torch.isfinite(p).all() for p in loaded.model.parameters())


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


def test_pause_holds_the_loop(tmp_path):
    import threading
    import time

    cfg = TrainConfig(task="copy", model=SMALL, steps=10_000, log_every=1, eval_every=10_000,
                      checkpoint_every=10_000)
    control = TrainControl()
    seen = []
    result = {}
    t = threading.Thread(target=lambda: result.update(train(cfg, tmp_path / "run", on_event=seen.append,
                                                           control=control)))
    control.pause()
    t.start()
    time.sleep(0.5)
    assert not [e for e in seen if e["event"] == "step"]  # paused before the first step
    assert any(e["event"] == "paused" for e in seen)
    control.resume()
    deadline = time.time() + 30
    while not [e for e in seen if e["event"] == "step"] and time.time() < deadline:
        time.sleep(0.05)
    control.cancel()
    t.join(30)
    assert result["step"] >= 1 and checkpoint_step(tmp_path / "run") == result["step"]


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
def test_motif_reaches_95_percent_with_the_lectures_configuration(tmp_path):
    """Lectures: embedding 32, learned positions, 1 head, 3 encoder blocks, ~39k parameters: 95.6%.

    Here (pre-LN, 8,000 steps of 64 fresh samples, 2,000 held-out samples): seed 0 reaches 95.6%,
    seed 2 98.7% (post-LN after 3,000 steps: 95.3% and 88.9% for seeds 0 and 1, too unsteady).
    About 2 minutes on one free CPU core (8 on a busy one).
    """
    cfg = TrainConfig(task="motif", task_options={"val_size": 2000}, family="bert",
                      model={"n_layers": 3, "n_heads": 1, "d_model": 32, "d_ff": 128, "type_vocab_size": 0,
                             "norm_placement": "pre"},
                      lr=3e-3, steps=8000, warmup_steps=100, batch_size=64, eval_every=1000,
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
