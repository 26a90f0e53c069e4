"""packaging/make_train_translate_figure.py, the README's Train panel training an encoder-decoder on translate:
the panel itself (1500 x 1050) once its run ends, here a run of 20 steps with an evaluation every 10."""
from __future__ import annotations

import pytest

from .figure_scripts import assert_drawn, assert_only_wrote, load_script, someone_elses_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_the_train_translate_figure_is_the_panel_once_its_run_ends(tmp_path, qapp, isolated_user_files):
    out = tmp_path / "shots"
    theirs = someone_elses_file(out)
    events = load_script("make_train_translate_figure").make(out, steps=20, eval_every=10, seconds=300)
    assert_only_wrote(out, {"train_translate.png"}, theirs)
    assert_drawn(out / "train_translate.png", (1500, 1050))
    assert [e["step"] for e in events if e["event"] == "eval"] == [10, 20]  # the evaluations drawn
    assert events[-1]["event"] == "done"  # the run ended before the grab
