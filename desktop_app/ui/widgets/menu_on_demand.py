"""A pyqtgraph ViewBox whose right-click menu is made at its first right-click.

pyqtgraph makes every ViewBox's context menu (View All, the X and Y axis forms, mouse mode...) when the
plot is made: ~5-8 ms a plot, and a panel of seven plots (Dynamics) makes seven at its first show, before
anyone right-clicks. This one makes it when first asked (a right-click, or another item's menu that
gathers it), so a person keeps the same menu.
"""
from __future__ import annotations

from typing import Callable

import pyqtgraph as pg
from PySide6.QtWidgets import QMenu
from pyqtgraph.graphicsItems.ViewBox.ViewBoxMenu import ViewBoxMenu


class MenuOnDemandViewBox(pg.ViewBox):
    """Pass as a plot's viewBox= (pg.PlotWidget(viewBox=...), addPlot(viewBox=...)); `fill_menu(menu)`, if
    given, adds the plot's own actions to the menu when it is made."""

    def __init__(self, *args, enableMenu: bool = True,  # noqa: N803 (pyqtgraph's name)
                 fill_menu: Callable[[QMenu], None] | None = None, **kwargs) -> None:
        super().__init__(*args, enableMenu=False, **kwargs)
        self.state["enableMenu"] = enableMenu  # (menuEnabled() says it; the menu itself waits)
        self._fill_menu = fill_menu

    def _applyMenuEnabled(self) -> None:  # noqa: N802 - pyqtgraph's: disabling drops a made menu, enabling waits
        if not self.menuEnabled() and self.menu is not None:
            self.menu.setParent(None)
            self.menu = None

    def getMenu(self, ev):  # noqa: N802
        if self.menu is None and self.menuEnabled():
            self.menu = ViewBoxMenu(self)
            self.updateViewLists()
            if self._fill_menu is not None:
                self._fill_menu(self.menu)
        return self.menu

    def getContextMenus(self, event):  # noqa: N802
        return self.getMenu(event).actions() if self.menuEnabled() else []
