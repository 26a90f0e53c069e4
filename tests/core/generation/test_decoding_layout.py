"""Transformer.pack_for_decoding in float32 on the CPU: every weight a step streams, 2 MB or more, in memory advised
for transparent huge pages (model.huge_page_buffer), laid out once, with the same values, ids and records."""
from __future__ import annotations

import sys

import pytest
import torch

from desktop_app.core import model as model_module
from desktop_app.core.checkpoints import load_model_folder, new_model, save_model_folder
from desktop_app.core.families import REGISTRY
from desktop_app.core.generation import GenerationSession, GenerationSettings

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _huge_pages_here() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


needs_huge_pages = pytest.mark.skipif(not sys.platform.startswith("linux") or not _huge_pages_here(),
                                      reason="transparent huge pages: Linux with them not off")


def _advised_huge(address: int) -> bool:
    """Whether the mapping holding `address` was advised MADV_HUGEPAGE (VmFlags 'hg' in /proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start <= address < end
            elif inside and head == "VmFlags:":
                return "hg" in line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def _gpt2_folder(tmp_path):
    # 4 MB MLP and unembedding weights (2,048 x 512 float32), GPT-2's Conv1D layout once loaded: Q/K/V side by side
    cfg = REGISTRY["gpt2"].preset(d_model=512, n_layers=2, n_heads=8, d_ff=2048, vocab_size=2048, context_length=64)
    save_model_folder(new_model(cfg, seed=0).eval(), tmp_path / "gpt2")
    return tmp_path / "gpt2"


def _weights(model):
    """Each nn.Linear's weight, and each block's Q/K/V weights side by side (one product of 3 MB here)."""
    out = {n: m.weight for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    for l, block in enumerate(model.blocks):
        out[f"blocks.{l}.attn.qkv"] = model_module.packed_linears((block.attn.q, block.attn.k, block.attn.v))[0]
    return out


@needs_huge_pages
def test_the_weights_a_step_streams_are_laid_out_once_in_huge_pages_with_their_values(tmp_path):
    model = load_model_folder(_gpt2_folder(tmp_path)).model
    before = {n: t.clone() for n, t in model.state_dict().items()}
    model.pack_for_decoding()
    large = {n: w for n, w in _weights(model).items() if w.numel() * w.element_size() >= model_module.HUGE_PAGE}
    # the loader's side-by-side Q/K/V too (not only what pack_for_decoding lays out anew), and the tied unembedding
    assert {"blocks.0.attn.qkv", "blocks.1.attn.qkv", "blocks.0.mlp.up", "blocks.0.mlp.down", "lm_head"} <= set(large)
    assert all(_advised_huge(w.data_ptr()) for w in large.values()), [n for n, w in large.items()
                                                                      if not _advised_huge(w.data_ptr())]
    assert model.lm_head.weight is model.tok_embed.weight  # still tied
    after = model.state_dict()
    assert all(torch.equal(after[n], t) for n, t in before.items())
    where = {n: p.data_ptr() for n, p in model.named_parameters()}
    model.pack_for_decoding()  # every session calls it: nothing copied again
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == where


@needs_huge_pages
def test_huge_pages_change_no_id_logit_nor_record(tmp_path, monkeypatch):
    folder = _gpt2_folder(tmp_path)

    def generated():
        model = load_model_folder(folder).model
        s = GenerationSession(model, [5, 17, 300, 2], GenerationSettings("greedy"), stop_tokens=[], record=True)
        nodes = [s.root] + [node for node in s.run(6)]
        return s.ids(), [n.next_logits for n in nodes], [n.record for n in nodes], model

    ids, logits, records, model = generated()
    assert _advised_huge(model.blocks[0].mlp.up.weight.data_ptr())
    monkeypatch.setattr(model_module, "huge_pages_for", lambda nbytes: False)  # as without them
    plain_ids, plain_logits, plain_records, plain = generated()
    assert not _advised_huge(plain.blocks[0].mlp.up.weight.data_ptr())
    assert ids == plain_ids
    assert all(torch.equal(a, b) for a, b in zip(logits, plain_logits))
    assert [sorted(r) for r in records] == [sorted(r) for r in plain_records]
    assert all(torch.equal(r[name], p[name]) for r, p in zip(records, plain_records) for name in r)
