"""The one beam search (core/generation/search.py) gives transformers' `generate(num_beams=4)` ids, for a
decoder-only model (Llama) and an encoder-decoder (Marian) alike, with early stopping True, False and "never",
and length penalties that favour short (0.5), neutral (1) and long (2) hypotheses: tiny random models saved by
transformers, an end token that the search meets on the way (so hypotheses finish at different lengths)."""
from __future__ import annotations

import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.generation import GenerationSettings, generate

transformers = pytest.importorskip("transformers")

from family_cases.marian import marian  # noqa: E402
from family_cases.t5 import VOCAB  # noqa: E402

N = 10
PENALTIES = (0.5, 1.0, 2.0)


def llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=None, eos_token_id=None, pad_token_id=None))


def marian_sharper():
    """Marian with its weights (not its norms, nor its fixed sinusoids) x 3: a tiny random one spreads its probability so evenly that
    every length penalty picks the same hypothesis."""
    hf = marian()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "layer_norm" not in name and "embed_positions" not in name:  # (sinusoids: not in the file)
                p.mul_(3.0)
    return hf


FAMILIES = {"llama": llama, "marian": marian_sharper}


def reference(hf, prompt: list[int], eos: int | None, **kw) -> list[int]:
    """generate's ids after the prompt (a decoder) or after the start token (an encoder-decoder), through the end token."""
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=N, num_beams=4, eos_token_id=eos,
                          pad_token_id=hf.config.pad_token_id or 0, forced_eos_token_id=None, bad_words_ids=None, **kw)[0].tolist()
    out = out[1:] if hf.config.is_encoder_decoder else out[len(prompt):]
    return out[:out.index(eos) + 1] if eos in out else out


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    torch.manual_seed(0)
    hf = FAMILIES[request.param]().eval()
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    prompts = [torch.randint(3, VOCAB - 1, (6,), generator=torch.Generator().manual_seed(s)).tolist() for s in range(3)]
    # the end token: one that the search itself writes at its fourth step (without an end token)
    eos = reference(hf, prompts[0], None)[3]
    return hf, load_model_folder(folder).model, prompts, eos


@pytest.mark.parametrize("early_stopping", [False, True, "never"])
def test_beam_ids_are_generates(family, early_stopping):
    hf, model, prompts, eos = family
    refs, penalty_matters = [], False
    for prompt in prompts:
        by_penalty = set()
        for penalty in PENALTIES:
            ref = reference(hf, prompt, eos, early_stopping=early_stopping, length_penalty=penalty)
            settings = GenerationSettings("beam", beams=4, length_penalty=penalty, early_stopping=early_stopping)
            ids, session = generate(model, prompt, N, settings, stop_tokens=[eos])
            assert ids[len(session.prompt):] == ref, (prompt, penalty)
            refs.append(ref)
            by_penalty.add(tuple(ref))
        penalty_matters |= len(by_penalty) > 1
    # the cases are exercised: some hypothesis ended early on the end token, and the penalty changed a result
    assert any(r[-1] == eos and len(r) < N for r in refs)
    assert penalty_matters
