"""What-if edits, direct logit attribution and activation patching (core/interventions.py).

References: exact identities of the architecture, and the same edits done by hand with forward
hooks on a transformers GPT-2 (a model nobody here wrote)."""
from __future__ import annotations

import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder, new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.generation import GenerationSession, GenerationSettings
from desktop_app.core.interventions import (Intervention, activation_patching, direct_logit_attribution,
                                            parse_ablations, resolve)

transformers = pytest.importorskip("transformers")

L, H, D = 3, 4, 48
DH = D // H
IDS = [5, 17, 3, 88, 41, 9, 60, 2, 33, 71]
OTHER = [12, 4, 77, 30, 8, 55, 19, 90, 1, 64]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """(hf model, our loaded copy) of one random GPT-2."""
    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=D,
                                                              n_layer=L, n_head=H))
    hf.save_pretrained(folder)
    hf.eval()
    hf.config._attn_implementation = "eager"
    return hf, load_model_folder(folder)


def _llama(seed=0):
    cfg = ModelConfig.llama(vocab_size=97, d_model=D, n_layers=L, n_heads=H, n_kv_heads=2, d_ff=80,
                            context_length=64)
    return new_model(cfg, seed=seed).eval()


def _logits(model, ids, interventions=None):
    with torch.no_grad():
        return model(torch.tensor([ids]), interventions=interventions).logits[0]


def _hf_logits(hf, ids, layer, edit_slice):
    """HF logits with a forward pre-hook on block `layer`'s c_proj that rewrites its input [B, T, H*dh]."""
    def hook(module, args):
        z = args[0].clone()
        edit_slice(z)
        return (z,)
    handle = hf.transformer.h[layer].attn.c_proj.register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            return hf(torch.tensor([IDS])).logits[0]
    finally:
        handle.remove()


def _hf_c_proj_input(hf, ids, layer):
    got = {}
    handle = hf.transformer.h[layer].attn.c_proj.register_forward_pre_hook(lambda m, a: got.update(z=a[0].clone()))
    with torch.no_grad():
        hf(torch.tensor([ids]))
    handle.remove()
    return got["z"][0]  # [T, H*dh]


def test_zero_head_matches_transformers_hook(gpt2):
    hf, loaded = gpt2
    l, h = 1, 2
    rows = slice(h * DH, (h + 1) * DH)
    ref = _hf_logits(hf, IDS, l, lambda z: z[..., rows].zero_())
    ours = _logits(loaded.model, IDS, [Intervention(f"blocks.{l}.attn.head.{h}")])
    assert torch.allclose(ours, ref, atol=1e-4)
    assert not torch.allclose(ours, _logits(loaded.model, IDS), atol=1e-3)  # the head mattered


def test_mean_and_resample_match_transformers_hook(gpt2):
    hf, loaded = gpt2
    l, h = 2, 1
    rows = slice(h * DH, (h + 1) * DH)
    own, other = _hf_c_proj_input(hf, IDS, l), _hf_c_proj_input(hf, OTHER, l)

    def mean(z):
        z[..., rows] = own[:, rows].mean(0)

    def resample(z):
        z[..., rows] = other[:, rows]

    target = f"blocks.{l}.attn.head.{h}"
    ivs = resolve(loaded.model, IDS, [Intervention(target, "mean")])
    assert torch.allclose(_logits(loaded.model, IDS, ivs), _hf_logits(hf, IDS, l, mean), atol=1e-4)
    ivs = resolve(loaded.model, IDS, [Intervention(target, "resample", source_ids=tuple(OTHER))])
    assert torch.allclose(_logits(loaded.model, IDS, ivs), _hf_logits(hf, IDS, l, resample), atol=1e-4)


def test_zero_every_head_is_removing_the_attention_output(gpt2):
    model = gpt2[1].model
    l = 1
    heads = [Intervention(f"blocks.{l}.attn.head.{h}") for h in range(H)]
    bias_only = Intervention(f"blocks.{l}.attn.out", "replace", value=model.blocks[l].attn.o.bias.detach())
    assert torch.allclose(_logits(model, IDS, heads), _logits(model, IDS, [bias_only]), atol=1e-5)
    llama = _llama()  # no W_O bias: every head zeroed is the sublayer removed
    heads = [Intervention(f"blocks.{l}.attn.head.{h}") for h in range(H)]
    assert torch.allclose(_logits(llama, IDS, heads), _logits(llama, IDS, [Intervention(f"blocks.{l}.attn.out")]),
                          atol=1e-5)


def test_patching_the_last_residual_restores_the_clean_logits_exactly(gpt2):
    model = gpt2[1].model
    with torch.no_grad():
        _, clean = model.run_with_trace(torch.tensor([IDS]), names=[f"blocks.{L - 1}.resid_post", "logits"])
    patch = Intervention(f"blocks.{L - 1}.resid_post", "replace", value=clean[f"blocks.{L - 1}.resid_post"][0])
    assert torch.equal(_logits(model, OTHER, [patch]), clean["logits"][0])


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_direct_attributions_sum_to_the_logit(gpt2, which):
    model = gpt2[1].model if which == "gpt2" else _llama()
    for position, token in [(len(IDS) - 1, 7), (3, 50)]:
        att = direct_logit_attribution(model, IDS, position, token)
        assert att.logit == pytest.approx(float(_logits(model, IDS)[position, token]), abs=1e-6)
        assert abs(att.sum - att.logit) < 1e-4
        assert att.head_table.shape == (L, H) and len(att.rows()) == len(att.components)
        assert "final_norm_bias" in att.components if which == "gpt2" else "final_norm_bias" not in att.components


def test_direct_attribution_of_a_head_matches_transformers_by_hand(gpt2):
    hf, loaded = gpt2
    l, h, p, token = 2, 3, 6, 11
    z = _hf_c_proj_input(hf, IDS, l)  # [T, H*dh]
    got = {}
    handle = hf.transformer.ln_f.register_forward_pre_hook(lambda m, a: got.update(resid=a[0][0].clone()))
    with torch.no_grad():
        hf(torch.tensor([IDS]))
    handle.remove()
    w_o = hf.transformer.h[l].attn.c_proj.weight[h * DH:(h + 1) * DH]  # Conv1D: [in, out]
    head_vec = (z[p, h * DH:(h + 1) * DH] @ w_o).double()
    resid = got["resid"][p].double()
    ln = hf.transformer.ln_f
    sigma = torch.sqrt(resid.var(unbiased=False) + ln.eps)
    ref = ((head_vec - head_vec.mean()) / sigma * ln.weight.double()) @ hf.lm_head.weight[token].double()
    att = direct_logit_attribution(loaded, IDS, p, token)
    assert att.head_table[l, h] == pytest.approx(float(ref.detach()), abs=1e-5)


def test_mean_ablation_on_a_constant_text_changes_nothing():
    model = _llama()  # rotary: on one repeated token every position holds the same activations
    ids = [23] * 9
    for target in ("blocks.1.attn.head.2", "blocks.0.mlp.out", "blocks.2.attn.out"):
        ivs = resolve(model, ids, [Intervention(target, "mean")])
        assert torch.allclose(_logits(model, ids, ivs), _logits(model, ids), atol=1e-5)
    ivs = resolve(model, IDS, [Intervention("blocks.1.attn.head.2", "mean")])  # a real text: it does change
    assert not torch.allclose(_logits(model, IDS, ivs), _logits(model, IDS), atol=1e-4)


def test_patching_tables(gpt2):
    hf, loaded = gpt2
    clean, corrupted = IDS[:6], [5, 17, 3, 30, 41, 9]  # differ at position 3 only
    answer, wrong = 7, 8
    res = activation_patching(loaded, clean, corrupted, answer, wrong)
    assert res.resid.shape == (L + 1, 6) and res.heads.shape == (L, H)
    assert res.resid[-1, -1] == pytest.approx(1.0, abs=1e-6)  # the whole last state: all of it
    assert res.resid[-1, :-1] == pytest.approx(0.0, abs=1e-6)  # earlier positions no longer matter
    assert res.resid[0, [0, 1, 2, 4, 5]] == pytest.approx(0.0, abs=1e-6)  # same token: nothing to restore
    assert res.resid[0, 3] == pytest.approx(1.0, abs=1e-5)  # the only differing embedding: everything
    # one head patched, by hand through transformers
    l, h = 1, 0
    rows = slice(h * DH, (h + 1) * DH)
    clean_z = _hf_c_proj_input(hf, clean, l)

    def metric(logits):
        return float(logits[-1, answer] - logits[-1, wrong])

    def patched(z):
        z[..., rows] = clean_z[:, rows]
    with torch.no_grad():
        m_clean, m_corr = metric(hf(torch.tensor([clean])).logits[0]), metric(hf(torch.tensor([corrupted])).logits[0])

    def hook(module, args):
        z = args[0].clone()
        patched(z)
        return (z,)
    handle = hf.transformer.h[l].attn.c_proj.register_forward_pre_hook(hook)
    with torch.no_grad():
        m_patch = metric(hf(torch.tensor([corrupted])).logits[0])
    handle.remove()
    # a ratio of logit differences: float32 rounding (which depends on the thread count's summation
    # order) is amplified by 1 / (m_clean - m_corr), so the tolerance is relative
    assert res.heads[l, h] == pytest.approx((m_patch - m_corr) / (m_clean - m_corr), rel=2e-4)


@pytest.mark.parametrize("use_cache", [True, False])
def test_generation_applies_interventions_in_every_step(use_cache):
    model = _llama()
    ablate = parse_ablations("0.1,1.attn,2.3", model.cfg)
    s = GenerationSession(model, IDS[:4], GenerationSettings("greedy"), use_cache=use_cache, interventions=ablate)
    list(s.run(6))
    ids = s.ids()
    for t in range(4, len(ids)):  # each chosen token is the argmax of the ablated full forward
        assert ids[t] == int(_logits(model, ids[:t], ablate)[-1].argmax())
    plain = GenerationSession(model, IDS[:4], GenerationSettings("greedy"), use_cache=use_cache)
    assert not torch.allclose(plain.root.next_logits, s.root.next_logits, atol=1e-3)


def test_no_interventions_cost_nothing_and_bad_input_is_one_clear_error(gpt2):
    model = gpt2[1].model
    assert torch.equal(_logits(model, IDS, []), _logits(model, IDS))
    with pytest.raises(ValueError, match="LAYER.HEAD"):
        parse_ablations("1-2")
    with pytest.raises(ValueError, match="heads 0..3"):
        parse_ablations("1.4", model.cfg)
    with pytest.raises(ValueError, match="layers 0..2"):
        parse_ablations("3.0", model.cfg)
    with pytest.raises(ValueError, match="not an edit point"):
        Intervention("blocks.1.attn.wrong")
    with pytest.raises(ValueError, match="same length"):
        activation_patching(model, IDS, IDS[:-1], 3)
    with pytest.raises(ValueError, match="nothing to recover"):
        activation_patching(model, IDS, IDS, 3)
    with pytest.raises(ValueError, match="resolve it first"):
        _logits(model, IDS, [Intervention("blocks.0.mlp.out", "mean")])


def test_patching_under_an_ablation_patches_the_edited_model(gpt2):
    """The ablations are part of the model patched: a zero-ablated head carries nothing in the clean,
    corrupted or patched run, so patching it recovers exactly 0; the clean and corrupted metrics are
    the edited model's; and with no interventions the tables are the plain ones."""
    hf, loaded = gpt2
    model = loaded.model
    clean, corrupted = IDS[:6], [5, 17, 3, 30, 41, 9]
    answer, wrong = 7, 8
    plain = activation_patching(loaded, clean, corrupted, answer, wrong)
    for none in (None, []):
        same = activation_patching(loaded, clean, corrupted, answer, wrong, interventions=none)
        assert same.clean_metric == plain.clean_metric and same.corrupted_metric == plain.corrupted_metric
        assert (same.resid == plain.resid).all() and (same.heads == plain.heads).all()

    l, h = 1, 0
    ablate = [Intervention(f"blocks.{l}.attn.head.{h}")]
    res = activation_patching(loaded, clean, corrupted, answer, wrong, interventions=ablate)
    assert res.heads[l, h] == 0.0  # nothing flows through it in any run: the patched run is the corrupted one

    def metric(ids):
        return float((_logits(model, ids, ablate)[-1, answer] - _logits(model, ids, ablate)[-1, wrong]).double())
    assert res.clean_metric == pytest.approx(metric(clean), rel=1e-5)
    assert res.corrupted_metric == pytest.approx(metric(corrupted), rel=1e-5)
    assert res.clean_metric != pytest.approx(plain.clean_metric, rel=1e-3)  # the ablation did change the model
    # the whole last residual of the edited clean run restores the edited clean answer exactly
    assert res.resid[-1, -1] == pytest.approx(1.0, abs=1e-6)
    assert res.resid[0, [0, 1, 2, 4, 5]] == pytest.approx(0.0, abs=1e-6)
    # another head, patched by hand under the same ablation
    l2, h2 = 2, 1
    _, trace = model.run_with_trace(torch.tensor([clean]), names=[f"blocks.{l2}.attn.z"], interventions=ablate)
    patch = Intervention(f"blocks.{l2}.attn.head.{h2}", "replace", value=trace[f"blocks.{l2}.attn.z"][0, h2])
    with torch.no_grad():
        logits = model(torch.tensor([corrupted]), interventions=[patch, *ablate]).logits[0]
    m_patch = float(logits[-1, answer].double() - logits[-1, wrong].double())
    want = (m_patch - res.corrupted_metric) / (res.clean_metric - res.corrupted_metric)
    assert res.heads[l2, h2] == pytest.approx(want, rel=2e-4, abs=1e-6)


def test_an_edit_at_resid_mid_of_a_parallel_block_reaches_its_output():
    """GPT-NeoX's parallel block adds (mlp + attn) + input, transformers' order (bfloat16 rounds it
    differently from (input + attn) + mlp); an edited resid_mid is still what its MLP output is added to."""
    from desktop_app.core.families.gpt_neox import preset
    from desktop_app.core.trace import Trace

    cfg = preset(vocab_size=97, d_model=D, n_layers=L, n_heads=H, d_ff=80, context_length=64, rotary_fraction=0.5)
    model = new_model(cfg, seed=0).eval()
    shift = torch.randn(D, generator=torch.Generator().manual_seed(3))

    def run(interventions=None):
        trace = Trace(("blocks.1.*",))
        with torch.no_grad():
            model(torch.tensor([IDS]), trace=trace, interventions=interventions)
        return trace

    clean, edited = run(), run([Intervention("blocks.1.resid_mid", "add", value=shift)])
    torch.testing.assert_close(edited["blocks.1.resid_mid"], clean["blocks.1.resid_mid"] + shift)
    torch.testing.assert_close(edited["blocks.1.resid_post"], clean["blocks.1.resid_post"] + shift)
    torch.testing.assert_close(clean["blocks.1.resid_post"], clean["blocks.1.resid_mid"] + clean["blocks.1.mlp.out"])
