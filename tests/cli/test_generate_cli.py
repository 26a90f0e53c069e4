"""`python -m desktop_app generate`: ids and text as one JSON object, same results as the core."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from desktop_app.cli import main
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.generation import GenerationSettings, generate
from desktop_app.core.tokenizer import char_tokenizer
from tiny_models import save_tiny_model

transformers = pytest.importorskip("transformers")

TEXT = "the cat sat on the mat. "


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=50, n_positions=32, n_embd=32,
                                                              n_layer=2, n_head=4, eos_token_id=None,
                                                              bos_token_id=None))
    hf.save_pretrained(folder)
    return folder, hf.eval()


@pytest.fixture(scope="module")
def char_dir(tmp_path_factory):
    specials = ["<|endoftext|>"]
    folder = save_tiny_model(tmp_path_factory.mktemp("charlm"), TEXT, specials=specials, context_length=32)
    return folder, char_tokenizer(TEXT, specials=specials)


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    specials = ["[PAD]", "[MASK]", "[UNK]"]
    folder = save_tiny_model(tmp_path_factory.mktemp("bert"), TEXT, "bert", specials=specials, context_length=32)
    return folder, char_tokenizer(TEXT, specials=specials)


def _json(capsys, *args) -> dict:
    assert main(["generate", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_greedy_ids_equal_transformers_generate(gpt2_dir, capsys):
    folder, hf = gpt2_dir
    out = _json(capsys, folder, "--prompt-ids", "1,2,3", "--max-new", 10, "--strategy", "greedy")
    with torch.no_grad():
        ref = hf.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=10, do_sample=False, pad_token_id=0)[0].tolist()
    assert out["ids"] == ref and out["prompt_length"] == 3 and "text" not in out


def test_text_prompt_decodes_and_seeded_sampling_repeats(char_dir, capsys):
    folder, tok = char_dir
    args = (folder, "--prompt", "the ", "--max-new", 8, "--strategy", "top-p", "--top-p", "0.9",
            "--temperature", "1.5", "--seed", 3)
    a, b = _json(capsys, *args), _json(capsys, *args)
    assert a["ids"] == b["ids"] and a["ids"][:4] == tok.encode("the ")
    assert a["text"] == tok.decode(a["ids"]) and a["text"].startswith("the ")
    beam = _json(capsys, folder, "--prompt", "the ", "--max-new", 4, "--strategy", "beam", "--beams", 3)
    loaded = load_model_folder(folder)
    want, session = generate(loaded, tok.encode("the "), 4, GenerationSettings("beam", beams=3), seed=0)
    assert beam["ids"] == want and beam["score"] == max(b.score for b in session.beams)  # the best beam
    # its score is the model's own log-probability of the generated tokens (full forward, no cache)
    with torch.no_grad():
        logp = torch.log_softmax(loaded.model(torch.tensor([want])).logits[0].double(), -1)
    assert 4 < len(want) <= 8
    assert beam["score"] == pytest.approx(sum(float(logp[i - 1, want[i]]) for i in range(4, len(want))), abs=1e-4)
    if len(want) < 8:  # ended early: on the model's end token
        assert want[-1] == tok.eos_token_id


def test_encoder_fills_masks(bert_dir, capsys):
    folder, tok = bert_dir
    out = _json(capsys, folder, "--prompt", "the [MASK]at", "--max-new", 5)
    assert len(out["filled"]) == 1 and tok.mask_token_id not in out["ids"]


def test_bad_input_gives_a_message(gpt2_dir, char_dir, capsys):
    folder, _ = gpt2_dir
    assert main(["generate", str(folder), "--prompt", "hi", "--max-new", "3"]) == 2
    assert "no tokenizer.json" in capsys.readouterr().err
    assert main(["generate", str(folder), "--prompt-ids", ",".join(["1"] * 40), "--max-new", "3"]) == 2
    assert "context length" in capsys.readouterr().err


def test_subprocess_entry_point(char_dir):
    folder, _ = char_dir
    out = subprocess.run([sys.executable, "-m", "desktop_app", "generate", str(folder), "--prompt-ids", "3,4",
                          "--max-new", "3", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["ids"]) == 5


def test_stop_ids_outside_the_vocabulary_are_refused(gpt2_dir, capsys):
    """Issue 41: --stop-ids 100000 on a small vocabulary was accepted (a stop that can never happen)."""
    assert main(["generate", str(gpt2_dir[0]), "--prompt-ids", "1,2", "--max-new", "2", "--stop-ids", "3,100000"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--stop-ids 100000 is not a token" in err and len(err.splitlines()) == 1


def test_length_penalty_and_early_stopping_reach_the_beam_search_as_generates(gpt2_dir, capsys):
    """--length-penalty and --early-stopping give transformers' generate(num_beams=4, length_penalty=...,
    early_stopping=...) ids, with an end token the search meets on the way; and they change the result."""
    folder, hf = gpt2_dir
    prompt = [1, 2, 3]

    def reference(eos, **kw):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, num_beams=4,
                              eos_token_id=eos, pad_token_id=0, **kw)[0].tolist()[len(prompt):]
        return out[:out.index(eos) + 1] if eos in out else out

    eos = reference(None)[3]  # a token the search writes at its fourth step
    results = set()
    for penalty in ("0.25", "1", "3"):
        for mode, theirs in (("false", False), ("true", True), ("never", "never")):
            out = _json(capsys, folder, "--prompt-ids", "1,2,3", "--max-new", 8, "--strategy", "beam", "--beams", 4,
                        "--stop-ids", eos, "--length-penalty", penalty, "--early-stopping", mode)
            ref = reference(eos, length_penalty=float(penalty), early_stopping=theirs)
            assert out["ids"][len(prompt):] == ref, (penalty, mode)
            results.add(tuple(ref))
    assert len(results) > 1  # the options reached the search


@pytest.mark.parametrize("args, message", [
    (("--length-penalty", "11"), "argument --length-penalty: must be in [-10, 10], got 11"),
    (("--length-penalty", "nan"), "argument --length-penalty: must be in [-10, 10]"),
    (("--early-stopping", "sometimes"), "argument --early-stopping: invalid choice: 'sometimes'"),
])
def test_beam_options_are_checked_where_declared(gpt2_dir, capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        main(["generate", str(gpt2_dir[0]), "--prompt-ids", "1", "--strategy", "beam", *args])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
