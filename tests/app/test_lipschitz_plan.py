"""app/lipschitz.py: the lengths a Lipschitz sweep runs, decided once for the panel and the `lipschitz` command."""
from __future__ import annotations

import csv

import pytest

from desktop_app.app.lipschitz import plan_lengths
from desktop_app.cli import main
from desktop_app.core import lipschitz as lip
from desktop_app.core.config import ModelConfig
from tiny_models import save_tiny_model

TEXT = "the quick brown fox jumps over the lazy dog while the cat sleeps. " * 3
CFG = ModelConfig.gpt2(vocab_size=40, d_model=16, n_layers=1, n_heads=2, d_ff=32, context_length=32)


def test_lengths_over_the_context_or_the_text_are_skipped_with_a_note_each():
    plan = plan_lengths(CFG, "real", [4, 8, 16, 40], list(range(12)), 2, longer="give a longer --text-file")
    assert plan.lengths == [4, 8] and plan.ids == list(range(12)) and plan.where == "the text"
    assert plan.notes == ["skipped n = 40: longer than the model's context length 32",
                          "skipped n = 16: the text has 12 tokens (give a longer --text-file)"]


def test_a_short_current_text_gives_way_to_the_demo_text_a_file_never_does():
    demo = list(range(30))
    plan = plan_lengths(CFG, "real", [4, 8, 16], [1, 2, 3, 4, 5], 1, fallback=lambda: demo)
    assert plan.lengths == [4, 8, 16] and plan.ids == demo and plan.where == "the demo text"
    assert plan.notes == ["the current text has 5 tokens, too few for these lengths: real windows come from the "
                          "bundled demo text (30 tokens)"]
    kept = plan_lengths(CFG, "real", [4, 8, 16], [1, 2, 3, 4, 5], 1, where="notes.txt")
    assert kept.lengths == [4] and kept.ids == [1, 2, 3, 4, 5] and "notes.txt has 5 tokens" in kept.notes[0]


def test_samples_are_reduced_to_the_distinct_windows_and_said_in_the_front_ends_words():
    plan = plan_lengths(CFG, "real", [4, 10], list(range(12)), 10, samples_said="--samples {k}")
    assert plan.lengths == [4, 10]
    windows = len(lip.window_starts(12, 10, 10))
    assert plan.notes == [f"--samples 10 reduced to {windows}: the text has only {windows} distinct windows of "
                          "n = 10 tokens"] and windows < 10


def test_a_construction_per_length_ignores_the_sample_count_and_needs_no_text():
    plan = plan_lengths(CFG, "adversarial", [4, 64], None, 3)
    assert plan.lengths == [4, 64] and plan.notes == [
        "the adversarial input is one construction per n, so Samples K = 3 gives one sample each"]
    synthetic = plan_lengths(None, "random", [4, 8], None, 3, function=lip.SYNTHETIC)
    assert synthetic.lengths == [4, 8] and synthetic.notes == []


def test_no_length_that_fits_is_one_line():
    with pytest.raises(ValueError, match=r"^no length fits: the text has 5 tokens and the context is 32; "
                                         r"choose lengths up to 5$"):
        plan_lengths(CFG, "real", [8, 16], [1, 2, 3, 4, 5], 1)


def test_the_cli_skips_a_length_over_the_context_as_the_panel_does(tmp_path, capsys):
    """Before, `lipschitz --lengths 4,8,64` on a model with 32 positions failed ("n = 64 exceeds the model's
    context length 32", exit 2) and wrote nothing; the panel skipped n = 64 with a note and measured the rest."""
    folder = save_tiny_model(tmp_path / "model", TEXT, d_model=16, n_layers=1, n_heads=2, d_ff=32, context_length=32)
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    out = tmp_path / "out.csv"
    assert main(["lipschitz", str(folder), "--layer", "0", "--data", "real", "--text-file", str(tmp_path / "text.txt"),
                 "--lengths", "4,8,64", "--samples", "2", "--csv", str(out)]) == 0
    assert "note: skipped n = 64: longer than the model's context length 32" in capsys.readouterr().err
    with open(out, newline="") as fh:
        assert [int(r["n"]) for r in csv.DictReader(fh)] == [4, 4, 8, 8]
