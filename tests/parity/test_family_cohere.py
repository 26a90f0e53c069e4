"""Cohere beyond its parity case (family_cases/cohere.py): use_qk_norm refused by name, the logit scale read,
and the Lipschitz lab exact on a layer whose q/k rows were reordered for the interleaved rotary."""
from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from family_cases.cohere import cohere  # noqa: E402
from family_lipschitz import check_lipschitz_and_heads  # noqa: E402
from family_parity import check_config_edit_refused  # noqa: E402


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(use_qk_norm=True), "use_qk_norm true is not supported"),
    (lambda d: d.update(logit_scale=0), "logit_scale must be a positive number"),
])
def test_refusals_name_the_field(edit, message, tmp_path):
    check_config_edit_refused(cohere(), edit, message, tmp_path)


def test_lipschitz_on_a_cohere_layer(tmp_path):
    differences = check_lipschitz_and_heads(cohere(), tmp_path, bilinear=False)
    assert max(differences.values()) < 1e-6, differences
