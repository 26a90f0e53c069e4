"""Transformer.pack_for_decoding in float32 on the CPU: every weight a step streams, 2 MB or more, in memory advised
for transparent huge pages (model.huge_page_buffer), laid out once, with the same values, ids and records."""
from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest
import torch

from desktop_app.app import generation as app_generation
from desktop_app.core import devices
from desktop_app.core import model as model_module
from desktop_app.core.checkpoints import load_model_folder, new_model, save_model_folder
from desktop_app.core.devices import MemoryEstimateError
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


# -- the memory for it: huge-page copies only where they fit (model._decoding_copy), counted before a generation ----


def _load(folder, monkeypatch, available):
    """The model, then this much memory available (faked) from here on."""
    model = load_model_folder(folder).model
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": available)
    return model


def _copied_bytes(model, before: set[int]) -> int:
    """Bytes of the buffers holding the parameters now in memory of their own (not where they were in `before`), the
    tied one once: each buffer from its first element to its last, in whole rows (a column-major weight's rows are
    padded: model.padded_rows; Q/K/V side by side share one buffer's rows)."""
    spans: dict[int, tuple[int, int, int]] = {}  # buffer -> (start, end, row bytes)
    for p in model.parameters():
        if p.data_ptr() in before:
            continue
        size = p.element_size()
        end = p.data_ptr() + (1 + sum((n - 1) * s for n, s in zip(p.shape, p.stride()))) * size
        start0, end0, row0 = spans.get(p.untyped_storage().data_ptr(), (p.data_ptr(), end, 0))
        spans[p.untyped_storage().data_ptr()] = (min(start0, p.data_ptr()), max(end0, end), max(row0, max(p.stride()) * size))
    return sum(-((start - end) // row) * row for start, end, row in spans.values())  # (whole rows: rounded up)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("room", [True, False])
def test_the_estimate_is_the_bytes_pack_for_decoding_copies(tmp_path, monkeypatch, family, room):
    """decoding_copy_bytes follows pack_for_decoding's rules (and pack_linears'): GPT-2's Conv1D weights, its
    side-by-side Q/K/V and the tied unembedding, a Llama's row-major weights and separate Q/K/V; with room for the
    huge-page copies or without; nothing more once made."""
    cfg = REGISTRY[family].preset(d_model=512, n_layers=2, n_heads=8, d_ff=2048, vocab_size=2048, context_length=64)
    save_model_folder(new_model(cfg, seed=0).eval(), tmp_path / family)
    full = model_module.decoding_copy_bytes(_load(tmp_path / family, monkeypatch, 1 << 50))
    model = _load(tmp_path / family, monkeypatch, 1 << 50 if room else full)
    before = {p.data_ptr() for p in model.parameters()}
    expected = model_module.decoding_copy_bytes(model)
    model.pack_for_decoding()
    assert _copied_bytes(model, before) == expected > 0
    # without room: less by GPT-2's up projections and Q/K/V (column-major in the file), a Llama's down projections
    assert (expected < full) == (not room and _huge_pages_here()) and expected <= full
    # what is left: nothing, or the huge-page copies held back (a later session makes them where they then fit)
    assert model_module.decoding_copy_bytes(model) == full - expected


def test_copies_of_weights_in_anonymous_memory_count_as_the_largest_one(monkeypatch):
    """A model converted to float32 as it loaded (or a new one) holds its weights in anonymous memory, which each
    copy frees once made: memory grows by the largest copy at its moment, not by their sum (a count that would refuse
    generations that fit). A model read from its folder: by the sum (test above: its weights stay in the file's map)."""
    cfg = REGISTRY["llama"].preset(d_model=512, n_layers=2, n_heads=8, d_ff=2048, vocab_size=2048, context_length=64)
    model = new_model(cfg, seed=0).eval()
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": 1 << 50)
    before = {p.data_ptr() for p in model.parameters()}
    growth = model_module.decoding_copy_bytes(model)
    model.pack_for_decoding()
    assert growth == 2048 * 512 * 4  # the unembedding, an MLP's up (or gate) projection: the largest
    assert _copied_bytes(model, before) > 2 * growth


@needs_huge_pages
def test_without_room_for_the_huge_page_copy_none_is_made_and_generation_is_the_same(tmp_path, monkeypatch, caplog):
    """The copy into huge pages was made whatever the memory (+300 MB at GPT-2 124M, ~6 GB at GPT-2 XL in float32):
    a machine that holds the model but not the copy swapped. Now, when the memory available does not cover the
    copy with a quarter to spare, the weights already in the step's layout stay in the file's map (one line in the
    log says so), the others are laid out as before, and the ids, logits and records are the same bits."""
    folder = _gpt2_folder(tmp_path)
    full = model_module.decoding_copy_bytes(_load(folder, monkeypatch, 1 << 50))
    made = []  # the huge-page buffers made during a generation (whether other memory is advised huge is not ours:
    # numpy advises its large arrays, and the heap they leave is where a later 4 KB-page copy may land)
    make = model_module.huge_page_buffer
    monkeypatch.setattr(model_module, "huge_page_buffer",
                        lambda numel, dtype: (lambda b: (b is not None and made.append(numel), b)[1])(make(numel, dtype)))

    def generated(available):
        made.clear()
        model = _load(folder, monkeypatch, available)
        where = {n: p.data_ptr() for n, p in model.named_parameters()}
        expected = model_module.decoding_copy_bytes(model)
        s = GenerationSession(model, [5, 17, 300, 2], GenerationSettings("greedy"), stop_tokens=[], record=True)
        copied = _copied_bytes(model, set(where.values()))
        moved = {n for n, p in model.named_parameters() if p.data_ptr() != where[n]}
        nodes = [s.root] + [node for node in s.run(6)]
        return (s.ids(), [n.next_logits for n in nodes], [n.record for n in nodes]), model, moved, expected, copied

    with caplog.at_level(logging.INFO, logger="desktop_app"):
        out, model, moved, expected, copied = generated(1 << 50)
        assert not caplog.records
        assert copied == expected == full
        assert {"blocks.0.mlp.up.weight", "blocks.0.attn.q.weight", "blocks.0.mlp.down.weight"} <= moved
        assert _advised_huge(model.blocks[0].mlp.up.weight.data_ptr()) and made

        short, model, moved, expected, copied = generated(full)  # less than the copy and a quarter
        assert [r.getMessage() for r in caplog.records] == [
            f"generation: {devices.human_bytes(full - copied)} of float32 weights not copied into huge pages "
            f"({devices.human_bytes(full)} available, short of the copy and a quarter to spare): steps read them "
            f"where they are (slower, the same values)"]
    assert copied == expected < full
    # in the file's map still: what was copied only for huge pages; laid out in 4 KB pages: the down projections
    # (row-major for their step) and the unembedding (column-major), as before huge pages
    assert not moved & {"blocks.0.mlp.up.weight", "blocks.0.attn.q.weight", "blocks.0.attn.o.weight"}
    assert {"blocks.0.mlp.down.weight", "blocks.1.mlp.down.weight", "tok_embed.weight"} <= moved  # (tied: lm_head)
    assert not made  # (the down projections laid out in memory torch allocates)
    ids, logits, records = out
    assert short[0] == ids
    assert all(torch.equal(a, b) for a, b in zip(short[1], logits))
    assert [sorted(r) for r in short[2]] == [sorted(r) for r in records]
    assert all(torch.equal(r[name], p[name]) for r, p in zip(short[2], records) for name in r)


def test_the_generation_memory_check_counts_the_weights_copy_until_it_is_made(tmp_path, monkeypatch):
    """app.generation's check before a generation (the CLI's generate, the Generate panel's Run N) counted the
    history tree only, and the session's start then copied the weights (a float32 model's whole size in the worst
    case). It now counts the copy pack_for_decoding will make (without the huge-page copies when there is no room
    for them), and nothing once the session has made it."""
    folder = _gpt2_folder(tmp_path)
    full = model_module.decoding_copy_bytes(_load(folder, monkeypatch, 1 << 50))
    model = _load(folder, monkeypatch, 1 << 50)
    loaded = SimpleNamespace(config=model.cfg, model=model)
    history = sum(app_generation.generation_bytes(model.cfg, torch.float32, 4, 6, 1).values())
    app_generation.check_generation_memory(loaded, 4, 6, 1, "--max-new 6")
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": history + full - 1)
    made = model_module.decoding_copy_bytes(model)  # no room for the huge-page copies
    assert 0 < made <= full and (made < full) == _huge_pages_here()
    with pytest.raises(MemoryEstimateError, match="^--max-new 6 needs about .* for the generated tokens' "
                                                  "distributions and KV cache, and the weights laid out for "
                                                  "one-token steps; this machine has"):
        monkeypatch.setattr(devices, "available_memory", lambda device="cpu": history + made - 1)
        app_generation.check_generation_memory(loaded, 4, 6, 1, "--max-new 6")
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": history + made)
    app_generation.check_generation_memory(loaded, 4, 6, 1, "--max-new 6")  # what it makes, exactly
    GenerationSession(model, [5, 17, 300, 2], GenerationSettings("greedy"), stop_tokens=[])  # made now
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": history)
    app_generation.check_generation_memory(loaded, 4, 6, 1, "--max-new 6")
    bert = new_model(REGISTRY["bert"].preset(d_model=64, n_layers=1, n_heads=2, d_ff=128, vocab_size=512), seed=0)
    assert model_module.decoding_copy_bytes(bert) > 0  # what pack_for_decoding would copy; a masked fill never calls it
    history = sum(app_generation.generation_bytes(bert.cfg, torch.float32, 4, 6, 1).values())
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": history)
    app_generation.check_generation_memory(SimpleNamespace(config=bert.cfg, model=bert), 4, 6, 1, "--max-new 6")


def test_column_major_rows_of_4_kb_are_lengthened_with_the_same_ids_logits_and_records(tmp_path, monkeypatch):
    """MKL's float32 product of several rows (a prompt's forward, a beam step) by a column-major weight whose rows
    are a multiple of 4 KB apart ran 1.2-1.4x slower (8 rows; model.padded_rows): pack_for_decoding now makes such
    rows of 24 KB or more 64 bytes longer, Q/K/V side by side too (still one product), counted by decoding_copy_bytes;
    shorter rows (one row by them was slower lengthened) and the row-major layout as they were. The same kernels:
    every id, logit and record (greedy and beam steps) the same bits as unpadded."""
    # Q/K/V side by side and MLP gate and up 6,144 outputs (24 KB a row); W_O 2,048 (8 KB)
    cfg = REGISTRY["llama"].preset(d_model=2048, n_layers=1, n_heads=16, d_ff=6144, vocab_size=1024, context_length=64)
    save_model_folder(new_model(cfg, seed=0).eval(), tmp_path / "llama")

    def generated():
        model = load_model_folder(tmp_path / "llama").model
        before = {p.data_ptr() for p in model.parameters()}
        expected = model_module.decoding_copy_bytes(model)
        out = []
        for settings in (GenerationSettings("greedy"), GenerationSettings("beam", beams=4)):
            s = GenerationSession(model, [5, 17, 300, 2, 9, 11, 40, 7], settings, stop_tokens=[], record=True)
            nodes = [s.root] + list(s.run(4))
            out.append((s.ids(), [n.next_logits for n in nodes], [n.record for n in nodes]))
        assert _copied_bytes(model, before) == expected
        return out, model

    out, model = generated()
    block = model.blocks[0]
    assert block.attn.q.weight.stride() == (1, 6144 + 16)
    assert block.mlp.gate.weight.stride() == block.mlp.up.weight.stride() == (1, 6144 + 16)
    assert block.attn.o.weight.stride() == (1, 2048)  # 8 KB rows: as they were
    assert block.mlp.down.weight.stride() == (6144, 1)  # row-major: as it was
    qkv = model_module.packed_linears((block.attn.q, block.attn.k, block.attn.v))
    assert qkv is not None and qkv[0].shape == (6144, 2048) and qkv[0].stride() == (1, 6144 + 16)
    monkeypatch.setattr(model_module, "padded_rows", lambda n, itemsize: n)  # as before
    plain, plain_model = generated()
    assert plain_model.blocks[0].mlp.up.weight.stride() == (1, 6144)
    for (ids, logits, records), (p_ids, p_logits, p_records) in zip(out, plain):
        assert ids == p_ids
        assert all(torch.equal(a, b) for a, b in zip(logits, p_logits))
        assert [sorted(r) for r in records] == [sorted(r) for r in p_records]
        assert all(torch.equal(r[name], p[name]) for r, p in zip(records, p_records) for name in r)
