"""The half-precision prepacked copy (Transformer._prepack_one_row) in the memory counted before a generation:
model.decoding_copy_bytes counts exactly the copies _prepack_one_row makes (one rule for both,
model._one_row_groups_to_pack), so app.generation's checks (the CLI's generate, the Generate panel's start)
refuse a start whose history and copy do not fit together. They counted float32's layouts only: a bfloat16
start passed, then the copy (the weights' bytes again) was made and the history had less room than checked."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from desktop_app.app import generation as app_generation
from desktop_app.cli import main
from desktop_app.core import devices
from desktop_app.core import model as model_module
from desktop_app.core.checkpoints import load_model_folder, new_model, save_model_folder
from desktop_app.core.config import ModelConfig
from desktop_app.core.devices import MemoryEstimateError
from desktop_app.core.generation import GenerationSession, GenerationSettings

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

PROMPT = [5, 17, 30, 2]
# Qwen2's layout: Q/K/V biases (prepacked side by side with the group), none on o; gated MLP; tied unembedding.
# Llama's: no biases, untied. GPT-2's: biases everywhere, an ungated MLP (up and down prepacked alone).
CONFIGS = {
    "qwen2": lambda: ModelConfig.llama(vocab_size=97, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
                                       context_length=64, attention_bias=True, attention_out_bias=False,
                                       tie_embeddings=True),
    "llama": lambda: ModelConfig.llama(vocab_size=97, d_model=64, n_layers=3, n_heads=4, n_kv_heads=1, d_ff=96,
                                       context_length=64, tie_embeddings=False),
    "gpt2": lambda: ModelConfig.gpt2(vocab_size=97, d_model=64, n_layers=2, n_heads=4, d_ff=256, context_length=64),
}


def _model(family: str, dtype: torch.dtype = torch.bfloat16):
    return new_model(CONFIGS[family](), seed=0).eval().to(dtype)


def _available(monkeypatch, nbytes: int) -> None:
    """The memory available, faked from here on (the one function that reads it)."""
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": nbytes)


def _stored_bytes(model) -> int:
    """Bytes of the prepacked copies the model keeps (OneRowCopy: the weights prepacked, a group's biases)."""
    copies = [model_module.one_row_copy(m) for m in model.modules()]
    return sum(c.weight.numel() * c.weight.element_size()
               + (0 if c.bias is None else c.bias.numel() * c.bias.element_size()) for c in copies if c is not None)


def _made(model) -> int:
    """The bytes of the prepacked copies pack_for_decoding makes for a copy of `model` with memory to spare."""
    twin = copy.deepcopy(model)
    with pytest.MonkeyPatch.context() as mp:
        _available(mp, 1 << 50)
        twin.pack_for_decoding()
    return _stored_bytes(twin)


@pytest.fixture
def bfloat16_prepacks():
    if not model_module._one_row_products_here(torch.bfloat16):
        pytest.skip("this CPU or torch build has no prepacked bfloat16 product")


@pytest.mark.usefixtures("bfloat16_prepacks")
@pytest.mark.parametrize("family", list(CONFIGS))
def test_the_estimate_is_the_bytes_of_the_prepacked_copies_made_then_none(family, monkeypatch):
    model = _model(family)
    _available(monkeypatch, 1 << 50)
    estimate = model_module.decoding_copy_bytes(model)
    weights = sum(m.weight.numel() * 2 for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))
    model.pack_for_decoding()
    assert estimate == _stored_bytes(model) >= weights > 0  # the biases side by side besides (Qwen2's, GPT-2's)
    assert (estimate > weights) == (family != "llama")
    assert model_module.decoding_copy_bytes(model) == 0  # made: nothing more
    assert model_module.decoding_copy_bytes(_model(family), prepack=False) == 0  # a beam session makes none
    # a weight written in place makes its copy stale: the next pack_for_decoding makes that one again, counted so
    with torch.no_grad():
        model.lm_head.weight.mul_(1)
    stale = model_module.decoding_copy_bytes(model)
    assert stale == model.lm_head.weight.numel() * 2
    before = _stored_bytes(model)
    model.pack_for_decoding()
    assert _stored_bytes(model) == before and model_module.decoding_copy_bytes(model) == 0


@pytest.mark.usefixtures("bfloat16_prepacks")
def test_without_a_quarter_to_spare_no_copy_is_made_nor_counted(monkeypatch):
    full = model_module.decoding_copy_bytes(_model("qwen2"))  # (the machine's memory: plenty for this one)
    model = _model("qwen2")
    _available(monkeypatch, full * 5 // 4 - 1)
    assert model_module.decoding_copy_bytes(model) == 0
    model.pack_for_decoding()
    assert _stored_bytes(model) == 0
    _available(monkeypatch, full * 5 // 4)
    assert model_module.decoding_copy_bytes(model) == full
    model.pack_for_decoding()
    assert _stored_bytes(model) == full


def test_where_this_cpu_has_no_prepacked_product_none_is_counted(monkeypatch):
    """float16 needs AVX-512 FP16 or AVX-NE-CONVERT (oneDNN's reorder refuses it otherwise): what is counted is what
    is made, whichever this machine is; and a model _prepack_one_row never sees (float32's copies only)."""
    _available(monkeypatch, 1 << 50)
    model = _model("llama", torch.float16)
    estimate = model_module.decoding_copy_bytes(model)
    model.pack_for_decoding()
    assert estimate == _stored_bytes(model)
    assert (estimate > 0) == model_module._one_row_products_here(torch.float16)
    monkeypatch.setattr(model_module, "_one_row_products_here", lambda dtype: False)
    assert model_module.decoding_copy_bytes(_model("llama")) == 0


@pytest.mark.usefixtures("bfloat16_prepacks")
def test_the_generation_checks_refuse_a_start_where_history_and_copy_do_not_fit(monkeypatch):
    model = _model("qwen2")
    loaded = SimpleNamespace(config=model.cfg, model=model)
    made = _made(model)
    _available(monkeypatch, 1 << 50)
    assert model_module.decoding_copy_bytes(model) == made
    # a session that records 56 tokens (the panel's Run N): enough history that history + copy leaves the copy its
    # quarter to spare (the copy is made, so counted)
    history = sum(app_generation.generation_bytes(model.cfg, torch.bfloat16, 4, 56, 1, record=True).values())
    assert history >= made // 4
    _available(monkeypatch, history + made - 1)
    with pytest.raises(MemoryEstimateError, match="^Run 56 needs about .* records and KV cache, and the weights laid "
                                                  "out for one-token steps; this machine has"):
        app_generation.check_generation_memory(loaded, 4, 56, 1, "Run 56", record=True)
    # a beam search makes no copy (GenerationSession._pack_for): its history alone is checked
    beam = sum(app_generation.generation_bytes(model.cfg, torch.bfloat16, 4, 56, 3, record=True).values())
    _available(monkeypatch, beam)
    app_generation.check_generation_memory(loaded, 4, 56, 3, "Beams 3", record=True)
    # the Generate panel's start: the prompt's records and the copy
    prompt = list(range(3, 63))
    start = sum(app_generation.generation_bytes(model.cfg, torch.bfloat16, len(prompt), 0, 1, record=True).values())
    assert start >= made // 4
    _available(monkeypatch, start + made - 1)
    with pytest.raises(MemoryEstimateError, match="^Start needs about"):
        app_generation.check_start_memory(loaded, prompt, "Start", GenerationSettings("greedy"))
    app_generation.check_start_memory(loaded, prompt, "Start", GenerationSettings("beam", beams=3))  # none made
    with pytest.raises(MemoryEstimateError, match="^Start needs about"):  # one beam: one-row steps, the copy
        app_generation.check_start_memory(loaded, prompt, "Start", GenerationSettings("beam", beams=1))
    _available(monkeypatch, start + made)
    app_generation.check_start_memory(loaded, prompt, "Start", GenerationSettings("greedy"))
    # where the copy would not have its quarter to spare it is neither made nor counted: the history alone
    _available(monkeypatch, made * 5 // 4 - 1)
    app_generation.check_generation_memory(loaded, 4, 2, 1, "Run 2", record=True)
    _available(monkeypatch, history + made)
    app_generation.check_generation_memory(loaded, 4, 56, 1, "Run 56", record=True)  # what it makes, exactly
    GenerationSession(model, PROMPT, GenerationSettings("greedy"), stop_tokens=[])  # made now, at this memory
    assert _stored_bytes(model) == made
    _available(monkeypatch, history)
    app_generation.check_generation_memory(loaded, 4, 56, 1, "Run 56", record=True)


@pytest.mark.usefixtures("bfloat16_prepacks")
def test_the_cli_generate_refuses_a_bfloat16_generation_whose_copy_does_not_fit(tmp_path, monkeypatch, capsys):
    # a large vocabulary, tied: the history's logits (generate records nothing) leave the copy its quarter to spare,
    # and history + copy leave room for the load's own check (the weights)
    cfg = ModelConfig.llama(vocab_size=4096, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64,
                            context_length=64, tie_embeddings=True)
    save_model_folder(new_model(cfg, seed=0).eval(), tmp_path / "llama")
    made = _made(load_model_folder(tmp_path / "llama", dtype="bfloat16").model)
    history = sum(app_generation.generation_bytes(cfg, torch.bfloat16, 4, 56, 1).values())
    assert history >= made // 4
    _available(monkeypatch, history + made - 1)
    args = ["generate", str(tmp_path / "llama"), "--dtype", "bfloat16", "--prompt-ids", "5,17,30,2", "--max-new", "56"]
    assert main(args) == 2
    assert "--max-new 56 needs about" in capsys.readouterr().err
    _available(monkeypatch, history + made)
    assert main(args) == 0
