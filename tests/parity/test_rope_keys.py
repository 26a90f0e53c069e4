"""Rotary scaling in config.json under either key (issue 25 §4): transformers 5 writes
`rope_parameters`, older tools `rope_scaling` (+ a top-level rope_theta), and a folder may carry both.
Whichever key holds it, a supported scaling (linear, llama3) gives transformers' logits (1e-4) and
differs from the unscaled model; a model saved here reads back in transformers the same; an
unsupported type (yarn, longrope, dynamic, unknown), a non-positive or non-finite parameter, and two
keys that disagree are refused in one line naming config.json and the key, never run as plain rotary.
Every rotary family reads the block the same way (families.rope): LLaMA, Qwen2, Qwen3, Mistral,
Gemma 3 (its full-attention block) and GPT-NeoX."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from desktop_app.core.checkpoints import ModelLoadError, load_model_folder, save_model_folder  # noqa: E402

THETA = 1000.0
SCALINGS = {"linear": {"rope_type": "linear", "factor": 4.0},
            "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 16}}
SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, bos_token_id=None, eos_token_id=None, pad_token_id=None,
             initializer_range=0.2)  # large enough weights that positions move the logits
FAMILIES = {
    "llama": lambda rope: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **SMALL, num_key_value_heads=2, head_dim=16, rope_parameters=rope)),
    "qwen2": lambda rope: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **SMALL, num_key_value_heads=2, rope_parameters=rope)),
    "qwen3": lambda rope: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **SMALL, num_key_value_heads=2, head_dim=8, rope_parameters=rope)),
    "mistral": lambda rope: transformers.MistralForCausalLM(transformers.MistralConfig(
        **SMALL, num_key_value_heads=2, sliding_window=None, rope_parameters=rope)),
    "gemma3_text": lambda rope: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **SMALL, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"full_attention": rope, "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}})),
    "gpt_neox": lambda rope: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        **SMALL, rope_parameters={**rope, "partial_rotary_factor": 0.5})),
}
SUPPORTED = "(supported: default, linear, llama3)"


def _full_key(family: str) -> str:
    """Where a family's rope_parameters block holds the scaled rotary (Gemma 3: its full layers)."""
    return "rope_parameters['full_attention']" if family == "gemma3_text" else "rope_parameters"


def _write(folder, family: str, *, new: dict | None, old: dict | None) -> None:
    """config.json with the rotary block `new` under rope_parameters (Gemma 3: its full-attention
    entry) and/or `old` under rope_scaling beside a top-level rope_theta, as older tools write it."""
    path = folder / "config.json"
    d = json.loads(path.read_text())
    if family == "gemma3_text":
        if new is None:
            d["rope_local_base_freq"] = d["rope_parameters"]["sliding_attention"]["rope_theta"]
            del d["rope_parameters"]
        else:
            d["rope_parameters"]["full_attention"] = new
    else:
        fraction = (d.get("rope_parameters") or {}).get("partial_rotary_factor", d.get("rotary_pct"))
        if fraction is not None:  # GPT-NeoX: Pythia's own names, which fill in what rope_scaling leaves out
            d.update(rotary_pct=fraction, rotary_emb_base=THETA)
        if new is None:
            d.pop("rope_parameters", None)
        else:
            d["rope_parameters"] = {**({"partial_rotary_factor": fraction} if fraction else {}), **new}
    d.pop("rope_scaling", None)
    if old is not None:
        d.update(rope_scaling=old, rope_theta=THETA)
    path.write_text(json.dumps(d))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> a folder transformers wrote for an unscaled random model (rope_parameters, default)."""
    out = {}
    for family, make in FAMILIES.items():
        torch.manual_seed(0)
        folder = tmp_path_factory.mktemp(family)
        make({"rope_type": "default", "rope_theta": THETA}).save_pretrained(folder)
        out[family] = folder
    return out


def _copy(saved, family, tmp_path):
    folder = tmp_path / family
    shutil.copytree(saved[family], folder)
    return folder


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


FORMS = ["rope_parameters", "rope_scaling", "rope_scaling-type", "both"]


def _forms(scaling: dict, form: str) -> dict:
    theta = {**scaling, "rope_theta": THETA}
    legacy = {("type" if k == "rope_type" else k): v for k, v in scaling.items()}  # the oldest spelling
    return {"rope_parameters": dict(new=theta, old=None), "rope_scaling": dict(new=None, old=dict(scaling)),
            "rope_scaling-type": dict(new=None, old=legacy), "both": dict(new=theta, old=dict(scaling))}[form]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", list(SCALINGS))
def test_llama_scaling_under_each_key_matches_transformers(saved, tmp_path, kind, form):
    folder = _copy(saved, "llama", tmp_path)
    _write(folder, "llama", **_forms(SCALINGS[kind], form))
    ref = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    assert ref.config.rope_parameters["rope_type"] == kind  # transformers reads the scaling from this form too
    ours = load_model_folder(folder)
    assert ours.config.rope_scaling["rope_type"] == kind and ours.config.rope_theta == THETA
    ids = torch.randint(3, 97, (2, 24))  # past llama3's original 16 positions
    scaled = _logits(ours.model, ids)
    assert (scaled - _logits(ref, ids)).abs().max() < 1e-4

    # not silently ignored: the same weights without the scaling give other logits
    _write(folder, "llama", new={"rope_type": "default", "rope_theta": THETA}, old=None)
    assert (scaled - _logits(load_model_folder(folder).model, ids)).abs().max() > 1e-3

    # saved here, transformers reads the same rotary back
    save_model_folder(ours.model, tmp_path / "ours")
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ours").eval()
    assert back.config.rope_parameters["rope_type"] == kind
    assert (scaled - _logits(back, ids)).abs().max() < 1e-4
    assert load_model_folder(tmp_path / "ours").config.rope_scaling == ours.config.rope_scaling


@pytest.mark.parametrize("form", ["rope_scaling", "both"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_rotary_family_reads_a_linear_rope_scaling(saved, tmp_path, family, form):
    """rope_scaling (alone, or beside an agreeing rope_parameters) is applied by every rotary family,
    with transformers' logits, and changes them."""
    folder = _copy(saved, family, tmp_path)
    _write(folder, family, **_forms(SCALINGS["linear"], form))
    ref = type(FAMILIES[family]({"rope_type": "default"})).from_pretrained(folder).eval()
    ours = load_model_folder(folder)
    assert ours.config.rope_scaling == SCALINGS["linear"]
    ids = torch.randint(3, 97, (1, 12))
    scaled = _logits(ours.model, ids)
    assert (scaled - _logits(ref, ids)).abs().max() < 1e-4
    assert (scaled - _logits(load_model_folder(saved[family]).model, ids)).abs().max() > 1e-3


UNSUPPORTED = [{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
               {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4,
                "original_max_position_embeddings": 32},
               {"type": "dynamic", "factor": 2.0}, {"rope_type": "mystery", "factor": 2.0}]


@pytest.mark.parametrize("where", ["rope_scaling", "rope_parameters"])
@pytest.mark.parametrize("block", UNSUPPORTED, ids=lambda b: b.get("rope_type", b.get("type")))
@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_unsupported_type_under_either_key_is_refused_by_name(saved, tmp_path, family, block, where):
    """rope_scaling beside the rope_parameters transformers 5 wrote (the issue's case: it loaded
    unscaled), or rope_parameters alone."""
    folder = _copy(saved, family, tmp_path)
    if where == "rope_scaling":
        _write(folder, family, new={"rope_type": "default", "rope_theta": THETA}, old=block)
    else:
        _write(folder, family, new={**block, "rope_theta": THETA}, old=None)
    key = _full_key(family) if where == "rope_parameters" else "rope_scaling"
    kind = block.get("rope_type", block.get("type"))
    with pytest.raises(ModelLoadError) as err:
        load_model_folder(folder)
    assert str(err.value) == f"{folder / 'config.json'}: {key} type {kind!r} is not supported {SUPPORTED}"


@pytest.mark.parametrize("value", [-2.0, 0, float("nan"), float("inf"), "4", True])
@pytest.mark.parametrize("where", ["rope_scaling", "rope_parameters"])
@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gpt_neox"])
def test_a_factor_that_is_not_a_positive_finite_number_is_refused(saved, tmp_path, family, where, value):
    folder = _copy(saved, family, tmp_path)
    block = {"rope_type": "linear", "factor": value}
    _write(folder, family, **({"new": {**block, "rope_theta": THETA}, "old": None} if where == "rope_parameters"
                              else {"new": None, "old": block}))
    key = _full_key(family) if where == "rope_parameters" else "rope_scaling"
    with pytest.raises(ModelLoadError) as err:
        load_model_folder(folder)
    assert str(err.value) == f"{folder / 'config.json'}: {key}: factor must be a positive finite number, got {value!r}"


@pytest.mark.parametrize("old, differ", [
    ({"rope_type": "linear", "factor": 4.0}, "rope_type 'default' against 'linear'"),
    ({"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
     "rope_type 'default' against 'llama3'"),
])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_rope_scaling_beside_a_plain_rope_parameters_is_refused(saved, tmp_path, family, old, differ):
    """The issue's silent case: transformers 5 wrote rope_parameters (plain), rope_scaling was added;
    the two disagree, so neither is picked in silence."""
    folder = _copy(saved, family, tmp_path)
    _write(folder, family, new={"rope_type": "default", "rope_theta": THETA}, old=old)
    with pytest.raises(ModelLoadError) as err:
        load_model_folder(folder)
    message = str(err.value)
    assert message.startswith(f"{folder / 'config.json'}: {_full_key(family)} and rope_scaling disagree ({differ})")
    assert "\n" not in message


def test_two_keys_that_differ_in_a_factor_are_refused(saved, tmp_path):
    folder = _copy(saved, "qwen2", tmp_path)
    _write(folder, "qwen2", new={"rope_type": "linear", "factor": 2.0, "rope_theta": THETA},
           old={"rope_type": "linear", "factor": 4.0})
    with pytest.raises(ModelLoadError, match=r"config.json: rope_parameters and rope_scaling disagree "
                                             r"\(factor 2.0 against 4.0\)"):
        load_model_folder(folder)


def test_a_rope_scaling_added_to_a_folder_saved_here_is_not_ignored(saved, tmp_path):
    """A folder this app saved reads its own block first; a rope_scaling added by hand beside it (which
    transformers would apply) is refused unless it is the block's own scaling."""
    ours = load_model_folder(saved["llama"])
    save_model_folder(ours.model, tmp_path / "ours")
    path = tmp_path / "ours" / "config.json"
    d = json.loads(path.read_text())
    path.write_text(json.dumps({**d, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}))
    with pytest.raises(ModelLoadError, match=r"config.json: rope_scaling \{'rope_type': 'linear', 'factor': 4.0\} is "
                                             r"not the rotary scaling of the 'transformer_explorer' block \(None\)"):
        load_model_folder(tmp_path / "ours")


def test_one_block_with_two_types_is_refused(saved, tmp_path):
    """transformers reads rope_type and ignores type: a block giving both, differently, is ambiguous."""
    folder = _copy(saved, "llama", tmp_path)
    _write(folder, "llama", new={"rope_type": "default", "type": "linear", "factor": 4.0, "rope_theta": THETA}, old=None)
    with pytest.raises(ModelLoadError, match="config.json: rope_parameters gives two types, rope_type 'default' and "
                                             "type 'linear'; keep one"):
        load_model_folder(folder)
