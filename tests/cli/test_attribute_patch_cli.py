"""`attribute`, `patch`, and `--ablate` on `generate` and `trace`: files and JSON against transformers."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from desktop_app.cli import main
from desktop_app.core.checkpoints import new_model, save_model_folder
from desktop_app.core.config import ModelConfig
from desktop_app.core.tokenizer import char_tokenizer

transformers = pytest.importorskip("transformers")

H, DH = 4, 8
IDS = "5,17,3,8,41,9,30,2"


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=H * DH,
                                                              n_layer=2, n_head=H, eos_token_id=None,
                                                              bos_token_id=None))
    hf.save_pretrained(folder)
    return folder, hf.eval()


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _hf_logits_zeroed(hf, ids, layer, head):
    def hook(module, args):
        z = args[0].clone()
        z[..., head * DH:(head + 1) * DH] = 0
        return (z,)
    handle = hf.transformer.h[layer].attn.c_proj.register_forward_pre_hook(hook)
    with torch.no_grad():
        out = hf(torch.tensor([ids])).logits[0]
    handle.remove()
    return out


def test_attribute_writes_one_row_per_component_summing_to_the_logit(gpt2_dir, tmp_path, capsys):
    folder, hf = gpt2_dir
    out = tmp_path / "att.csv"
    assert main(["attribute", str(folder), "--ids", IDS, "--position", "5", "--token-id", "7", "--csv", str(out)]) == 0
    summary = _last_json(capsys)
    with torch.no_grad():
        ref = float(hf(torch.tensor([[int(i) for i in IDS.split(",")]])).logits[0, 5, 7])
    assert summary["logit"] == pytest.approx(ref, abs=1e-4)
    assert abs(summary["sum"] - summary["logit"]) < 1e-4
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == ["component", "layer", "head", "contribution"]
    assert len(rows) == 1 + 2 * (H + 2) + 1  # embed, per layer heads + attn bias + mlp, final norm bias
    assert sum(float(r["contribution"]) for r in rows) == pytest.approx(summary["logit"], abs=1e-4)
    assert sorted((r["layer"], r["head"]) for r in rows if r["component"] == "head") == \
        sorted((str(l), str(h)) for l in range(2) for h in range(H))


def test_patch_writes_both_tables(gpt2_dir, tmp_path, capsys):
    folder, _ = gpt2_dir
    out = tmp_path / "patch.csv"
    assert main(["patch", str(folder), "--clean-ids", "5,17,3,8,41", "--corrupted-ids", "5,17,3,30,41",
                 "--answer-id", "7", "--wrong-id", "8", "--csv", str(out)]) == 0
    summary = _last_json(capsys)
    assert summary["tokens"] == 5 and summary["clean_metric"] != summary["corrupted_metric"]
    rows = list(csv.DictReader(out.open()))
    resid = [r for r in rows if r["table"] == "resid"]
    heads = [r for r in rows if r["table"] == "head"]
    assert len(resid) == 3 * 5 and len(heads) == 2 * H
    last = {int(r["position"]): float(r["recovery"]) for r in resid if r["component"] == "blocks.1.resid_post"}
    assert last[4] == pytest.approx(1.0, abs=1e-6) and last[0] == pytest.approx(0.0, abs=1e-6)


def test_patch_under_ablation_patches_the_ablated_model(gpt2_dir, tmp_path, capsys):
    folder, hf = gpt2_dir
    out = tmp_path / "patch.csv"
    args = ["patch", str(folder), "--clean-ids", "5,17,3,8,41", "--corrupted-ids", "5,17,3,30,41",
            "--answer-id", "7", "--wrong-id", "8", "--ablate", "1.2", "--csv", str(out)]
    assert main(args) == 0
    summary = _last_json(capsys)
    clean = _hf_logits_zeroed(hf, [5, 17, 3, 8, 41], 1, 2)[-1]  # the metric of the ablated model, by HF hooks
    assert summary["clean_metric"] == pytest.approx(float(clean[7] - clean[8]), abs=1e-4)
    heads = {(int(r["layer"]), int(r["head"])): float(r["recovery"])
             for r in csv.DictReader(out.open()) if r["table"] == "head"}
    assert heads[1, 2] == 0.0  # an ablated head carries nothing to restore
    assert summary["ablated"] == "1.2"


def test_generate_ablate_fills_masks_with_the_ablated_encoder(tmp_path, capsys):
    from desktop_app.core.interventions import Intervention, resolve

    tok = char_tokenizer("abcdefgh ", specials=("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"))
    cfg = ModelConfig.bert(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, d_ff=64, context_length=32)
    model = new_model(cfg, seed=1).eval()
    with torch.no_grad():  # larger weights than at initialisation, so that the edits change a fill
        for name, w in model.named_parameters():
            if w.dim() == 2 and "embed" not in name:
                w.mul_(8)
    save_model_folder(model, tmp_path / "bert", tokenizer=tok)
    a, c, e = (tok.encode(ch)[0] for ch in "ace")
    prompt = [a, tok.mask_token_id, c, tok.mask_token_id, e]
    ids = ",".join(map(str, prompt))
    assert main(["generate", str(tmp_path / "bert"), "--prompt-ids", ids, "--order", "left-to-right",
                 "--ablate", "0.1,1.mlp", "--json"]) == 0
    got = _last_json(capsys)
    edits = [Intervention("blocks.0.attn.head.1"), Intervention("blocks.1.mlp.out")]
    seq = list(prompt)
    for fill in got["filled"]:  # each fill is the argmax of the edited model on the sequence so far
        with torch.no_grad():
            logits = model(torch.tensor([seq]), interventions=resolve(model, seq, edits)).logits[0, fill["position"]]
        assert fill["token"] == int(logits.argmax())
        seq[fill["position"]] = fill["token"]
    assert got["ids"] == seq
    assert main(["generate", str(tmp_path / "bert"), "--prompt-ids", ids, "--order", "left-to-right", "--json"]) == 0
    assert _last_json(capsys)["ids"] != seq  # the ablations change the fills of this model


def test_generate_and_trace_ablate_like_a_transformers_hook(gpt2_dir, tmp_path, capsys):
    folder, hf = gpt2_dir
    ids = [1, 2, 3]
    assert main(["generate", str(folder), "--prompt-ids", "1,2,3", "--max-new", "5", "--ablate", "1.2,0.0",
                 "--json"]) == 0
    got = _last_json(capsys)["ids"]
    for t in range(3, len(got)):  # greedy under the same two ablations, done by hand with HF hooks
        def hook_for(head):
            def hook(module, args):
                z = args[0].clone()
                z[..., head * DH:(head + 1) * DH] = 0
                return (z,)
            return hook
        hs = [hf.transformer.h[1].attn.c_proj.register_forward_pre_hook(hook_for(2)),
              hf.transformer.h[0].attn.c_proj.register_forward_pre_hook(hook_for(0))]
        with torch.no_grad():
            nxt = int(hf(torch.tensor([got[:t]])).logits[0, -1].argmax())
        for h in hs:
            h.remove()
        assert got[t] == nxt
    out = tmp_path / "t.npz"
    assert main(["trace", str(folder), "--ids", "1,2,3,4", "--ablate", "1.2", "--out", str(out)]) == 0
    logits = np.load(out)["logits"]
    ref = _hf_logits_zeroed(hf, [1, 2, 3, 4], 1, 2).numpy()
    assert np.allclose(logits, ref, atol=1e-4)
    assert ids == got[:3]


def test_bad_input_is_one_line_exit_2(gpt2_dir, tmp_path, capsys):
    folder, _ = gpt2_dir
    csv_out = str(tmp_path / "x.csv")
    assert main(["attribute", str(folder), "--ids", IDS, "--token-id", "99", "--csv", csv_out]) == 2
    assert "outside the vocabulary" in capsys.readouterr().err
    assert main(["attribute", str(folder), "--ids", IDS, "--position", "8", "--token-id", "1", "--csv", csv_out]) == 2
    assert "outside the text" in capsys.readouterr().err
    assert main(["patch", str(folder), "--clean-ids", "1,2,3", "--corrupted-ids", "1,2", "--answer-id", "3",
                 "--csv", csv_out]) == 2
    assert "same length" in capsys.readouterr().err
    assert main(["generate", str(folder), "--prompt-ids", "1,2", "--ablate", "2.0"]) == 2
    assert "layers 0..1" in capsys.readouterr().err
    assert main(["trace", str(folder), "--ids", "1,2", "--ablate", "x", "--out", str(tmp_path / "t.npz")]) == 2
    assert "LAYER.HEAD" in capsys.readouterr().err


def test_text_input_through_the_tokenizer(tmp_path, capsys):
    tok = char_tokenizer("abcdefgh ")
    cfg = ModelConfig.llama(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48,
                            context_length=32)
    save_model_folder(new_model(cfg, seed=1), tmp_path / "m", tokenizer=tok)
    out = tmp_path / "a.csv"
    assert main(["attribute", str(tmp_path / "m"), "--text", "abc dea", "--token-id", "2", "--csv", str(out)]) == 0
    summary = _last_json(capsys)
    assert summary["position"] == 6 and abs(summary["sum"] - summary["logit"]) < 1e-4
    assert main(["patch", str(tmp_path / "m"), "--clean", "abc dea", "--corrupted", "abc heh", "--answer-id", "2",
                 "--csv", str(tmp_path / "p.csv")]) == 0
    assert len(list(csv.DictReader((tmp_path / "p.csv").open()))) == 3 * 7 + 2 * 4


def test_trace_image_ablate_like_a_transformers_hook(tmp_path, capsys):
    folder = tmp_path / "vit"
    torch.manual_seed(0)
    hf = transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16,
        patch_size=8, num_labels=5)).eval()
    hf.save_pretrained(folder)
    image = np.random.default_rng(0).integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
    np.save(tmp_path / "picture.npy", image)
    out = tmp_path / "t.npz"
    assert main(["trace", str(folder), "--image", str(tmp_path / "picture.npy"), "--ablate", "1.2",
                 "--out", str(out)]) == 0
    z = np.load(out)

    def hook(module, args):  # head 2's part of layer 1's concatenated head outputs, zeroed
        zed = args[0].clone()
        zed[..., 2 * DH:3 * DH] = 0
        return (zed,)

    handle = hf.vit.layers[1].attention.o_proj.register_forward_pre_hook(hook)
    with torch.no_grad():
        ref = hf(pixel_values=torch.from_numpy(z["pixel_values"])[None]).logits[0].numpy()
    handle.remove()
    with torch.no_grad():
        plain = hf(pixel_values=torch.from_numpy(z["pixel_values"])[None]).logits[0].numpy()
    np.testing.assert_allclose(z["logits"], ref, atol=1e-4)
    assert not np.allclose(z["logits"], plain, atol=1e-4)
