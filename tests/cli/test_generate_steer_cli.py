"""`generate --steer-towards/--steer-away/--steer-layer/--steer-scale`: the steered continuation is
the core's steered generation (and not the plain one), it goes with --ablate, and partial flags are
refused in one line."""
from __future__ import annotations

import json

import pytest
import torch

from desktop_app.cli import main
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.generation import GenerationSettings, generate
from desktop_app.core.interventions import parse_ablations, steer, steering_vector
from desktop_app.core.tokenizer import char_tokenizer
from tiny_models import save_tiny_model

TEXT = "the cat sat on the mat. a dog ran far away! "
STEER = ["--steer-towards", "cat cat cat", "--steer-away", "dog!", "--steer-layer", "1", "--steer-scale", "4"]


@pytest.fixture(scope="module")
def char_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("charlm"), TEXT, init_std=0.2), char_tokenizer(TEXT)


def _run(capsys, *args) -> tuple[int, str, str]:
    code = main(["generate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_steered_text_differs_and_is_the_cores_steered_generation(char_dir, capsys):
    folder, tok = char_dir
    base = (folder, "--prompt", "the ", "--max-new", 12)
    code, plain, _ = _run(capsys, *base)
    assert code == 0
    code, steered, _ = _run(capsys, *base, *STEER)
    assert code == 0 and steered.startswith("the ") and steered != plain

    loaded = load_model_folder(folder)
    v = steering_vector(loaded.model, tok.encode("cat cat cat"), tok.encode("dog!"), 1)
    iv = steer(v, 1, 4.0, "cat cat cat", "dog!")
    want, _ = generate(loaded, tok.encode("the "), 12, GenerationSettings("greedy"), seed=0, interventions=[iv])
    assert steered.splitlines()[0] == tok.decode(want)

    # with --ablate: both edits apply
    code, out, _ = _run(capsys, *base, *STEER, "--ablate", "0.1", "--json")
    res = json.loads(out.strip().splitlines()[-1])
    edits = [*parse_ablations("0.1", loaded.config), iv]
    both, _ = generate(loaded, tok.encode("the "), 12, GenerationSettings("greedy"), seed=0, interventions=edits)
    assert code == 0 and res["ids"] == both and res["steer"] == iv.label == 'steer L1 x4.0 ("cat cat cat" - "dog!")'
    assert res["ids"] != want  # the ablation mattered too


def test_partial_steer_flags_and_bad_texts_are_one_line(char_dir, capsys):
    folder, _ = char_dir
    code, out, err = _run(capsys, folder, "--prompt", "the ", "--steer-towards", "cat", "--steer-layer", "1")
    assert code == 2 and out == ""
    assert err.strip() == ("error: steering needs all of --steer-towards, --steer-away, --steer-layer, "
                           "--steer-scale (missing --steer-away, --steer-scale)")
    code, _, err = _run(capsys, folder, "--prompt", "the ", *STEER[:5], "5", *STEER[6:])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "layers 0..1" in err
    code, _, err = _run(capsys, folder, "--prompt", "the ", "--steer-towards", "", *STEER[2:])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "towards text is empty" in err
    assert torch.is_tensor(steering_vector(load_model_folder(folder).model, [1], [2], 0))  # the model itself is fine
