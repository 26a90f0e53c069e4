"""OLMo and StableLM beyond their parity cases (family_cases/olmo.py, stablelm.py): the clamp that the OLMo
case relies on really acts, presets saved here open in transformers, StableLM's refused options name
themselves in one line, and the Lipschitz lab refuses OLMo's clipped q/k/v (a clamp it does not model)."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from family_cases.olmo import olmo  # noqa: E402
from family_cases.stablelm import stablelm  # noqa: E402
from family_lipschitz import check_lipschitz_and_heads, check_preset_opens_in_transformers  # noqa: E402
from family_parity import check_config_edit_refused  # noqa: E402

from desktop_app.core import lipschitz as lip  # noqa: E402
from desktop_app.core.checkpoints import load_model_folder  # noqa: E402


@pytest.mark.parametrize("family, over", [("olmo", dict(clip_qkv=0.1, n_kv_heads=2)),
                                          ("stablelm", dict(attention_bias=True, n_kv_heads=2))])
def test_preset_model_saved_here_opens_in_transformers(family, over, tmp_path):
    check_preset_opens_in_transformers(family, tmp_path, **over)


def test_olmo_clamp_changes_the_logits_of_the_parity_case(tmp_path):
    torch.manual_seed(0)
    olmo()().save_pretrained(tmp_path)
    model = load_model_folder(tmp_path).model
    ids = torch.randint(3, 97, (1, 12))
    with torch.no_grad():
        clipped = model(ids).logits
        model.cfg.clip_qkv = None
        assert (model(ids).logits - clipped).abs().max() > 1e-3


def test_the_lipschitz_lab_refuses_clipped_qkv_and_measures_olmo_without_it(tmp_path):
    olmo()().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"^q/k/v clipping \(clip_qkv 0.05, olmo\) is not in the Lipschitz lab"):
        lip.layer_map(load_model_folder(tmp_path).model, 1)
    differences = check_lipschitz_and_heads(olmo(clip_qkv=None), tmp_path / "unclipped", bilinear=True)
    assert max(differences.values()) < 1e-6, differences


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(qk_layernorm=True), "qk_layernorm true is not supported"),
    (lambda d: d.update(use_parallel_residual=True), "use_parallel_residual true is not supported yet"),
    (lambda d: d.update(hidden_act="gelu"), "unsupported hidden_act 'gelu'"),
])
def test_stablelm_refusals_name_the_field(edit, message, tmp_path):
    check_config_edit_refused(stablelm(), edit, message, tmp_path)


def test_stablelm_lipschitz_with_partial_rotary_and_qkv_biases(tmp_path):
    differences = check_lipschitz_and_heads(stablelm(), tmp_path, bilinear=True)
    assert max(differences.values()) < 1e-6, differences
