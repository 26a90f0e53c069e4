"""bfloat16 parity of the families added after the first bfloat16 checks (tests/core/generation/test_generation_half.py),
against transformers in bfloat16 with its default (SDPA) attention: each family's first parity case
(family_cases/<model_type>.py) cast to bfloat16 and saved, opened here in bfloat16 and packed for decoding as a
generation session runs it; every hidden state of the prompt's forward and of one KV-cached step, and their logits.

The tolerance is the existing checks': bit for bit (test_a_bfloat16_prompt_and_step_equal_transformers_default_
attention_bit_for_bit) where the arithmetic is transformers' op for op, which sixteen of these families are. The
other two round differently in one sublayer (named below, with the cause) and are held to the
logit tolerance of test_bfloat16_steps_fuse_their_products_and_keep_transformers_greedy_ids: 0.02 x the largest
|value|, for every hidden state and the logits (measured: 0.4-0.8% on the logits). `-m slow`: 18 families, ~1 min.
"""
from __future__ import annotations

import importlib

import pytest
import torch

transformers = pytest.importorskip("transformers")

from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.core.model import KVCache  # noqa: E402
from desktop_app.core.trace import Trace  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]  # ~1 s a family, 18 families

BIT_FOR_BIT = ("gemma", "gemma2", "phi3", "stablelm", "smollm3", "granite", "qwen2_moe", "qwen3_moe", "olmoe",
               # the MLP's gelu_new evaluated op by op as transformers' NewGELUActivation does (model.gelu_new)
               "gpt2", "phi", "gptj",
               # q and k rotated in float32 by float32 cos and sin, rounded once (rotary_precision)
               "olmo", "olmo2",
               # the same with cos and sin rounded first (rotary_precision), residual + attn + mlp (parallel_sum)
               "cohere",
               # the experts' terms weighted by float32 weights, summed in float32 (expert_weights_float32)
               "mixtral")
# where the bfloat16 rounding parts from transformers' (found by comparing each sublayer's input and output)
ROUNDED = {
    # Bloom's attention output before W_O already differs: transformers scores with baddbmm(absolute alibi
    # slope * j, q, k^T) rounded to bfloat16, adds the mask, rounds the float32 softmax before the value
    # product; ours is fused SDPA with the alibi as a relative additive mask (an explicit path would cost
    # speed). Its MLP's bloom_gelu is also a formula op by op (differs from F.gelu and gelu_new in bfloat16)
    "bloom": "alibi attention (explicit, rounded) and bloom_gelu",
    # transformers passes Falcon's one key/value head (multi_query) to SDPA unrepeated and without enable_gqa,
    # a broadcast that takes SDPA's math kernel; ours takes the fused grouped kernel. Checked: the math
    # kernel here made it bit for bit, but costs 2-3x (float32) to 3-6x (bfloat16) in attention: not done
    "falcon": "SDPA kernel (broadcast key/value head)",
}
FAMILIES = BIT_FOR_BIT + tuple(ROUNDED)
RELATIVE = 0.02


def _hidden_states(model, ids: torch.Tensor, cache) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Our hidden states as transformers' output_hidden_states gives them (the last after the final norm), logits."""
    trace = Trace(("embed", "blocks.*.resid_post", "final_norm.out"))
    with torch.inference_mode():
        out = model(ids, trace=trace, cache=cache)
    return trace.hidden_states(), out.logits


def _compare(theirs: list[torch.Tensor], ours: list[torch.Tensor], exact: bool, what: str) -> None:
    assert len(theirs) == len(ours), what
    for i, (a, b) in enumerate(zip(theirs, ours)):
        assert a.dtype == b.dtype == torch.bfloat16, (what, i)
        if exact:
            assert torch.equal(a, b), f"{what} {i} differs by {(a.float() - b.float()).abs().max()}"
        else:
            scale = a.float().abs().max()
            assert (a.float() - b.float()).abs().max() <= RELATIVE * scale, f"{what} {i}"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_bfloat16_prompt_and_step_match_transformers(family, tmp_path):
    make = next(iter(importlib.import_module(f"family_cases.{family}").CASES.values()))
    torch.manual_seed(0)
    reference = make()
    with torch.no_grad():  # norm gains and biases away from transformers' 1 and 0, as a trained checkpoint's
        for name, p in reference.named_parameters():
            if "norm" in name or ".ln" in name or "ln_" in name:
                p.add_(0.2 * torch.randn_like(p))
    reference.to(torch.bfloat16).save_pretrained(tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    loaded = load_model_folder(tmp_path, dtype="bfloat16")
    assert loaded.config.family == family and loaded.model.dtype == torch.bfloat16
    model = loaded.model
    model.pack_for_decoding()  # as a generation session runs it
    prompt = torch.randint(3, model.cfg.vocab_size - 1, (1, 12), generator=torch.Generator().manual_seed(1))
    cache = KVCache(model.cfg.n_layers)
    exact = family in BIT_FOR_BIT
    with torch.no_grad():
        out = hf(prompt, output_hidden_states=True, use_cache=True)
        ours, logits = _hidden_states(model, prompt, cache)
        _compare([*out.hidden_states, out.logits], [*ours, logits], exact, "prompt: hidden state")
        step = out.logits[0, -1].argmax().view(1, 1)
        out = hf(step, past_key_values=out.past_key_values, output_hidden_states=True, use_cache=True)
        ours, logits = _hidden_states(model, step, cache)
        _compare([*out.hidden_states, out.logits], [*ours, logits], exact, "step: hidden state")
