"""Gemma and Gemma 2 beyond their parity cases (family_cases/gemma.py, gemma2.py): refusals that name
the field, a preset model saved here opening in transformers, and the Lipschitz lab refusing Gemma 2's
soft-capped attention in one line (its measured function has no soft cap)."""
from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from family_cases.gemma import gemma  # noqa: E402
from family_cases.gemma2 import gemma2  # noqa: E402
from family_lipschitz import check_preset_opens_in_transformers  # noqa: E402
from family_parity import check_config_edit_refused  # noqa: E402

from desktop_app.core import lipschitz as lip  # noqa: E402
from desktop_app.core.checkpoints import load_model_folder  # noqa: E402


@pytest.mark.parametrize("family, over", [
    ("gemma", dict(n_kv_heads=2, head_dim=16)),
    ("gemma2", dict(n_kv_heads=2, sliding_window=3, layer_types=["sliding_attention", "full_attention"],
                    attn_logit_softcap=5.0, final_logit_softcap=10.0)),
])
def test_preset_model_saved_here_opens_in_transformers(family, over, tmp_path):
    check_preset_opens_in_transformers(family, tmp_path, **over)


@pytest.mark.parametrize("make, edit, message", [
    (gemma(), lambda d: d.update(hidden_act="relu"), "unsupported hidden_act 'relu'"),
    (gemma(), lambda d: d.update(use_bidirectional_attention=True), "use_bidirectional_attention"),
    (gemma2(), lambda d: d.update(hidden_activation="silu"), "unsupported hidden_activation 'silu'"),
    (gemma2(), lambda d: d.update(attn_logit_softcapping=-1.0), "attn_logit_softcapping must be a positive number"),
    (gemma2(), lambda d: d.update(sliding_window=None), "sliding_attention layers but sliding_window is null"),
])
def test_refusals_name_the_field(make, edit, message, tmp_path):
    check_config_edit_refused(make, edit, message, tmp_path)


def test_gemma2_default_layer_types_alternate_from_a_sliding_first_layer(tmp_path):
    gemma2(layer_types=None, num_hidden_layers=4)().save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    del d["layer_types"]
    (tmp_path / "config.json").write_text(json.dumps(d))
    assert load_model_folder(tmp_path).config.layer_types == transformers.Gemma2Config.from_pretrained(
        tmp_path).layer_types == ["sliding_attention", "full_attention"] * 2


def test_the_lipschitz_lab_refuses_soft_capped_attention_in_one_line(tmp_path):
    gemma2()().save_pretrained(tmp_path)
    model = load_model_folder(tmp_path).model
    with pytest.raises(ValueError) as err:
        lip.layer_map(model, 1)
    assert "soft-capping" in str(err.value) and "\n" not in str(err.value)
    gemma2(attn_logit_softcapping=None)().save_pretrained(tmp_path / "uncapped")  # without it: measured
    assert lip.layer_map(load_model_folder(tmp_path / "uncapped").model, 1) is not None
