"""app/whatif.py: the steering edit that `generate --steer-*` and the What if panel's Steer tab both build."""
from __future__ import annotations

import json

import pytest
import torch

from desktop_app.app.whatif import steering_edit, text_ids
from desktop_app.cli import main
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.generation import GenerationSettings, generate
from desktop_app.core.interventions import steering_vector
from tiny_models import save_tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TEXT = "the cat sat on the mat. a dog ran far away! "


@pytest.fixture(scope="module")
def char_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("charlm"), TEXT, init_std=0.2)


def test_the_edit_adds_scale_times_the_mean_difference_and_says_its_size(char_dir):
    loaded = load_model_folder(char_dir)
    iv, norm = steering_edit(loaded, "cat cat", "dog!", 1, -2.5)
    v = steering_vector(loaded.model, loaded.tokenizer.encode("cat cat"), loaded.tokenizer.encode("dog!"), 1)
    assert iv.point == "blocks.1.resid_post" and iv.how == "add"
    torch.testing.assert_close(iv.value, -2.5 * v)
    assert norm == pytest.approx(float(v.norm())) and norm > 0
    assert iv.label == 'steer L1 x-2.5 ("cat cat" - "dog!")'


def test_the_cli_generates_with_the_edit_the_panel_applies(char_dir, capsys):
    code = main(["generate", str(char_dir), "--prompt", "the ", "--max-new", "8", "--json", "--steer-towards", "cat",
                 "--steer-away", "dog!", "--steer-layer", "0", "--steer-scale", "3"])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    loaded = load_model_folder(char_dir)
    iv, _ = steering_edit(loaded, "cat", "dog!", 0, 3.0)  # what the Steer tab's Apply puts among the edits
    want, _ = generate(loaded, text_ids(loaded, "the ", "prompt"), 8, GenerationSettings("greedy"), seed=0,
                       interventions=[iv])
    assert code == 0 and res["steer"] == iv.label and res["ids"] == want


@pytest.mark.parametrize("towards, away, which", [("", "dog", "towards"), ("cat", "   ", "away from")])
def test_an_empty_or_blank_text_is_one_line_in_both_front_ends(char_dir, capsys, towards, away, which):
    loaded = load_model_folder(char_dir)
    with pytest.raises(ValueError, match=f"^the {which} text is empty$"):
        steering_edit(loaded, towards, away, 0, 1.0)
    # the CLI says the same (a blank text was steered with before: spaces are tokens of this model)
    code = main(["generate", str(char_dir), "--prompt", "the ", "--max-new", "2", "--steer-towards", towards,
                 "--steer-away", away, "--steer-layer", "0", "--steer-scale", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == f"error: the {which} text is empty"
