"""`trace MODEL --text/--ids SRC [--target-text/--target-ids TGT] --out F.npz` for encoder-decoders (issue 28):
the file holds what transformers' MarianMTModel and T5ForConditionalGeneration give with output_attentions and
output_hidden_states (within 1e-5), for the decoder input [start] + target; a target for a model that is not
an encoder-decoder is refused in one line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from desktop_app.cli import main

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 40
TOL = 1e-5


def _marian():
    return transformers.MarianMTModel(transformers.MarianConfig(
        vocab_size=VOCAB, d_model=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=24,
        scale_embedding=True, dropout=0.0, attention_dropout=0.0, pad_token_id=VOCAB - 1,
        decoder_start_token_id=VOCAB - 1, eos_token_id=0, forced_eos_token_id=None))


def _t5():
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=2,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, feed_forward_proj="gated-gelu",
        tie_word_embeddings=False, dropout_rate=0.0, decoder_start_token_id=0))


@pytest.fixture(scope="module", params=["marian", "t5"])
def hf_folder(request, tmp_path_factory):
    torch.manual_seed(0)
    hf = {"marian": _marian, "t5": _t5}[request.param]().eval()
    with torch.no_grad():  # norms and biases away from 1 and 0, so a missed one shows
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    hf.set_attn_implementation("eager")  # attention probabilities only come from the eager path
    return folder, hf


@pytest.mark.parametrize("target", [[5, 9, 2, 7], []])
def test_trace_of_a_source_and_target_is_transformers_output(hf_folder, tmp_path, target):
    folder, hf = hf_folder
    src = [3, 1, 4, 1, 5, 9, 2]
    out = tmp_path / "t.npz"
    args = ["trace", str(folder), "--ids", ",".join(map(str, src)), "--out", str(out)]
    if target:
        args += ["--target-ids", ",".join(map(str, target))]
    assert main(args) == 0
    z = np.load(out)
    decoder_input = [hf.config.decoder_start_token_id] + target
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([src]), decoder_input_ids=torch.tensor([decoder_input]),
                 output_attentions=True, output_hidden_states=True)
    S, T = len(src), len(decoder_input)
    assert z["tokens"].tolist() == src and z["decoder_tokens"].tolist() == decoder_input
    assert z["logits"].shape == (T, VOCAB)
    np.testing.assert_allclose(z["logits"], ref.logits[0].numpy(), atol=TOL, rtol=0)
    for key, maps, shape in (("encoder_attn", ref.encoder_attentions, (S, S)),
                             ("decoder_attn", ref.decoder_attentions, (T, T)),
                             ("cross_attn", ref.cross_attentions, (T, S))):
        assert sorted(k for k in z.files if k.startswith(key + ".")) == [f"{key}.{l}" for l in range(len(maps))]
        for l, m in enumerate(maps):
            assert z[f"{key}.{l}"].shape == (2, *shape)
            np.testing.assert_allclose(z[f"{key}.{l}"], m[0].numpy(), atol=TOL, rtol=0)
    for key, states in (("encoder_hidden", ref.encoder_hidden_states), ("decoder_hidden", ref.decoder_hidden_states)):
        assert sorted(k for k in z.files if k.startswith(key + ".")) == sorted(f"{key}.{i}" for i in range(len(states)))
        for i, h in enumerate(states):
            np.testing.assert_allclose(z[f"{key}.{i}"], h[0].numpy(), atol=TOL, rtol=0)


def test_a_target_text_is_tokenized_by_the_target_side_and_follows_the_start_token(tmp_path):
    """A folder with a tokenizer: --text the source, --target-text the target, each encoded as the app does."""
    from desktop_app.core.checkpoints import load_model_folder, new_model, save_model_folder
    from desktop_app.core.families import REGISTRY
    from desktop_app.core.training.tasks import make_task

    task = make_task("translate", encoder_decoder=True)
    cfg = REGISTRY["marian"].preset(vocab_size=task.tokenizer.vocab_size, d_model=16, n_layers=1, n_heads=2,
                                    d_ff=32, context_length=16, pad_token_id=0, eos_token_id=2,
                                    decoder_start_token_id=1)
    save_model_folder(new_model(cfg, seed=0), tmp_path / "m", tokenizer=task.tokenizer)
    out = tmp_path / "t.npz"
    assert main(["trace", str(tmp_path / "m"), "--text", "the black dog runs", "--target-text", "le chien noir",
                 "--out", str(out)]) == 0
    z = np.load(out)
    tok = load_model_folder(tmp_path / "m").tokenizer
    assert z["tokens"].tolist() == tok.encode("the black dog runs")
    assert z["decoder_tokens"].tolist() == [1] + tok.encode("le chien noir")
    assert z["logits"].shape == (4, cfg.vocab_size) and z["cross_attn.0"].shape == (2, 4, 4)


def test_a_target_for_a_model_that_is_not_an_encoder_decoder_is_refused_in_one_line(tmp_path, capsys):
    from desktop_app.core.checkpoints import new_model, save_model_folder
    from desktop_app.core.config import ModelConfig

    cfg = ModelConfig.gpt2(vocab_size=20, d_model=8, n_layers=1, n_heads=2, d_ff=16, context_length=8)
    save_model_folder(new_model(cfg, seed=0), tmp_path / "g")
    for option in ("--target-ids", "--target-text"):
        code = main(["trace", str(tmp_path / "g"), "--ids", "1,2,3", option, "4", "--out", str(tmp_path / "x.npz")])
        err = capsys.readouterr().err.strip()
        assert code != 0 and len(err.splitlines()) == 1, err
        assert f"{option}:" in err and "not an encoder-decoder" in err
    assert not (tmp_path / "x.npz").exists()


@pytest.mark.parametrize("layers", ["0:1", "0:3", "1:"])
def test_a_layer_range_on_an_encoder_decoder_is_refused_in_one_line_saying_why(hf_folder, tmp_path, capsys, layers):
    """A layer range picks blocks of one stack; an encoder-decoder's trace records both stacks whole, so
    --layers is refused (naming the folder and why), whether or not it fits the encoder's count, and
    nothing is written. The app's trace_input refuses it too (a range past the encoder's blocks included)."""
    from desktop_app.app.tracing import parse_layers, trace_input
    from desktop_app.core.checkpoints import load_model_folder

    folder, _ = hf_folder
    out = tmp_path / "t.npz"
    code = main(["trace", str(folder), "--ids", "3,1,4", "--layers", layers, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1, err
    assert "--layers:" in err and str(folder) in err and "encoder-decoder" in err and "both stacks whole" in err
    assert not out.exists()
    loaded = load_model_folder(folder)
    with pytest.raises(ValueError, match="encoder-decoder, whose trace records both stacks whole"):
        trace_input(loaded, "", [3, 1, 4], layers=parse_layers(layers))
