"""Dynamics: Step clicked quickly, many times, with the demo model open: each click advances one frame (of
'Steps / frame' steps), and the status line says the time the particles are at, not the last curve
measurement's (ui17 saw 20 quick clicks give t = 0.1, the status still at t = 0)."""
from __future__ import annotations

import re

import pytest
from PySide6.QtCore import Qt

from .walkthrough import click_panel_tab, open_window

CLICKS = 20


def _status_t(panel) -> float:
    """The time the status line names first ('… t = 1.3: 1 cluster(s) …')."""
    found = re.search(r"\bt = ([-0-9.e+]+)", panel.status.text())
    assert found, panel.status.text()
    return float(found.group(1))


def test_quick_step_clicks_each_advance_one_frame_and_the_status_says_t(qtbot, model_dirs, isolated_user_files):
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    panel = click_panel_tab(qtbot, window, "Dynamics")
    qtbot.waitUntil(lambda: panel.sim is not None and not panel.is_running(), timeout=30_000)  # the first look
    dt, per_click = panel.dt.value(), panel.steps_per_frame.value()
    assert panel._frames[-1].t == 0 and _status_t(panel) == 0
    for _ in range(CLICKS):  # faster than a step: the clicks come while the first one's worker runs
        qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.is_running(), timeout=60_000)
    assert panel.sim.steps == CLICKS * per_click
    assert len(panel._frames) == 1 + CLICKS  # one frame a click, for the time slider
    assert panel._frames[-1].t == pytest.approx(CLICKS * per_click * dt)
    assert _status_t(panel) == pytest.approx(CLICKS * per_click * dt)
    assert panel.time_label.text() == f"t = {panel._frames[-1].t:.3g}"

    # three more (no curve measured at their end: every 10 steps): the status follows each one too
    for _ in range(3):
        qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.is_running(), timeout=60_000)
    assert panel._frames[-1].t == pytest.approx((CLICKS + 3) * per_click * dt)
    assert _status_t(panel) == pytest.approx((CLICKS + 3) * per_click * dt)


def test_step_clicks_waiting_their_turn_go_with_a_reset(qtbot, model_dirs, isolated_user_files):
    """Steps clicked for the particles on show are not run on the ones Reset builds next."""
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    panel = click_panel_tab(qtbot, window, "Dynamics")
    qtbot.waitUntil(lambda: panel.sim is not None and not panel.is_running(), timeout=30_000)
    for _ in range(5):
        qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.sim is not None and not panel.is_running(), timeout=30_000)
    assert panel.sim.steps == 0 and len(panel._frames) == 1 and _status_t(panel) == 0
