"""ExportBar's one rule: the bar follows its views. A view that may have nothing to export emits `drawn` when what
it shows changes and the bar checks again, so no panel calls refresh() by hand (a missed call once left What if's
buttons disabled for weeks); a view that could change without saying so is refused when the bar is built."""
from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from desktop_app.ui.widgets import export
from desktop_app.ui.widgets.export import ExportBar


class _Numbers(QWidget):
    """The smallest exportable view: numbers that arrive later, shown as a label."""
    drawn = Signal()

    def __init__(self) -> None:
        super().__init__()
        self.values = None
        self.label = QLabel("nothing yet")
        QVBoxLayout(self).addWidget(self.label)

    def show_values(self, values) -> None:
        self.values = np.asarray(values, dtype=np.float64)
        self.label.setText(", ".join(f"{v:g}" for v in self.values))
        self.drawn.emit()

    def clear(self) -> None:
        self.values = None
        self.label.setText("nothing yet")
        self.drawn.emit()

    def export_unavailable(self):
        return None if self.values is not None else "Nothing to export yet: no numbers"

    def export_widget(self):
        return self

    def export_arrays(self):
        return {"values": self.values}


class _Silent(QWidget):
    """A view whose export can change (export_unavailable) with no `drawn` to say so."""

    def export_unavailable(self):
        return "Nothing to export yet"

    def export_widget(self):
        return self


def test_the_bar_follows_what_its_view_draws_and_exports_it(qtbot, tmp_path, monkeypatch):
    view = _Numbers()
    bar = ExportBar(lambda: view, lambda: "numbers")
    for w in (view, bar):
        qtbot.addWidget(w)
        w.show()
    assert not any(b.isEnabled() for b in bar.buttons.values())
    assert bar.buttons["PNG"].toolTip() == "Nothing to export yet: no numbers"

    view.show_values([1.5, -2.0, 3.25])  # no refresh() call: the bar hears `drawn`
    assert all(b.isEnabled() for b in bar.buttons.values())
    monkeypatch.setattr(export, "ask_save_path", lambda *a, **k: str(tmp_path / "numbers.npz"))
    qtbot.mouseClick(bar.buttons["Data"], Qt.MouseButton.LeftButton)
    np.testing.assert_array_equal(np.load(tmp_path / "numbers.npz")["values"], [1.5, -2.0, 3.25])

    view.clear()
    assert not any(b.isEnabled() for b in bar.buttons.values())


def test_the_bar_follows_every_view_it_is_given_not_only_the_current_one(qtbot):
    first, second = _Numbers(), _Numbers()
    shown = [first]
    bar = ExportBar(lambda: shown[0], lambda: "numbers", views=(first, second))
    qtbot.addWidget(bar)
    shown[0] = second  # as a tab change makes another view current
    second.show_values([1.0])
    assert all(b.isEnabled() for b in bar.buttons.values())


def test_a_view_that_cannot_say_it_drew_is_refused_when_the_bar_is_built(qtbot):
    view = _Silent()
    qtbot.addWidget(view)
    with pytest.raises(TypeError, match="_Silent has export_unavailable\\(\\) but no drawn signal"):
        ExportBar(lambda: view, lambda: "silent")
