"""GPT-J against transformers' GPTJForCausalLM: every case of family_cases/gptj.py through check_family
(logits, every attention pattern, greedy ids, the round trip with q/k rows permuted back to GPT-J's
interleaved pairs), until the generated test over the registry (test_every_family) runs them."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from family_cases.gptj import CASES  # noqa: E402
from family_parity import check_family  # noqa: E402


@pytest.mark.parametrize("case", sorted(CASES))
def test_gptj_parity(case, tmp_path):
    loaded = check_family(CASES[case], tmp_path)
    cfg = loaded.config
    assert cfg.family == "gptj" and cfg.shared_input_norm and cfg.final_logits_bias
    assert not hasattr(loaded.model.blocks[0], "norm2") and loaded.model.lm_bias is not None


def test_direct_logit_attribution_of_gptj_sums_to_the_logit_with_its_unembedding_bias(tmp_path):
    """The unembedding's bias is a component of its own (logits_bias): without it the parts miss the logit."""
    from desktop_app.core.checkpoints import load_model_folder
    from desktop_app.core.interventions import direct_logit_attribution

    hf = CASES["rotary4-of-8"]()
    with torch.no_grad():
        hf.lm_head.bias.normal_(0, 1.0)  # far from zero: a missing term shows
    hf.save_pretrained(tmp_path)
    loaded = load_model_folder(tmp_path)
    att = direct_logit_attribution(loaded, [5, 9, 13, 2, 40], 4, 17)
    assert "logits_bias" in att.components
    assert float(att.contributions.sum()) == pytest.approx(att.logit, abs=1e-4)
    bias = att.contributions[att.components.index("logits_bias")]
    assert bias == pytest.approx(float(loaded.model.lm_bias[17].detach()))
