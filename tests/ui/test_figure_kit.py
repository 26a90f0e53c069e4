"""packaging/figure_kit.py, what the figure scripts share: the window they show, the model they open in it."""
from __future__ import annotations

import time

import pytest

from desktop_app.paths import demo_model_dir

from .figure_scripts import load_script

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_a_model_the_window_cannot_open_stops_the_script_at_once_naming_it(tmp_path, qapp, isolated_user_files):
    """Before, a script waited out its whole wait (two to ten minutes) on a folder the window had refused."""
    kit = load_script("figure_kit")
    absent = tmp_path / "absent"
    with kit.shown_window(800, 600) as (state, window):
        started = time.monotonic()
        with pytest.raises(OSError, match=rf"^make_x: cannot open {absent}: .*no such folder"):
            kit.open_model(qapp, window, absent, "make_x", seconds=60)
        assert time.monotonic() - started < 30 and state.loaded is None
        kit.open_model(qapp, window, demo_model_dir(), "make_x")  # then a model it can open: opened and traced
        assert state.loaded is not None and state.trace is not None and state.token_ids
    assert not window.isVisible()  # closed at the end


def test_the_routing_script_on_a_missing_run_says_so_in_one_line(tmp_path, qapp, isolated_user_files, capsys):
    out = tmp_path / "routing.png"
    assert load_script("make_routing_figure").main(["--run", str(tmp_path / "absent"), str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("make_routing_figure: cannot open") and "\n" not in err
    assert not out.exists()
