"""Sparse dictionaries against SAELens itself (test-only reference: pip install sae-lens).

Small random dictionaries that SAELens builds and saves (standard, JumpReLU, TopK, a transcoder and a
skip transcoder) at several hooks of random GPT-2 and LLaMA folders that `transformers` saves: the app's
feature activations equal SAELens' `encode` of the activations `transformers` computes (taken with
forward hooks on its modules), within 1e-5 relative, and its reconstructions SAELens' `decode`; SAELens
loads a dictionary the app trained and computes the same activations.
"""
from __future__ import annotations

import pytest
import torch

sae_lens = pytest.importorskip("sae_lens")
transformers = pytest.importorskip("transformers")

from sae_lens import SAE  # noqa: E402
from sae_lens.saes.sae import SAEMetadata  # noqa: E402

from desktop_app.app.features import features_on, open_dictionary  # noqa: E402
from desktop_app.core.checkpoints import load_model_folder  # noqa: E402
from desktop_app.core.features.dictionary import DictionaryError, load_dictionary, save_dictionary  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
REL = 1e-5


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=32, n_embd=48, n_layer=3, n_head=4)
    return transformers.GPT2LMHeadModel(cfg)


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=80, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg)


def _modules(hf, layer: int) -> dict:
    """The transformers modules whose inputs / outputs are each TransformerLens hook of `layer`."""
    if isinstance(hf, transformers.GPT2LMHeadModel):
        b = hf.transformer.h[layer]
        return {"block": b, "attn": b.attn, "o_proj": b.attn.c_proj, "norm2": b.ln_2, "mlp": b.mlp}
    b = hf.model.layers[layer]
    return {"block": b, "attn": b.self_attn, "o_proj": b.self_attn.o_proj, "norm2": b.post_attention_layernorm,
            "mlp": b.mlp}


def _first(x):
    return x[0] if isinstance(x, tuple) else x


def hf_activation(hf, ids: list[int], hook: str) -> torch.Tensor:
    """[T, width] of a TransformerLens hook computed by transformers (forward hooks on its modules)."""
    parts = hook.split(".")
    layer, what = int(parts[1]), ".".join(parts[2:])
    m = _modules(hf, layer)
    got = {}

    def pre(key):
        def f(module, args, kwargs):
            got[key] = (args[0] if args else kwargs["hidden_states"]).detach()
        return f

    def post(key):
        def f(module, args, out):
            got[key] = _first(out).detach()
        return f

    where = {"hook_resid_pre": (m["block"], pre, "pre"), "hook_resid_post": (m["block"], post, "post"),
             "hook_attn_out": (m["attn"], post, "post"), "hook_mlp_out": (m["mlp"], post, "post"),
             "hook_resid_mid": (m["norm2"], pre, "pre"), "ln2.hook_normalized": (m["norm2"], pre, "pre"),
             "attn.hook_z": (m["o_proj"], pre, "pre")}[what]
    module, make, kind = where
    handle = (module.register_forward_pre_hook(make(what), with_kwargs=True) if kind == "pre"
              else module.register_forward_hook(make(what)))
    try:
        with torch.no_grad():
            hf(torch.tensor([ids]))
    finally:
        handle.remove()
    x = got[what][0].float()
    if what == "ln2.hook_normalized":  # TransformerLens': the norm's input before its gain and bias
        if isinstance(hf, transformers.GPT2LMHeadModel):
            x = x - x.mean(-1, keepdim=True)
        x = x / (x.pow(2).mean(-1, keepdim=True) + _eps(m["norm2"])).sqrt()
    return x


def _eps(norm) -> float:
    return norm.eps if hasattr(norm, "eps") else norm.variance_epsilon


def _randomize(sae, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            scale = 0.3 if name.startswith("W_") else 0.1
            p.copy_(torch.randn(p.shape, generator=g) * scale)
            if name == "threshold":
                p.copy_(torch.rand(p.shape, generator=g) * 0.2)


def saelens_dictionary(kind: str, hook: str, d_in: int, folder, seed: int = 0, hook_out: str | None = None,
                       d_out: int | None = None, **extra):
    """A random dictionary built and saved by SAELens itself."""
    from sae_lens.saes.jumprelu_sae import JumpReLUSAEConfig
    from sae_lens.saes.standard_sae import StandardSAEConfig
    from sae_lens.saes.topk_sae import TopKSAEConfig
    from sae_lens.saes.transcoder import SkipTranscoderConfig, TranscoderConfig

    meta = SAEMetadata(hook_name=hook, **({"hook_name_out": hook_out} if hook_out else {}))
    d_sae = 40
    cfg = {"standard": lambda: StandardSAEConfig(d_in=d_in, d_sae=d_sae, metadata=meta, **extra),
           "jumprelu": lambda: JumpReLUSAEConfig(d_in=d_in, d_sae=d_sae, metadata=meta, **extra),
           "topk": lambda: TopKSAEConfig(d_in=d_in, d_sae=d_sae, k=6, metadata=meta, **extra),
           "transcoder": lambda: TranscoderConfig(d_in=d_in, d_sae=d_sae, d_out=d_out, metadata=meta,
                                                  apply_b_dec_to_input=False),
           "skip_transcoder": lambda: SkipTranscoderConfig(d_in=d_in, d_sae=d_sae, d_out=d_out, metadata=meta,
                                                           apply_b_dec_to_input=False)}[kind]()
    sae = SAE.from_dict(cfg.to_dict())
    _randomize(sae, seed)
    sae.save_model(folder)
    return SAE.load_from_disk(folder)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = {}
    for name, make in (("gpt2", _gpt2), ("llama", _llama)):
        torch.manual_seed(0)
        hf = make().eval()
        folder = tmp_path_factory.mktemp(name)
        hf.save_pretrained(folder, safe_serialization=True)
        out[name] = (hf, load_model_folder(folder))
    return out


IDS = [3, 17, 42, 5, 88, 13, 61, 2, 9, 70, 33, 21]
CASES = [
    ("gpt2", "standard", "blocks.1.hook_resid_post", {}),
    ("gpt2", "jumprelu", "blocks.0.hook_mlp_out", {}),
    ("gpt2", "topk", "blocks.2.hook_attn_out", {}),
    ("gpt2", "standard", "blocks.1.hook_resid_pre", {"apply_b_dec_to_input": False}),
    ("gpt2", "standard", "blocks.2.hook_resid_mid", {"normalize_activations": "constant_norm_rescale"}),
    ("gpt2", "topk", "blocks.1.attn.hook_z", {}),
    ("gpt2", "topk", "blocks.0.hook_resid_post", {"rescale_acts_by_decoder_norm": True}),
    ("llama", "standard", "blocks.2.hook_resid_post", {"normalize_activations": "layer_norm"}),
    ("llama", "jumprelu", "blocks.1.hook_resid_mid", {}),
    ("llama", "topk", "blocks.0.hook_mlp_out", {}),
    ("llama", "jumprelu", "blocks.2.attn.hook_z", {}),
]


def _close(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    ours, theirs = ours.detach(), theirs.detach().reshape(ours.shape).float()
    err = float((ours - theirs).abs().max())
    assert err <= REL * max(float(theirs.abs().max()), 1e-12), f"{what}: max |diff| {err:.3g} " \
                                                              f"(scale {float(theirs.abs().max()):.3g})"


@pytest.mark.parametrize("family,kind,hook,extra", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" + ("-" + "-".join(c[3])
                                                                                           if c[3] else "")
                                                              for c in CASES])
def test_activations_and_reconstructions_equal_saelens(models, tmp_path, family, kind, hook, extra):
    hf, loaded = models[family]
    cfg = loaded.config
    d_in = cfg.n_heads * cfg.d_head if hook.endswith("hook_z") else cfg.d_model
    sae = saelens_dictionary(kind, hook, d_in, tmp_path / "sae", **extra)
    att = open_dictionary(tmp_path / "sae", loaded)
    run = features_on(loaded, IDS, [att])[0]
    x = hf_activation(hf, IDS, hook)
    if sae.cfg.reshape_activations == "hook_z":
        x = x.reshape(len(IDS), cfg.n_heads, cfg.d_head)
    with torch.no_grad():
        acts = sae.encode(x)
        recon = sae.decode(acts)
    assert float(acts.abs().sum()) > 0, "the random dictionary fired nowhere: the comparison would be empty"
    _close(run.acts, acts, f"{kind} at {hook}: feature activations")
    _close(run.recon, recon, f"{kind} at {hook}: reconstructions")


@pytest.mark.parametrize("family,kind,hook,hook_out", [
    ("gpt2", "transcoder", "blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"),
    ("gpt2", "skip_transcoder", "blocks.0.hook_resid_mid", "blocks.0.hook_mlp_out"),
    ("llama", "skip_transcoder", "blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out"),
])
def test_transcoders_equal_saelens(models, tmp_path, family, kind, hook, hook_out):
    hf, loaded = models[family]
    d = loaded.config.d_model
    sae = saelens_dictionary(kind, hook, d, tmp_path / "tc", hook_out=hook_out, d_out=d)
    att = open_dictionary(tmp_path / "tc", loaded)
    assert att.read.name != att.write.name
    run = features_on(loaded, IDS, [att])[0]
    x = hf_activation(hf, IDS, hook)
    with torch.no_grad():
        acts = sae.encode(x)
        recon = sae(x)  # decode, plus the skip connection of a skip transcoder
    _close(run.acts, acts, f"{kind}: feature activations")
    _close(run.recon, recon, f"{kind}: outputs")
    _close(run.target, hf_activation(hf, IDS, hook_out), f"{kind}: the activation it writes")


def test_saelens_loads_a_dictionary_trained_here(tmp_path):
    from desktop_app.core.features import load_dictionary
    from desktop_app.core.training.sae import SaeTrainConfig, train_sae
    from desktop_app.paths import resources_dir

    loaded = load_model_folder(resources_dir() / "demo-model")
    text = tmp_path / "t.txt"
    text.write_text((resources_dir() / "demo-text.txt").read_text(encoding="utf-8")[:3000], encoding="utf-8")
    for arch in ("topk", "relu"):
        out = tmp_path / arch
        train_sae(SaeTrainConfig(text_file=str(text), hook="blocks.1.hook_resid_post", architecture=arch, d_sae=64,
                                 k=8, steps=20, batch_size=64), loaded, out)
        sae = SAE.load_from_disk(out)
        assert sae.cfg.metadata.hook_name == "blocks.1.hook_resid_post"
        assert sae.cfg.metadata.prepend_bos is False  # windows of the text, no BOS put before each (issue 41)
        att = open_dictionary(out, loaded)
        run = features_on(loaded, IDS, [att])[0]
        _, trace = loaded.model.run_with_trace(torch.tensor([IDS]), names=["blocks.1.resid_post"])
        with torch.no_grad():
            theirs = sae.encode(trace["blocks.1.resid_post"][0])
        assert float(theirs.abs().sum()) > 0
        _close(run.acts, theirs, f"{arch} trained here, read by SAELens")
        _close(load_dictionary(out).decode(run.acts), sae.decode(theirs), f"{arch}: decode")
    # a transcoder trained here (MLP input -> MLP output): SAELens reads it as one, with the same features
    out = tmp_path / "transcoder"
    train_sae(SaeTrainConfig(text_file=str(text), hook="blocks.1.ln2.hook_normalized", hook_out="blocks.1.hook_mlp_out",
                             architecture="relu", l1_coefficient=0.5, d_sae=64, steps=20, batch_size=64), loaded, out)
    sae = SAE.load_from_disk(out)
    assert type(sae).__name__ == "Transcoder" and sae.cfg.metadata.hook_name_out == "blocks.1.hook_mlp_out"
    run = features_on(loaded, IDS, [open_dictionary(out, loaded)])[0]
    _, trace = loaded.model.run_with_trace(torch.tensor([IDS]), names=["blocks.1.resid_mid"])
    assert loaded.config.norm == "layernorm"  # ln2.hook_normalized: resid_mid before ln2's gain and bias
    normalized = torch.nn.functional.layer_norm(trace["blocks.1.resid_mid"][0], (loaded.config.d_model,),
                                                eps=loaded.config.norm_eps)
    with torch.no_grad():
        theirs = sae.encode(normalized)
    _close(run.acts, theirs, "transcoder trained here, read by SAELens")
    _close(run.recon, sae.decode(theirs), "transcoder: decode")


# -- issue 41: gated SAEs, architectures by name, cfg.json as SAELens reads it ------------------------


def test_a_gated_sae_computes_as_saelens_does(tmp_path):
    """SAELens' own GatedSAE (b_gate, b_mag, r_mag): the app's activations and reconstructions equal its
    encode / decode (before: refused with "has no tensor 'b_enc'"); saved back, SAELens reads the same."""
    from sae_lens.saes.gated_sae import GatedSAEConfig

    meta = SAEMetadata(hook_name="blocks.1.hook_resid_post")
    sae = SAE.from_dict(GatedSAEConfig(d_in=48, d_sae=40, metadata=meta).to_dict())
    _randomize(sae, 5)
    sae.save_model(tmp_path / "gated")
    d = load_dictionary(tmp_path / "gated")
    assert d.architecture == "gated"
    x = torch.randn(20, 48, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = sae.encode(x)
    ours = d.encode(x)
    assert 0 < int((theirs != 0).sum()) < theirs.numel()
    assert torch.equal(ours != 0, theirs != 0)
    _close(ours, theirs, "gated encode")
    _close(d.decode(ours), sae.decode(theirs), "gated decode")
    save_dictionary(d, tmp_path / "again")
    again = SAE.load_from_disk(tmp_path / "again")
    with torch.no_grad():
        _close(ours, again.encode(x), "gated saved here, read by SAELens")


def test_any_other_architecture_is_refused_by_its_name(tmp_path):
    from sae_lens.saes.matching_pursuit_sae import MatchingPursuitSAEConfig

    meta = SAEMetadata(hook_name="blocks.1.hook_resid_post")
    SAE.from_dict(MatchingPursuitSAEConfig(d_in=48, d_sae=40, metadata=meta).to_dict()).save_model(tmp_path / "mp")
    with pytest.raises(DictionaryError, match=r"cfg.json: architecture 'matching_pursuit' is not one the app computes"):
        load_dictionary(tmp_path / "mp")


def test_a_cfg_without_architecture_is_read_as_saelens_reads_it(tmp_path):
    """SAELens 6's cfg.json must name its architecture (SAELens refuses one that does not, and so does the
    app; before, a TopK dictionary was computed as a standard one); an older one is a standard SAE that
    subtracts b_dec first, as SAELens computes it."""
    import json

    meta = SAEMetadata(hook_name="blocks.1.hook_resid_post")
    from sae_lens.saes.topk_sae import TopKSAEConfig

    sae = SAE.from_dict(TopKSAEConfig(d_in=48, d_sae=40, k=6, metadata=meta).to_dict())
    _randomize(sae, 2)
    sae.save_model(tmp_path / "topk")
    cfg_path = tmp_path / "topk" / "cfg.json"
    cfg = json.loads(cfg_path.read_text())
    del cfg["architecture"]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(Exception):
        SAE.load_from_disk(tmp_path / "topk")  # the reference refuses it
    with pytest.raises(DictionaryError, match="names no architecture"):
        load_dictionary(tmp_path / "topk")
    # an older cfg.json (no sae_lens_version, no apply_b_dec_to_input): standard, b_dec subtracted
    old = {"d_in": 48, "d_sae": 40, "hook_name": "blocks.1.hook_resid_post", "dtype": "float32", "device": "cpu"}
    cfg_path.write_text(json.dumps(old))
    reference = SAE.load_from_disk(tmp_path / "topk")
    d = load_dictionary(tmp_path / "topk")
    assert (d.architecture, d.apply_b_dec_to_input) == ("standard", True)
    x = torch.randn(10, 48, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _close(d.encode(x), reference.encode(x), "an older cfg.json")


def test_an_encoder_decoders_unknown_hook_names_its_stacks():
    from desktop_app.core.families import REGISTRY
    from desktop_app.core.features.hooks import hook_point

    cfg = REGISTRY["t5"].preset(vocab_size=40, d_model=16, n_layers=2, n_decoder_layers=1, n_heads=2, d_ff=32,
                                context_length=16)
    with pytest.raises(ValueError) as info:
        hook_point("blocks.0.hook_bogus", cfg)
    assert "encoder.blocks" in str(info.value) and "decoder.blocks" in str(info.value) and "\n" not in str(info.value)
