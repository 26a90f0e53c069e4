"""Issue 25, probes beyond its list, on the Lipschitz panel (clicked): an absurd geom:LO:HI:COUNT is
refused in the status line before any allocation, and lengths skipped by the hundred are summarised
(geom:2:512:1000 on a 25-token text listed every skipped length, thousands of characters, in the status)."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from .test_lipschitz_panel import lipschitz_panel

TEXT = "a rose is a rose is a rose, said the gardener to the queen of hearts. "


@pytest.fixture
def panel(qtbot):
    p = lipschitz_panel(qtbot, TEXT, n_layers=1)
    yield p
    if p.is_running():
        qtbot.mouseClick(p.cancel_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: not p.is_running(), timeout=60_000)


def _type_lengths(qtbot, p, text: str) -> None:
    p.lengths.selectAll()
    qtbot.keyClicks(p.lengths, text)
    assert p.lengths.text() == text


def test_absurd_geom_count_is_refused_in_the_status_line(panel, qtbot):
    _type_lengths(qtbot, panel, "geom:2:512:1000000000000")
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    assert "COUNT from 1 to 1000" in panel.status.text() and not panel.is_running()


def test_hundreds_of_skipped_lengths_are_summarised(panel, qtbot):
    panel.samples.setValue(1)
    _type_lengths(qtbot, panel, "geom:8:4000:1000")  # the text has 71 tokens, the context 128
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.is_running() and panel.run_button.isEnabled(), timeout=120_000)
    status = panel.status.text()
    assert "skipped n = " in status and "lengths)" in status, status
    assert len(status) < 600, status  # one line's worth, not every skipped length


def test_default_lengths_fit_the_text_on_screen_and_typed_ones_are_kept(panel, qtbot):
    # the defaults went up to 128 on a 71-token text: the first Run skipped lengths it could not fill
    assert 64 <= len(panel._token_ids()) < 128
    assert panel.lengths.text() == "4,8,16,32,64"
    panel.samples.setValue(1)
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.is_running() and panel.run_button.isEnabled(), timeout=120_000)
    assert "skipped" not in panel.status.text(), panel.status.text()
    panel.state.set_text(TEXT[:20])  # a shorter text: the defaults follow it
    assert panel.lengths.text() == "4,8,16"
    _type_lengths(qtbot, panel, "4,8")
    panel.state.set_text(TEXT)
    assert panel.lengths.text() == "4,8"
