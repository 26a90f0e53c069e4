"""packaging/make_seq2seq_figures.py, the README's encoder-decoder figures: the Model panel on a source and a
target, the Attention panel's cross, encoder and decoder heatmaps, and (--generate) the Generate panel alone
after stepping a source, each grabbed at the README's size, here on a tiny untrained Marian (the figures' shapes,
not what a trained model shows)."""
from __future__ import annotations

import numpy as np
import pytest

from translate_models import save_translate_model

from .figure_scripts import assert_drawn, assert_only_wrote, load_script, someone_elses_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

ATTENTION = ("seq2seq_attention.png", "seq2seq_attention_encoder.png", "seq2seq_attention_decoder.png")


@pytest.fixture
def marian(tmp_path):
    return save_translate_model(tmp_path / "marian", d_model=16, n_layers=1, n_decoder_layers=1, n_heads=2,
                                d_ff=32, context_length=24)


def test_the_seq2seq_figures_are_the_panels_at_the_readmes_sizes(tmp_path, qapp, isolated_user_files, marian,
                                                                 capsys):
    out = tmp_path / "shots"
    theirs = someone_elses_file(out)
    assert load_script("make_seq2seq_figures").main([str(marian), str(out), "--head", "1"]) == 0
    assert_only_wrote(out, {"seq2seq_model.png", *ATTENTION}, theirs)
    model_panel = assert_drawn(out / "seq2seq_model.png", (1400, 568))  # a panel of the window at 1400 x 640
    heatmaps = [assert_drawn(out / name, (1400, 568)) for name in ATTENTION]
    assert len({h.tobytes() for h in heatmaps}) == 3  # three kinds of attention
    assert not np.array_equal(heatmaps[0], model_panel)
    printed = capsys.readouterr().out.splitlines()
    assert [line for line in printed if line.startswith("wrote ")] == [
        f"wrote {out / name}" for name in ("seq2seq_model.png", *ATTENTION)]  # in this order


def test_the_generate_figure_is_the_panel_alone_after_stepping_the_source(tmp_path, qapp, isolated_user_files,
                                                                          marian):
    out = tmp_path / "shots"
    theirs = someone_elses_file(out)
    load_script("make_seq2seq_figures").generate_figure(qapp, str(marian), out)  # what --generate adds
    assert_only_wrote(out, {"generate_seq2seq.png"}, theirs)
    assert_drawn(out / "generate_seq2seq.png", (1300, 760))
