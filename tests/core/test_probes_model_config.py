"""Issue 25, probes beyond its list (model folders): a config.json edited to absurd sizes, or naming a
key twice, is refused in one line before anything is built (n_layer 10**9 built 10**9 meta blocks:
2.4 GB after 110 s, no refusal); a model.safetensors that is a folder says so (it said "No such device
(os error 19)")."""
from __future__ import annotations

import json
import time

import pytest
import torch

from desktop_app.core import devices
from desktop_app.core.checkpoints import ModelLoadError, load_model_folder, model_class
from desktop_app.core.config import MAX_SIZES, ConfigError, ModelConfig
from desktop_app.core.families import REGISTRY
from tiny_models import save_tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def folder(tmp_path):
    return save_tiny_model(tmp_path / "model", "abcdefgh ", d_model=8, n_heads=2, d_ff=16, context_length=16)


def _hf_only(folder, **changes) -> dict:
    """config.json without the app's own block (as a Hugging Face model has it), with `changes`."""
    d = json.loads((folder / "config.json").read_text())
    d.pop("transformer_explorer")
    d.update(changes)
    return d


def _refused(folder, match: str) -> str:
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError) as exc:
        load_model_folder(folder)
    msg = str(exc.value)
    assert "\n" not in msg and str(folder / "config.json") in msg and match in msg, msg
    assert time.perf_counter() - t0 < 10  # refused before building anything
    return msg


@pytest.mark.parametrize("key", ["n_layer", "n_embd", "n_inner", "vocab_size", "n_head"])
def test_a_size_far_beyond_any_model_is_refused_before_building(folder, key):
    (folder / "config.json").write_text(json.dumps(_hf_only(folder, **{key: 10**9})))
    _refused(folder, "1,000,000,000 is beyond the")


def test_a_duplicate_key_is_refused_by_name(folder):
    text = json.dumps(_hf_only(folder)).replace('"n_layer": 2', '"n_layer": 2, "n_layer": 1000000000')
    assert text.count('"n_layer"') == 2
    (folder / "config.json").write_text(text)
    msg = _refused(folder, "'n_layer' appears twice")
    assert "1000000000" not in msg


@pytest.mark.parametrize("name", sorted(MAX_SIZES))
def test_every_size_and_count_has_an_upper_bound(name):
    with pytest.raises(ConfigError, match=f"^{name} .* is beyond the {MAX_SIZES[name]:,} this app supports"):
        ModelConfig.gpt2(**{name: MAX_SIZES[name] + 1})


def test_the_parameter_estimate_matches_the_built_model_of_every_family():
    for name, family in REGISTRY.items():
        for cfg in (family.preset(), family.preset(d_model=96, n_heads=4, d_ff=200, vocab_size=300, n_layers=3)):
            with torch.device("meta"):
                n = model_class(cfg)(cfg).num_parameters()  # an encoder-decoder's both stacks (issue 28)
            assert abs(cfg.parameter_estimate() - n) <= 0.02 * n, (name, cfg.parameter_estimate(), n)


def test_weights_beyond_memory_are_refused_with_the_estimate(folder, monkeypatch):
    # sizes a real model has (within every bound): 48 layers of width 8192 are 39 billion weights
    (folder / "config.json").write_text(json.dumps(_hf_only(folder, n_layer=48, n_embd=8192, n_inner=32768,
                                                            n_head=64)))
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": 10**9)
    msg = _refused(folder, "the model it describes needs about 155 GB for its weights; this machine has 1 GB available")
    assert msg.startswith(str(folder / "config.json") + ": ")


def test_model_safetensors_that_is_a_folder_says_so(folder):
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").mkdir()
    with pytest.raises(ModelLoadError) as exc:
        load_model_folder(folder)
    assert str(exc.value) == f"{folder / 'model.safetensors'}: is a folder, not a file"


def test_config_json_that_is_a_folder_says_so(folder):
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()
    with pytest.raises(ModelLoadError) as exc:
        load_model_folder(folder)
    assert str(exc.value) == f"{folder / 'config.json'}: is a folder, not a file"


def test_a_config_of_absurdly_many_parameters_is_refused_even_within_each_bound():
    with pytest.raises(ConfigError, match="parameters, beyond the"):
        ModelConfig.gpt2(n_layers=1024, d_model=1 << 16, n_heads=64, d_ff=1 << 18, context_length=64)


def test_a_pad_token_id_outside_the_vocabulary_is_refused_in_one_line(tmp_path):
    # transformers' OPT refuses it (torch's padding_idx must be a row of the embedding); it was accepted here
    transformers = pytest.importorskip("transformers")
    transformers.OPTForCausalLM(transformers.OPTConfig(
        vocab_size=120, hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2,
        max_position_embeddings=32, word_embed_proj_dim=16, pad_token_id=1)).save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    with pytest.raises(AssertionError, match="Padding_idx"):
        transformers.OPTForCausalLM(transformers.OPTConfig(**{**d, "pad_token_id": 10**6}))
    (tmp_path / "config.json").write_text(json.dumps({**d, "pad_token_id": 10**6}))
    _refused(tmp_path, "pad_token_id 1000000 is not a token of the 120-token vocabulary")


def test_a_config_json_of_gigabytes_is_refused_unread(folder):
    """read_json had no cap of its own (a SAELens cfg.json had 16 MB): a 2 GB config.json was read whole, then
    parsed. Now every JSON file it reads has the cap unless the caller lifts it: one line naming the file."""
    import tracemalloc

    with open(folder / "config.json", "r+b") as fh:
        fh.truncate(2 << 30)  # sparse: no disk used
    tracemalloc.start()
    try:
        msg = _refused(folder, "config.json: is 2,147,483,648 bytes, not a settings file (at most 16,777,216 are read)")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    assert msg.startswith(str(folder / "config.json")), msg


def test_a_config_json_just_under_the_cap_still_opens(folder):
    from desktop_app.core.files import MAX_JSON_BYTES

    text = json.dumps(json.loads((folder / "config.json").read_text()))
    (folder / "config.json").write_text(text + " " * (MAX_JSON_BYTES - len(text.encode())))
    assert (folder / "config.json").stat().st_size == MAX_JSON_BYTES
    assert load_model_folder(folder).config.n_layers == 2
