"""packaging/make_dynamics_figures.py, the README's two Dynamics screenshots: the panel (the window's grab of it)
after Reset and a few Steps, on the sphere and on the demo model's tokens and head, at the README's sizes."""
from __future__ import annotations

import numpy as np
import pytest

from .figure_scripts import assert_drawn, assert_only_wrote, load_script, someone_elses_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_the_dynamics_figures_are_the_panel_after_its_steps(tmp_path, qapp, isolated_user_files, capsys):
    script = load_script("make_dynamics_figures")
    out = tmp_path / "shots"
    theirs = someone_elses_file(out)
    script.make(qapp, out, sphere_steps=10, model_steps=2)
    assert_only_wrote(out, {"dynamics_sphere.png", "dynamics_model.png"}, theirs)
    sphere = assert_drawn(out / "dynamics_sphere.png", (1280, 728))  # the panel in the window at 1280 x 800
    model = assert_drawn(out / "dynamics_model.png", (1400, 828))  # and at 1400 x 900
    assert not np.array_equal(sphere[:700, :1280], model[:700, :1280])
    printed = capsys.readouterr().out
    # what each shows (the panel's status line): 10 steps of dt 0.1 on the sphere, 2 frames of 10 on the tokens
    assert "Q = K = V = I; n = 400, d = 3. t = 1:" in printed
    assert "layer 0 head 0; n = " in printed and "t = 2:" in printed
