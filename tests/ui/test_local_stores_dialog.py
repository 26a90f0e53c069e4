"""File > Open from Local Model Stores…: Ollama's and LM Studio's models (fake stores built by the test)
in a table; a refused row says why and cannot be opened; Open opens the chosen model."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

pytest.importorskip("gguf")
sys.path.insert(0, str(Path(__file__).parents[1] / "core" / "formats"))
from fake_stores import make_lmstudio, make_ollama  # noqa: E402

from desktop_app.ui.local_stores_dialog import LocalStoresDialog  # noqa: E402
from desktop_app.ui.main_window import MainWindow  # noqa: E402
from desktop_app.ui.state import AppState  # noqa: E402


@pytest.fixture
def home(tmp_path, monkeypatch, isolated_user_files):
    home = tmp_path / "home"
    make_ollama(home / ".ollama" / "models", tmp_path / "outside")
    make_lmstudio(home / ".lmstudio" / "models", tmp_path / "outside")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    return home


def _click(qtbot, table, row: int) -> None:
    qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton,
                     pos=table.visualRect(table.model().index(row, 1)).center())


def test_stores_listed_refusals_explained_and_open_opens(qtbot, home, tmp_path):
    window = MainWindow(AppState())
    qtbot.addWidget(window)
    window.show()
    window.local_stores_action.trigger()
    dialog = window.findChild(LocalStoresDialog)
    assert dialog is not None and dialog.isVisible()
    qtbot.waitUntil(lambda: dialog.table.rowCount() > 0, timeout=30_000)
    table = dialog.table
    rows = {table.item(r, 1).text(): r for r in range(table.rowCount())}
    assert len(rows) == 7 and "7 model(s), 2 the app can open" in dialog.status.text()
    evil = rows["evil:dots"]
    _click(qtbot, table, evil)
    assert not dialog.open_button.isEnabled()
    assert dialog.reason.text().startswith("Ollama evil:dots cannot be opened: the manifest names")
    tiny = rows["llama-tiny:q8"]
    assert [table.item(tiny, c).text() for c in (0, 2, 3, 5)] == ["Ollama", "llama", "Q8_0", "yes"]
    dialog.grab().save(str(tmp_path / "local-stores.png"))
    _click(qtbot, table, tiny)
    assert dialog.open_button.isEnabled()
    with qtbot.waitSignal(window.state.model_changed, timeout=20_000) as sig:
        qtbot.mouseClick(dialog.open_button, Qt.MouseButton.LeftButton)
    assert sig.args[0].name == "llama tiny" and sig.args[0].path.parent == home / ".ollama" / "models" / "blobs"
