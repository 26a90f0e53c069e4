"""SmolLM3 beyond its parity cases (family_cases/smollm3.py): its NoPE layers are read as transformers reads
them (also from the default interval), a preset with NoPE layers saved here opens in transformers, and the
Lipschitz lab is exact on a NoPE layer (no rotary) and on a rotary one."""
from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from family_cases.smollm3 import smollm3  # noqa: E402
from family_lipschitz import check_lipschitz_and_heads, check_preset_opens_in_transformers  # noqa: E402

from desktop_app.core.checkpoints import load_model_folder  # noqa: E402


def test_nope_layers_and_windows_read_as_transformers_reads_them(tmp_path):
    smollm3(no_rope_layers=None, num_hidden_layers=8, use_sliding_window=True, sliding_window=4)().save_pretrained(
        tmp_path)
    cfg = load_model_folder(tmp_path).config
    ref = transformers.SmolLM3Config.from_pretrained(tmp_path)
    assert cfg.rotary_layers == [bool(f) for f in ref.no_rope_layers] == [True, True, True, False] * 2
    assert cfg.layer_types == ref.layer_types and cfg.sliding_window == 4


def test_preset_with_nope_layers_opens_in_transformers(tmp_path):
    check_preset_opens_in_transformers("smollm3", tmp_path, n_kv_heads=2, rotary_layers=[True, False])


@pytest.mark.parametrize("layer", [1, 2], ids=["nope", "rotary"])
def test_lipschitz_on_nope_and_rotary_layers(layer, tmp_path):
    differences = check_lipschitz_and_heads(smollm3(), tmp_path, bilinear=True, layer=layer)
    assert max(differences.values()) < 1e-6, differences
