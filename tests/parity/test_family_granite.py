"""Granite beyond its parity cases (family_cases/granite.py): each of the four multipliers changes the logits
(so the parity case would see one left out), a preset with them saved here opens in transformers, and the
Lipschitz lab refuses the residual multiplier in one line (its measured function has none)."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from family_cases.granite import granite  # noqa: E402
from family_lipschitz import check_preset_opens_in_transformers  # noqa: E402

from desktop_app.core import lipschitz as lip  # noqa: E402
from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.core.model import sublayers_of  # noqa: E402


def test_preset_with_multipliers_opens_in_transformers(tmp_path):
    check_preset_opens_in_transformers("granite", tmp_path, n_kv_heads=2, embed_scale=6.0, attn_scale=0.3,
                                       residual_multiplier=0.5, lm_head_scale=0.25)


@pytest.mark.parametrize("field", ["embed_scale", "attn_scale", "residual_multiplier", "lm_head_scale"])
def test_each_multiplier_changes_the_logits(field, tmp_path):
    torch.manual_seed(0)
    granite()().save_pretrained(tmp_path)
    model = load_model_folder(tmp_path).model
    ids = torch.randint(3, 97, (1, 12))
    with torch.no_grad():
        before = model(ids).logits
        setattr(model.cfg, field, None)
        for block in model.blocks:  # read once at build time
            block.sublayers = sublayers_of(model.cfg)
            block.attn.scale = model.cfg.attn_scale
        assert (model(ids).logits - before).abs().max() > 1e-3


def test_the_lipschitz_lab_refuses_the_residual_multiplier_in_one_line(tmp_path):
    granite()().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"^the residual multiplier \(residual_multiplier 0.22, granite\)") as err:
        lip.layer_map(load_model_folder(tmp_path).model, 1)
    assert "\n" not in str(err.value)


def test_direct_logit_attribution_refuses_the_residual_multiplier_in_one_line(tmp_path):
    from desktop_app.core.interventions import direct_logit_attribution

    granite()().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"^direct logit attribution: the residual multiplier"):
        direct_logit_attribution(load_model_folder(tmp_path), [5, 6, 7], 2, 4)
