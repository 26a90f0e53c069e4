"""OLMo 2 against transformers' Olmo2ForCausalLM: every case of family_cases/olmo2.py through check_family
(logits, every attention pattern, greedy ids, the round trip), until the generated test over the registry
(test_every_family) runs them."""
from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from family_cases.olmo2 import CASES  # noqa: E402
from family_parity import check_family  # noqa: E402


@pytest.mark.parametrize("case", sorted(CASES))
def test_olmo2_parity(case, tmp_path):
    loaded = check_family(CASES[case], tmp_path)
    cfg = loaded.config
    assert cfg.family == "olmo2" and cfg.norm_placement == "output" and cfg.qk_norm_across_heads
    block = loaded.model.blocks[0]
    assert not hasattr(block, "norm1") and block.attn.q_norm.weight.shape == (cfg.n_heads * cfg.d_head,)


def test_the_lipschitz_lab_refuses_q_and_k_normed_over_all_heads_in_one_line():
    """Its attention map norms each head's q and k on its own: OLMo 2's norm over all heads is not that map."""
    from desktop_app.core.families import REGISTRY
    from desktop_app.core.lipschitz.measured import layer_map
    from desktop_app.core.model import Transformer

    cfg = REGISTRY["olmo2"].preset(vocab_size=50, d_model=32, n_layers=1, n_heads=4, d_ff=64, context_length=16)
    with pytest.raises(ValueError, match="norms them over all heads at once"):
        layer_map(Transformer(cfg), 0)
