"""Widgets drawn without a window (the render command, benchmarks, screenshots): their clean end."""
from __future__ import annotations


def dispose(panel) -> None:
    """Delete the widgets while the QApplication still exists: left to interpreter shutdown, PySide6
    and pyqtgraph may tear them down in an order that crashes the process after the file is written."""
    import gc

    from PySide6.QtCore import QCoreApplication, QEvent

    panel.close()
    panel.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    QCoreApplication.processEvents()
    del panel
    gc.collect()
