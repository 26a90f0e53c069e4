"""The README's routing screenshot: packaging/make_routing_figure.py trains the small Mixtral of its docstring,
opens it in the main window offscreen and grabs the Layers panel's Routing view of block 1."""
from __future__ import annotations


import pytest
from PySide6.QtGui import QImage

from .figure_scripts import load_script

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.mark.slow  # about 30 s: trains the 122-step model first
def test_the_routing_figure_shows_block_1s_router_over_the_text(tmp_path, qapp, isolated_user_files, capsys):
    script = load_script("make_routing_figure")
    out = tmp_path / "routing.png"
    assert script.main([str(out)]) == 0
    image = QImage(str(out))
    assert (image.width(), image.height()) == (1100, 760)
    printed = capsys.readouterr().out
    assert "Router probabilities per token, block L1" in printed
    means = [float(word) for word in printed.split("per expert:")[1].split("\n")[0].split()[1::2]]
    assert len(means) == 8 and abs(sum(means) - 1) < 0.01  # each token's router probabilities sum to 1
