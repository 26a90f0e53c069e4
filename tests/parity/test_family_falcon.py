"""Falcon beyond its parity cases (family_cases/falcon.py): ALiBi (scaled with the scores in Falcon) and an
activation other than GELU refused by name; the Lipschitz lab exact on a layer of the grouped layout."""
from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from family_cases.falcon import falcon  # noqa: E402
from family_lipschitz import check_lipschitz_and_heads  # noqa: E402
from family_parity import check_config_edit_refused  # noqa: E402


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(alibi=True), "alibi true is not supported"),
    (lambda d: d.update(activation="relu"), "unsupported activation 'relu'"),
])
def test_refusals_name_the_field(edit, message, tmp_path):
    check_config_edit_refused(falcon(), edit, message, tmp_path)


def test_lipschitz_on_a_grouped_layer(tmp_path):
    differences = check_lipschitz_and_heads(falcon(new_decoder_architecture=True, num_kv_heads=2, bias=True),
                                            tmp_path, bilinear=False)
    assert max(differences.values()) < 1e-6, differences
