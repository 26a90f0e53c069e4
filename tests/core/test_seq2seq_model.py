"""The encoder-decoder model itself (core/seq2seq.py), issue 28: cached decoding, trace names and shapes,
head ablation of the three attention kinds, training, folders, and the config checks of its switches.
Parity with transformers: tests/parity/test_seq2seq_parity.py."""
from __future__ import annotations

import copy

import pytest
import torch

from desktop_app.core.checkpoints import load_model_folder, new_model, save_model_folder
from desktop_app.core.config import ConfigError, ModelConfig
from desktop_app.core.families import REGISTRY, encoder_decoder_problem
from desktop_app.core.interventions import Intervention
from desktop_app.core.seq2seq import EncoderDecoder, greedy_batch
from seq2seq_decode import beam_decode, greedy_decode
from desktop_app.core.trace import Trace

# init_std 0.2: weights large enough that every head's output shows in the logits (post-LN BART included)
SMALL = dict(vocab_size=40, d_model=32, n_layers=2, n_decoder_layers=3, n_heads=4, d_ff=48, context_length=24,
             init_std=0.2)
PRESETS = {
    "t5_v1_0": lambda: REGISTRY["t5"].preset(**SMALL, relative_buckets=8, relative_max_distance=12),
    "t5_v1_1": lambda: REGISTRY["t5"].preset(**SMALL, relative_buckets=8, relative_max_distance=12,
                                             activation="geglu", tie_embeddings=False),
    "bart": lambda: REGISTRY["bart"].preset(**SMALL),
    "marian": lambda: REGISTRY["marian"].preset(**SMALL),  # scaled embeddings: opus-mt's scale_embedding
}


def model_of(name: str, seed: int = 0) -> EncoderDecoder:
    model = new_model(PRESETS[name](), seed=seed).eval()
    with torch.no_grad():  # biases and norms away from their initial zeros and ones
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
        if model.cfg.final_logits_bias:
            model.lm_bias.normal_()
    return model


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 40, (2, 7), generator=g)
    tgt = torch.randint(3, 40, (2, 5), generator=g)
    mask = torch.ones_like(src)
    mask[0, -2:] = 0
    return src, tgt, mask


@pytest.mark.parametrize("name", list(PRESETS))
def test_step_by_step_decoding_with_the_cache_gives_the_teacher_forced_logits(name):
    model = model_of(name)
    src, tgt, mask = batch()
    with torch.no_grad():
        full = model(src, tgt, src_mask=mask).logits
        enc = model.encode(src, src_mask=mask)
        cache = model.new_cache()
        steps = [model.decode(tgt[:, i:i + 1], enc, src_mask=mask, cache=cache).logits for i in range(tgt.shape[1])]
        # two tokens, then the rest: a cache filled by more than one token at a time
        cache2 = model.new_cache()
        parts = [model.decode(tgt[:, :2], enc, src_mask=mask, cache=cache2).logits,
                 model.decode(tgt[:, 2:], enc, src_mask=mask, cache=cache2).logits]
    assert cache.length == tgt.shape[1]
    assert (torch.cat(steps, 1) - full).abs().max() < 1e-5
    assert (torch.cat(parts, 1) - full).abs().max() < 1e-5


def test_the_trace_names_every_stack_and_the_three_kinds_of_attention():
    model = model_of("marian")
    src, tgt, mask = batch()
    out, trace = model.run_with_trace(src, tgt, src_mask=mask)
    H, S, T = model.cfg.n_heads, src.shape[1], tgt.shape[1]
    assert trace["encoder.embed"].shape == (2, S, 32) and trace["decoder.embed"].shape == (2, T, 32)
    for l in range(model.cfg.n_layers):
        assert trace[f"encoder.blocks.{l}.attn.pattern"].shape == (2, H, S, S)
        assert trace[f"encoder.blocks.{l}.resid_post"].shape == (2, S, 32)
    for l in range(model.cfg.n_decoder_layers):
        self_p = trace[f"decoder.blocks.{l}.attn.pattern"]
        cross = trace[f"decoder.blocks.{l}.cross_attn.pattern"]
        assert self_p.shape == (2, H, T, T) and cross.shape == (2, H, T, S)
        assert torch.equal(self_p.triu(1), torch.zeros_like(self_p))  # causal
        assert torch.allclose(cross.sum(-1), torch.ones(2, H, T))
        assert cross[0, :, :, -2:].abs().max() == 0  # the padded source tokens are never read
        assert trace[f"decoder.blocks.{l}.cross_attn.z"].shape == (2, H, T, model.cfg.d_head)
        assert trace[f"decoder.blocks.{l}.cross_attn.out"].shape == (2, T, 32)
        assert trace[f"decoder.blocks.{l}.resid_post"].shape == (2, T, 32)
    last = model.cfg.n_decoder_layers - 1
    assert torch.equal(trace[f"decoder.blocks.{last}.resid_post"], out.hidden)
    assert torch.equal(trace["logits"], out.logits)
    assert torch.equal(trace[f"encoder.blocks.{model.cfg.n_layers - 1}.resid_post"], out.encoder_hidden)


def _without_head(model: EncoderDecoder, module: str, head: int) -> EncoderDecoder:
    """A copy whose attention `module` (e.g. decoder.blocks.1.cross_attn) has head `head`'s W_O columns zeroed."""
    other = copy.deepcopy(model)
    attn = other.get_submodule(module)
    dh = other.cfg.d_head
    with torch.no_grad():
        attn.o.weight[:, head * dh:(head + 1) * dh] = 0
    return other


@pytest.mark.parametrize("module", ["encoder.blocks.1.attn", "decoder.blocks.0.attn", "decoder.blocks.2.cross_attn"])
@pytest.mark.parametrize("name", ["t5_v1_0", "bart"])
def test_ablating_a_head_of_each_kind_is_removing_its_output(name, module):
    model = model_of(name)
    src, tgt, mask = batch(1)
    ablate = [Intervention(f"{module}.head.2")]
    with torch.no_grad():
        clean = model(src, tgt, src_mask=mask).logits
        edited = model(src, tgt, src_mask=mask, interventions=ablate).logits
        reference = _without_head(model, module, 2)(src, tgt, src_mask=mask).logits
    assert (edited - clean).abs().max() > 1e-3
    assert (edited - reference).abs().max() < 1e-5
    # and through the cache, one token at a time
    with torch.no_grad():
        enc = model.encode(src, src_mask=mask, interventions=ablate)
        cache = model.new_cache()
        steps = torch.cat([model.decode(tgt[:, i:i + 1], enc, src_mask=mask, cache=cache, interventions=ablate).logits
                           for i in range(tgt.shape[1])], 1)
    assert (steps - reference).abs().max() < 1e-5


def test_an_edit_target_names_its_stack_and_layer_range():
    cfg = PRESETS["bart"]()
    Intervention("decoder.blocks.2.cross_attn.head.3").check(cfg)  # 3 decoder layers
    with pytest.raises(ValueError, match="layers 0..1"):
        Intervention("encoder.blocks.2.attn.head.0").check(cfg)  # 2 encoder layers
    assert Intervention("decoder.blocks.1.cross_attn.head.0").point == "decoder.blocks.1.cross_attn.z"
    assert Intervention("blocks.1.attn.head.0").point == "blocks.1.attn.z"


def test_the_marian_preset_scales_its_embeddings_as_opus_mt_does():
    assert REGISTRY["marian"].preset(d_model=64).embed_scale == 8.0
    assert REGISTRY["marian"].preset(d_model=64, embed_scale=None).embed_scale is None


def test_a_marian_model_built_here_trains():
    """new_model gives a trainable encoder-decoder: teacher forcing on a copy batch lowers the loss
    (the trainer proper is core/training's; this checks the model's gradients reach every part)."""
    cfg = REGISTRY["marian"].preset(vocab_size=12, d_model=32, n_layers=1, n_heads=4, d_ff=64, context_length=16)
    model = new_model(cfg, seed=0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    src = torch.randint(2, 12, (16, 6), generator=torch.Generator().manual_seed(0))
    decoder_input = torch.cat([torch.full((16, 1), cfg.decoder_start_token_id), src[:, :-1]], 1)
    losses = []
    for _ in range(30):
        logits = model(src, decoder_input).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 12), src.reshape(-1))
        opt.zero_grad()
        loss.backward()
        if not losses:  # every weight gets a gradient: the encoder through cross-attention too
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_model_built_here_is_saved_under_transformers_names_and_reopens_exactly(name, tmp_path):
    model = model_of(name)
    assert REGISTRY[model.cfg.family].hf_compatible(model.cfg)
    save_model_folder(model, tmp_path / "m")
    loaded = load_model_folder(tmp_path / "m")
    src, tgt, mask = batch(2)
    with torch.no_grad():
        assert torch.equal(loaded.model(src, tgt, src_mask=mask).logits, model(src, tgt, src_mask=mask).logits)
    assert greedy_decode(loaded.model, src[0], 6) == greedy_decode(model, src[0], 6)
    assert beam_decode(loaded.model, src[0], 6, 2) == beam_decode(model, src[0], 6, 2)


@pytest.mark.parametrize("name, change", [("t5_v1_0", dict(norm="layernorm", activation="silu")),
                                          ("marian", dict(norm_placement="pre", final_norm=True, positions="learned")),
                                          ("bart", dict(relative_buckets=4, attention_kind="l2"))])
def test_a_model_transformers_cannot_hold_is_saved_with_our_names_and_reopens_exactly(name, change, tmp_path):
    model = new_model(PRESETS[name]().replace(**change), seed=0).eval()
    assert not REGISTRY[model.cfg.family].hf_compatible(model.cfg)
    save_model_folder(model, tmp_path / "m")
    loaded = load_model_folder(tmp_path / "m")
    assert loaded.config == model.cfg
    src, tgt, mask = batch(3)
    with torch.no_grad():
        assert torch.equal(loaded.model(src, tgt, src_mask=mask).logits, model(src, tgt, src_mask=mask).logits)


def test_a_folder_with_weights_for_a_decoder_layer_the_config_lacks_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from desktop_app.core.checkpoints import ModelLoadError
    model = model_of("bart")
    save_model_folder(model, tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    sd = load_file(weights)
    sd["model.decoder.layers.3.fc1.weight"] = sd["model.decoder.layers.0.fc1.weight"].clone()
    save_file(sd, str(weights), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"holds weights for layer\(s\) 3 .*model.decoder.layers.3.fc1.weight"):
        load_model_folder(tmp_path / "m")


def test_only_the_encoder_decoders_with_a_family_open():
    for model_type in ("t5", "bart", "marian"):
        assert encoder_decoder_problem({"model_type": model_type, "is_encoder_decoder": True}) is None
    for config in ({"model_type": "pegasus"}, {"model_type": "mbart"}, {"model_type": "bert", "is_encoder_decoder": True}):
        assert encoder_decoder_problem(config) == f"encoder-decoder models ({config['model_type']}) are not supported yet"


@pytest.mark.parametrize("change, message", [
    (dict(relative_buckets=-1), "relative_buckets must be a non-negative integer"),
    (dict(sinusoidal_layout="spiral"), "unknown sinusoidal layout 'spiral'"),
    (dict(lm_head_scale=0.0), "lm_head_scale must be a positive finite number"),
    (dict(lm_head_scale=float("nan")), "lm_head_scale must be a positive finite number"),
    (dict(n_decoder_layers=0), "n_decoder_layers must be a positive integer"),
    (dict(n_decoder_layers=10 ** 6), "n_decoder_layers 1,000,000 is beyond"),
    (dict(relative_max_distance=0), "relative_max_distance must be a positive integer"),
    (dict(decoder_start_token_id=1.5), "decoder_start_token_id must be an integer or null"),
    (dict(final_logits_bias=1), "final_logits_bias must be true or false"),
    (dict(causal=False), "its decoder is causal"),
    (dict(positions="rotary"), "rotary positions"),
])
def test_every_new_config_field_is_checked_where_declared(change, message):
    base = PRESETS["t5_v1_0"]().to_dict()
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**{**base, **change})


def test_relative_buckets_belong_to_encoder_decoders_and_the_parameter_estimate_counts_both_stacks():
    with pytest.raises(ConfigError, match="relative position buckets are for encoder-decoders"):
        ModelConfig.gpt2(relative_buckets=8)
    for name in PRESETS:
        model = model_of(name)
        n = model.num_parameters()
        assert abs(model.cfg.parameter_estimate() - n) <= 0.02 * n, name


def test_decoding_without_a_start_token_or_past_the_context_says_so():
    model = new_model(REGISTRY["bart"].preset(**{**SMALL, "context_length": 8}, decoder_start_token_id=None))
    with pytest.raises(ValueError, match="no decoder_start_token_id"):
        greedy_decode(model, [5, 6, 7], 3)
    with pytest.raises(ValueError, match="source of 9 tokens exceeds the context length 8"):
        model.encode(torch.arange(9))
    with pytest.raises(ValueError, match="target of 9 tokens exceeds the context length 8"):
        model.decode(torch.arange(9), model.encode(torch.arange(3)))
    with pytest.raises(ValueError, match="the source is empty: the encoder needs at least one token"):
        model.encode(torch.zeros(1, 0, dtype=torch.long))
    enc, cache = model.encode(torch.arange(3)), model.new_cache()
    model.decode(torch.tensor([2]), enc, cache=cache)
    with pytest.raises(ValueError, match="the target is empty: the decoder needs at least one token"):
        model.decode(torch.zeros(1, 0, dtype=torch.long), enc, cache=cache)


def test_a_trace_only_records_what_it_asks_for():
    model = model_of("t5_v1_1")
    src, tgt, _ = batch()
    trace = Trace(["decoder.blocks.*.cross_attn.pattern"])
    with torch.no_grad():
        model(src, tgt, trace=trace)
    assert sorted(trace.keys()) == [f"decoder.blocks.{l}.cross_attn.pattern" for l in range(3)]
    _, lazy = model.run_with_trace(src, tgt, ["decoder.blocks.1.cross_attn.head_out"], lazy=True,
                                   pattern_dtype=torch.float16)
    assert lazy["decoder.blocks.1.cross_attn.head_out"].shape == (2, 4, 5, 32)


def test_decoding_arguments_are_checked():
    model = model_of("marian")
    assert greedy_decode(model, [4, 5], 0) == [] and beam_decode(model, [4, 5], 0, 3) == []
    with pytest.raises(ValueError, match="new tokens must be a non-negative integer, got -1"):
        greedy_decode(model, [4, 5], -1)
    with pytest.raises(ValueError, match="beams: must be an integer from 1 to 1,000,000,000, got 0"):
        beam_decode(model, [4, 5], 3, 0)
    with pytest.raises(ValueError, match=r"length_penalty: must be in \[-10, 10\], got nan"):
        beam_decode(model, [4, 5], 3, 2, length_penalty=float("nan"))
    with pytest.raises(ValueError, match="early_stopping must be true, false or 'never'"):
        beam_decode(model, [4, 5], 3, 2, early_stopping="sometimes")
    # one beam is greedy search
    assert beam_decode(model, [4, 5, 6], 6, 1) == greedy_decode(model, [4, 5, 6], 6)


@pytest.mark.parametrize("stack, kind", [("encoder", "attn"), ("decoder", "cross_attn")])
def test_head_matrices_give_the_recorded_scores_of_each_kind(stack, kind):
    """A = W_K^T W_Q * scale: softmax(x_i^T A^T y_j) is the recorded pattern (T5 v1.1: no biases, scale 1;
    cross-attention has no position bias, the encoder's is added)."""
    model = model_of("t5_v1_1")
    src, tgt, _ = batch(4)
    _, trace = model.run_with_trace(src, tgt)
    layer, head = 1, 2
    hm = model.head_matrices(layer, head, stack=stack, kind=kind)
    x = trace[f"{stack}.blocks.{layer}.{kind}.input"] if kind == "cross_attn" else trace[f"{stack}.blocks.{layer}.attn.input"]
    y = trace["encoder.final_norm.out"] if kind == "cross_attn" else x
    scores = x @ hm.A.T @ y.transpose(1, 2)
    if stack == "encoder":
        scores = scores + model.encoder.position_bias(src.shape[1], src.shape[1], 0)[0, head]
    pattern = trace[f"{stack}.blocks.{layer}.{kind}.pattern"][:, head]
    assert (torch.softmax(scores, -1) - pattern).abs().max() < 1e-5
    with pytest.raises(ValueError, match="no encoder cross_attn"):
        model.head_matrices(0, 0, stack="encoder", kind="cross_attn")
    with pytest.raises(ValueError, match="the decoder has layers 0..2, not 3"):
        model.head_matrices(3, 0)


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_folder_opens_in_bfloat16_and_computes_close_to_float32(name, tmp_path):
    model = model_of(name)
    save_model_folder(model, tmp_path / "m")
    half = load_model_folder(tmp_path / "m", dtype="bfloat16").model
    src, tgt, mask = batch(5)
    with torch.no_grad():
        ref = model(src, tgt, src_mask=mask).logits
        out = half(src, tgt, src_mask=mask).logits
        _, trace = half.run_with_trace(src, tgt, src_mask=mask)  # the explicit path too (T5's bias in bfloat16)
        steps = greedy_decode(half, src[0], 4)
    assert out.dtype == torch.bfloat16 and len(steps) == 4
    assert (out.float() - ref).abs().max() < 0.1 * ref.abs().max()
    assert (trace["logits"].float() - ref).abs().max() < 0.1 * ref.abs().max()


@pytest.mark.parametrize("name", ["t5_v1_0", "marian"])
def test_greedy_batch_of_padded_sources_writes_what_each_source_alone_does(name):
    """The trainer's exact match decodes padded batches (greedy_batch with the source mask, the cache):
    each row writes what greedy_decode writes for its source alone, unpadded; with eos_id it stops once
    every row has written it, and a row that ended first goes on (callers read up to its end)."""
    model = model_of(name)
    src, _, mask = batch()
    src = src.masked_fill(mask == 0, 0)
    rows = greedy_batch(model, src, 6, src_mask=mask)
    assert rows.shape == (2, 6)
    for i in range(2):
        alone = src[i][mask[i].bool()]
        assert rows[i].tolist() == greedy_decode(model, alone, 6)
    eos = int(rows[0, 2])
    stopped = greedy_batch(model, src, 6, src_mask=mask, eos_id=eos)
    ends = [row.index(eos) if eos in row else 6 for row in rows.tolist()]
    assert stopped.shape[1] == min(6, max(ends) + 1)
    assert stopped.tolist() == rows[:, :stopped.shape[1]].tolist()


@pytest.mark.parametrize("name", ["t5_v1_0", "marian"])
@pytest.mark.parametrize("stop_at", ["encoder.embed", "encoder.blocks.0.attn.input", "encoder.blocks.1.mlp.out",
                                     "decoder.embed", "decoder.blocks.0.attn.input",
                                     "decoder.blocks.1.cross_attn.input", "decoder.blocks.2.resid_cross"])
def test_each_stack_stops_right_after_the_point(name, stop_at):
    # as Transformer.forward(stop_at=...): the stopped stack's records are its whole pass's up to the point,
    # bit for bit, and nothing after; the stream there is what the stopped pass returns
    model = model_of(name)
    src, tgt, mask = batch()
    stack = stop_at.split(".")[0]
    with torch.no_grad():
        full = Trace((f"{stack}.*",))
        enc = model.encode(src, src_mask=mask, trace=full if stack == "encoder" else None)
        if stack == "decoder":
            model.decode(tgt, enc, src_mask=mask, trace=full)
        early = Trace((f"{stack}.*",))
        if stack == "encoder":
            hidden = model.encode(src, src_mask=mask, trace=early, stop_at=stop_at)
        else:
            out = model.decode(tgt, enc, src_mask=mask, trace=early, stop_at=stop_at)
            assert out.logits is None
            hidden = out.hidden
    assert list(early) == list(full)[:list(full).index(stop_at) + 1]
    for k in early:
        assert torch.equal(early[k], full[k]), k
    stream = {"encoder.blocks.0.attn.input": "encoder.embed", "encoder.blocks.1.mlp.out": "encoder.blocks.1.resid_mid",
              "decoder.blocks.0.attn.input": "decoder.embed",
              "decoder.blocks.1.cross_attn.input": "decoder.blocks.1.resid_mid"}
    assert torch.equal(hidden, full[stream.get(stop_at, stop_at)])


def test_a_stop_point_the_stack_has_not_is_an_error_not_a_whole_pass():
    model = model_of("marian")
    src, tgt, _ = batch()
    with torch.no_grad():
        enc = model.encode(src)
        for wrong in ("encoder.blocks.2.attn.input", "blocks.0.attn.input", "decoder.embed"):
            with pytest.raises(ValueError, match="no point of this 2-layer encoder's pass"):
                model.encode(src, stop_at=wrong)
        for wrong in ("decoder.blocks.3.attn.input", "encoder.blocks.0.attn.input", "decoder.emb"):
            with pytest.raises(ValueError, match="no point of this 3-layer decoder's pass"):
                model.decode(tgt, enc, stop_at=wrong)
