"""Numerical parity with Hugging Face `transformers` (a test-only reference nobody here wrote).

Random-initialised models saved by transformers load here and give the same hidden states,
attention probabilities and logits; a model saved here loads in transformers with the same outputs.
"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from desktop_app.core.checkpoints import load_model_folder, save_model_folder  # noqa: E402
from desktop_app.core.trace import Trace  # noqa: E402

TOL = 1e-4


def _gpt2(lm_head=True):
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=48, n_layer=3, n_head=4)
    cls = transformers.GPT2LMHeadModel if lm_head else transformers.GPT2Model
    return cls(cfg)


def _bert(lm_head=True):
    cfg = transformers.BertConfig(vocab_size=97, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                  intermediate_size=96, max_position_embeddings=32)
    cls = transformers.BertForMaskedLM if lm_head else transformers.BertModel
    return cls(cfg)


def _llama(tied=False):
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=80, max_position_embeddings=64,
                                   tie_word_embeddings=tied)
    return transformers.LlamaForCausalLM(cfg)


CASES = {
    "gpt2-lm": (_gpt2, True), "gpt2-base": (lambda: _gpt2(False), False),
    "bert-mlm": (_bert, True), "bert-base": (lambda: _bert(False), False),
    "llama-gqa": (_llama, True), "llama-tied": (lambda: _llama(True), True),
}


def _hf_run(hf, ids):
    hf.eval()
    hf.config._attn_implementation = "eager"  # probabilities are only returned by the eager path
    with torch.no_grad():
        return hf(ids, output_hidden_states=True, output_attentions=True)


def _compare(ours_loaded, hf_out, ids, has_lm_head):
    model = ours_loaded.model
    trace = Trace()
    with torch.no_grad():
        out = model(ids, trace=trace)
    hs = trace.hidden_states()
    assert len(hs) == len(hf_out.hidden_states)
    for i, (a, b) in enumerate(zip(hs, hf_out.hidden_states)):
        assert (a - b).abs().max().item() < TOL, f"hidden state {i}"
    for l, att in enumerate(hf_out.attentions):
        assert (trace.pattern(l) - att).abs().max().item() < TOL, f"attention layer {l}"
    if has_lm_head:
        assert (out.logits - hf_out.logits).abs().max().item() < TOL
    else:
        assert out.logits is None


@pytest.mark.parametrize("case", sorted(CASES))
def test_transformers_checkpoint_loads_with_same_outputs(case, tmp_path):
    make, has_head = CASES[case]
    torch.manual_seed(0)
    hf = make()
    hf.save_pretrained(tmp_path)
    ids = torch.randint(0, 97, (2, 11))
    ours = load_model_folder(tmp_path)
    assert ours.config.lm_head == has_head
    _compare(ours, _hf_run(hf, ids), ids, has_head)


@pytest.mark.parametrize("case", sorted(CASES))
def test_model_saved_here_loads_in_transformers(case, tmp_path):
    make, has_head = CASES[case]
    torch.manual_seed(1)
    hf = make()
    hf.save_pretrained(tmp_path / "hf")
    ours = load_model_folder(tmp_path / "hf")
    with torch.no_grad():  # perturb so the round trip cannot pass by re-reading HF's own file
        for p in ours.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    save_model_folder(ours.model, tmp_path / "ours")
    back = transformers.AutoModel if not has_head else None
    cls = type(hf) if back is None else back
    hf2 = cls.from_pretrained(tmp_path / "ours")
    ids = torch.randint(0, 97, (1, 9))
    _compare(ours, _hf_run(hf2, ids), ids, has_head)


def test_attention_mask_padding_matches_bert(tmp_path):
    torch.manual_seed(2)
    hf = _bert()
    hf.save_pretrained(tmp_path)
    ours = load_model_folder(tmp_path).model
    ids = torch.randint(0, 97, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 5:] = 0
    hf.eval()
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).logits
    assert (ref[0] - got[0]).abs().max() < TOL
    assert (ref[1, :5] - got[1, :5]).abs().max() < TOL
