"""Issue 13, clicked: the Lipschitz tab on the four walkthrough models. Run with the defaults (on the
demo model the text is too short for n = 128: the lengths it cannot fill are skipped and said),
then the adversarial construction and a synthetic head with small lengths typed in, then the table
exported through the export bar's Data button. No error dialog, no error log."""
from __future__ import annotations

import csv

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QToolButton

from .walkthrough import WALKTHROUGH_MODELS, open_window, click_panel_tab, type_into






def _run(qtbot, panel) -> None:
    rows = panel.table.rowCount()
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.is_running(), timeout=60_000)
    assert "failed" not in panel.status.text(), panel.status.text()
    assert "exponent" in panel.status.text(), panel.status.text()
    assert panel.table.rowCount() > rows


@pytest.mark.parametrize("name", WALKTHROUGH_MODELS)
def test_lipschitz_walkthrough(qtbot, model_dirs, name, error_watch, isolated_user_files, tmp_path, monkeypatch):
    window, state = open_window(qtbot, model_dirs[name], name=name, watch=error_watch)
    panel = click_panel_tab(qtbot, window, "Lipschitz")
    assert panel.source.currentText() == "Model layer" and panel.data.currentText() == "real"

    # the defaults, untouched: they fit the text on screen (issue 41), so the first Run skips none of them
    defaults = [int(n) for n in panel.lengths.text().split(",")]
    assert defaults[0] == 4 and len(defaults) >= 2
    _run(qtbot, panel)
    measured = [r.n for r in panel.runs[-1].result.lengths]
    assert measured == defaults and "skipped" not in panel.status.text(), panel.status.text()
    assert state.loaded.name in panel.table.item(0, 0).text()  # runs carry the model's name

    # the adversarial construction: one input per n, said (Samples K is never reduced silently)
    qtbot.keyClicks(panel.data, "adversarial")
    assert panel.data.currentText() == "adversarial"
    type_into(qtbot, panel.lengths, "4,8,16")
    type_into(qtbot, panel.samples, "2")
    assert panel.samples.value() == 2
    _run(qtbot, panel)
    assert [r.n for r in panel.runs[-1].result.lengths] == [4, 8, 16]
    assert "one sample each" in panel.status.text()

    # a synthetic head
    qtbot.keyClicks(panel.source, "Synthetic")
    assert panel.source.currentText() == "Synthetic head" and panel.d.isVisible()
    type_into(qtbot, panel.lengths, "3,6")
    _run(qtbot, panel)
    assert [r.n for r in panel.runs[-1].result.lengths] == [3, 6]
    assert len(panel.runs) == 3

    # the table through the export bar's Data button (CSV)
    out = tmp_path / "lipschitz.csv"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(out), "CSV table (*.csv)")))
    data_button = next(b for b in panel.export_bar.findChildren(QToolButton) if b.text() == "Data")
    qtbot.mouseClick(data_button, Qt.MouseButton.LeftButton)
    with open(out, newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0][0] == "run" and len(rows) - 1 == panel.table.rowCount()
    error_watch.assert_clean()
