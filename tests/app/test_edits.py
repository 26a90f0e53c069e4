"""app/edits.py: the one rule for adding, replacing and removing a what-if edit, and its `changed` event."""
from __future__ import annotations

import torch

from desktop_app.app.edits import ADDED, ALREADY, REPLACED, EditList
from desktop_app.app.features import feature_edit_from
from desktop_app.core.config import ModelConfig
from desktop_app.core.features import SparseDictionary, attach
from desktop_app.core.interventions import Intervention, force_routing, steer


def _watched(edits: EditList) -> list[list]:
    seen: list[list] = []
    edits.changed.connect(lambda now: seen.append([iv.label for iv in now]))
    return seen


def test_the_same_edit_again_changes_nothing():
    edits = EditList()
    seen = _watched(edits)
    assert edits.add(Intervention("blocks.1.mlp.out")) == ADDED
    assert edits.add(Intervention("blocks.1.mlp.out")) == ALREADY  # What if says "already applied"
    assert [iv.label for iv in edits] == ["zero blocks.1.mlp.out"] and seen == [["zero blocks.1.mlp.out"]]


def test_another_kind_of_ablation_of_the_same_target_replaces_it_and_goes_last():
    edits = EditList([Intervention("blocks.1.attn.head.2"), Intervention("blocks.0.mlp.out", "mean")])
    seen = _watched(edits)
    assert edits.add(Intervention("blocks.1.attn.head.2", "resample", source_ids=(3, 4))) == REPLACED
    assert [(iv.target, iv.how) for iv in edits] == [("blocks.0.mlp.out", "mean"), ("blocks.1.attn.head.2", "resample")]
    # a resample from another text is another edit: it replaces the first resample
    assert edits.add(Intervention("blocks.1.attn.head.2", "resample", source_ids=(5,))) == REPLACED
    assert [iv.source_ids for iv in edits] == [None, (5,)] and len(seen) == 2


def test_other_targets_and_positions_stack():
    edits = EditList()
    assert edits.add(Intervention("blocks.1.attn.head.2")) == ADDED
    assert edits.add(Intervention("blocks.1.attn.head.3")) == ADDED
    assert edits.add(Intervention("blocks.1.attn.head.2", positions=(0,))) == ADDED
    assert len(edits) == 3


def test_a_routing_of_the_same_token_and_layer_replaces_the_old_one():
    edits = EditList()
    assert edits.add(force_routing(0, [2], [1, 3])) == ADDED
    assert edits.add(force_routing(0, [4], [1, 3])) == ADDED  # another token
    assert edits.add(force_routing(0, [2], [0, 5])) == REPLACED
    assert [(iv.positions, iv.value.tolist()) for iv in edits] == [((4,), [1, 3]), ((2,), [0, 5])]


def test_one_steer_at_a_time_and_a_steer_keeps_the_other_edits():
    v = torch.ones(8)
    ablation = Intervention("blocks.0.attn.head.1")
    graph_edit = Intervention("blocks.1.mlp.out", "add", value=torch.ones(3, 8), name="transcoder features L1/f2@0")
    edits = EditList([ablation, graph_edit])
    assert edits.add(steer(v, 1, 4.0, "a", "b")) == ADDED
    assert edits.add(steer(v, 0, -2.0, "c", "d")) == REPLACED  # another layer too: the panel has one slider
    assert [iv.label for iv in edits][:2] == [ablation.label, graph_edit.label]  # the graph's add is no steer
    assert edits[-1].label.startswith("steer L0 x-2.0") and len(edits) == 3
    assert edits.add(steer(v, 0, -2.0, "c", "d")) == ALREADY  # the same vector again


def test_a_graph_edit_of_the_same_features_replaces_the_earlier_one():
    old = Intervention("blocks.1.mlp.out", "add", value=torch.ones(3, 8), name="transcoder features L1/f2@0")
    other = Intervention("blocks.1.mlp.out", "add", value=torch.ones(3, 8), name="transcoder features L1/f7@0")
    edits = EditList([old, other])
    seen = _watched(edits)
    new = Intervention("blocks.1.mlp.out", "add", value=2 * torch.ones(3, 8), name="transcoder features L1/f2@0")
    assert edits.add_all([new, Intervention("blocks.0.mlp.out", "add", value=torch.ones(3, 8), name="x")]) == [
        REPLACED, ADDED]
    assert [iv for iv in edits][:2] == [other, new] and len(seen) == 1  # one event for the lot
    assert edits.add_all([new]) == [ALREADY] and len(seen) == 1


def _attached(seed: int):
    cfg = ModelConfig.gpt2(vocab_size=50, d_model=16, n_layers=2, n_heads=2, d_ff=32, context_length=16)
    g = torch.Generator().manual_seed(seed)
    d = SparseDictionary(torch.randn(16, 8, generator=g), torch.zeros(8), torch.randn(8, 16, generator=g),
                         torch.zeros(16), hook="blocks.1.hook_resid_post")
    return attach(d, cfg)


def test_a_feature_edit_replaces_the_same_features_edit_of_the_same_dictionary_only():
    a, b = _attached(0), _attached(1)
    edits = EditList()
    assert edits.add(feature_edit_from(a, 3, "clamp", 2.0)) == ADDED
    assert edits.add(feature_edit_from(a, 4, "zero")) == ADDED
    assert edits.add(feature_edit_from(b, 3, "zero")) == ADDED  # another dictionary's feature 3
    assert edits.add(feature_edit_from(a, 3, "scale", 5.0)) == REPLACED
    assert edits.add(feature_edit_from(a, 3, "scale", 5.0)) == ALREADY
    assert [(iv.features.attached is a, iv.features.ops[0].feature, iv.features.ops[0].how) for iv in edits] == [
        (True, 4, "zero"), (False, 3, "zero"), (True, 3, "scale")]
    removed = edits.remove_if(lambda iv: iv.features.attached is a)
    assert len(removed) == 2 and len(edits) == 1


def test_remove_clear_and_set_say_the_list_now():
    x, y = Intervention("blocks.0.mlp.out"), Intervention("blocks.1.mlp.out")
    edits = EditList([x, y])
    seen = _watched(edits)
    edits.remove_at(5)  # out of range: nothing
    assert edits.remove_if(lambda iv: False) == []  # nothing removed: no event
    edits.remove_at(0)
    assert list(edits) == [y] and seen == [["zero blocks.1.mlp.out"]]
    edits.set([x, y])
    edits.clear()
    edits.clear()  # Clear all with none: said too (the plain model is traced again)
    assert list(edits) == [] and seen[1:] == [["zero blocks.0.mlp.out", "zero blocks.1.mlp.out"], [], []]
