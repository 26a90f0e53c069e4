"""packaging/make_motif_attention_figure.py, the README's figure of a motif model's attention: the README's motif
transformer (here trained 20 steps: the figure's making, not the trained model's finding) opened in the window,
its Attention panel's heatmap of layer 1's head on the figure's sequence, grabbed at 1300 x 820."""
from __future__ import annotations

import pytest

from .figure_scripts import assert_drawn, assert_only_wrote, load_script, someone_elses_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_the_motif_attention_figure_is_layer_1s_heatmap_on_the_sequence(tmp_path, qapp, isolated_user_files):
    script = load_script("make_motif_attention_figure")
    run = tmp_path / "motif"
    summary = script.train_readme_model(run, steps=20)
    assert summary["step"] == 20
    out = tmp_path / "shots"
    theirs = someone_elses_file(out)
    shown = script.make(qapp, str(run), out / "training-motif-attention.png")
    assert_only_wrote(out, {"training-motif-attention.png"}, theirs)
    assert_drawn(out / "training-motif-attention.png", (1300, 820))
    assert shown["tokens"] == script.TEXT.split()  # one letter a token, as the figure's axes show
    assert shown["answer"] == 11 and shown["tokens"][10] == "A" and "A" not in shown["tokens"][11:]
    assert 0 <= shown["read"] < 20 and 0 < shown["share"] <= 1


def test_the_script_says_what_it_cannot_open(tmp_path, qapp, isolated_user_files, capsys):
    script = load_script("make_motif_attention_figure")
    out = tmp_path / "figure.png"
    assert script.main(["--run", str(tmp_path / "absent"), str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("make_motif_attention_figure:") and "\n" not in err
    assert not out.exists()
