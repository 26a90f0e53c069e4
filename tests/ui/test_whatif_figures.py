"""packaging/make_whatif_figures.py, the README's What if figures: the window on the demo model after the
attribution, the patching, Generate with a head zero-ablated and Generate steered (each grabbed at 1280 x 800),
and with --motif the What if panel alone (1300 x 560) patching a motif model's two texts."""
from __future__ import annotations

import pytest

from desktop_app.core.training import TrainConfig, train

from .figure_scripts import assert_drawn, assert_only_wrote, load_script, someone_elses_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

DEMO = ("whatif_attribution.png", "whatif_patching.png", "whatif_generate.png", "whatif_steer.png")


def test_the_what_if_figures_are_the_window_after_each_click(tmp_path, qapp, isolated_user_files, capsys):
    out = tmp_path / "shots"
    theirs = someone_elses_file(out)
    assert load_script("make_whatif_figures").main([str(out)]) == 0
    assert_only_wrote(out, set(DEMO), theirs)
    shots = {name: assert_drawn(out / name, (1280, 800)) for name in DEMO}
    assert len({shot.tobytes() for shot in shots.values()}) == 4  # four different views
    printed = capsys.readouterr().out
    assert "logit 11.43 = sum 11.43" in printed  # the attribution's bars add up to the logit
    assert "largest head recovery: layer" in printed  # the patching ran
    assert printed.count("log p") == 2  # Generate compared with and without the edits: ablated, then steered
    assert 'Applied steer L2 x6.0 ("the Queen shouted" - "Alice thought")' in printed


def test_the_motif_figure_is_the_what_if_panel_alone_after_its_patching(tmp_path, qapp, isolated_user_files,
                                                                         capsys):
    motif = tmp_path / "motif"  # the README's motif model's shape, trained 4 steps: the figure, not its finding
    train(TrainConfig(task="motif", family="gpt2", model={"n_layers": 2, "n_heads": 1, "d_model": 32, "d_ff": 64,
                                                          "context_length": 20},
                      steps=4, batch_size=8, eval_every=4, checkpoint_every=4, seed=0), motif)
    out = tmp_path / "shots"
    theirs = someone_elses_file(out)
    load_script("make_whatif_figures").motif_figure(qapp, str(motif), out)
    assert_only_wrote(out, {"whatif_motif.png"}, theirs)
    assert_drawn(out / "whatif_motif.png", (1300, 560))
    assert "largest head recovery: layer" in capsys.readouterr().out


def test_a_figure_named_by_a_link_is_refused_and_what_it_points_to_kept(tmp_path, qapp, isolated_user_files, capsys):
    """A link where a figure goes is never written through (the file it points to is someone else's): the script
    stops with one line naming it, status 1. Before, the grab was saved through the link, over that file."""
    out = tmp_path / "shots"
    theirs = someone_elses_file(tmp_path / "elsewhere")
    out.mkdir()
    (out / "whatif_attribution.png").symlink_to(theirs)
    assert load_script("make_whatif_figures").main([str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"make_whatif_figures: {out / 'whatif_attribution.png'} is a symbolic link") and "\n" not in err
    assert_only_wrote(theirs.parent, set(), theirs)
    assert sorted(p.name for p in out.iterdir()) == ["whatif_attribution.png"]
