"""core/families: the registry is the only list of families, and each family's ONE weight table
serves both directions (save -> load gives back the same tensors, and `transformers`, a reference
nobody here wrote, loads what we save with the same outputs)."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from desktop_app.cli import main as cli_main
from desktop_app.core.checkpoints import (CONFIG, WEIGHTS, ModelLoadError, hf_compatible, load_model_folder,
                                          new_model, read_config, save_model_folder)
from desktop_app.core.config import ConfigError, ModelConfig
from desktop_app.core.families import REGISTRY, family_for
from desktop_app.core.trace import Trace

SMALL = dict(vocab_size=61, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=16)
# Every family with and without its LM head, tied and untied, and LLaMA's optional biases.
CONFIGS = {
    "gpt2-lm": ("gpt2", {}), "gpt2-untied": ("gpt2", {"tie_embeddings": False}),
    "gpt2-base": ("gpt2", {"lm_head": False}),
    "bert-mlm": ("bert", {}), "bert-untied": ("bert", {"tie_embeddings": False}),
    "bert-base": ("bert", {"lm_head": False}),
    "llama-gqa": ("llama", {"n_kv_heads": 2}), "llama-tied": ("llama", {"tie_embeddings": True}),
    "llama-biases": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "llama-base": ("llama", {"lm_head": False}),
}


def _perturbed_model(cfg: ModelConfig, seed: int = 0):
    """A fresh model with every tensor made distinct (biases start at zero and norms at one, so a
    table that swapped two of them would otherwise round-trip unnoticed)."""
    model = new_model(cfg, seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def _config(case: str) -> ModelConfig:
    model_type, over = CONFIGS[case]
    return REGISTRY[model_type].preset(**{**SMALL, **over})


def test_registry_lists_the_three_original_families_and_checks_family_names():
    from desktop_app.core.families import family_of
    assert {"gpt2", "bert", "llama"} <= set(REGISTRY)
    for model_type, family in REGISTRY.items():
        assert family.model_type == model_type
        assert family.preset(**SMALL).family == model_type
        assert family_of(model_type) is family
    # the family check is the registry's (ModelConfig sits below it and imports no family)
    with pytest.raises(ConfigError, match="unknown family 'mamba'") as err:
        family_of(ModelConfig(family="mamba"))
    assert all(name in str(err.value) for name in REGISTRY)


def test_cli_families_lists_exactly_the_registry(capsys):
    assert cli_main(["families", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["model_type"] for r in rows] == list(REGISTRY)
    for r in rows:
        family = REGISTRY[r["model_type"]]
        assert r["title"] == family.title
        assert r["kind"] == ("encoder-decoder" if family.encoder_decoder else
                             "decoder" if family.decoder else "encoder")
        assert r["trainable"] == family.trainable
    kinds = {r["model_type"]: r["kind"] for r in rows}
    assert [kinds[f] for f in ("t5", "bart", "marian", "bert", "vit", "gpt2", "gemma2", "phi3")] == \
        ["encoder-decoder"] * 3 + ["encoder"] * 2 + ["decoder"] * 3
    assert cli_main(["families"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(REGISTRY)
    assert lines[list(REGISTRY).index("bert")].split()[1] == "encoder"
    assert lines[list(REGISTRY).index("t5")].split()[1] == "encoder-decoder"  # issue 41: it said "decoder"


def test_model_panel_family_names_are_the_registry_titles():
    pytest.importorskip("PySide6")
    from desktop_app.ui.panels.model import FAMILY_NAMES
    assert FAMILY_NAMES == {k: f.title for k, f in REGISTRY.items()}


def test_unknown_model_type_names_it_and_lists_the_supported_families(tmp_path):
    (tmp_path / CONFIG).write_text(json.dumps({"model_type": "mamba", "vocab_size": 10}))
    with pytest.raises(ModelLoadError) as err:
        read_config(tmp_path)
    assert err.value.path == tmp_path / CONFIG
    assert "unknown model_type 'mamba'" in err.value.problem
    assert f"supported: {', '.join(REGISTRY)}" in err.value.problem
    with pytest.raises(ModelLoadError, match="no 'model_type' field"):
        family_for(None, tmp_path / CONFIG)
    with pytest.raises(ModelLoadError, match="unknown model_type 3"):
        family_for(3, tmp_path / CONFIG)


def test_auto_map_custom_code_is_refused_and_never_run(tmp_path):
    folder = tmp_path / "custom"
    save_model_folder(new_model(ModelConfig.gpt2(**SMALL), seed=0), folder)
    d = json.loads((folder / CONFIG).read_text())
    d["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (folder / CONFIG).write_text(json.dumps(d))
    marker = tmp_path / "ran"
    (folder / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\nclass EvilModel: pass\n")
    with pytest.raises(ModelLoadError) as err:
        load_model_folder(folder)
    assert err.value.path == folder / CONFIG
    assert "auto_map" in err.value.problem and "never runs" in err.value.problem
    assert not marker.exists()


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_weight_table_round_trips_every_tensor(case, tmp_path):
    cfg = _config(case)
    assert hf_compatible(cfg)
    family = REGISTRY[cfg.family]
    model = _perturbed_model(cfg)
    save_model_folder(model, tmp_path)
    with safe_open(str(tmp_path / WEIGHTS), framework="pt") as st:
        stored = set(st.keys())
    prefix = family.prefix(cfg)
    table = family.weights(cfg)
    assert stored == {w.theirs if w.outside_prefix else prefix + w.theirs for w in table}
    # every tensor of ours has an entry (a tied head is the embedding, not stored twice)
    tied = {"lm_head.weight"} if cfg.lm_head and cfg.tie_embeddings else set()
    assert {name for w in table for name in w.ours} == set(model.state_dict()) - tied
    loaded = load_model_folder(tmp_path)
    assert loaded.config == cfg
    want, got = model.state_dict(), loaded.model.state_dict()
    assert set(got) == set(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_bert_old_gamma_beta_names_are_read(tmp_path):
    from safetensors.torch import load_file, save_file
    cfg = _config("bert-mlm")
    model = _perturbed_model(cfg)
    save_model_folder(model, tmp_path)
    tensors = load_file(str(tmp_path / WEIGHTS))
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in tensors.items()}
    assert renamed.keys() != tensors.keys()
    save_file(renamed, str(tmp_path / WEIGHTS), metadata={"format": "pt"})
    got = load_model_folder(tmp_path).model.state_dict()
    for name, t in model.state_dict().items():
        assert torch.equal(got[name], t), name


def test_a_config_the_hf_class_cannot_hold_round_trips_with_our_names(tmp_path):
    cfg = ModelConfig.gpt2(**SMALL, norm="rmsnorm", positions="rotary")
    assert not hf_compatible(cfg)
    model = _perturbed_model(cfg)
    save_model_folder(model, tmp_path)
    got = load_model_folder(tmp_path).model.state_dict()
    for name, t in model.state_dict().items():
        assert torch.equal(got[name], t), name


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_transformers_loads_the_saved_folder_with_the_same_outputs(case, tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = _config(case)
    family = REGISTRY[cfg.family]
    model = _perturbed_model(cfg, seed=1)
    save_model_folder(model, tmp_path)
    hf = getattr(transformers, family.architecture(cfg)).from_pretrained(tmp_path)
    hf.eval()
    hf.config._attn_implementation = "eager"
    ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    trace = Trace()
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
        out = model(ids, trace=trace)
    assert (trace.hidden_states()[-1] - ref.hidden_states[-1]).abs().max().item() < 1e-4
    if cfg.lm_head:
        assert (out.logits - ref.logits).abs().max().item() < 1e-4
    else:
        assert not hasattr(ref, "logits") or ref.logits is None


def test_training_presets_come_from_the_registry():
    from desktop_app.core.training.trainer import TrainConfig, model_config_for
    for model_type, family in REGISTRY.items():
        if family.trainable:
            cfg = model_config_for(TrainConfig(family=model_type, model=dict(SMALL)))
            assert cfg == family.preset(**SMALL, lm_head=True)
    with pytest.raises(ValueError, match="unknown family 'mamba'"):
        model_config_for(TrainConfig(family="mamba", model=dict(SMALL)))


def test_untied_bert_from_transformers_uses_the_decoder_bias(tmp_path):
    """Untied, BertForMaskedLM's forward adds cls.predictions.decoder.bias (no longer the same
    tensor as cls.predictions.bias): the logits must match with the two made different."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(4)
    hf = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=16, tie_word_embeddings=False))
    with torch.no_grad():
        hf.cls.predictions.decoder.bias.copy_(torch.randn(61))
        hf.cls.predictions.bias.copy_(torch.randn(61))
    hf.save_pretrained(tmp_path)
    hf.eval()
    ids = torch.randint(0, 61, (1, 7))
    ours = load_model_folder(tmp_path)
    assert not ours.config.tie_embeddings
    with torch.no_grad():
        assert (ours.model(ids).logits - hf(ids).logits).abs().max().item() < 1e-4


@pytest.mark.parametrize("rotary_fraction", [1.0, 0.5])
def test_interleaved_rotary_rows_go_from_pairs_to_halves_per_head_and_back(rotary_fraction):
    """GPT-J's and Cohere's one reordering: each head's rotating dims (0, 1, 2, 3, ...) -> (0, 2, ..., 1, 3, ...),
    the dims past rotary_fraction kept in place; weights and biases alike; writing undoes it."""
    from desktop_app.core.families.base import INTERLEAVED_ROTARY

    cfg = ModelConfig(family="gptj", **{**SMALL, "n_heads": 2, "d_model": 16}, rotary_fraction=rotary_fraction)
    r = int(8 * rotary_fraction)
    per_head = [*range(0, r, 2), *range(1, r, 2), *range(r, 8)]
    expected = torch.tensor([h * 8 + i for h in range(2) for i in per_head])
    bias = torch.arange(16)
    weight = torch.arange(16 * 3).reshape(16, 3)
    assert torch.equal(INTERLEAVED_ROTARY.to_ours(bias, cfg)[0], expected)
    assert torch.equal(INTERLEAVED_ROTARY.to_ours(weight, cfg)[0], weight[expected])
    assert torch.equal(INTERLEAVED_ROTARY.to_theirs(INTERLEAVED_ROTARY.to_ours(weight, cfg), cfg), weight)
