"""Issue 27: the GUI's trace holds memory proportional to what is shown.

Its attention patterns are kept in the model's dtype (float16 when a half-precision checkpoint computes
in float32), head outputs are computed for the layer a view asks for (and cached), never for every
layer up front; a trace that would not fit is refused before it runs, with the choices that would fit;
the compute dtype suits the machine (a bfloat16 checkpoint in bfloat16 on a CPU with AVX-512 BF16 or AMX,
in float32 on one without them when it fits)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from desktop_app.app.tracing import check_trace_memory, estimated_trace_bytes, trace_input
from desktop_app.core import analysis, devices
from desktop_app.core.checkpoints import LoadedModel, load_model_folder, new_model, save_model_folder
from desktop_app.core.config import ModelConfig
from desktop_app.core.views import attention as attention_views
from desktop_app.core.views import layers as layers_views

pytestmark = pytest.mark.usefixtures("one_torch_thread")

L, H, D, T = 6, 4, 32, 40


def _loaded(dtype=torch.float32, stored=None) -> LoadedModel:
    cfg = ModelConfig.llama(vocab_size=64, d_model=D, n_layers=L, n_heads=H, n_kv_heads=2, d_ff=64,
                            context_length=128)
    model = new_model(cfg, seed=0).to(dtype).eval()
    return LoadedModel(model=model, config=cfg, tokenizer=None, path=None, name="tiny-llama",
                       stored_dtype=stored or dtype)


IDS = [(7 * i + 3) % 64 for i in range(T)]


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_the_guis_trace_keeps_patterns_and_forms_head_outputs_for_the_layer_shown_only():
    loaded = _loaded()
    _, trace = trace_input(loaded, "", IDS)  # what AppState's worker runs for the text box
    _, full = loaded.model.run_with_trace(torch.tensor([IDS]))  # everything, every layer, up front
    patterns = _bytes(trace.pattern(l) for l in range(L))
    assert patterns == L * H * T * T * 4
    head_outs = _bytes(full[f"blocks.{l}.attn.head_out"] for l in range(L))
    assert head_outs == L * H * T * D * 4  # H times a residual per layer: what is no longer held
    assert not any(k.endswith(("head_out", "logit_lens")) for k in trace.keys())
    # O(patterns): the patterns plus a few [T, d] tensors per layer
    assert trace.nbytes() < patterns + 10 * L * T * D * 4
    assert trace.nbytes() < full_bytes(full) - head_outs + 1  # never more than the eager trace

    # the Layers panel's numbers (component norms every layer) form no head output at all
    result = layers_views.compute_layers(trace, loaded.model)
    assert trace.head_out_computed == 0
    np.testing.assert_allclose(result.head_norms, analysis.head_output_norms(full), rtol=1e-5, atol=1e-7)
    # the Attention panel reads the patterns of the layer it paints, shared, not copied
    data = attention_views.prepare(trace, None, None)
    assert np.shares_memory(data.patterns[3], trace.pattern(3).numpy())

    # a view asking for layer 2's head outputs forms layer 2's, once, equal to the recorded ones
    assert torch.equal(trace["blocks.2.attn.head_out"], full["blocks.2.attn.head_out"])
    assert torch.equal(trace.head_out(2), full["blocks.2.attn.head_out"])
    assert trace.head_out_computed == 1
    before = trace.nbytes()
    trace.head_out(4), trace.head_out(5)  # the cache keeps the last few layers, not all of them
    assert trace.head_out_computed == 3
    assert trace.nbytes() - before <= H * T * D * 4  # two layers cached: one more than before
    assert "blocks.0.attn.head_out" in trace


def full_bytes(trace) -> int:
    return _bytes(trace.tensors.values())


def test_a_half_precision_checkpoint_computed_in_float32_keeps_float16_patterns():
    loaded = _loaded(torch.float32, stored=torch.bfloat16)
    _, trace = trace_input(loaded, "", IDS)
    assert trace.pattern(0).dtype == torch.float16
    assert trace["blocks.0.resid_post"].dtype == torch.float32
    _, full = loaded.model.run_with_trace(torch.tensor([IDS]))
    np.testing.assert_allclose(trace.pattern(5).float().numpy(), full.pattern(5).numpy(), atol=1e-3)
    # a bfloat16 model keeps its own dtype; a float32 checkpoint stays exact (float32)
    assert devices.pattern_dtype(torch.bfloat16, torch.bfloat16) is None
    assert devices.pattern_dtype(torch.float32, torch.float32) is None
    half = _loaded(torch.bfloat16)
    _, trace = trace_input(half, "", IDS)
    assert trace.pattern(0).dtype == torch.bfloat16


def test_the_estimate_follows_what_is_recorded_and_a_trace_that_cannot_fit_is_refused_with_choices(monkeypatch):
    loaded = _loaded()
    _, trace = trace_input(loaded, "", IDS)
    est = estimated_trace_bytes(loaded, T)
    assert trace.nbytes() <= est <= trace.nbytes() + 4 * (2 * H * T * T * 4 + 3 * T * 64 * 4 + T * 64 * 4)
    big = estimated_trace_bytes(loaded, 2 * T)
    assert big > 3 * trace.nbytes()  # T^2 patterns
    have = (est + big) // 2
    with pytest.raises(devices.MemoryEstimateError) as exc:
        check_trace_memory(loaded, 2 * T, available=have)
    msg = str(exc.value)
    assert "\n" not in msg and "a trace of 80 tokens through 6 layers of tiny-llama needs about" in msg, msg
    tokens = int(msg.split("at most ")[1].split(" tokens")[0])
    first = int(msg.split("the first ")[1].split(" of 6 layers")[0])
    assert T <= tokens < 2 * T and estimated_trace_bytes(loaded, tokens) <= have < estimated_trace_bytes(loaded, tokens + 1)
    assert 1 <= first < L and estimated_trace_bytes(loaded, 2 * T, layers=first) <= have
    # the app refuses before running (no out-of-memory crash), and the choice offered works
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": have)
    with pytest.raises(devices.MemoryEstimateError):
        trace_input(loaded, "", IDS * 2)
    _, short = trace_input(loaded, "", (IDS * 2)[:tokens])
    assert short.pattern(0).shape[-1] == tokens
    _, some = trace_input(loaded, "", IDS * 2, layers=first)
    assert some.n_layers == first and some.pattern(first - 1).shape[-1] == 2 * T


def _units(**names):
    """A stand-in for devices.half_matrix_units: the CPU has the named units ({"bfloat16": "AMX"})."""
    return lambda dtype: names.get(devices.dtype_name(dtype), "")


def test_the_compute_dtype_suits_the_machine(tmp_path, monkeypatch):
    choose = devices.choose_compute_dtype
    monkeypatch.setattr(devices, "half_matrix_units", _units())  # a CPU without bfloat16 instructions
    assert choose(torch.float32, "cpu", 10**6).dtype == torch.float32
    c = choose(torch.bfloat16, "cpu", 10**6, available=10**9)
    assert c.dtype == torch.float32 and "no bfloat16 matrix instructions" in c.reason
    c = choose(torch.bfloat16, "cpu", 10**9, available=10**9)  # a float32 copy would not fit: say why not
    assert c.dtype == torch.bfloat16 and "not float32" in c.reason and "needs about 5 GB" in c.reason
    assert choose(torch.bfloat16, "cuda", 10**6).dtype == torch.bfloat16
    assert choose(torch.bfloat16, "cpu", 10**6, requested="bfloat16").dtype == torch.bfloat16

    # a bfloat16 checkpoint opened with "auto" computes in float32 there; as stored without it
    model = _loaded(torch.bfloat16).model
    save_model_folder(model, tmp_path / "m")
    auto = load_model_folder(tmp_path / "m", dtype="auto")
    assert auto.model.dtype == torch.float32 and auto.stored_dtype == torch.bfloat16 and auto.dtype_reason
    assert load_model_folder(tmp_path / "m").model.dtype == torch.bfloat16
    _, trace = trace_input(auto, "", IDS)
    assert trace.pattern(0).dtype == torch.float16


@pytest.mark.parametrize("units", ["AVX-512 BF16", "AMX"])
def test_a_cpu_with_bfloat16_instructions_computes_a_bfloat16_checkpoint_in_bfloat16(tmp_path, monkeypatch, units):
    # AVX-512 BF16 without AMX (this machine's AMD EPYC): bfloat16 traced 1.0x transformers against
    # float32's 0.3-0.4x, its steps as fast, at 0.7x the memory (README, bench scale)
    monkeypatch.setattr(devices, "half_matrix_units", _units(bfloat16=units))
    c = devices.choose_compute_dtype(torch.bfloat16, "cpu", 10**6, available=10**12)
    assert c.dtype == torch.bfloat16 and units in c.reason and "\n" not in c.reason
    assert devices.choose_compute_dtype(torch.float32, "cpu", 10**6).dtype == torch.float32  # stays exact
    # float16 needs its own units (AMX-FP16): without them it computes in float32 even here
    c = devices.choose_compute_dtype(torch.float16, "cpu", 10**6, available=10**12)
    assert c.dtype == torch.float32 and "no float16 matrix instructions" in c.reason
    monkeypatch.setattr(devices, "half_matrix_units", _units(bfloat16=units, float16="AMX-FP16"))
    c = devices.choose_compute_dtype(torch.float16, "cpu", 10**6, available=10**12)
    assert c.dtype == torch.float16 and "AMX-FP16" in c.reason

    save_model_folder(_loaded(torch.bfloat16).model, tmp_path / "m")
    auto = load_model_folder(tmp_path / "m", dtype="auto")
    assert auto.model.dtype == torch.bfloat16 and units in auto.dtype_reason
    _, trace = trace_input(auto, "", IDS)
    assert trace.pattern(0).dtype == torch.bfloat16  # the model's own dtype: no float16 copy


def test_half_matrix_units_reads_torchs_cpu_probes(monkeypatch):
    probes = {"_is_amx_tile_supported": False, "_is_avx512_bf16_supported": False, "_is_amx_fp16_supported": False}
    for name in probes:
        monkeypatch.setattr(torch.cpu, name, lambda name=name: probes[name], raising=False)
    assert devices.half_matrix_units(torch.bfloat16) == "" == devices.half_matrix_units(torch.float16)
    probes["_is_avx512_bf16_supported"] = True
    assert devices.half_matrix_units(torch.bfloat16) == "AVX-512 BF16"
    assert devices.half_matrix_units(torch.float16) == ""  # bfloat16 dot products do not multiply float16
    probes["_is_amx_tile_supported"] = probes["_is_amx_fp16_supported"] = True
    assert devices.half_matrix_units(torch.bfloat16) == "AMX"
    assert devices.half_matrix_units(torch.float16) == "AMX-FP16"
    assert devices.half_matrix_units(torch.float32) == ""
    monkeypatch.delattr(torch.cpu, "_is_amx_fp16_supported")  # an older torch without the probe
    assert devices.half_matrix_units(torch.float16) == ""


def test_info_says_which_dtype_auto_chose_and_why(tmp_path, capsys):
    from desktop_app.cli import main

    save_model_folder(_loaded(torch.bfloat16).model, tmp_path / "m")
    want = devices.choose_compute_dtype(torch.bfloat16, "cpu", 10**4)  # this machine's answer, whatever it is
    assert main(["info", str(tmp_path / "m")]) == 0
    err = capsys.readouterr().err
    line = [l for l in err.splitlines() if l.startswith("compute dtype ")]
    assert line == [f"compute dtype {want.reason}"], err
    assert line[0].startswith(f"compute dtype {devices.dtype_name(want.dtype)}: ")
