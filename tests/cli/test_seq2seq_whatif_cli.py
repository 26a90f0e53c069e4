"""`attribute` and `patch` on an encoder-decoder (issue 28): --text/--ids is the source, --target-ids the
target the decoder reads after its start token; the logit against transformers' T5, the bars summing to it,
a zero-ablated cross-attention head adding nothing, patching's rows of the three kinds of head."""
from __future__ import annotations

import csv
import json

import pytest
import torch

from desktop_app.cli import main
from desktop_app.core.checkpoints import new_model, save_model_folder
from desktop_app.core.config import ModelConfig
from desktop_app.core.families import REGISTRY

transformers = pytest.importorskip("transformers")

SRC, TGT = "5,17,3,8,21,9", "14,8,27"


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    cfg = REGISTRY["t5"].preset(vocab_size=40, d_model=32, n_layers=2, n_decoder_layers=2, n_heads=4, d_ff=48,
                                context_length=24, relative_buckets=8, relative_max_distance=12, init_std=0.2,
                                decoder_start_token_id=0)
    folder = tmp_path_factory.mktemp("t5") / "m"
    save_model_folder(new_model(cfg, seed=0), folder)
    return folder


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _ids(text):
    return [int(x) for x in text.split(",")]


def test_attribute_reads_the_decoders_logit_and_sums_to_it(t5_dir, tmp_path, capsys):
    out = tmp_path / "dla.csv"
    assert main(["attribute", str(t5_dir), "--ids", SRC, "--target-ids", TGT, "--position", "-1", "--token-id", "11",
                 "--csv", str(out)]) == 0
    res = _last_json(capsys)
    hf = transformers.T5ForConditionalGeneration.from_pretrained(t5_dir).eval()
    with torch.no_grad():
        want = hf(input_ids=torch.tensor([_ids(SRC)]), decoder_input_ids=torch.tensor([[0] + _ids(TGT)])).logits
    assert res["position"] == 3 and res["logit"] == pytest.approx(float(want[0, -1, 11]), abs=1e-4)
    assert abs(res["sum"] - res["logit"]) < 1e-4
    rows = list(csv.DictReader(out.open()))
    assert sum(r["component"] == "cross_head" for r in rows) == 2 * 4
    assert sum(float(r["contribution"]) for r in rows) == pytest.approx(res["logit"], abs=1e-4)

    # a zero-ablated cross-attention head adds nothing
    assert main(["attribute", str(t5_dir), "--ids", SRC, "--target-ids", TGT, "--token-id", "11", "--ablate",
                 "cross.0.1", "--csv", str(out), "--overwrite"]) == 0
    ablated = _last_json(capsys)
    rows = list(csv.DictReader(out.open()))
    (cell,) = [r for r in rows if r["component"] == "cross_head" and r["layer"] == "0" and r["head"] == "1"]
    assert float(cell["contribution"]) == 0.0 and ablated["logit"] != pytest.approx(res["logit"], abs=1e-6)


def test_patch_runs_two_sources_and_names_the_heads_of_each_kind(t5_dir, tmp_path, capsys):
    out = tmp_path / "patch.csv"
    corrupted = "5,17,3,30,21,9"
    assert main(["patch", str(t5_dir), "--clean-ids", SRC, "--corrupted-ids", corrupted, "--target-ids", TGT,
                 "--answer-id", "11", "--wrong-id", "12", "--csv", str(out)]) == 0
    res = _last_json(capsys)
    assert res["head_rows"] == ["enc L0", "enc L1", "dec L0", "dec L1", "cross L0", "cross L1"]
    rows = list(csv.DictReader(out.open()))
    heads = {r["component"] for r in rows if r["table"] == "head"}
    assert {"encoder.blocks.1.attn.head.3", "decoder.blocks.0.attn.head.0", "decoder.blocks.1.cross_attn.head.2"} <= heads
    resid = {(r["component"], int(r["position"])): float(r["recovery"]) for r in rows if r["table"] == "resid"}
    assert resid[("encoder.embed", 3)] == pytest.approx(1.0, abs=1e-5)  # the one source token that differs
    assert resid[("encoder.embed", 0)] == pytest.approx(0.0, abs=1e-6)


def test_a_target_for_a_one_stack_model_is_refused_in_one_line(tmp_path, capsys):
    folder = tmp_path / "gpt2"
    save_model_folder(new_model(ModelConfig.gpt2(vocab_size=40, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                                                 context_length=16), seed=0), folder)
    code = main(["attribute", str(folder), "--ids", SRC, "--target-ids", TGT, "--token-id", "3",
                 "--csv", str(tmp_path / "x.csv")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "--target-ids" in err and "not an encoder-decoder" in err and "\n" not in err


def test_lipschitz_measures_a_cross_attention_layer_of_the_stack_named(t5_dir, tmp_path, capsys):
    import numpy as np

    from desktop_app.core import lipschitz as lip
    from desktop_app.core.checkpoints import load_model_folder

    out = tmp_path / "lip.csv"
    assert main(["lipschitz", str(t5_dir), "--stack", "cross", "--layer", "1", "--source-text", SRC,
                 "--target-text", "14,8,27,30,2,9,11", "--lengths", "2,4", "--samples", "2", "--csv", str(out)]) == 0
    res = _last_json(capsys)
    assert res["label"].startswith("cross L1 real target") and res["rows"] == 4
    rows = list(csv.DictReader(out.open()))
    model = load_model_folder(t5_dir).model.float()
    dec = [0, 14, 8, 27, 30, 2, 9, 11]
    X = lip.real_inputs(model, dec, 1, 4, 2, lip.window_starts(len(dec), 4, 2), stack="cross", source_ids=_ids(SRC))
    fmap = lip.layer_map(model, 1, stack="cross", source_ids=_ids(SRC))
    exact = lip.exact_jacobian_norm(fmap, X).numpy()
    np.testing.assert_allclose([float(r["lipschitz"]) for r in rows if r["n"] == "4"], exact, rtol=1e-3)


@pytest.mark.parametrize("args, message", [([], "choose --stack encoder, decoder or cross"),
                                           (["--stack", "cross"], "give --source-text")])
def test_lipschitz_on_an_encoder_decoder_says_what_it_needs(t5_dir, tmp_path, capsys, args, message):
    code = main(["lipschitz", str(t5_dir), *args, "--lengths", "2", "--csv", str(tmp_path / "x.csv")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and message in err and "\n" not in err


def test_lipschitz_refuses_a_target_longer_than_the_decoders_context_in_one_line(t5_dir, tmp_path, capsys):
    """As trace, attribute and patch do (tests/cli/test_seq2seq_target_context_cli.py): the sweep's windows
    would otherwise come from a target cut to the context without a word."""
    too_long = ",".join(str(3 + i % 30) for i in range(24))  # context 24: [start] + at most 23 tokens
    code = main(["lipschitz", str(t5_dir), "--stack", "decoder", "--layer", "0", "--source-text", SRC,
                 "--target-text", too_long, "--lengths", "2", "--samples", "1", "--csv", str(tmp_path / "x.csv")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "target: 24 tokens exceed the decoder's context length 24" in err and "\n" not in err
    assert not (tmp_path / "x.csv").exists()
