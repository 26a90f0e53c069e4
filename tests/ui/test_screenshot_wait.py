"""--screenshot's wait for the panel's demo: the Train panel's run gets its own bound by default.

`--panel train --screenshot` starts a training process (it imports torch, then trains 400 steps) and waits
for its fourth evaluation: 66 s at load 10 on 2 cores, where the one default of 30 s ended it with an error."""
from __future__ import annotations

import time

import pytest

from desktop_app.ui import app as app_module
from desktop_app.ui.panels.training import TrainingPanel


@pytest.fixture
def demo_waits(monkeypatch, tmp_path):
    """The seconds --screenshot gives each panel's demo (its deadline less the time of the call); the demo
    itself is not run (it reports a timeout at once: main says so and exits 1)."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    waits: list[float] = []

    def demo(window, deadline: float) -> bool:
        waits.append(deadline - time.time())
        return False

    monkeypatch.setattr(app_module, "_run_panel_demo", demo)
    return waits


def test_the_train_panels_screenshot_waits_for_its_run_by_default(demo_waits, tmp_path, capsys):
    out = str(tmp_path / "shot.png")
    assert app_module.main(["--panel", "train", "--screenshot", out]) == 1
    assert TrainingPanel.screenshot_wait_s - 5 < demo_waits[-1] <= TrainingPanel.screenshot_wait_s
    assert f"did not finish within {TrainingPanel.screenshot_wait_s:g} s" in capsys.readouterr().err
    assert app_module.main(["--panel", "model", "--screenshot", out]) == 1  # another panel: the default
    assert app_module.WAIT_S - 5 < demo_waits[-1] <= app_module.WAIT_S
    assert app_module.main(["--panel", "train", "--screenshot", out, "--timeout", "7"]) == 1  # asked: that
    assert 2 < demo_waits[-1] <= 7
