"""Mixture-of-experts families against transformers (issue 36): every case file of mixtral, qwen3_moe,
qwen2_moe and olmoe passes check_family (logits, patterns, greedy ids through the KV cache, round trip) and
routes every token of every layer to the experts transformers' router chooses, with its weights; the
expert ablation and the forced routing edits are what recomputing by hand gives; half-precision
generation (the packed, prepacked decoding path) runs on a mixture."""
from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from family_lipschitz import check_preset_opens_in_transformers  # noqa: E402
from family_parity import check_family  # noqa: E402

from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.core.families import REGISTRY  # noqa: E402
from desktop_app.core.generation import GenerationSettings, generate  # noqa: E402
from desktop_app.core.interventions import Intervention, ablate_expert, force_routing  # noqa: E402

MOE_FAMILIES = ("mixtral", "qwen3_moe", "qwen2_moe", "olmoe")
ROUTING = ["blocks.*.mlp.router", "blocks.*.mlp.experts", "blocks.*.mlp.expert_weights", "blocks.*.mlp.input",
           "blocks.*.mlp.out"]


def cases(model_type: str) -> dict:
    path = Path(__file__).parent / "family_cases" / f"{model_type}.py"
    spec = importlib.util.spec_from_file_location(f"family_cases_{model_type}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


ALL_CASES = [(t, c, build) for t in MOE_FAMILIES for c, build in cases(t).items()]


def hf_routing(hf, ids: torch.Tensor) -> dict[int, tuple]:
    """Layer -> (router logits, weights, chosen ids) [B*T, ...] from transformers' own router modules."""
    seen = {}
    for name, mod in hf.named_modules():
        if type(mod).__name__.endswith("TopKRouter"):
            layer = int(name.split("layers.")[1].split(".")[0])
            mod.register_forward_hook(lambda m, args, out, layer=layer: seen.__setitem__(layer, out))
    hf.eval()
    with torch.no_grad():
        hf(ids)
    return seen


@pytest.mark.parametrize("model_type,case,build", ALL_CASES, ids=[f"{t}-{c}" for t, c, _ in ALL_CASES])
def test_moe_family_parity_and_router_choice(model_type, case, build, tmp_path):
    check_family(build, tmp_path)
    family = REGISTRY[model_type]
    assert family.moe and family.decoder
    hf = type(build()).from_pretrained(tmp_path / "hf")
    loaded = load_model_folder(tmp_path / "hf")
    assert loaded.config.num_experts == (getattr(hf.config, "num_local_experts", None) or hf.config.num_experts)
    torch.manual_seed(1)
    ids = torch.randint(3, hf.config.vocab_size, (2, 12))
    theirs = hf_routing(hf, ids)
    _, trace = loaded.model.run_with_trace(ids, ROUTING)
    assert sorted(theirs) == list(range(loaded.config.n_layers))
    for layer, (logits, weights, chosen) in theirs.items():
        ours_ids = trace[f"blocks.{layer}.mlp.experts"].reshape(chosen.shape)
        ours_w = trace[f"blocks.{layer}.mlp.expert_weights"].reshape(weights.shape)
        ours_logits = trace[f"blocks.{layer}.mlp.router"].reshape(logits.shape)
        assert torch.equal(ours_ids.sort(-1).values, chosen.sort(-1).values), f"layer {layer}: chosen experts"
        order_ours, order_theirs = ours_ids.argsort(-1), chosen.argsort(-1)
        err = (ours_w.gather(-1, order_ours) - weights.float().gather(-1, order_theirs)).abs().max().item()
        assert err < 1e-6, f"layer {layer}: expert weights {err:.2e}"
        assert (ours_logits - logits).abs().max().item() < 1e-5, f"layer {layer}: router logits"


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_a_preset_mixture_saved_here_opens_in_transformers(family, tmp_path):
    """What `train --family` builds (8 experts, top-2; Qwen2-MoE's shared expert) is saved under the
    family's names and computes the same logits in transformers."""
    check_preset_opens_in_transformers(family, tmp_path, n_kv_heads=2)


@pytest.fixture(scope="module")
def mixtral_folder(tmp_path_factory):
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("mixtral")
    cases("mixtral")["4-experts-top2-gqa"]().save_pretrained(folder)
    return folder


def test_a_zeroed_expert_changes_the_output_exactly_as_recomputing_without_it(mixtral_folder):
    loaded = load_model_folder(mixtral_folder)
    model = loaded.model
    ids = torch.randint(3, 97, (1, 16), generator=torch.Generator().manual_seed(2))
    _, clean = model.run_with_trace(ids, ROUTING + ["logits"])
    expert = int(clean["blocks.1.mlp.experts"][0, 0, 0])  # chosen by the first token at least
    with torch.no_grad():
        ablated = model(ids, interventions=[ablate_expert(1, expert)]).logits
        without = copy.deepcopy(model)
        without.blocks[1].mlp.experts[expert].down.weight.zero_()  # the expert's output is 0 at every token
        reference = without(ids).logits
    assert torch.equal(ablated, reference)
    assert not torch.allclose(ablated, clean["logits"])


def test_the_expert_outputs_sum_to_the_mlp_output_and_are_recorded_only_when_asked_for_by_name(mixtral_folder):
    model = load_model_folder(mixtral_folder).model
    ids = torch.randint(3, 97, (1, 10), generator=torch.Generator().manual_seed(3))
    _, everything = model.run_with_trace(ids, ["*"])
    assert not any(".expert_out." in name for name in everything)  # per-expert: never under "*"
    _, trace = model.run_with_trace(ids, ["blocks.0.mlp.expert_out.*", "blocks.0.mlp.out", "blocks.0.mlp.experts"])
    outs = [trace[f"blocks.0.mlp.expert_out.{e}"] for e in range(4)]
    assert torch.allclose(sum(outs), trace["blocks.0.mlp.out"], atol=1e-6)
    chosen = trace["blocks.0.mlp.experts"][0]
    for e, out in enumerate(outs):  # zero exactly at the tokens that did not choose the expert
        unchosen = ~(chosen == e).any(-1)
        assert torch.equal(out[0, unchosen], torch.zeros_like(out[0, unchosen]))


def test_a_forced_routing_runs_the_forced_experts_with_the_router_s_renormalised_weights(mixtral_folder):
    model = load_model_folder(mixtral_folder).model
    ids = torch.randint(3, 97, (1, 8), generator=torch.Generator().manual_seed(4))
    _, clean = model.run_with_trace(ids, ROUTING)
    own = set(clean["blocks.0.mlp.experts"][0, 5].tolist())
    forced = sorted(set(range(4)) - own)[:2]  # the two experts the token did not choose
    edit = force_routing(0, [5], forced).check(model.cfg)
    _, trace = model.run_with_trace(ids, ROUTING, interventions=[edit])
    assert trace["blocks.0.mlp.experts"][0, 5].tolist() == forced
    assert torch.equal(trace["blocks.0.mlp.experts"][0, :5], clean["blocks.0.mlp.experts"][0, :5])
    x = trace["blocks.0.mlp.input"][0, 5]
    moe = model.blocks[0].mlp
    with torch.no_grad():
        probs = torch.softmax(moe.router(x), -1)[forced]
        weights = probs / probs.sum()
        expected = sum(w * moe.experts[e](x[None])[0] for w, e in zip(weights, forced))
    assert torch.allclose(trace["blocks.0.mlp.out"][0, 5], expected, atol=1e-6)
    assert torch.allclose(trace["blocks.0.mlp.expert_weights"][0, 5], weights, atol=1e-7)


def test_routing_edits_outside_the_model_are_refused_in_one_line(mixtral_folder):
    cfg = load_model_folder(mixtral_folder).config
    with pytest.raises(ValueError, match="experts 0..3"):
        ablate_expert(0, 4).check(cfg)
    with pytest.raises(ValueError, match="must differ"):
        force_routing(0, [1], [2, 2]).check(cfg)
    with pytest.raises(ValueError, match="2 expert ids in 0..3"):
        force_routing(0, [1], [1, 2, 3]).check(cfg)
    with pytest.raises(ValueError, match="no router"):
        Intervention("blocks.0.mlp.router", "zero").check(REGISTRY["llama"].preset())


def test_half_precision_generation_runs_on_a_mixture(mixtral_folder):
    """bfloat16 on the CPU: pack_for_decoding prepacks each expert's gate and up as one product, and every product
    a step makes (the experts, the router); greedy ids equal float32's for the first steps."""
    prompt = [5, 17, 33, 8]
    ids32, _ = generate(load_model_folder(mixtral_folder), prompt, 12, GenerationSettings("greedy"), stop_tokens=[])
    ids16, _ = generate(load_model_folder(mixtral_folder, dtype="bfloat16"), prompt, 12, GenerationSettings("greedy"),
                        stop_tokens=[])
    assert len(ids16) == len(ids32) == len(prompt) + 12
    assert ids16[:len(prompt) + 2] == ids32[:len(prompt) + 2]


def test_a_forced_routing_holds_through_kv_cached_generation(mixtral_folder):
    """The edit names an absolute position: generated tokens at it are routed as forced, the prompt is not."""
    loaded = load_model_folder(mixtral_folder)
    prompt = [5, 17, 33, 8]
    plain, _ = generate(loaded, prompt, 6, GenerationSettings("greedy"), stop_tokens=[])
    forced = [force_routing(l, [6], [0, 1]) for l in range(2)] + [force_routing(l, [7], [2, 3]) for l in range(2)]
    edited, _ = generate(loaded, prompt, 6, GenerationSettings("greedy"), stop_tokens=[], interventions=forced)
    with torch.no_grad():  # the same edits on the whole edited sequence at once: the same next tokens
        logits = loaded.model(torch.tensor([edited[:-1]]), interventions=forced).logits[0]
        unedited = loaded.model(torch.tensor([edited[:-1]])).logits[0]
    assert logits[len(prompt) - 1:].argmax(-1).tolist() == edited[len(prompt):]
    # (rows before the edit: the same up to rounding; an expert's product over a different set of rows may sum in
    # another order on some BLAS, e.g. MKL's generic path on AMD)
    assert torch.allclose(logits[:6], unedited[:6], rtol=0, atol=1e-5) and not torch.allclose(logits[6:], unedited[6:])
    assert edited[:len(prompt) + 3] == plain[:len(prompt) + 3]  # position 6's token is predicted at 6: the 4th new one
