"""`export` writes a model (a folder or a GGUF file) as GGUF or as a Hugging Face folder, and every
command takes a .gguf file as its MODEL: a GGUF exported here opens in transformers' GGUF loader with
the same logits and tokenizer ids; an existing output is never replaced without --overwrite."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from desktop_app.cli import main  # noqa: E402
from desktop_app.core.formats import load_model_file  # noqa: E402
from desktop_app.core.tokenizer import train_bpe  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "core" / "formats"))
from test_gguf_tokenizer import sentences  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TEXT = "Hello world, the cat sat on a mat in Zürich 2024."


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    tok = train_bpe(sentences(200, seed=3), 300, specials=("<|endoftext|>",))
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0))
    hf.save_pretrained(folder)
    tok.save(folder / "tokenizer.json")
    return folder


def hf_gguf_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("kind,tolerance", [("f16", 1e-4), ("q8_0", 1e-3)])
def test_exported_gguf_opens_in_transformers_with_the_same_logits(llama_dir, tmp_path, kind, tolerance, capsys):
    out = tmp_path / f"model-{kind}.gguf"
    assert main(["export", str(llama_dir), "--format", "gguf", "--type", kind, "--out", str(out)]) == 0
    ours = load_model_file(out, dtype="float32")
    ids = torch.tensor([ours.tokenizer.encode(TEXT)])
    with torch.no_grad():
        mine = ours.model(ids).logits
    theirs = hf_gguf_logits(out, ids)
    assert (mine - theirs).abs().max().item() <= tolerance * theirs.abs().max().item()
    # the tokenizer travelled: transformers' GGUF tokenizer reads the ids the folder's tokenizer gives
    folder_tok = transformers.AutoTokenizer.from_pretrained(llama_dir)
    gguf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=out.name)
    for text in sentences(200, seed=4):
        assert gguf_tok(text, add_special_tokens=False)["input_ids"] == folder_tok(text)["input_ids"]
    info = ours.gguf
    assert info.types["attention"] == {kind.upper(): 8} and info.types["norms"] == {"F32": 5}


def test_never_over_an_existing_output_without_overwrite(llama_dir, tmp_path, capsys):
    out = tmp_path / "model.gguf"
    out.write_bytes(b"someone's file")
    assert main(["export", str(llama_dir), "--format", "gguf", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {out} exists; pass --overwrite to replace it"
    assert out.read_bytes() == b"someone's file"
    assert main(["export", str(llama_dir), "--format", "gguf", "--out", str(out), "--overwrite"]) == 0
    assert out.read_bytes()[:4] == b"GGUF"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # nothing left from the atomic write


def test_gguf_to_hf_folder_and_every_command_takes_the_file(llama_dir, tmp_path, capsys):
    gguf_file = tmp_path / "m.gguf"
    assert main(["export", str(llama_dir), "--format", "gguf", "--type", "q8_0", "--out", str(gguf_file)]) == 0
    capsys.readouterr()
    assert main(["info", str(gguf_file)]) == 0
    info = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert info["family"] == "llama" and info["gguf"]["file_type"] == "MOSTLY_Q8_0"
    assert info["gguf"]["quantization"]["MLP"] == {"Q8_0": 6} and info["gguf"]["dequantized"] is True

    folder = tmp_path / "back"
    assert main(["export", str(gguf_file), "--format", "hf", "--out", str(folder)]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ours = load_model_file(gguf_file, dtype="float32")
    ids = torch.tensor([ours.tokenizer.encode(TEXT)])
    with torch.no_grad():
        assert (hf(ids).logits - ours.model(ids).logits).abs().max().item() <= 1e-5

    trace = tmp_path / "t.npz"
    assert main(["trace", str(gguf_file), "--text", TEXT, "--out", str(trace)]) == 0
    with np.load(trace) as t:
        assert {"attn.1", "hidden.2", "logits"} <= set(t.files)
    capsys.readouterr()
    assert main(["generate", str(gguf_file), "--prompt", "the cat", "--max-new", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == str(gguf_file) and len(out["ids"]) > out["prompt_length"] >= 2


def test_a_trained_run_exports_as_gguf(tmp_path, capsys):
    """A run trained here (a task's character vocabulary, which GGUF cannot hold: said in a note) exports as
    GGUF, and the file computes what the run's model computes."""
    run = tmp_path / "run"
    assert main(["train", "--task", "modadd", "--p", "5", "--family", "llama", "--layers", "1", "--heads", "2",
                 "--d-model", "32", "--steps", "2", "--eval-every", "2", "--batch-size", "4", "--device", "cpu",
                 "--out", str(run)]) == 0
    out = tmp_path / "run.gguf"
    capsys.readouterr()
    assert main(["export", str(run), "--format", "gguf", "--type", "f32", "--out", str(out)]) == 0
    assert "note: the tokenizer has no GGUF form" in capsys.readouterr().err
    ours, trained = load_model_file(out), load_model_file(run)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(ours.model(ids).logits, trained.model(ids).logits)
