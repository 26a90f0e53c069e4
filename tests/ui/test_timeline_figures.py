"""Issue 30, the README's figures: packaging/make_timeline_figures.py trains the induction run, opens its
Across-training window offscreen and exports it with the window's own export; the numbers it exports show
the induction head, the logit lens of its layer and that layer's Lipschitz constant changing together."""
from __future__ import annotations

import csv

import numpy as np
import pytest

from desktop_app.app.timeline import halfway_step

from .figure_scripts import load_script

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _series(path, metric):
    """{(layer, head): (steps, values)} of `metric` in an Across-training CSV export."""
    out: dict = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["metric"] == metric:
                out.setdefault((int(r["layer"]), int(r["head"])), []).append((int(r["step"]), float(r["value"])))
    return {k: (np.array([s for s, _ in v]), np.array([x for _, x in v])) for k, v in out.items()}


@pytest.mark.slow  # 1-2 minutes: trains the 600-step run, then measures its 13 kept steps
def test_the_readme_figures_show_the_logit_lens_rising_with_the_induction_head(tmp_path, qapp, isolated_user_files):
    script = load_script("make_timeline_figures")
    assert script.main(["--docs", str(tmp_path)]) == 0
    for name in ("screenshots/timeline.png", "screenshots/timeline_across.png", "figures/induction_across_training.png",
                 "figures/induction_lipschitz.png"):
        assert (tmp_path / name).stat().st_size > 10_000, name
    figure = tmp_path / "figures" / "induction_across_training.csv"
    induction = _series(figure, "induction")
    best = max(induction, key=lambda k: induction[k][1][-1])
    steps, head = induction[best]
    assert best[0] == 1 and head[0] < 0.3 < 0.7 < head[-1]
    lens = _series(figure, "logit-lens")
    assert set(lens) == {(0, -1), (1, -1)}
    assert lens[(1, -1)][1][0] < 0.05 and lens[(1, -1)][1][-1] > 0.8  # layer 1 reads the answer once the head forms
    assert lens[(0, -1)][1].max() < 0.05  # layer 0 alone does not: chance is 1/64
    rise = halfway_step(steps, head)
    assert abs(halfway_step(*lens[(1, -1)]) - rise) <= 50
    lipschitz = _series(tmp_path / "figures" / "induction_lipschitz.csv", "lipschitz")
    growth = np.diff(lipschitz[(1, -1)][1])
    assert lipschitz[(1, -1)][1][-1] > 5 * lipschitz[(1, -1)][1][0]
    assert abs(int(lipschitz[(1, -1)][0][1:][np.argmax(growth)]) - rise) <= 50  # its steepest growth: the phase change
