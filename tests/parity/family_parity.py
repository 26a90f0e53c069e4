"""The parity checks every family's test runs against `transformers` (test-only reference).

One call per family: `check_family(make_hf, tmp_path)` with a function that builds a tiny random
`transformers` model. It checks what issue 16 asks of every family: the folder Hugging Face writes
opens here with the same logits (1e-4), every layer's attention pattern (1e-5) and hidden states;
decoders give the same greedy ids as `generate` for 32 steps (through the app's KV-cached
GenerationSession); encoders give the same MLM logits; and a model saved here (perturbed, so the
round trip cannot pass by re-reading Hugging Face's own file) opens with `from_pretrained` again
with the same outputs. The same call checks an encoder-decoder (T5, BART, Marian: decoder logits, the
three kinds of attention map, greedy ids as `generate`'s, the round trip) and an image model (ViT:
pixels in, class logits or the pooler out), by what the model `make_hf()` builds is.

The generated test over the family registry (test_every_family.py) runs it on every case of
family_cases/<model_type>.py.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
import torch

from desktop_app.core.checkpoints import LoadedModel, ModelLoadError, load_model_folder, save_model_folder
from desktop_app.core.generation import GenerationSettings, generate
from seq2seq_decode import greedy_decode
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


def sharpened(hf, factor: float = 12.0):
    """Random q and k weights give scores of ~1e-2, where a soft cap or a score scale changes nothing
    measurable: scaled up (the model's layers' self_attn.q_proj and k_proj), the scores reach several
    units and a part of the score computation left out shows in the logits. Returns hf."""
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(factor)
            layer.self_attn.k_proj.weight.mul_(factor)
    return hf


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
    if hf.config.is_encoder_decoder:
        return check_encoder_decoder(hf, tmp_path, greedy_steps=min(greedy_steps, 10))
    if getattr(hf, "main_input_name", "input_ids") == "pixel_values":
        return check_images(hf, tmp_path)
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


# -- images (ViT) ------------------------------------------------------------------------------


def image_outputs(hf, pixels: torch.Tensor):
    hf.eval()
    hf.config._attn_implementation = "eager"
    with torch.no_grad():
        return hf(pixel_values=pixels, output_hidden_states=True, output_attentions=True)


def compare_images(loaded: LoadedModel, hf_out, pixels: torch.Tensor, what: str) -> None:
    """Our forward pass on the same pixels: hidden states, every pattern over [CLS] + patches, logits
    (or, headless, the last hidden state and the pooler)."""
    trace = Trace()
    with torch.no_grad():
        out = loaded.model(pixels, trace=trace)
    n_patches = (loaded.config.image_size // loaded.config.patch_size) ** 2
    hidden = trace.hidden_states()
    assert len(hidden) == len(hf_out.hidden_states), what
    for i, (a, b) in enumerate(zip(hidden[:-1], hf_out.hidden_states[:-1])):
        assert (a - b).abs().max().item() < LOGITS_TOL, f"{what} hidden state {i}"
    assert len(hf_out.attentions) == loaded.config.n_layers
    for layer, pattern in enumerate(hf_out.attentions):
        ours = trace.pattern(layer)
        assert ours.shape == pattern.shape == (pixels.shape[0], loaded.config.n_heads, 1 + n_patches, 1 + n_patches)
        err = (ours - pattern).abs().max().item()
        assert err < PATTERN_TOL, f"{what} attention pattern of layer {layer}: {err:.2e}"
    if getattr(hf_out, "logits", None) is not None:
        assert out.logits.shape == hf_out.logits.shape
        err = (out.logits - hf_out.logits).abs().max().item()
        assert err < LOGITS_TOL, f"{what} logits: {err:.2e}"
    else:
        assert out.logits is None
        err = (trace.hidden_states()[-1] - hf_out.last_hidden_state).abs().max().item()
        assert err < LOGITS_TOL, f"{what} last hidden state: {err:.2e}"
        if hf_out.pooler_output is not None:
            err = (trace["pooler"] - hf_out.pooler_output).abs().max().item()
            assert err < LOGITS_TOL, f"{what} pooler: {err:.2e}"
        else:
            assert "pooler" not in trace


def check_images(hf, tmp_path: Path) -> LoadedModel:
    hf.save_pretrained(tmp_path / "hf")
    loaded = load_model_folder(tmp_path / "hf")
    c = hf.config
    pixels = torch.randn(2, c.num_channels, c.image_size, c.image_size)
    compare_images(loaded, image_outputs(hf, pixels), pixels, "from transformers:")

    with torch.no_grad():  # perturb, save here, open in transformers again
        for p in loaded.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    save_model_folder(loaded.model, tmp_path / "ours")
    hf2 = type(hf).from_pretrained(tmp_path / "ours", **({} if hasattr(hf, "classifier") else
                                                          {"add_pooling_layer": hf.pooler is not None}))
    compare_images(loaded, image_outputs(hf2, pixels), pixels, "saved here:")
    assert load_model_folder(tmp_path / "ours").config == loaded.config
    return loaded


# -- encoder-decoders (T5, BART, Marian) -------------------------------------------------------


def randomise_biases(hf):
    """transformers starts final_logits_bias (and LayerNorm biases) at zero: give them values, so that a
    bias read from the wrong place or not at all shows in the logits. Returns hf."""
    with torch.no_grad():
        for name, t in hf.named_buffers():
            if name.endswith("final_logits_bias"):
                t.normal_(0.0, 0.5)
        for name, p in hf.named_parameters():
            if "layer_norm" in name or "layernorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return hf


def seq2seq_inputs(vocab: int, seed: int = 1):
    """(source, target, source mask): two rows, the second source padded (masked keys in the encoder
    and the cross-attention); ids from 3 to vocab - 2 (0..2 and the last are often special)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab - 1, (2, 9), generator=g)
    tgt = torch.randint(3, vocab - 1, (2, 6), generator=g)
    src_mask = torch.ones_like(src)
    src_mask[1, -3:] = 0
    return src, tgt, src_mask


def compare_seq2seq(model, hf, src, tgt, src_mask, what: str) -> None:
    """Decoder logits (with and without a trace), every attention map of the three kinds and the
    encoder's output against `hf` (eager attention) on the same source and target."""
    trace = Trace()
    with torch.no_grad():
        ours = model(src, tgt, src_mask=src_mask, trace=trace)
        ref = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, output_attentions=True,
                 output_hidden_states=True)
    err = (ours.logits - ref.logits).abs().max().item()
    assert err < LOGITS_TOL, f"{what} logits: {err:.2e}"
    with torch.no_grad():  # without a trace: the fused attention path (T5's bias as an additive mask)
        err = (model(src, tgt, src_mask=src_mask).logits - ref.logits).abs().max().item()
    assert err < LOGITS_TOL, f"{what} logits without a trace: {err:.2e}"
    real = src_mask.bool()
    kinds = (("encoder", "attn", ref.encoder_attentions, model.cfg.n_layers),
             ("decoder", "attn", ref.decoder_attentions, model.cfg.n_decoder_layers),
             ("decoder", "cross_attn", ref.cross_attentions, model.cfg.n_decoder_layers))
    for stack, kind, maps, n in kinds:
        assert len(maps) == n, f"{what} {stack} {kind}: {len(maps)} layers"
        for layer, theirs in enumerate(maps):
            mine = trace[f"{stack}.blocks.{layer}.{kind}.pattern"]
            assert mine.shape == theirs.shape, f"{what} {stack}.{layer}.{kind}"
            if stack == "encoder":  # a padded query's row is not a real token's: compare real rows
                mine, theirs = mine[real[:, None, :, None].expand_as(mine)], theirs[real[:, None, :, None].expand_as(theirs)]
            err = (mine - theirs).abs().max().item()
            assert err < PATTERN_TOL, f"{what} {stack} layer {layer} {kind} pattern: {err:.2e}"
    enc = trace["encoder.final_norm.out"] if model.cfg.final_norm else trace[f"encoder.blocks.{model.cfg.n_layers - 1}.resid_post"]
    err = (enc - ref.encoder_last_hidden_state)[real].abs().max().item()
    assert err < LOGITS_TOL, f"{what} encoder output: {err:.2e}"


def check_encoder_decoder(hf, tmp_path: Path, greedy_steps: int = 10) -> LoadedModel:
    """An encoder-decoder folder opens with transformers' outputs, decodes greedily as `generate`, and
    a model saved here (perturbed) opens in transformers with the same outputs."""
    hf.eval()
    hf.set_attn_implementation("eager")  # attention probabilities only come from the eager path
    hf.save_pretrained(tmp_path / "hf")
    loaded = load_model_folder(tmp_path / "hf")
    src, tgt, src_mask = seq2seq_inputs(hf.config.vocab_size)
    compare_seq2seq(loaded.model, hf, src, tgt, src_mask, "from transformers:")
    with torch.no_grad():
        ref = hf.generate(src[:1], max_new_tokens=greedy_steps, num_beams=1, do_sample=False, eos_token_id=None,
                          pad_token_id=hf.config.pad_token_id, forced_eos_token_id=None, forced_bos_token_id=None,
                          bad_words_ids=None, no_repeat_ngram_size=0, repetition_penalty=1.0, min_length=0,
                          decoder_start_token_id=loaded.config.decoder_start_token_id)[0, 1:].tolist()
    assert greedy_decode(loaded.model, src[0], greedy_steps) == ref

    with torch.no_grad():  # perturb (the logits bias too), save here, open in transformers again
        for p in loaded.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    save_model_folder(loaded.model, tmp_path / "ours")
    back = type(hf).from_pretrained(tmp_path / "ours").eval()
    back.set_attn_implementation("eager")
    compare_seq2seq(loaded.model, back, src, tgt, src_mask, "saved here:")
    return loaded


def check_config_edit_refused(make_hf: Callable, edit: Callable[[dict], None], message: str, tmp_path: Path) -> None:
    """The folder transformers writes for make_hf(), its config.json edited by edit(d), is refused on load
    with one line that names config.json and matches `message` (a field this app does not compute)."""
    make_hf().save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    edit(d)
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ModelLoadError, match=message) as err:
        load_model_folder(tmp_path)
    assert "config.json" in str(err.value) and "\n" not in str(err.value)
