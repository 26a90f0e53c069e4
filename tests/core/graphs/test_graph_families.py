"""Issue 37: attribution graphs on every decoder family the app opens, and on encoder-decoders' decoders.

Each family's tiny random model is made by `transformers` (tests/parity/family_cases/<model_type>.py, the
parity suite's builders), saved and opened here, in float64, with random transcoders. The definition is
checked as in test_graph.py: the frozen replacement forward gives the real model's logits and the recorded
transcoder inputs, and every edge into a logit and into a feature is the change in that target when its
source (a feature, an error node, a token) is removed with everything else frozen. An encoder-decoder's
cross-attention is frozen with its pattern, the encoder's output a constant.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.families import REGISTRY
from desktop_app.core.graphs import attribute, build_context, graph_problem, load_transcoders, salient_targets
from desktop_app.core.graphs.edits import FeatureSet, feature_interventions
from desktop_app.core.graphs.replacement import n_graph_layers, stack_prefix
from desktop_app.core.graphs.transcoders import random_transcoders

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

PARITY = Path(__file__).resolve().parents[2] / "parity"
DECODERS = [name for name, f in REGISTRY.items() if f.decoder]
# one family per kind of block by default (the rest with -m slow): pre-norm RMS and LayerNorm, parallel with
# two norms and with one, Gemma 2's offset norms / sandwich norms / soft-caps / scaled embeddings, OLMo's
# clipped values, OLMo 2's output norms, Granite's multipliers, Bloom's ALiBi and embedding norm, Cohere's
# logit scale, mixtures (with a shared expert), and the three encoder-decoders
FAST = {"llama", "gpt2", "gpt_neox", "gptj", "gemma2", "olmo", "olmo2", "granite", "bloom", "cohere", "mixtral",
        "qwen2_moe", "t5", "bart", "marian"}
IDS = [1, 9, 4, 17, 23, 6]
SOURCE = [5, 8, 13, 21, 3]


def family_model(family: str, folder: Path):
    if str(PARITY) not in sys.path:
        sys.path.insert(0, str(PARITY))
    build = next(iter(importlib.import_module(f"family_cases.{family}").CASES.values()))
    torch.manual_seed(0)
    build().save_pretrained(folder)
    model = load_model_folder(folder).model.to(torch.float64).eval()
    assert model.cfg.family == family
    with torch.no_grad():  # token rows of unit scale: OLMo 2's MLPs read the un-normed stream, which the
        model.tok_embed.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(1))  # features then read
    return model


def pre_activation(ctx, target, activations=None, errors=None, tokens=None):
    """A target's pre-activation in the frozen replacement model: ("logit", vector) or ("feature", index)."""
    feature_inputs, h = ctx.forward(tokens=tokens, activations=activations, errors=errors)
    if target[0] == "logit":
        return float(target[1].to(h.dtype) @ h[-1])
    layer, pos, _ = ctx.active[target[1]].tolist()
    return float(ctx.encoder_vectors(torch.tensor([target[1]]))[0] @ feature_inputs[layer][pos])


@pytest.mark.parametrize("family", [pytest.param(f, marks=() if f in FAST else pytest.mark.slow) for f in DECODERS])
def test_each_family_graph_is_the_frozen_models_direct_effects(tmp_path, family):
    model = family_model(family, tmp_path / "hf")
    assert graph_problem(model.cfg) is None
    L, encdec = n_graph_layers(model), bool(stack_prefix(model))
    cross_layer = len(family) % 2 == 0  # both kinds of transcoder across the families
    random_transcoders(tmp_path / "tc", L, model.cfg.d_model, 12, seed=3, cross_layer=cross_layer,
                       activation="jump_relu", skip=not cross_layer)
    tc = load_transcoders(tmp_path / "tc")
    ids = ([model.cfg.decoder_start_token_id] + IDS[1:]) if encdec else IDS
    ctx = build_context(model, ids, tc, source=SOURCE if encdec else None)
    assert len(ctx.active) > 10

    # the frozen forward reproduces the real logits and the recorded transcoder inputs (the model's float32
    # norms in a float64 model: agreement to float32's precision)
    feature_inputs, h = ctx.forward()
    assert torch.allclose(ctx.logits(h), ctx.frozen.logits, atol=2e-5, rtol=0)
    prefix = stack_prefix(model)
    names = [f"{prefix}blocks.{l}.mlp.input" for l in range(L)]
    x = torch.tensor(ids)[None]
    _, trace = model.run_with_trace(torch.tensor(SOURCE)[None], x, names) if encdec else model.run_with_trace(x, names)
    assert torch.allclose(torch.stack(feature_inputs), torch.stack([trace[n][0] for n in names]), atol=2e-5)

    # every edge into the first logit target and into two last-layer features: the effect of removing its source
    targets = salient_targets(model, ctx.frozen.logits[-1], 2, 0.95, str)
    graph = attribute(ctx, targets, batch_size=16)
    A, n, T = graph.adjacency, len(ctx.active), ctx.n_pos
    last = [i for i in range(n) if ctx.active[i, 0] == L - 1][:2]
    assert last
    for target, row in [(("logit", targets.vectors[0]), graph.logit_index(0))] + [(("feature", i), i) for i in last]:
        base = pre_activation(ctx, target)
        tol = 1e-9 * float(A[row].abs().max()) + 1e-12
        effects = []
        for s in range(n):
            acts = ctx.activations.clone()
            acts[s] = 0
            effects.append(base - pre_activation(ctx, target, activations=acts))
        for layer in range(L):
            for pos in range(T):
                errors = ctx.error_vectors.clone()
                errors[layer, pos] = 0
                effects.append(base - pre_activation(ctx, target, errors=errors))
        for pos in range(T):
            tokens = ctx.frozen.token_vectors.clone()
            tokens[pos] = 0
            effects.append(base - pre_activation(ctx, target, tokens=tokens))
        assert torch.allclose(A[row, :n + (L + 1) * T], torch.tensor(effects, dtype=A.dtype), atol=tol, rtol=0), target
        assert float(A[row, :n].abs().max()) > 1e-6  # edges worth checking
    # a last-layer feature clamped as a What-if edit on the live model moves that layer's MLP output by its
    # decoder vector (an encoder-decoder's edit point is in its decoder)
    edits = feature_interventions(ctx, [FeatureSet(last[0], "clamp", 2.0)])
    assert [e.target for e in edits] == [f"{prefix}blocks.{L - 1}.mlp.out"]


@pytest.mark.parametrize("family", [pytest.param(f, marks=() if f in FAST else pytest.mark.slow)
                                    for f in DECODERS if not REGISTRY[f].encoder_decoder])
def test_each_familys_graph_read_layer_by_layer_is_the_whole_models_and_reads_no_mlp(tmp_path, monkeypatch, family):
    """A model larger than memory (core/streamed.py): the replacement model's passes read only the parts of
    a block they use (its norms, the attention's values and output), whatever the family's placement of
    them; the graph is the one of the model held whole."""
    from desktop_app.core.streamed import streamed_of

    family_model(family, tmp_path / "hf")
    whole, streamed = (load_model_folder(tmp_path / "hf", streamed=s).model for s in (False, True))
    random_transcoders(tmp_path / "tc", n_graph_layers(whole), whole.cfg.d_model, 12, seed=3)
    tc = load_transcoders(tmp_path / "tc")
    graphs, read = [], []
    for model in (whole, streamed):
        ctx = build_context(model, IDS, tc)
        if model is streamed:  # after the real forward (which reads every block whole)
            load_block = streamed_of(model).load_block

            def recording(layer, device, only):
                tensors = load_block(layer, device, only)
                read.append(set(tensors))
                return tensors
            monkeypatch.setattr(streamed_of(model), "load_block", recording)
        graphs.append(attribute(ctx, salient_targets(model, ctx.frozen.logits[-1], 3, 0.95, str), batch_size=16))
    assert torch.equal(graphs[0].adjacency, graphs[1].adjacency)
    assert read and not [names for names in read if any(n.startswith("mlp.") for n in names)], read
    assert not streamed_of(streamed).resident
