"""Export what a view shows: PNG and SVG of a widget or plot, the numbers as CSV or NPZ.

One place for every panel's export buttons; all file writes are atomic (core.checkpoints).
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Iterable, Sequence

from PySide6.QtCore import QBuffer, QIODevice
from PySide6.QtWidgets import QApplication, QFileDialog, QWidget

from ...core.checkpoints import atomic_write_bytes


def widget_png_bytes(widget: QWidget) -> bytes:
    pixmap = widget.grab()
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    pixmap.save(buf, "PNG")
    return bytes(buf.data())


def save_widget_png(widget: QWidget, path: str | Path) -> None:
    atomic_write_bytes(Path(path), widget_png_bytes(widget))


def save_plot_svg(item, path: str | Path) -> None:
    """Vector SVG of a pyqtgraph PlotItem / GraphicsScene item (or PlotWidget)."""
    import pyqtgraph.exporters as pge

    plot_item = item.getPlotItem() if hasattr(item, "getPlotItem") else item
    exporter = pge.SVGExporter(plot_item)
    data = exporter.export(toBytes=True)
    atomic_write_bytes(Path(path), data if isinstance(data, bytes) else bytes(data))


def save_csv(path: str | Path, header: Sequence[str], rows: Iterable[Sequence]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    atomic_write_bytes(Path(path), buf.getvalue().encode("utf-8"))


def save_npz(path: str | Path, **arrays) -> None:
    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(Path(path), buf.getvalue())


def copy_widget_image(widget: QWidget) -> None:
    QApplication.clipboard().setPixmap(widget.grab())


def ask_save_path(parent: QWidget, title: str, default_name: str, filters: str) -> str | None:
    """File dialog for exports; returns None when the user cancels."""
    path, _ = QFileDialog.getSaveFileName(parent, title, default_name, filters)
    return path or None
