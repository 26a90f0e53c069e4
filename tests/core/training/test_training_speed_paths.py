"""The trainer's fast paths (fused optimizer step, no gather when every position is scored) give the
results of the plain paths to float rounding, and the fused step can be turned off."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from desktop_app.core.devices import half_matrix_units
from desktop_app.core.training import TrainConfig, train
from desktop_app.core.training import trainer as tr
from desktop_app.core.training.optim import FUSED_ENV, make_optimizer, use_fused_step
from desktop_app.core.training.tasks import IGNORE


def _params():
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(8, 4)), torch.nn.Parameter(torch.randn(4))]


def test_adam_family_and_sgd_take_the_fused_step_on_cpu():
    for name in ("adamw", "adam", "sgd"):
        opt = make_optimizer(name, _params(), lr=1e-3)
        assert all(g["fused"] for g in opt.param_groups), name
    lion = make_optimizer("lion", _params(), lr=1e-3)  # ours: no fused flag to set
    use_fused_step(lion)
    assert "fused" not in lion.param_groups[0]


def test_the_environment_variable_turns_the_fused_step_off(monkeypatch):
    monkeypatch.setenv(FUSED_ENV, "0")
    opt = make_optimizer("adamw", _params(), lr=1e-3)
    assert not any(g["fused"] for g in opt.param_groups)


def test_fused_and_plain_adamw_agree_to_rounding(monkeypatch):
    runs = []
    for fused in ("1", "0"):
        monkeypatch.setenv(FUSED_ENV, fused)
        params = _params()
        opt = make_optimizer("adamw", params, lr=1e-2, weight_decay=0.1)
        for step in range(20):
            loss = sum((p.sin() * (step + 1)).sum() for p in params)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        runs.append([p.detach().clone() for p in params])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _cfg(**kw):
    return TrainConfig(**{**dict(task="modadd", task_options={"p": 7}, model={"n_layers": 1, "n_heads": 2,
                                                                              "d_model": 16},
                                 steps=2, batch_size=4, eval_every=100, checkpoint_every=1, log_every=1), **kw})


def test_a_resumed_run_takes_this_machines_choice_not_the_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setenv(FUSED_ENV, "0")
    train(_cfg(steps=1), tmp_path / "run")  # written by a run with the plain step
    monkeypatch.setenv(FUSED_ENV, "1")
    seen = {}
    real = tr.make_optimizer

    def spy(*a, **k):
        seen["opt"] = real(*a, **k)
        return seen["opt"]
    monkeypatch.setattr(tr, "make_optimizer", spy)
    train(_cfg(steps=2), tmp_path / "run", resume=True)
    assert all(g["fused"] for g in seen["opt"].param_groups)


def test_loss_model_without_gather_matches_the_gathered_loss():
    from desktop_app.core.checkpoints import new_model
    from desktop_app.core.config import ModelConfig

    model = new_model(ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, d_ff=32, context_length=8,
                                  lm_head=True), seed=0)
    x = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(2))
    loss, correct, n = tr.LossModel(model)(x, y)  # every position scored: the no-gather path
    logits = model(x).logits
    assert n == 24
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, 11).float(), y.flatten()))
    assert int(correct) == int((logits.argmax(-1) == y).sum())
    y2 = y.clone()
    y2[:, :5] = IGNORE  # some positions unscored: the gathered path, same formula on the rest
    loss2, _, n2 = tr.LossModel(model)(x, y2)
    assert n2 == 9
    torch.testing.assert_close(loss2, F.cross_entropy(logits[:, 5:].reshape(-1, 11).float(), y2[:, 5:].flatten()))


def test_hits_count_what_argmax_counts():
    """The training accuracy's count (hits: the target's logit is the row's max, in float32) equals argmax's
    on random logits; in bfloat16, where logits tie at the top, argmax's first index decides as before."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(300, 13, generator=gen)
    targets = torch.randint(0, 13, (300,), generator=gen)
    targets[:100] = logits[:100].argmax(-1)  # a third right for sure, the rest by chance
    assert int(tr.hits(logits, targets)) == int((logits.argmax(-1) == targets).sum()) >= 100
    tied = torch.tensor([[1.0, 3.0, 3.0, 0.0]], dtype=torch.bfloat16)
    assert int(tr.hits(tied, torch.tensor([2]))) == 0 and int(tr.hits(tied, torch.tensor([1]))) == 1


def test_attention_projections_in_one_product_match_three_in_values_and_gradients():
    """With gradients on, q, k, v come from one product over the three weights side by side: the same
    values and the same gradients (weights, biases, input) as three separate products, GQA included."""
    from desktop_app.core.checkpoints import new_model
    from desktop_app.core.config import ModelConfig

    for kv_heads, bias in ((4, True), (2, False)):
        model = new_model(ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=4, n_kv_heads=kv_heads, d_ff=32,
                                      context_length=8, attention_bias=bias), seed=0)
        attn = model.blocks[0].attn
        x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
        grads = []
        for one_product in (True, False):
            attn.zero_grad()
            x.grad = None
            qkv = attn.project_qkv(x) if one_product else (attn.q(x), attn.k(x), attn.v(x))
            (qkv[0].sum() * 2 + qkv[1].pow(2).sum() + qkv[2].sin().sum()).backward()
            grads.append([t.detach().clone() for t in qkv] + [x.grad.clone()] +
                         [p.grad.clone() for lin in (attn.q, attn.k, attn.v) for p in lin.parameters()])
        assert len(grads[0]) == 4 + 3 * (2 if bias else 1)
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b)


def test_clipping_measures_the_norms_once_and_agrees_with_torch():
    """clip_gradients: the total norm torch's clip_grad_norm_ gives (before clipping), each group's norm as
    the per-parameter formula gives it, and the same clipped gradients."""
    from desktop_app.core.checkpoints import new_model
    from desktop_app.core.config import ModelConfig

    model = new_model(ModelConfig(vocab_size=11, d_model=16, n_layers=2, n_heads=2, d_ff=32, context_length=8,
                                  lm_head=True), seed=0)
    x = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(1))
    groups = tr.layer_groups(model)
    results = []
    for ours in (True, False):
        model.zero_grad()
        (model(x).logits.pow(2).mean() * 100).backward()
        expected_groups = {k: float(torch.cat([p.grad.flatten() for p in ps]).norm()) for k, ps in groups.items()}
        if ours:
            total, per_group = tr.clip_gradients(model, groups, 0.5, per_group=True)
            assert per_group.keys() == expected_groups.keys()
            for k in per_group:
                assert abs(per_group[k] - expected_groups[k]) <= 1e-5 * max(expected_groups[k], 1)
        else:
            total = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5))
        results.append((total, [p.grad.clone() for p in model.parameters()]))
    assert results[0][0] > 0.5  # it clipped
    assert abs(results[0][0] - results[1][0]) <= 1e-5 * results[1][0]
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b)
    before = [p.grad.clone() for p in model.parameters()]
    total, per_group = tr.clip_gradients(model, groups, 1e9, per_group=False)  # within the bound: untouched
    assert per_group is None and abs(total - float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9))) <= 1e-6
    for a, b in zip(before, model.parameters()):
        assert torch.equal(a, b.grad)


def test_hits_in_half_precision_count_the_first_top_index_as_argmax_does():
    """Half-precision logits are counted by argmax over their exact float32 values (the CPU's bfloat16 argmax
    was ~3x slower): the same first index at a tie, the same count as argmax in the logits' own dtype."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(500, 40, generator=gen).mul(4).round().div(4).to(torch.bfloat16)  # many ties at the top
    targets = torch.randint(0, 40, (500,), generator=gen)
    targets[:200] = logits[:200].float().topk(2, -1).indices[:, 1]  # often tied with the argmax, after it
    want = int((logits.argmax(-1) == targets).sum())
    assert int(tr.hits(logits, targets)) == want
    assert want < int((logits.gather(-1, targets[:, None])[:, 0] >= logits.amax(-1)).sum())  # ties were met


class _Ops(TorchDispatchMode):
    """The names of the ops that ran (aten.gelu.default, ...)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def _gpt2_step(precision_dtype, fused_allowed, monkeypatch):
    """One bfloat16-autocast forward and backward of a small GPT-2 on the CPU: the loss, the gradients, and the
    ops that ran (the fused attention kernel or not)."""
    from desktop_app.core import model as model_module
    from desktop_app.core.checkpoints import new_model
    from desktop_app.core.config import ModelConfig

    context = 16
    if not fused_allowed:
        monkeypatch.setattr(model_module, "explicit_differentiates_faster", lambda q, k: False)
    model = new_model(ModelConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=context,
                                  positions="learned", norm="layernorm", activation="gelu_tanh"), seed=0)
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randint(0, 50, (3, context), generator=gen), torch.randint(0, 50, (3, context), generator=gen)
    with _Ops() as ops, torch.autocast("cpu", dtype=precision_dtype, enabled=precision_dtype is not None):
        loss = F.cross_entropy(model(x).logits.float().flatten(0, 1), y.flatten())
    loss.backward()
    return float(loss.detach()), [p.grad.float() for p in model.parameters()], ops.names


native_bfloat16 = pytest.mark.skipif(not half_matrix_units(torch.bfloat16),
                                     reason="the explicit route is taken only on a CPU with bfloat16 matrix instructions")


@native_bfloat16
def test_bfloat16_training_attention_runs_as_explicit_products_with_the_fused_kernels_results(monkeypatch):
    """In bfloat16 on a CPU with bfloat16 matrix instructions, attention that will be differentiated takes the
    explicit products (the fused kernel's bfloat16 backward was 2.8x slower at bench training's shape): the loss
    and gradients are the fused kernel's to bfloat16 rounding, and both are float32's to mixed-precision error."""
    loss, grads, ops = _gpt2_step(torch.bfloat16, True, monkeypatch)
    assert not any("scaled_dot_product" in op for op in ops), sorted(o for o in ops if "attention" in o)
    fused_loss, fused_grads, fused_ops = _gpt2_step(torch.bfloat16, False, monkeypatch)
    assert any("scaled_dot_product" in op for op in fused_ops)
    full_loss, full_grads, _ = _gpt2_step(None, True, monkeypatch)
    assert abs(loss - fused_loss) < 0.005 and abs(loss - full_loss) < 0.005
    ours, fused, full = (torch.cat([g.flatten() for g in gs]) for gs in (grads, fused_grads, full_grads))
    error, fused_error = float((ours - full).norm() / full.norm()), float((fused - full).norm() / full.norm())
    assert error < 0.02 and fused_error < 0.02 and float((ours - fused).norm() / full.norm()) < 0.02, \
        (error, fused_error)


@native_bfloat16
def test_the_fused_kernel_stays_without_gradients_in_float32_and_past_512_keys(monkeypatch):
    from desktop_app.core.model import explicit_differentiates_faster

    q = torch.randn(1, 2, 8, 16, dtype=torch.bfloat16, requires_grad=True)
    assert explicit_differentiates_faster(q, q)
    with torch.no_grad():
        assert not explicit_differentiates_faster(q, q)
    assert not explicit_differentiates_faster(q.detach(), q.detach())
    assert not explicit_differentiates_faster(q.float(), q.float())
    long = torch.randn(1, 2, 513, 16, dtype=torch.bfloat16, requires_grad=True)
    assert not explicit_differentiates_faster(long, long)
    at_most, many = (torch.empty(n, 16, 512, 16, dtype=torch.bfloat16, requires_grad=True) for n in (4, 5))
    assert explicit_differentiates_faster(at_most, at_most)  # 4 x 16 x 512 x 512 = 2^24 weights kept
    assert not explicit_differentiates_faster(many, many)
    _, _, ops = _gpt2_step(None, True, monkeypatch)  # float32: the fused kernel
    assert any("scaled_dot_product" in op for op in ops)


def test_half_precision_tanh_gelu_is_one_kernel_in_training_and_gelu_new_in_inference():
    """In training (train mode) the bfloat16 tanh GELU is F.gelu, which rounds once (forward and backward ~1.6-2.4x
    faster than gelu_new's eight roundings); in inference gelu_new op by op, for transformers' bfloat16 bits."""
    from desktop_app.core.config import ModelConfig
    from desktop_app.core.model import MLP, gelu_new

    torch.manual_seed(0)
    mlp = MLP(ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, d_ff=64, activation="gelu_tanh")).to(torch.bfloat16)
    x = torch.randn(3, 5, 16, dtype=torch.bfloat16)
    up = mlp.up(x)
    for training, want in ((True, F.gelu(up, approximate="tanh")), (False, gelu_new(up))):
        mlp.train(training)
        with _Ops() as ops:
            out = mlp(x)
        assert ("aten.gelu.default" in ops.names) == training and ("aten.tanh.default" in ops.names) != training
        assert torch.equal(out, mlp.down(want))
