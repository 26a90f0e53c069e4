"""Phi (Phi-2) beyond its parity case (family_cases/phi.py): qk_layernorm is refused; the
Lipschitz lab is exact on a layer (its one input norm: test_one_input_norm.py)."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from family_cases.phi import phi  # noqa: E402
from family_lipschitz import check_lipschitz_and_heads  # noqa: E402

from desktop_app.core.checkpoints import ModelLoadError, load_model_folder  # noqa: E402


def test_qk_layernorm_is_refused_by_name(tmp_path):
    phi()().save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    d["qk_layernorm"] = True
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ModelLoadError, match="qk_layernorm true is not supported") as err:
        load_model_folder(tmp_path)
    assert "config.json" in str(err.value)


def test_lipschitz_on_a_phi_layer(tmp_path):
    differences = check_lipschitz_and_heads(phi(), tmp_path, bilinear=True)
    assert max(differences.values()) < 1e-6, differences


def test_direct_logit_attribution_adds_up_with_the_head_bias(tmp_path):
    """Phi's LM head has a bias: it is one of the terms, and the terms sum to the logit."""
    from desktop_app.core.interventions import direct_logit_attribution

    torch.manual_seed(0)
    phi()().save_pretrained(tmp_path)
    loaded = load_model_folder(tmp_path)
    ids = torch.randint(3, 97, (9,)).tolist()
    attribution = direct_logit_attribution(loaded, ids, 8, 5)
    assert "logits_bias" in attribution.components
    assert abs(float(attribution.contributions.sum()) - attribution.logit) < 1e-4
