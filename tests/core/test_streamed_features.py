"""Feature edits, dictionary attribution and What if on a model read layer by layer (core/streamed.py) give
what they give on the same model loaded whole: every weight they read outside a block's forward is read
through `holding`, and every block is let go afterwards."""
from __future__ import annotations

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402

from desktop_app.app import features as app_features  # noqa: E402
from desktop_app.app import whatif  # noqa: E402
from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.core.features import FeatureOp, SparseDictionary, attach, feature_edit  # noqa: E402
from desktop_app.core.streamed import streamed_of  # noqa: E402
from desktop_app.core.tokenizer import char_tokenizer  # noqa: E402

from test_streamed import reads_of  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
HIDDEN, HEADS, LAYERS = 64, 4, 3


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(the tiny LLaMA loaded whole, the same folder read layer by layer)"""
    folder = tmp_path_factory.mktemp("streamed-features") / "llama"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=256)).save_pretrained(folder)
    char_tokenizer("abcdefghijklmnopqrstuvwxyz .,").save(folder / "tokenizer.json")  # for a dashboard's text file
    whole, streamed = load_model_folder(folder), load_model_folder(folder, streamed=True)
    assert streamed_of(streamed.model) is not None and streamed_of(whole.model) is None
    return whole, streamed


def dictionary(hook: str, seed: int = 0) -> SparseDictionary:
    g = torch.Generator().manual_seed(seed)
    return SparseDictionary(torch.randn(HIDDEN, 48, generator=g) * 0.3, torch.randn(48, generator=g) * 0.1,
                            torch.randn(48, HIDDEN, generator=g) * 0.3, torch.randn(HIDDEN, generator=g) * 0.1, hook=hook)


IDS = [5, 17, 3, 99, 42, 8, 61, 23, 7, 11]
HOOKS = ["blocks.1.attn.hook_z", "blocks.1.hook_mlp_out", "blocks.2.hook_resid_post"]


def let_go(loaded) -> bool:
    return not streamed_of(loaded.model).resident


@pytest.mark.parametrize("hook", HOOKS)
def test_feature_attribution_on_a_streamed_model_is_the_whole_models(pair, hook):
    whole, streamed = pair
    att = attach(dictionary(hook), whole.config)
    a, b = (app_features.attribute_next_token(m, IDS, att) for m in (whole, streamed))
    assert a[1] == b[1]  # the same top token
    fa, fb = a[0], b[0]
    assert len(fa.features) > 0
    assert np.array_equal(fa.features, fb.features) and np.array_equal(fa.contributions, fb.contributions)
    # the same up to rounding: a product's bits can follow its operands' alignment (MKL's generic path on an AMD EPYC:
    # the whole model's weights lie in the file's map at 56 mod 64, a streamed block's copies at 0)
    assert np.allclose((fa.bias, fa.skip, fa.error, fa.direct), (fb.bias, fb.skip, fb.error, fb.direct),
                       rtol=1e-5, atol=1e-8)
    assert let_go(streamed)


@pytest.mark.parametrize("hook", HOOKS)
def test_feature_edits_lens_and_dashboard_on_a_streamed_model_are_the_whole_models(pair, hook, tmp_path):
    whole, streamed = pair
    att = attach(dictionary(hook, seed=1), whole.config)
    run = app_features.features_on(whole, IDS, [att])[0]
    top = int(run.acts[-1].argmax())
    edits = [feature_edit(att, [FeatureOp(top, "zero"), FeatureOp((top + 1) % 48, "add", 2.0)])]
    with torch.no_grad():
        la, lb = (m.model(torch.tensor([IDS]), interventions=edits).logits for m in (whole, streamed))
        plain = whole.model(torch.tensor([IDS])).logits
    assert not torch.equal(la, plain)  # the edit does something
    assert torch.equal(la, lb)
    # the lens on the edited model, What if's attribution and patching with the edit in place
    (ra, _), = app_features.lens_on(whole, IDS, [att], edits)
    (rb, _), = app_features.lens_on(streamed, IDS, [att], edits)
    assert torch.equal(ra.acts, rb.acts)
    (da, ta), (db, tb) = (whatif.attribute_ids(m, IDS, -1, None, edits) for m in (whole, streamed))
    assert ta == tb and da.components == db.components
    assert np.array_equal(np.asarray(da.contributions), np.asarray(db.contributions))
    corrupted = IDS[:3] + [1] + IDS[4:]
    pa, pb = (whatif.patch_ids(m, IDS, corrupted, ta, interventions=edits) for m in (whole, streamed))
    assert pa.clean_metric == pb.clean_metric and pa.corrupted_metric == pb.corrupted_metric
    assert np.array_equal(pa.resid, pb.resid) and np.array_equal(pa.heads, pb.heads)
    # a feature's dashboard over a file and its decoder's tokens
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 3)
    ca, cb = (app_features.dashboard(m, att, text, top, top=5, window=4) for m in (whole, streamed))
    assert ca.active_tokens > 0 and ca.rows == cb.rows
    assert app_features.decoder_tokens(whole, att, top) == app_features.decoder_tokens(streamed, att, top)
    assert let_go(streamed)


def test_what_if_steering_on_a_streamed_model_is_the_whole_models(pair):
    whole, streamed = pair
    (sa, na), (sb, nb) = (whatif.steering_edit(m, "a calm day", "a dark storm", 1, 3.0) for m in (whole, streamed))
    assert na == nb
    assert whatif.top_token(whole, IDS, -1, [sa]) == whatif.top_token(streamed, IDS, -1, [sb])
    assert let_go(streamed)


def test_an_attribution_graph_on_a_streamed_model_is_the_whole_models(pair, tmp_path):
    """The local replacement model drives each block's sublayers outside its forward (Block.compose)."""
    from desktop_app.core.graphs import attribute, build_context, load_transcoders
    from desktop_app.core.graphs.attribution import salient_targets
    from desktop_app.core.graphs.transcoders import random_transcoders

    whole, streamed = pair
    random_transcoders(tmp_path / "tc", LAYERS, HIDDEN, 32, seed=3)
    graphs = []
    for m in (whole, streamed):
        ctx = build_context(m.model, IDS, load_transcoders(tmp_path / "tc"))
        graphs.append(attribute(ctx, salient_targets(m.model, ctx.frozen.logits[-1], 3, 0.95, str), batch_size=16))
    a, b = graphs
    assert a.active_features.shape[0] > 5
    assert torch.equal(a.active_features, b.active_features) and torch.equal(a.adjacency, b.adjacency)
    assert let_go(streamed)


def test_what_if_forced_routing_on_a_streamed_mixtral_is_the_whole_models(tmp_path):
    torch.manual_seed(0)
    transformers.MixtralForCausalLM(transformers.MixtralConfig(
        vocab_size=128, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=2, num_attention_heads=HEADS,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=64)).save_pretrained(tmp_path)
    whole, streamed = load_model_folder(tmp_path), load_model_folder(tmp_path, streamed=True)
    results = []
    for m in (whole, streamed):
        forced = whatif.forced_routing(m.config, 1, 3, "0,2")
        attribution, token = whatif.attribute_ids(m, IDS, -1, None, [forced])
        with torch.no_grad():
            logits = m.model(torch.tensor([IDS]), interventions=[forced]).logits
        results.append((token, np.asarray(attribution.contributions), logits))
    (ta, ca, la), (tb, cb, lb) = results
    with torch.no_grad():
        assert not torch.equal(la, whole.model(torch.tensor([IDS])).logits)  # the routing forced changes them
    assert ta == tb and np.array_equal(ca, cb) and torch.equal(la, lb)
    assert let_go(streamed)


@pytest.mark.parametrize("keep_budget", [0, None])
def test_a_streamed_graphs_backward_keeps_one_block_in_memory(pair, tmp_path, monkeypatch, keep_budget):
    """Autograd saves the weights a product used for its backward: without care, what the replacement
    model's forward used of every block it read would stay in memory through the backward. Each time the
    backward reaches a layer's feature input, the real block tensors alive (a weak reference to the
    storage of each tensor read from the files) are counted: besides the first layers' parts `keeping`
    keeps (none with a budget of 0; by default no more than a block's bytes: here all three layers'),
    one layer's at most; no more than a block beside what is kept."""
    from torch.multiprocessing.reductions import StorageWeakRef

    from desktop_app.core.graphs import attribute, build_context, load_transcoders
    from desktop_app.core.graphs import attribution
    from desktop_app.core.graphs.attribution import salient_targets
    from desktop_app.core.graphs.transcoders import random_transcoders

    _, loaded = pair
    streamed = streamed_of(loaded.model)
    monkeypatch.setattr(streamed, "keep_budget", keep_budget)
    read: list[tuple[int, int, StorageWeakRef]] = []  # (layer, bytes, its storage) of every tensor read
    load_block = streamed.load_block

    def recording_load_block(layer, device, only):
        tensors = load_block(layer, device, only)
        read.extend((layer, t.untyped_storage().nbytes(), StorageWeakRef(t.untyped_storage())) for t in tensors.values())
        return tensors
    monkeypatch.setattr(streamed, "load_block", recording_load_block)
    block_bytes = sum(p.numel() * p.element_size() for p in loaded.model.blocks[0].parameters())

    seen = []  # per backward step: (how many layers not kept have tensors alive, the bytes of those, of all)

    def alive_blocks(_grad):
        alive = [(layer, nbytes) for layer, nbytes, ref in read if not ref.expired()]
        others = [(layer, nbytes) for layer, nbytes in alive if layer not in streamed.keep]
        seen.append((len({layer for layer, _ in others}), sum(n for _, n in others), sum(n for _, n in alive)))
    forward = attribution.linear_forward

    def watched_forward(*args):
        feature_inputs, h = forward(*args)
        if h.requires_grad:
            for f in feature_inputs:
                f.register_hook(alive_blocks)
        return feature_inputs, h
    monkeypatch.setattr(attribution, "linear_forward", watched_forward)

    random_transcoders(tmp_path / "tc", LAYERS, HIDDEN, 32, seed=3)
    ctx = build_context(loaded.model, IDS, load_transcoders(tmp_path / "tc"))
    attribute(ctx, salient_targets(loaded.model, ctx.frozen.logits[-1], 3, 0.95, str), batch_size=16)
    assert len(seen) >= LAYERS  # every layer's feature input is reached in each backward
    assert max(layers for layers, _, _ in seen) <= 1, seen
    assert max(nbytes for _, nbytes, _ in seen) <= block_bytes, (seen, block_bytes)
    kept = max(alive - others for _, others, alive in seen)
    assert kept == 0 if keep_budget == 0 else 0 < kept <= block_bytes, (seen, block_bytes)
    assert let_go(streamed) and not any(streamed.held.values())


def test_a_streamed_graphs_backward_starts_with_what_its_forward_read_last(pair, tmp_path, monkeypatch):
    """Each backward batch's forward reads every layer's parts, then its backward reads them again from
    the last layer down: all but the last, whose saved tensors are kept across the turn (a layer's
    memory). The same graph as the whole model's. (Nothing kept across batches: a keep budget of 0.)"""
    from desktop_app.core.graphs import attribute, attribution, build_context, load_transcoders
    from desktop_app.core.graphs.attribution import salient_targets
    from desktop_app.core.graphs.transcoders import random_transcoders

    whole, loaded = pair
    streamed = streamed_of(loaded.model)
    monkeypatch.setattr(streamed, "keep_budget", 0)
    random_transcoders(tmp_path / "tc", LAYERS, HIDDEN, 32, seed=3)
    batches, compute_rows = [0], attribution.compute_rows
    monkeypatch.setattr(attribution, "compute_rows", lambda *args: batches.append(1) or compute_rows(*args))
    graphs = []
    for m in (whole, loaded):
        ctx = build_context(m.model, IDS, load_transcoders(tmp_path / "tc"))
        if m is loaded:
            read, batches[:] = reads_of(streamed, monkeypatch), []
        graphs.append(attribute(ctx, salient_targets(m.model, ctx.frozen.logits[-1], 3, 0.95, str), batch_size=4))
    layers = [layer for layer, _ in read]
    # a batch whose backward passes the last layer (targets there or in the logits): forward 0 .. L-1, then
    # backward L-2 .. 0, not L-1 again (a batch of earlier targets' backward stops below)
    turn = list(range(LAYERS)) + list(range(LAYERS - 2, -1, -1))
    assert any(layers[i:i + len(turn)] == turn for i in range(len(layers))), layers
    assert layers.count(LAYERS - 1) == len(batches) >= 2, layers  # once a batch: its forward
    assert torch.equal(graphs[0].adjacency, graphs[1].adjacency)
    assert let_go(loaded) and not any(streamed.held.values())


def test_a_whole_models_graph_runs_without_saved_tensor_hooks(pair, tmp_path, monkeypatch):
    """Reading weights again in the backward is for a streamed model only: one held whole keeps autograd's own."""
    from desktop_app.core.graphs import attribute, build_context, load_transcoders
    from desktop_app.core.graphs.attribution import salient_targets
    from desktop_app.core.graphs.transcoders import random_transcoders

    def refused(*_args):
        raise AssertionError("saved tensor hooks on a model held whole")
    monkeypatch.setattr(torch.autograd.graph, "saved_tensors_hooks", refused)
    whole, _ = pair
    random_transcoders(tmp_path / "tc", LAYERS, HIDDEN, 32, seed=3)
    ctx = build_context(whole.model, IDS, load_transcoders(tmp_path / "tc"))
    graph = attribute(ctx, salient_targets(whole.model, ctx.frozen.logits[-1], 3, 0.95, str), batch_size=16)
    assert graph.active_features.shape[0] > 5


def test_part_of_a_block_is_read_with_what_is_stored_with_it(tmp_path):
    """The backward reads only the weights it saved; GPT-2's c_attn holds q, k and v in one tensor, so
    asking for v reads the three (the same values as the whole block's read), and no MLP."""
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4,
                                                         n_positions=64)).save_pretrained(tmp_path / "gpt2")
    streamed = streamed_of(load_model_folder(tmp_path / "gpt2", streamed=True).model)
    cpu = torch.device("cpu")
    part, block = streamed.load_block(1, cpu, {"attn.v.weight", "norm1.weight"}), streamed.load_block(1, cpu, None)
    assert set(part) == {"attn.q.weight", "attn.k.weight", "attn.v.weight", "norm1.weight"}
    assert all(torch.equal(t, block[n]) for n, t in part.items())


def test_a_streamed_graph_reads_no_mlp_after_its_real_forward(pair, tmp_path, monkeypatch):
    """The replacement model replaces every MLP: past the real forward (freeze's), neither its passes nor
    their backward read a block's MLP from the files, only the norms and the attention's values and output;
    the graph is the whole model's."""
    from desktop_app.core.graphs import attribute, build_context, load_transcoders
    from desktop_app.core.graphs.attribution import salient_targets
    from desktop_app.core.graphs.transcoders import random_transcoders

    whole, loaded = pair
    streamed = streamed_of(loaded.model)
    random_transcoders(tmp_path / "tc", LAYERS, HIDDEN, 32, seed=3)
    graphs = []
    for m in (whole, loaded):
        ctx = build_context(m.model, IDS, load_transcoders(tmp_path / "tc"))
        if m is loaded:
            read = reads_of(streamed, monkeypatch)
        graphs.append(attribute(ctx, salient_targets(m.model, ctx.frozen.logits[-1], 3, 0.95, str), batch_size=16))
    a, b = graphs
    assert torch.equal(a.active_features, b.active_features) and torch.equal(a.adjacency, b.adjacency)
    used = {"norm1.weight", "norm2.weight", "attn.v.weight", "attn.o.weight"}
    assert len(read) >= LAYERS and {layer for layer, _ in read} == set(range(LAYERS))
    assert all(names <= used for _, names in read), read
    assert let_go(loaded) and not any(streamed.held.values())


@pytest.mark.parametrize("kept", [1, LAYERS])
def test_a_streamed_graph_reads_the_first_layers_parts_once(pair, tmp_path, monkeypatch, kept):
    """`keeping`: the parts the replacement model reads of the first layers (as many as the keep budget
    holds: one layer's here, or all of them, the default's one block's bytes) stay in memory through the
    freeze's replay and through every backward batch, read once each rather than again by the replay after
    the real forward and by every batch's forward and backward; the others as before. The graph is the
    whole model's, bit for bit, and everything is let go after."""
    from desktop_app.core.graphs import attribute, attribution, build_context, load_transcoders
    from desktop_app.core.graphs.attribution import salient_targets
    from desktop_app.core.graphs.replacement import _parts_read
    from desktop_app.core.graphs.transcoders import random_transcoders
    from desktop_app.core.streamed import parameter_names

    whole, loaded = pair
    streamed = streamed_of(loaded.model)
    block = loaded.model.blocks[0]
    parts = parameter_names(block, _parts_read(block))
    part_bytes = sum(p.numel() * p.element_size() for n, p in block.named_parameters() if n in parts)
    assert LAYERS * part_bytes <= sum(p.numel() * p.element_size() for p in block.parameters())  # the default's
    monkeypatch.setattr(streamed, "keep_budget", None if kept == LAYERS else kept * part_bytes)
    random_transcoders(tmp_path / "tc", LAYERS, HIDDEN, 32, seed=3)
    batches, compute_rows = [], attribution.compute_rows
    monkeypatch.setattr(attribution, "compute_rows", lambda *args: batches.append(1) or compute_rows(*args))
    graphs = []
    for m in (whole, loaded):
        if m is loaded:
            read, batches[:] = reads_of(streamed, monkeypatch), []
        ctx = build_context(m.model, IDS, load_transcoders(tmp_path / "tc"))
        if m is loaded:
            assert not streamed.resident
            freeze_reads, read[:] = list(read), []
        graphs.append(attribute(ctx, salient_targets(m.model, ctx.frozen.logits[-1], 3, 0.95, str), batch_size=4))
    whole_block = {n for n, _ in block.named_parameters()}
    # the real forward reads every block whole; the replay only the parts of those not kept
    assert freeze_reads == [(l, whole_block) for l in range(LAYERS)] + [(l, parts) for l in range(kept, LAYERS)]
    assert len(batches) >= 3 and all(names == parts for _, names in read), read
    layers = [layer for layer, _ in read]
    assert all(layers.count(l) == 1 for l in range(kept)), layers  # read once for all the batches
    if kept < LAYERS:  # the others every batch: the forward reads each, the backward all but the last again
        assert layers.count(LAYERS - 1) == len(batches) and layers.count(kept) > len(batches), layers
    assert torch.equal(graphs[0].active_features, graphs[1].active_features)
    assert torch.equal(graphs[0].adjacency, graphs[1].adjacency)
    assert let_go(loaded) and not any(streamed.held.values())
