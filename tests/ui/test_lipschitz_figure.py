"""packaging/make_figures.py, the README's Lipschitz figure: the Lipschitz panel's screenshot demo on the demo
model (layer 0: head 1 on real windows, on the paper's adversarial inputs, the masked sublayer on real windows;
n = 4..256), its plot exported at 1100 x 700 and its numbers as CSV."""
from __future__ import annotations

import csv
import re

import pytest

from .figure_scripts import assert_drawn, assert_only_wrote, load_script, someone_elses_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def test_the_lipschitz_figure_is_the_panels_plot_and_numbers(tmp_path, qapp, isolated_user_files, capsys):
    out = tmp_path / "figures"
    theirs = someone_elses_file(out)
    assert load_script("make_figures").main([str(out)]) == 0
    assert_only_wrote(out, {"lipschitz_demo.png", "lipschitz_demo.csv"}, theirs)
    assert_drawn(out / "lipschitz_demo.png", (1102, 776))  # the plot widget at 1100 x 700 and its frame
    with open(out / "lipschitz_demo.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    runs = {r["run"]: sorted({int(x["n"]) for x in rows if x["run"] == r["run"]}) for r in rows}
    assert list(runs) == ["demo-model L0 H1 real demo-text.txt", "demo-model L0 H1 adversarial",
                          "demo-model L0 real demo-text.txt masked"]
    assert all(ns == [4, 8, 16, 32, 64, 128, 256] for ns in runs.values())
    printed = capsys.readouterr().out
    exponents = {m[0]: float(m[1]) for m in re.findall(r"^(.*): exponent (\S+) \[", printed, re.M)}
    assert list(exponents) == list(runs)  # each run's fitted exponent printed
    assert abs(exponents["demo-model L0 H1 adversarial"] - 0.5) < 0.1  # the paper's n^(1/2): the README's caption
