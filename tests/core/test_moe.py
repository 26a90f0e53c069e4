"""Mixture of experts without transformers (issue 36): the config's checks, direct logit attribution split by
expert, the router load the trainer logs, and training a small Mixtral (8 experts, top-2)."""
from __future__ import annotations

import pytest
import torch

from desktop_app.core.config import ConfigError
from desktop_app.core.families import REGISTRY
from desktop_app.core.interventions import direct_logit_attribution
from desktop_app.core.model import Transformer
from desktop_app.core.moe import RouterLogits, expert_load, load_balancing_loss
from desktop_app.core.training import TrainConfig, train

SMALL = dict(vocab_size=53, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=16, context_length=32)


def model_of(family: str, **kw) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(REGISTRY[family].preset(**{**SMALL, **kw})).eval()
    with torch.no_grad():  # the presets' norms start at 1 (0 for Gemma's): make them count
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("change, message", [
    (dict(experts_per_token=9), "experts_per_token must be in 1..num_experts"),
    (dict(router_norm="sigmoid"), "unknown router_norm 'sigmoid'"),
    (dict(activation="gelu"), "mixture-of-experts needs gated experts"),
    (dict(num_experts=0), "a shared expert needs num_experts > 0"),
    (dict(shared_expert_d_ff=0), "shared_expert_gate needs a shared expert"),
    (dict(num_experts=-1), "num_experts must be a non-negative integer"),
])
def test_mixture_switches_are_checked_where_declared(change, message):
    with pytest.raises(ConfigError, match=message):
        REGISTRY["qwen2_moe"].preset(**{**SMALL, **change})


def test_q_k_norm_across_heads_needs_q_k_norms():
    with pytest.raises(ConfigError, match="qk_norm_across_heads needs qk_norm"):
        REGISTRY["llama"].preset(qk_norm_across_heads=True)


@pytest.mark.parametrize("family", ["qwen2_moe", "mixtral"])
def test_direct_logit_attribution_splits_the_mlp_term_by_expert(family):
    model = model_of(family)
    ids = list(range(5, 17))
    position, token = 7, 11
    att = direct_logit_attribution(model, ids, position, token)
    assert abs(att.sum - att.logit) < 1e-4
    assert "mlp" not in att.components and att.experts.shape == (2, 8)
    _, trace = model.run_with_trace(torch.tensor([ids]), ["blocks.*.mlp.experts", "blocks.1.resid_post",
                                                          "blocks.1.mlp.expert_out.*"])
    rows = [(c, l, h, v) for c, l, h, v in att.rows() if c in ("expert", "shared_expert")]
    for l in range(2):
        chosen = sorted(trace[f"blocks.{l}.mlp.experts"][0, position].tolist())
        assert [h for c, layer, h, _ in rows if c == "expert" and layer == l] == chosen
        layer_sum = sum(v for _, layer, _, v in rows if layer == l)
        assert abs(layer_sum - att.mlp[l]) < 1e-5  # the split keeps the MLP's total
        assert all(att.experts[l, e] == 0 for e in range(8) if e not in chosen)
    assert ("shared_expert" in att.components) == (family == "qwen2_moe")
    # one expert's term by hand: W_U[token] . (g * c / rms(resid)), the final RMSNorm linearised at resid
    e = int(trace["blocks.1.mlp.experts"][0, position, 0])
    c = trace[f"blocks.1.mlp.expert_out.{e}"][0, position].double()
    resid = trace["blocks.1.resid_post"][0, position].double()
    norm = model.final_norm
    by_hand = model.lm_head.weight[token].detach().double() @ (norm.weight.detach().double() * c / torch.sqrt(resid.pow(2).mean() + norm.eps))
    assert abs(float(by_hand) - att.experts[1, e]) < 1e-5


def test_expert_load_counts_the_routing_choices():
    model = model_of("mixtral")
    ids = torch.randint(0, 53, (3, 10), generator=torch.Generator().manual_seed(1))
    load = expert_load(model, ids)
    _, trace = model.run_with_trace(ids, ["blocks.*.mlp.experts"])
    assert load.shape == (2, 8) and torch.allclose(load.sum(-1), torch.ones(2, dtype=load.dtype))
    for l in range(2):
        chosen = trace[f"blocks.{l}.mlp.experts"].flatten()
        for e in range(8):
            assert float(load[l, e]) == pytest.approx(int((chosen == e).sum()) / chosen.numel(), abs=1e-12)


@pytest.mark.usefixtures("one_torch_thread")
def test_train_builds_a_small_mixtral_and_logs_its_router_load(tmp_path):
    cfg = TrainConfig(task="copy", family="mixtral", model={"n_layers": 2, "n_heads": 2, "d_model": 32, "d_ff": 32},
                      steps=6, eval_every=3, checkpoint_every=100, log_every=3, batch_size=8)
    events = []
    train(cfg, tmp_path / "run", on_event=events.append)
    evals = [e for e in events if e["event"] == "eval"]
    assert len(evals) == 2
    for ev in evals:
        load = torch.tensor(ev["expert_load"])
        assert load.shape == (2, 8) and torch.allclose(load.sum(-1), torch.ones(2, dtype=load.dtype))
        assert ev["expert_load_max"] == pytest.approx(float(load.max()) * 8)
    from desktop_app.core.checkpoints import load_model_folder
    loaded = load_model_folder(tmp_path / "run")
    assert (loaded.config.num_experts, loaded.config.experts_per_token) == (8, 2)
    assert REGISTRY["mixtral"].hf_compatible(loaded.config)  # saved under Mixtral's names


@pytest.mark.parametrize("family, k", [("mixtral", 2), ("olmoe", 3)])
def test_load_balancing_loss_is_transformers_on_the_same_router_logits(family, k):
    """Our auxiliary loss of the model's own router logits (recorded with their gradients) against
    transformers' load_balancing_loss_func on the same logits; the loss model adds coef x it, the coef as the
    family's config (Mixtral 0.001, OLMoE 0.01), and its gradient reaches the routers."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    from desktop_app.core.training.trainer import LossModel

    model = model_of(family, experts_per_token=k).train()
    ids = torch.randint(0, 53, (3, 10), generator=torch.Generator().manual_seed(1))
    routers = RouterLogits()
    model(ids, trace=routers)
    logits = routers.logits()
    assert len(logits) == 2 and logits[0].requires_grad
    ours = load_balancing_loss(logits, 8, k)
    theirs = load_balancing_loss_func(tuple(r.detach().reshape(-1, 8) for r in logits), 8, k)
    assert float(ours.detach()) == pytest.approx(float(theirs), rel=1e-6) and float(ours.detach()) > k  # random routers: uneven
    assert model.cfg.router_aux_loss_coef == {"mixtral": 0.001, "olmoe": 0.01}[family]

    targets = torch.randint(0, 53, (3, 10), generator=torch.Generator().manual_seed(2))
    with_aux, _, _ = LossModel(model)(ids, targets)
    model.cfg = model.cfg.replace(router_aux_loss_coef=0.0)
    plain, _, _ = LossModel(model)(ids, targets)
    assert float(with_aux - plain) == pytest.approx({"mixtral": 0.001, "olmoe": 0.01}[family] * float(ours), rel=1e-4)
    model.zero_grad()
    with_aux.backward()
    assert model.blocks[0].mlp.router.weight.grad.abs().sum() > 0
