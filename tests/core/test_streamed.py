"""A model larger than the free memory opens with its blocks read from the files only while each computes
(core/streamed.py): the trace, the first look, generation and the Lipschitz lab give what the model held
whole gives, and the resident set stays within a few layers' weights (measured in a subprocess whose
available memory is overridden to less than the weights)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
import torch  # noqa: E402

from desktop_app.core import devices  # noqa: E402
from desktop_app.core.checkpoints import ModelLoadError, load_model_folder  # noqa: E402
from desktop_app.core.streamed import holding, streamed_of  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
REPO = Path(__file__).resolve().parents[2]


def llama_folder(folder: Path, hidden: int = 64, inter: int = 96, layers: int = 3, dtype=torch.float32) -> Path:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256))
    model.to(dtype).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return llama_folder(tmp_path_factory.mktemp("streamed") / "llama")


def test_streamed_model_traces_generates_and_measures_as_the_whole_one(tiny):
    from desktop_app.app.tracing import trace_input
    from desktop_app.core.generation import GenerationSession, GenerationSettings
    from desktop_app.core.lipschitz.measured import layer_map

    whole, streamed = load_model_folder(tiny), load_model_folder(tiny, streamed=True)
    s = streamed_of(streamed.model)
    assert s is not None and streamed_of(whole.model) is None
    assert {p.device.type for p in streamed.model.blocks.parameters()} == {"meta"}  # nothing read yet
    ids = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(whole.model(ids).logits, streamed.model(ids).logits)
    assert s.loads == 3 and not s.resident  # each block read once, and let go

    # the trace, layer by layer as the first look receives it, lazily derived head outputs included
    seen: list[int] = []
    _, ta = trace_input(whole, "", ids[0].tolist())
    _, tb = trace_input(streamed, "", ids[0].tolist(), on_layer=lambda ready: seen.append(ready.done))
    assert seen == [1, 2, 3]
    for name in ("blocks.2.resid_post", "blocks.1.attn.pattern", "logits"):
        assert torch.equal(ta[name], tb[name]), name
    assert torch.equal(ta.head_out(1), tb.head_out(1))
    assert not s.resident

    # generation: the same greedy tokens
    def greedy(loaded) -> list[int]:
        session = GenerationSession(loaded, [5, 9, 3], GenerationSettings("greedy"), stop_tokens=[])
        for _ in session.run(6):
            pass
        return session.ids()

    assert greedy(whole) == greedy(streamed)
    assert not s.resident

    # the Lipschitz lab's map of one layer: the same weights, the block let go afterwards
    text_ids = ids[0].tolist()
    X = torch.randn(2, 8, 64, dtype=torch.float64)
    fa, fb = layer_map(whole.model, 1), layer_map(streamed.model, 1)
    assert torch.equal(fa.to(torch.float64)(X), fb.to(torch.float64)(X))
    assert not s.resident
    # direct logit attribution reads each layer's output bias (GPT-2 has one; a LLaMA's is None, read all the same)
    from desktop_app.core.interventions import direct_logit_attribution

    da, db = (direct_logit_attribution(m, text_ids, 5, 7) for m in (whole, streamed))
    assert da.components == db.components and torch.equal(torch.as_tensor(da.contributions),
                                                          torch.as_tensor(db.contributions))
    assert not s.resident
    # and a whole sweep of that layer on real windows of a text (its inputs: a forward stopped after it)
    from desktop_app.core.lipschitz.sweep import SweepSpec, run_sweep

    text = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    sweeps = [run_sweep(SweepSpec(data="real", model=m.model, layer=1, token_ids=text, lengths=(4, 8), samples=2))
              for m in (whole, streamed)]
    for a, b in zip(sweeps[0].lengths, sweeps[1].lengths):
        assert a.n == b.n and (a.lipschitz == b.lipschitz).all() and (a.radius == b.radius).all()
    assert not s.resident
    with holding(streamed.model, 2):
        assert streamed.model.blocks[2].attn.o.weight.device.type == "cpu" and s.resident == {2}
        with torch.no_grad():
            streamed.model(ids)  # a held block stays in through a forward
        assert s.resident == {2}
    assert not s.resident


def reads_of(streamed, monkeypatch) -> list[tuple[int, set[str]]]:
    """(layer, names) of every block read from the files from now on."""
    reads = []
    load_block = streamed.load_block

    def recording(layer, device, only):
        tensors = load_block(layer, device, only)
        reads.append((layer, set(tensors)))
        return tensors
    monkeypatch.setattr(streamed, "load_block", recording)
    return reads


def test_holding_part_of_a_block_reads_only_that_part(tiny):
    whole, loaded = load_model_folder(tiny), load_model_folder(tiny, streamed=True)
    s, block = streamed_of(loaded.model), loaded.model.blocks[1]
    o_bytes = sum(p.numel() * p.element_size() for p in block.attn.o.parameters())
    with holding(loaded.model, 1, only={"attn.o"}):
        assert {n for n, p in block.named_parameters() if p.device.type != "meta"} == {"attn.o.weight"}
        assert torch.equal(block.attn.o.weight, whole.model.blocks[1].attn.o.weight)
        assert s.bytes_read == o_bytes and s.resident == {1} and s.resident_bytes() == o_bytes
        with holding(loaded.model, 1, only={"attn.o", "norm1"}):  # only what is not in yet is read
            assert s.bytes_read == o_bytes + block.norm1.weight.numel() * 4
        ids = torch.tensor([[3, 1, 4, 1, 5]])
        with torch.no_grad():  # the block's forward reads the rest of it, and the held block stays in
            assert torch.equal(loaded.model(ids).logits, whole.model(ids).logits)
        assert all(p.device.type == "cpu" for p in block.parameters()) and s.resident == {1}
    assert not s.resident and {p.device.type for p in block.parameters()} == {"meta"}
    with pytest.raises(ValueError, match="no module or parameter attn.w_o"):
        with holding(loaded.model, 1, only={"attn.w_o"}):
            pass
    assert not any(s.held.values())


def test_keeping_keeps_the_first_blocks_parts_within_its_budget(tiny, monkeypatch):
    """Within `keeping`, the parts it names of the first blocks, as many as the budget holds, stay in once
    read: passes over the layers again read only the others; a block's forward reads only the rest of
    it, the same logits; all let go on leaving."""
    from desktop_app.core.streamed import keeping

    whole, loaded = load_model_folder(tiny), load_model_folder(tiny, streamed=True)
    s, blocks = streamed_of(loaded.model), loaded.model.blocks
    o_bytes = sum(p.numel() * p.element_size() for p in blocks[0].attn.o.parameters())
    monkeypatch.setattr(s, "keep_budget", 2 * o_bytes)  # two layers' attn.o of the three
    read = reads_of(s, monkeypatch)
    with keeping(loaded.model, lambda block: {"attn.o"}):
        for _ in range(3):  # three passes over the layers
            for layer in range(3):
                with holding(loaded.model, layer, only={"attn.o"}):
                    assert torch.equal(blocks[layer].attn.o.weight, whole.model.blocks[layer].attn.o.weight)
        assert read == [(0, {"attn.o.weight"}), (1, {"attn.o.weight"})] + [(2, {"attn.o.weight"})] * 3, read
        assert s.resident == {0, 1} and s.resident_bytes() == 2 * o_bytes
        ids = torch.tensor([[3, 1, 4, 1, 5]])
        read.clear()
        with torch.no_grad():
            assert torch.equal(loaded.model(ids).logits, whole.model(ids).logits)
        rest = {n for n, _ in blocks[0].named_parameters()} - {"attn.o.weight"}
        assert [names == rest for _, names in read] == [True, True, False], read  # the third: whole
        assert s.resident == {0, 1} and s.resident_bytes() == 2 * o_bytes
    assert not s.resident and {p.device.type for p in blocks.parameters()} == {"meta"}
    # by default one block's bytes: here every layer's attn.o; a budget of 0 keeps nothing
    for budget, kept in ((None, {0, 1, 2}), (0, set())):
        monkeypatch.setattr(s, "keep_budget", budget)
        with keeping(loaded.model, lambda block: {"attn.o"}):
            for layer in range(3):
                with holding(loaded.model, layer, only={"attn.o"}):
                    pass
            assert s.resident == kept
        assert not s.resident


def test_what_reads_a_block_outside_its_forward_reads_no_mlp(tiny, monkeypatch):
    """The lazy trace's head outputs, direct logit attribution, the Lipschitz lab's map and a generation
    step's trace use a layer's attention (and its norms) only: the MLP, most of a block, stays in the files.
    Each gives what the model held whole gives."""
    from desktop_app.app.tracing import trace_input
    from desktop_app.core.generation import GenerationSession, GenerationSettings
    from desktop_app.core.interventions import direct_logit_attribution
    from desktop_app.core.lipschitz.measured import layer_map

    whole, loaded = load_model_folder(tiny), load_model_folder(tiny, streamed=True)
    ids = [5, 9, 3, 7, 1, 2]
    _, ta = trace_input(whole, "", ids)
    _, tb = trace_input(loaded, "", ids)
    s = streamed_of(loaded.model)
    reads = reads_of(s, monkeypatch)
    block = {name for name, _ in loaded.model.blocks[0].named_parameters()}
    attention = {"attn.q.weight", "attn.k.weight", "attn.v.weight", "attn.o.weight"}
    assert torch.equal(ta.head_out(1), tb.head_out(1))
    assert reads == [(1, {"attn.o.weight"})]
    del reads[:]
    da, db = (direct_logit_attribution(m, ids, 5, 7) for m in (whole, loaded))
    assert torch.equal(torch.as_tensor(da.contributions), torch.as_tensor(db.contributions))
    # its forward reads each block whole (in its forward), then each layer's output bias: a LLaMA has none
    assert reads == [(l, block) for l in range(3)]
    del reads[:]
    X = torch.randn(2, 8, 64, dtype=torch.float64)
    assert torch.equal(layer_map(whole.model, 1).to(torch.float64)(X), layer_map(loaded.model, 1).to(torch.float64)(X))
    assert reads == [(1, attention)]

    # a generation step's trace: its head outputs as with the whole blocks held (the same session's records)
    session = GenerationSession(loaded, [5, 9, 3], GenerationSettings("greedy"), stop_tokens=[])
    list(session.run(3))
    del reads[:]
    part, _ = session.step_trace()
    assert sorted(layer for layer, _ in reads) == [0, 1, 2]
    assert all(names == {"attn.v.weight", "attn.o.weight"} for _, names in reads), reads
    with holding(loaded.model, 0), holding(loaded.model, 1), holding(loaded.model, 2):
        held, _ = session.step_trace()
    assert all(torch.equal(part[f"blocks.{l}.attn.head_out"], held[f"blocks.{l}.attn.head_out"]) for l in range(3))
    assert not s.resident


def test_a_forward_stopped_in_a_block_reads_only_what_it_uses_there(tiny, monkeypatch):
    """The Lipschitz lab's inputs are a forward stopped at a layer's attention input (real_inputs): that
    block's norm before attention is read, not its attention or MLP; the earlier blocks whole. A stop after
    attention reads the attention too, not the MLP. The sweep equals the model held whole's."""
    from desktop_app.core.lipschitz.inputs import real_inputs
    from desktop_app.core.lipschitz.sweep import SweepSpec, run_sweep

    whole, loaded = load_model_folder(tiny), load_model_folder(tiny, streamed=True)
    s = streamed_of(loaded.model)
    reads = reads_of(s, monkeypatch)
    blocks = loaded.model.blocks
    block = {name for name, _ in blocks[0].named_parameters()}
    nbytes = lambda l, names: sum(p.numel() * p.element_size() for n, p in whole.model.blocks[l].named_parameters()
                                  if n in names)
    text = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    assert torch.equal(real_inputs(whole.model, text, 2, 8, 3), real_inputs(loaded.model, text, 2, 8, 3))
    assert reads == [(0, block), (1, block), (2, {"norm1.weight"})]
    assert s.bytes_read == 2 * nbytes(0, block) + nbytes(2, {"norm1.weight"}) and not s.resident

    del reads[:]
    with torch.no_grad():
        loaded.model(torch.tensor([text[:8]]), stop_at="blocks.0.resid_mid")
    attention = {n for n in block if n.startswith("attn.")}
    assert reads == [(0, {"norm1.weight"} | attention)]

    del reads[:]
    sweeps = [run_sweep(SweepSpec(data="real", model=m.model, layer=1, token_ids=text, lengths=(4, 8), samples=2))
              for m in (whole, loaded)]
    for a, b in zip(sweeps[0].lengths, sweeps[1].lengths):
        assert a.n == b.n and (a.lipschitz == b.lipschitz).all() and (a.radius == b.radius).all()
    # the layer's map (its attention), then its inputs: block 0 whole, layer 1's norm before attention
    assert reads == [(1, attention), (0, block), (1, {"norm1.weight"})]
    assert not s.resident


def test_direct_logit_attribution_reads_only_the_output_bias_after_its_forward(tmp_path, monkeypatch):
    """GPT-2's attention has an output bias, read per layer after the forward: that tensor alone."""
    from desktop_app.core.interventions import direct_logit_attribution

    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4,
                                                         n_positions=64)).save_pretrained(tmp_path / "gpt2")
    whole, loaded = load_model_folder(tmp_path / "gpt2"), load_model_folder(tmp_path / "gpt2", streamed=True)
    reads = reads_of(streamed_of(loaded.model), monkeypatch)
    da, db = (direct_logit_attribution(m, [5, 9, 3, 7], 3, 5) for m in (whole, loaded))
    assert "attn_bias" in da.components and da.components == db.components
    assert torch.equal(torch.as_tensor(da.contributions), torch.as_tensor(db.contributions))
    block = {name for name, _ in loaded.model.blocks[0].named_parameters()}
    assert reads == [(0, block), (1, block), (0, {"attn.o.bias"}), (1, {"attn.o.bias"})]


def test_a_model_larger_than_the_free_memory_opens_streamed(tiny, monkeypatch):
    """What decides it: the weights beyond the available memory (a test-only override here), the files
    holding them, and room for the embeddings and two layers; an absurd config is still refused."""
    weights = sum(f.stat().st_size for f in tiny.glob("*.safetensors"))
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": weights * 4 // 5)
    loaded = load_model_folder(tiny)
    assert streamed_of(loaded.model) is not None
    assert "each layer is read from the files while it computes" in loaded.dtype_reason
    with pytest.raises(ModelLoadError, match="needs about"):  # for training, the whole model must fit
        load_model_folder(tiny, for_training=True)
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": 1000)
    with pytest.raises(ModelLoadError, match="needs about"):  # not even the embeddings fit
        load_model_folder(tiny)
    config = json.loads((tiny / "config.json").read_text())
    absurd = tiny.parent / "absurd"
    absurd.mkdir()
    for f in tiny.iterdir():
        (absurd / f.name).write_bytes(f.read_bytes())
    (absurd / "config.json").write_text(json.dumps({**config, "intermediate_size": 10 ** 6}))
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": 2 * 10 ** 9)  # room for two layers
    with pytest.raises(ModelLoadError, match="needs about"):  # the files do not hold what it describes
        load_model_folder(absurd)


def test_under_a_cards_memory_cap_a_cuda_load_is_decided_streamed(tiny, monkeypatch):
    """The CUDA path up to the card (no device here): under a per-process cap on the card
    (set_per_process_memory_fraction, as `bench scale --memory-cap-gb` sets it) smaller than the weights, the
    whole model is refused on "cuda" and the layer-by-layer load is chosen; below the embeddings and two
    layers, neither. (Each block then goes to the card only while it computes: block_device, tested above
    with the blocks placed on a second device name.)"""
    from types import SimpleNamespace

    from desktop_app.core.checkpoints import _stream_fits, read_config
    from desktop_app.core.devices import MemoryEstimateError, check_memory

    weights = sum(f.stat().st_size for f in tiny.glob("*.safetensors"))
    total = 80 * 2**30

    def card(cap: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (total, total))
        monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: cap / total)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(total_memory=total))
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)

    cfg = read_config(tiny)
    card(weights * 4 // 5)
    assert devices.available_memory("cuda:0") == weights * 4 // 5
    with pytest.raises(MemoryEstimateError):
        check_memory(cfg.parameter_estimate() * 4, "the model it describes", "for its weights", "cuda")
    assert _stream_fits(cfg, tiny, 4, "cuda", for_training=False)
    assert not _stream_fits(cfg, tiny, 4, "cuda", for_training=True)
    card(1000)  # not even the embeddings
    assert not _stream_fits(cfg, tiny, 4, "cuda", for_training=False)


def test_a_damaged_block_is_named_when_it_is_read(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = llama_folder(tmp_path / "llama")
    sd = load_file(folder / "model.safetensors")
    sd["model.layers.1.mlp.up_proj.weight"][3, 4] = float("nan")
    save_file(sd, folder / "model.safetensors", metadata={"format": "pt"})
    loaded = load_model_folder(folder, streamed=True)  # blocks are checked as they are read
    with pytest.raises(ModelLoadError, match="'model.layers.1.mlp.up_proj.weight' holds NaN"):
        with torch.no_grad():
            loaded.model(torch.tensor([[1, 2, 3]]))


def test_each_block_tensor_is_checked_at_its_first_read_only(tiny, monkeypatch):
    """Every generated token (every graph batch) reads the blocks again: the same bytes, checked once."""
    from desktop_app.core import checkpoints

    checked = []
    check = checkpoints._check_finite
    monkeypatch.setattr(checkpoints, "_check_finite", lambda files, into: checked.extend(files) or check(files, into))
    loaded = load_model_folder(tiny, streamed=True)
    assert checked and not any(".layers." in name for name in checked)  # the embeddings, head, final norm
    del checked[:]
    per_block = len(list(loaded.model.blocks[0].parameters()))
    with torch.no_grad():
        loaded.model(torch.tensor([[1, 2, 3]]))
        assert len(checked) == len(set(checked)) == 3 * per_block
        assert all(name.startswith("model.layers.") for name in checked)
        loaded.model(torch.tensor([[4, 5, 6]]))
    assert len(checked) == 3 * per_block and streamed_of(loaded.model).loads == 6


def test_a_float64_block_beyond_float32s_range_is_named_when_it_is_read(tmp_path):
    """Finite in the file, infinite once cast: said as such, not as damage."""
    from safetensors.torch import load_file, save_file

    folder = llama_folder(tmp_path / "llama")
    sd = {k: v.double() for k, v in load_file(folder / "model.safetensors").items()}
    sd["model.layers.1.mlp.up_proj.weight"][3, 4] = -1e39
    save_file(sd, folder / "model.safetensors", metadata={"format": "pt"})
    loaded = load_model_folder(folder, streamed=True)
    with pytest.raises(ModelLoadError, match="'model.layers.1.mlp.up_proj.weight' holds values beyond float32's range"):
        with torch.no_grad():
            loaded.model(torch.tensor([[1, 2, 3]]))


CHILD = r"""
import json, sys, torch
torch.set_num_threads(1)
from desktop_app.core import devices
from desktop_app.benchmarks.scale import _peak_mb, _rss_mb
folder, cap = sys.argv[1], int(sys.argv[2])
if cap:
    devices.available_memory = lambda device="cpu": cap  # the test's small machine
from desktop_app.core.checkpoints import load_model_folder
baseline = _rss_mb()
loaded = load_model_folder(folder)
ids = torch.arange(64)[None] % 128
with torch.no_grad():
    logits = loaded.model(ids).logits
print(json.dumps({"streamed": getattr(loaded.model, "streamed", None) is not None, "baseline_mb": baseline,
                  "peak_mb": _peak_mb(), "logits": logits[0, -1, :8].tolist(), "sum": float(logits.double().sum())}))
"""


# A real model's layer tensors (an 8B model's: 32-230 MB) are above glibc's largest dynamic mmap threshold
# (32 MB), so each freed one goes back to the system; this test's 4 MB ones would stay in malloc's heap
# and hide what is measured: the child allocates them as it would a real layer's
SIZE_LIKE_A_REAL_LAYER = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}


@pytest.mark.slow
def test_peak_resident_set_stays_within_a_few_layers(tmp_path):
    """Eight float32 layers of 16 MB each: held whole, the forward maps every one of them in; read
    layer by layer under a cap of half the weights, the peak grows by a few layers (the block being
    read from the file, its copy, the work), and the logits are the same."""
    folder = llama_folder(tmp_path / "llama", hidden=512, inter=2048, layers=8)
    weights = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    layer_mb = weights / 8 / 2**20

    def child(cap: int) -> dict:
        out = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(cap)], capture_output=True, text=True,
                             env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", **SIZE_LIKE_A_REAL_LAYER},
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    whole, capped = child(0), child(weights // 2)
    assert capped["streamed"] and not whole["streamed"]
    assert capped["logits"] == whole["logits"] and capped["sum"] == whole["sum"]
    grew_whole = whole["peak_mb"] - whole["baseline_mb"]
    grew_capped = capped["peak_mb"] - capped["baseline_mb"]
    assert grew_whole > 7 * layer_mb, (grew_whole, layer_mb)
    assert grew_capped < 4 * layer_mb, (grew_capped, layer_mb)


# -- layers across several devices -------------------------------------------------------------


def test_plan_devices_gives_consecutive_layers_by_free_memory():
    from desktop_app.core.streamed import plan_devices

    cuda0, cuda1 = torch.device("cuda:0"), torch.device("cuda:1")
    assert plan_devices(32, ["cuda:0", "cuda:1"]) == [cuda0] * 16 + [cuda1] * 16
    assert plan_devices(32, ["cuda:0", "cuda:1"], [30 * 2**30, 10 * 2**30]) == [cuda0] * 24 + [cuda1] * 8
    assert plan_devices(5, ["cuda:0", "cuda:1"], [None, 10]) == [cuda0] * 3 + [cuda1] * 2  # unknown: evenly
    # each device gets a layer, however lopsided its memory
    assert plan_devices(3, ["cuda:0", "cuda:1", "cuda:2"], [100, 1, 1]) == [cuda0, cuda1, torch.device("cuda:2")]
    assert plan_devices(1, ["cuda:0", "cuda:1"]) == [cuda0]
    with pytest.raises(ValueError, match="listed twice"):
        plan_devices(4, ["cuda:0", "cuda:0"])


@pytest.mark.parametrize("streamed", [False, True])
def test_layers_placed_across_two_devices_give_the_same_logits(tiny, streamed):
    """No second device here: "cpu" and "cpu:0" are two device names (torch computes both on the CPU), so
    this runs the placement (the plan, each block's inputs moved to its device, its output home, a
    streamed block read onto its device) and the reopening the Device menu does; the cuda test below
    puts the blocks on a real card."""
    from desktop_app.ui.state import _moved

    whole = load_model_folder(tiny)
    placed = _moved(load_model_folder(tiny, streamed=streamed), "cpu,cpu:0")
    assert placed.model.block_devices == [torch.device("cpu")] * 2 + [torch.device("cpu:0")]
    assert (streamed_of(placed.model) is not None) == streamed
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(whole.model(ids).logits, placed.model(ids).logits)


@pytest.mark.cuda
def test_layers_split_across_the_cpu_and_the_card(tiny):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from desktop_app.app.tracing import trace_input
    from desktop_app.core.formats import load_model_file

    whole = load_model_folder(tiny)
    placed = load_model_file(tiny, device="cpu,cuda:0")
    assert [d.type for d in placed.model.block_devices] == ["cpu", "cpu", "cuda"] or \
        [d.type for d in placed.model.block_devices].count("cuda") >= 1
    assert placed.model.blocks[-1].attn.o.weight.device.type == "cuda"
    ids = list(range(3, 40))
    _, ta = trace_input(whole, "", ids)
    _, tb = trace_input(placed, "", ids, host_records=True)
    assert tb["blocks.2.resid_post"].device.type == "cpu"  # each layer's records brought to the host
    assert torch.allclose(ta["logits"], tb["logits"], atol=1e-4)
    streamed = load_model_file(tiny, device="cpu,cuda:0", streamed=True)
    with torch.no_grad():
        logits = streamed.model(torch.tensor([ids])).logits
    assert torch.allclose(ta["logits"], logits, atol=1e-4)


def test_devices_argument_takes_two_or_more_present_devices():
    import argparse

    from desktop_app.app.arguments import devices as devices_arg

    with pytest.raises(argparse.ArgumentTypeError, match="two or more"):
        devices_arg("cpu")
    with pytest.raises(argparse.ArgumentTypeError, match="listed twice"):
        devices_arg("cpu,cpu")
    if not torch.cuda.is_available():
        with pytest.raises(argparse.ArgumentTypeError, match="not available on this machine"):
            devices_arg("cuda:0,cuda:1")


def test_a_gguf_file_is_dequantized_layer_by_layer_too(tmp_path):
    pytest.importorskip("gguf")
    from desktop_app.core.formats import load_model_file
    from desktop_app.core.formats.gguf_export import save_gguf

    folder = llama_folder(tmp_path / "llama")
    save_gguf(load_model_folder(folder).model, tmp_path / "llama.gguf", kind="q8_0")
    whole = load_model_file(tmp_path / "llama.gguf", dtype="float32")
    streamed = load_model_file(tmp_path / "llama.gguf", dtype="float32", streamed=True)
    assert streamed_of(streamed.model) is not None and "dequantized while it computes" in streamed.dtype_reason
    ids = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(whole.model(ids).logits, streamed.model(ids).logits)
