"""Phi-3 beyond its parity cases (family_cases/phi3.py): refusals that name the field, a preset model saved
here (fused q|k|v of unequal parts written back) opening in transformers, longrope's attention factor as
transformers computes it, and the Lipschitz lab on a longrope layer."""
from __future__ import annotations

import math

import pytest

transformers = pytest.importorskip("transformers")

from family_cases.phi3 import phi3  # noqa: E402
from family_lipschitz import check_lipschitz_and_heads, check_preset_opens_in_transformers  # noqa: E402
from family_parity import check_config_edit_refused  # noqa: E402

from desktop_app.core.checkpoints import load_model_folder  # noqa: E402


def test_preset_model_saved_here_opens_in_transformers(tmp_path):
    check_preset_opens_in_transformers("phi3", tmp_path, n_kv_heads=2, rotary_fraction=0.5)


def test_longrope_attention_factor_follows_the_context_ratio(tmp_path):
    phi3()().save_pretrained(tmp_path)
    scaling = load_model_folder(tmp_path).config.rope_scaling
    assert scaling["rope_type"] == "longrope" and scaling["original_max_position_embeddings"] == 8
    assert scaling["attention_factor"] == pytest.approx(math.sqrt(1 + math.log(128 / 8) / math.log(8)))


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["rope_parameters"].update(rope_type="dynamic", factor=2.0), "type 'dynamic' is not supported"),
    (lambda d: d["rope_parameters"].update(short_factor=[1.0, 2.0]), "short_factor as a list of 4 positive numbers"),
    (lambda d: d["rope_parameters"].update(long_factor="x"), "long_factor as a list of positive numbers"),
    (lambda d: d.update(hidden_act="gelu"), "unsupported hidden_act 'gelu'"),
])
def test_refusals_name_the_field(edit, message, tmp_path):
    check_config_edit_refused(phi3(), edit, message, tmp_path)


def test_lipschitz_on_a_longrope_layer(tmp_path):
    differences = check_lipschitz_and_heads(phi3(), tmp_path, bilinear=False, n=10)  # n > the original context 8
    assert max(differences.values()) < 1e-6, differences
