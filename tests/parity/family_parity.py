"""The parity checks every family's test runs against `transformers` (test-only reference).

One call per family: `check_family(make_hf, tmp_path)` with a function that builds a tiny random
`transformers` model. It checks what issue 16 asks of every family: the folder Hugging Face writes
opens here with the same logits (1e-4), every layer's attention pattern (1e-5) and hidden states;
decoders give the same greedy ids as `generate` for 32 steps (through the app's KV-cached
GenerationSession); encoders give the same MLM logits; and a model saved here (perturbed, so the
round trip cannot pass by re-reading Hugging Face's own file) opens with `from_pretrained` again
with the same outputs.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from desktop_app.core.checkpoints import LoadedModel, load_model_folder, save_model_folder
from desktop_app.core.generation import GenerationSettings, generate
from desktop_app.core.trace import Trace

LOGITS_TOL = 1e-4
PATTERN_TOL = 1e-5


def hf_outputs(hf, ids: torch.Tensor):
    """Hidden states, attention probabilities and logits from `transformers`' eager attention."""
    hf.eval()
    hf.config._attn_implementation = "eager"  # probabilities are only returned by the eager path
    with torch.no_grad():
        return hf(ids, output_hidden_states=True, output_attentions=True)


def compare_outputs(loaded: LoadedModel, hf_out, ids: torch.Tensor, what: str = "") -> None:
    """Our forward pass against `hf_out` on the same ids: hidden states, every pattern, logits."""
    trace = Trace()
    with torch.no_grad():
        out = loaded.model(ids, trace=trace)
    hidden = trace.hidden_states()
    assert len(hidden) == len(hf_out.hidden_states), what
    # the last hidden state: HF families differ on whether it is before or after the final norm,
    # the logits below settle the end of the stack either way
    for i, (a, b) in enumerate(zip(hidden[:-1], hf_out.hidden_states[:-1])):
        assert (a - b).abs().max().item() < LOGITS_TOL, f"{what} hidden state {i}"
    for layer, pattern in enumerate(hf_out.attentions):
        err = (trace.pattern(layer) - pattern).abs().max().item()
        assert err < PATTERN_TOL, f"{what} attention pattern of layer {layer}: {err:.2e}"
    if getattr(hf_out, "logits", None) is not None:
        err = (out.logits - hf_out.logits).abs().max().item()
        assert err < LOGITS_TOL, f"{what} logits: {err:.2e}"


def check_greedy(loaded: LoadedModel, hf, prompt: list[int], steps: int = 32) -> None:
    """The app's greedy decoding (KV cache) gives the ids `transformers.generate` gives."""
    hf.eval()
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                          num_beams=1, pad_token_id=0, eos_token_id=None)[0].tolist()
    ids, _ = generate(loaded, prompt, steps, GenerationSettings("greedy"), stop_tokens=[])
    assert ids == ref


def check_family(make_hf: Callable[[], object], tmp_path: Path, *, seq_len: int = 12, seed: int = 0,
                 greedy_steps: int = 32, vocab: int | None = None) -> LoadedModel:
    """Every parity check of one family on the model `make_hf()` builds; returns what was loaded."""
    torch.manual_seed(seed)
    hf = make_hf()
    hf.save_pretrained(tmp_path / "hf")
    loaded = load_model_folder(tmp_path / "hf")
    vocab = vocab or hf.config.vocab_size
    ids = torch.randint(3, vocab, (2, seq_len))  # ids 0..2 are often special (pad, bos, eos)
    compare_outputs(loaded, hf_outputs(hf, ids), ids, "from transformers:")
    if loaded.config.causal and loaded.config.lm_head:
        check_greedy(loaded, hf, ids[0, :4].tolist(), greedy_steps)

    with torch.no_grad():  # perturb, save here, open in transformers again
        for p in loaded.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    save_model_folder(loaded.model, tmp_path / "ours")
    hf2 = type(hf).from_pretrained(tmp_path / "ours")
    compare_outputs(loaded, hf_outputs(hf2, ids), ids, "round trip:")
    return loaded
