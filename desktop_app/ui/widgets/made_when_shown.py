"""A widget made when it is first shown (or first asked for), its place in the layout held meanwhile.

A panel's first show makes everything it holds on the UI thread: a pyqtgraph plot is ~10-25 ms to make, and
a plot on a tab not on show, or in a box shown only for some models, is made for nothing at that click. Put
`MadeWhenShown(make)` where the widget goes: `make()` runs at the placeholder's first show (its tab chosen,
its box shown) or at the first `.widget()`, whichever comes first, and the widget fills the placeholder.

    page = MadeWhenShown(lambda: Heatmap(...))
    tabs.addTab(page, "Patching")
    page.made          # False until then
    page.widget()      # the widget (made now if not yet)
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtWidgets import QVBoxLayout, QWidget


class MadeWhenShown(QWidget):
    def __init__(self, make: Callable[[], QWidget], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._make = make
        self._widget: QWidget | None = None
        QVBoxLayout(self).setContentsMargins(0, 0, 0, 0)

    @property
    def made(self) -> bool:
        return self._widget is not None

    def widget(self) -> QWidget:
        if self._widget is None:
            from ..settings import palette_is_dark, restyle_plots

            self._widget = w = self._make()
            self.layout().addWidget(w)
            if palette_is_dark():  # (pyqtgraph's own colours: as the window does for a panel built after the theme)
                restyle_plots(w)
            if self.isVisible():  # now, at its size (else a queued call shows it, then lays it out, after a paint)
                w.show()
                self.layout().activate()  # (a layout skips a widget not shown yet)
        return self._widget

    def showEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self.widget()
        super().showEvent(event)
