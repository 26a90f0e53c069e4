"""Bloom and the score parts that ride on the attention's mask or scores (ALiBi, Gemma 2's soft cap) beyond
their parity cases: generation's attention rows, computed from the cached keys (not the forward pass),
are the full forward's patterns; a preset saved here opens in transformers; the Lipschitz lab refuses
ALiBi in one line."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from family_cases.bloom import bloom  # noqa: E402
from family_cases.gemma2 import gemma2  # noqa: E402
from family_lipschitz import check_preset_opens_in_transformers  # noqa: E402

from desktop_app.core import lipschitz as lip  # noqa: E402
from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.core.generation import GenerationSession, GenerationSettings  # noqa: E402


def test_preset_model_saved_here_opens_in_transformers(tmp_path):
    check_preset_opens_in_transformers("bloom", tmp_path, n_heads=4)


@pytest.mark.parametrize("make", [bloom(), gemma2()], ids=["bloom-alibi", "gemma2-softcap-windows"])
def test_generation_attention_rows_are_the_forward_patterns(make, tmp_path):
    torch.manual_seed(0)
    make().save_pretrained(tmp_path)
    model = load_model_folder(tmp_path).model
    session = GenerationSession(model, [5, 9, 2, 7, 11], GenerationSettings("greedy"), stop_tokens=[])
    list(session.run(8))  # the prompt's rows (several queries), then one-token steps past the window
    for node in (session.current, session.current.parent.parent):
        trace, _ = session.step_trace(node)
        with torch.no_grad():
            _, ref = model.run_with_trace(torch.tensor([session.ids(node)]), names=("blocks.*.attn.pattern",))
        for layer in range(model.cfg.n_layers):
            name = f"blocks.{layer}.attn.pattern"
            assert (trace[name] - ref[name]).abs().max() < 1e-5, (node.depth, layer)


def test_the_lipschitz_lab_refuses_alibi_in_one_line(tmp_path):
    bloom()().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"^ALiBi's bias by distance \(bloom\) is not in the Lipschitz lab") as err:
        lip.layer_map(load_model_folder(tmp_path).model, 1)
    assert "\n" not in str(err.value)
