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


def test_step_clicks_while_the_texts_trace_runs_build_the_particles_from_it_then_step(
        qtbot, model_dirs, isolated_user_files, monkeypatch):
    """From the tokens: a new text's trace runs (held after its first layer), Step clicked three times. The
    particles are built from its tokens once it arrives, then stepped three times (before: built only)."""
    from .test_stale_state import _held_after_the_first_layer

    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    panel = click_panel_tab(qtbot, window, "Dynamics")
    qtbot.waitUntil(lambda: panel.sim is not None and not panel.is_running(), timeout=30_000)
    panel.init.setCurrentIndex(panel.init.findData("tokens"))
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)  # from the text's tokens
    qtbot.waitUntil(lambda: panel.sim is not None and not panel.is_running(), timeout=30_000)
    gate, reached, _ = _held_after_the_first_layer(state, monkeypatch)
    state.set_text("Alice was beginning to get very tired of sitting by her sister on the bank.")
    qtbot.waitUntil(lambda: reached.is_set() and state.tracing is not None, timeout=30_000)
    for _ in range(3):
        qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    assert panel.sim is None and panel.status.text().startswith("Tracing the text")
    gate.set()
    qtbot.waitUntil(lambda: state.trace_is_current(), timeout=30_000)
    qtbot.waitUntil(lambda: panel.sim is not None and not panel.is_running(), timeout=30_000)
    assert panel.sim.config.n == len(state.token_ids)  # the new text's tokens
    assert panel.sim.steps == 3 * panel.steps_per_frame.value() and len(panel._frames) == 4
    assert _status_t(panel) == pytest.approx(panel._frames[-1].t)
