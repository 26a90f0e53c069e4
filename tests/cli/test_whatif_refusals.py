"""`attribute` and `patch` refuse the models the What if panel disables, with the panel's own line
(app.whatif.attribution_problem / patching_problem, one check for both front ends; issue 26)."""
from __future__ import annotations

import pytest

from desktop_app.app.whatif import attribution_problem, patching_problem
from desktop_app.cli import main
from desktop_app.core.checkpoints import new_model, save_model_folder
from desktop_app.core.config import ModelConfig
from desktop_app.core.families import REGISTRY

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = dict(vocab_size=20, d_model=16, n_layers=1, n_heads=2, d_ff=32, context_length=8)
MODELS = {
    "sentence-bert": ModelConfig.bert(**SMALL, lm_head=False),  # no language-model head
    "post-norm": ModelConfig.gpt2(**SMALL, norm_placement="post"),  # not a sum of sublayers' outputs
    "vit": REGISTRY["vit"].preset(d_model=16, n_layers=1, n_heads=2, d_ff=32, image_size=8, patch_size=4,
                                  vocab_size=3),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("whatif-refusals")
    for name, cfg in MODELS.items():
        save_model_folder(new_model(cfg, seed=0), root / name)
    return root


def _refusal(capsys, argv: list[str]) -> list[str]:
    assert main(argv) == 2
    return capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("name", [n for n, cfg in MODELS.items() if attribution_problem(cfg)])
def test_attribute_refuses_what_the_panel_disables_in_its_words(folders, tmp_path, capsys, name):
    out = tmp_path / "a.csv"
    lines = _refusal(capsys, ["attribute", str(folders / name), "--ids", "1,2,3", "--token-id", "1",
                              "--csv", str(out)])
    assert lines == [f"error: {attribution_problem(MODELS[name])}"]
    assert not out.exists()


@pytest.mark.parametrize("name", [n for n, cfg in MODELS.items() if patching_problem(cfg)])
def test_patch_refuses_what_the_panel_disables_in_its_words(folders, tmp_path, capsys, name):
    out = tmp_path / "p.csv"
    lines = _refusal(capsys, ["patch", str(folders / name), "--clean-ids", "1,2,3", "--corrupted-ids", "1,2,4",
                              "--answer-id", "1", "--csv", str(out)])
    assert lines == [f"error: {patching_problem(MODELS[name])}"]
    assert not out.exists()


def test_the_cases_are_the_panels():
    """Each model above is one the panel disables (so the tests above are not empty)."""
    assert all(attribution_problem(cfg) for cfg in MODELS.values())
    assert patching_problem(MODELS["sentence-bert"]) and patching_problem(MODELS["vit"])
    assert not patching_problem(MODELS["post-norm"])  # patching reads logits only: a post-norm model is fine
