"""Every device path of the core on a real device: CPU always, CUDA where this machine has it.

Each test runs once per device ("cpu", and "cuda" marked `cuda`: `pytest -m cuda` runs only those,
and they skip with a reason where torch.cuda.is_available() is False) and compares the device's
result with a reference computed here on the CPU in float32 or float64, independently of the path
under test: a float64 forward for logits, a hand-written greedy loop for generation, the model with
a head's W_O columns zeroed for an ablation, the exact Jacobian for the Lipschitz estimator, an
uninterrupted run for a resumed one. The CPU params are real tests too (and keep the logic honest on
machines without a GPU); the CUDA params replace the faked torch.cuda of the older tests.
"""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from desktop_app.core import lipschitz as lip
from desktop_app.core.checkpoints import load_model_folder, new_model, save_model_folder
from desktop_app.core.config import ModelConfig
from desktop_app.core.devices import resolve_device, resolve_dtype
from desktop_app.core.generation import GenerationSession, GenerationSettings
from desktop_app.core.interventions import Intervention
from desktop_app.core.training import TrainConfig, checkpoint_step, train

CUDA = torch.cuda.is_available()
NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False on this machine"


@pytest.fixture(params=[pytest.param("cpu", id="cpu"),
                        pytest.param("cuda", id="cuda",
                                     marks=[pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason=NO_CUDA)])])
def device(request) -> str:
    return request.param


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


SMALL = {"n_layers": 2, "n_heads": 4, "d_model": 32, "d_ff": 64}


def _model(family: str = "gpt2", seed: int = 0, **kw):
    """A tiny model on the CPU in float32; init_std 0.4 keeps its top tokens well apart."""
    base = dict(vocab_size=37, context_length=32, init_std=0.4, **SMALL)
    base.update(kw)
    if family == "llama":
        base.setdefault("n_kv_heads", 2)
    return new_model(getattr(ModelConfig, family)(**base), seed=seed).eval()


def _f64(model):
    """An independent float64 copy of a CPU model: the reference every device result is held to."""
    ref = new_model(model.cfg, seed=0).double().eval()
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    return ref


IDS = [3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 3, 8, 4]

# per dtype the model computes in: (rtol, atol as a share of the reference's largest |logit|). Measured
# on the CPU against float64 with these tiny models (init_std 0.4): float32 ~1e-6; bfloat16 2.5%
# (GPT-2) and 7.5% (LLaMA: RMSNorm, SwiGLU, rotary rounded to 8 bits); float16 0.26% and 0.65%.
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (0.0, 0.12), torch.float16: (0.0, 0.015)}


def _close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    rtol, share = TOLERANCES[dtype]
    atol = share * float(ref.abs().max())
    torch.testing.assert_close(got.double().cpu(), ref.double(), rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


# -- device switch -----------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["gpt2", "llama"])  # learned positions; rotary tables made on the device
def test_a_model_folder_loads_onto_the_device_with_the_cpu_logits(tmp_path, device, family):
    model = _model(family)
    save_model_folder(model, tmp_path / "m")
    with torch.no_grad():
        ref = _f64(model)(torch.tensor([IDS])).logits
    for name in ("float32", "bfloat16", "float16"):
        loaded = load_model_folder(tmp_path / "m", device=device, dtype=name)
        m = loaded.model
        assert m.device.type == resolve_device(device).type, name
        assert all(p.device.type == m.device.type for p in m.parameters()), name
        assert all(b.device.type == m.device.type for b in m.buffers()), name
        assert m.dtype == resolve_dtype(name) and loaded.config.dtype == name
        with torch.no_grad():
            out = m(torch.tensor([IDS], device=m.device)).logits
        assert out.device.type == m.device.type and out.dtype == m.dtype
        _close(out, ref, m.dtype, f"{family} {name} on {device}")


def test_saving_a_device_model_writes_cpu_tensors_that_reload_equal(tmp_path, device):
    model = _model().to(device)
    save_model_folder(model, tmp_path / "m")
    back = load_model_folder(tmp_path / "m")  # CPU
    assert back.model.device.type == "cpu"
    for k, v in model.state_dict().items():
        assert torch.equal(back.model.state_dict()[k], v.cpu()), k


# -- generation --------------------------------------------------------------------------------


def _greedy_reference(model, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy decoding by hand in float64 on the CPU: one full forward per token, no cache."""
    ref = _f64(model)
    ids, logits = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            last = ref(torch.tensor([ids])).logits[0, -1]
            top2 = last.topk(2).values
            assert float(top2[0] - top2[1]) > 1e-3, "the reference's top two are too close to compare devices"
            logits.append(last)
            ids.append(int(last.argmax()))
    return ids, logits


def test_greedy_generation_on_the_device_matches_the_cpu(tmp_path, device):
    model = _model(seed=1)
    save_model_folder(model, tmp_path / "m")
    prompt, n = IDS[:5], 12
    want, want_logits = _greedy_reference(model, prompt, n)
    loaded = load_model_folder(tmp_path / "m", device=device)
    session = GenerationSession(loaded, prompt, GenerationSettings("greedy"), stop_tokens=[])
    nodes = list(session.run(n))
    assert session.ids() == want
    assert [node.how for node in nodes] == ["greedy"] * n
    # the distribution after each token is the reference's (the cache path on the device)
    for node, ref in zip([session.root] + nodes[:-1], want_logits):
        assert node.next_logits.device.type == "cpu"
        _close(node.next_logits, ref, torch.float32, f"next-token logits after position {node.position}")
    trace, ids = session.step_trace()
    assert ids == want
    for name, t in trace.items():
        assert t.device.type == "cpu", name
    NAMES = ("blocks.1.attn.pattern", "blocks.1.attn.head_out", "blocks.1.resid_post")
    with torch.no_grad():
        _, ref_trace = _f64(model).run_with_trace(torch.tensor([want]), names=NAMES)
    for name in NAMES:  # head_out: rebuilt on the device from the recorded inputs and patterns
        _close(trace[name], ref_trace[name], torch.float32, f"step trace {name}")


def test_sampling_on_the_device_draws_the_cpu_tokens(device):
    # the sampling generator lives on the CPU: the same seed draws the same tokens on every device
    model = _model(seed=2)
    prompt = IDS[:4]
    cpu = GenerationSession(_model(seed=2), prompt, GenerationSettings("sample"), seed=7, stop_tokens=[], record=False)
    dev = GenerationSession(model.to(device), prompt, GenerationSettings("sample"), seed=7, stop_tokens=[],
                            record=False)
    cpu_nodes, dev_nodes = list(cpu.run(10)), list(dev.run(10))
    assert dev.ids() == cpu.ids()
    assert [n.how for n in dev_nodes] == ["sampled"] * 10
    for a, b in zip(cpu_nodes, dev_nodes):
        assert b.prob == pytest.approx(a.prob, rel=1e-4, abs=1e-6)


# -- training ----------------------------------------------------------------------------------


def _val_loss_on_cpu(run_dir, cfg: TrainConfig) -> float:
    """Mean cross-entropy per scored token of the reloaded CPU model on the run's held-out set."""
    from desktop_app.core.training.tasks import IGNORE
    from desktop_app.core.training.trainer import task_for

    loaded = load_model_folder(run_dir)
    val = task_for(cfg, causal=True, tokenizer=loaded.tokenizer).val_set(cfg.seed)
    with torch.no_grad():
        logits = loaded.model(val.inputs).logits.double()
    return float(F.cross_entropy(logits.flatten(0, 1), val.targets.flatten(), ignore_index=IGNORE))


@pytest.mark.parametrize("precision", ["float32", "bfloat16", "float16"])
def test_training_on_the_device_lowers_the_loss_and_saves_finite_cpu_weights(tmp_path, device, precision):
    cfg = TrainConfig(task="copy", task_options={"length": 4, "symbols": 5}, model=SMALL, lr=3e-3,
                      warmup_steps=0, schedule="constant", steps=30, batch_size=16, log_every=5, eval_every=30,
                      checkpoint_every=30, device=device, precision=precision)
    if device == "cpu" and precision == "float16":
        with pytest.raises(ValueError, match="needs CUDA"):
            train(cfg, tmp_path / "run")
        return
    if device == "cuda" and precision == "bfloat16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    events = []
    summary = train(cfg, tmp_path / "run", on_event=events.append)
    assert next(e for e in events if e["event"] == "start")["device"].startswith(device)
    losses = [e["train_loss"] for e in events if e["event"] == "step"]
    assert all(math.isfinite(v) for v in losses), losses
    assert losses[-1] < 0.8 * losses[0], losses
    loaded = load_model_folder(tmp_path / "run")  # on the CPU
    assert loaded.model.device.type == "cpu" and loaded.config.dtype == "float32"
    for name, p in loaded.model.named_parameters():
        assert p.dtype == torch.float32 and bool(torch.isfinite(p).all()), name
    # the saved weights are the trained ones: their float64 CPU loss is the run's own evaluation
    # (which ran on the device, under autocast for bfloat16 and float16)
    rel = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 1e-2}[precision]
    assert _val_loss_on_cpu(tmp_path / "run", cfg) == pytest.approx(summary["val_loss"], rel=rel)
    # float16 keeps its loss scale for a resumed run; the others have none to keep
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert ("scaler" in state and state["scaler"]["scale"] > 0) == (precision == "float16"), state.get("scaler")
    if precision == "float16":  # a resumed run takes it up without complaint
        more = train(TrainConfig(**{**cfg.to_dict(), "steps": cfg.steps + 2}), tmp_path / "run", resume=True)
        assert math.isfinite(more["train_loss"])


def _weights(path) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in load_model_folder(path).model.state_dict().items()}


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_resume_on_the_device_restores_the_rng_of_dropout(tmp_path, device, monkeypatch):
    # Dropout draws from the device's generator (torch's CPU one, or CUDA's): a resumed run matches an
    # uninterrupted one only when the checkpoint puts that state back. Between the two halves the
    # global RNGs are reseeded, as a new process would have them.
    from desktop_app.core.training import trainer

    base = dict(task="copy", task_options={"length": 4, "symbols": 5}, model={**SMALL, "dropout": 0.2}, lr=3e-3,
                warmup_steps=0, schedule="constant", batch_size=16, log_every=2, eval_every=8, checkpoint_every=8,
                device=device)
    train(TrainConfig(**base, steps=8), tmp_path / "straight")

    def split(name: str) -> dict:
        train(TrainConfig(**base, steps=4), tmp_path / name)
        assert checkpoint_step(tmp_path / name) == 4
        torch.manual_seed(12345)  # every device's generator, as in a fresh process
        train(TrainConfig(**base, steps=8), tmp_path / name, resume=True)
        assert checkpoint_step(tmp_path / name) == 8
        return _weights(tmp_path / name)

    straight = _weights(tmp_path / "straight")
    # CPU: bit for bit (test_resume_exact). CUDA kernels may sum in another order from run to run.
    tol = 0.0 if device == "cpu" else 1e-5
    assert _max_diff(split("resumed"), straight) <= tol
    # the control: without the torch/CUDA states (the batch order still restored) dropout draws other
    # masks and the weights move apart by far more than the tolerance
    monkeypatch.setattr(trainer, "_restore_rng", lambda rng, gen: gen.set_state(rng["rng.batches"]))
    assert _max_diff(split("unrestored"), straight) > max(100 * tol, 1e-4)  # ~1e-2 measured on the CPU


# -- the Lipschitz estimator -------------------------------------------------------------------


def test_lipschitz_estimate_on_the_device_matches_the_exact_cpu_jacobian(device):
    model = _model(seed=3)
    ref = _f64(model)
    ids, n, layer = IDS[:12], 6, 1
    X64 = lip.real_inputs(ref, ids, layer, n, 2).double()  # [2, n, d], the layer's input on two windows
    exact = lip.exact_jacobian_norm(lip.module_function(ref, layer), X64)  # the model's own module, on the CPU
    # the estimator on the device, float64 there too: agrees to its tolerance
    dev64 = _f64(model).to(device)
    est = lip.spectral_norm(lip.layer_map(dev64, layer), X64.to(device), tol=1e-5)
    assert est.sigma.device.type == resolve_device(device).type
    assert bool(est.converged.all())
    torch.testing.assert_close(est.sigma.cpu(), exact, rtol=1e-4, atol=0.0)
    # the sweep on a float32 model on the device (its own real-text inputs): the same windows' values
    dev32 = _model(seed=3).to(device)
    result = lip.run_sweep(lip.SweepSpec(data="real", model=dev32, layer=layer, lengths=(n,), samples=2,
                                         token_ids=ids, tol=1e-5))
    (row,) = result.lengths
    assert len(row.lipschitz) == len(X64)
    torch.testing.assert_close(torch.from_numpy(row.lipschitz).double(), exact, rtol=2e-3, atol=0.0)
    assert (row.lipschitz <= row.upper_bound * (1 + 1e-6)).all()  # Theorem 3.1 on the device's numbers


# -- interventions -----------------------------------------------------------------------------


def test_zero_ablating_a_head_on_the_device_equals_the_cpu_model_without_that_head(device):
    model = _model(seed=4)
    layer, head = 1, 2
    ref = _f64(model)
    dh = ref.cfg.d_model // ref.cfg.n_heads
    with torch.no_grad():
        # the independent reference: head h contributes W_O[:, h*dh:(h+1)*dh] z_h; zero those columns
        ref.blocks[layer].attn.o.weight[:, head * dh:(head + 1) * dh] = 0
        want = ref(torch.tensor([IDS])).logits
        clean = _f64(model)(torch.tensor([IDS])).logits
    assert float((want - clean).abs().max()) > 1e-2, "the head does not matter: the test would prove nothing"
    dev = model.to(device)
    with torch.no_grad():
        got = dev(torch.tensor([IDS], device=dev.device),
                  interventions=[Intervention(f"blocks.{layer}.attn.head.{head}")]).logits
    assert got.device.type == dev.device.type
    _close(got, want, torch.float32, f"head {layer}.{head} zeroed on {device}")
    # and at some positions only: the earlier positions keep the clean logits
    with torch.no_grad():
        part = dev(torch.tensor([IDS], device=dev.device),
                   interventions=[Intervention(f"blocks.{layer}.attn.head.{head}", positions=(10, 11))]).logits
    _close(part[:, :10], clean[:, :10], torch.float32, "positions before the ablated ones")
    _close(part[:, 10:12], want[:, 10:12], torch.float32, "the ablated positions")
