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

from ...core.files import atomic_write_bytes, check_output_file


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
    try:
        exporter = pge.SVGExporter(plot_item)
        data = exporter.export(toBytes=True)
    except ValueError:
        # pyqtgraph 0.14's exporter cannot parse the path syntax of recent Qt SVG output
        # ("not enough values to unpack"): draw the item's scene region through QSvgGenerator instead.
        save_scene_item_svg(plot_item, path)
        return
    atomic_write_bytes(Path(path), data if isinstance(data, bytes) else bytes(data))


def save_scene_item_svg(item, path: str | Path) -> None:
    """Vector SVG of a graphics item's region of its scene (QSvgGenerator, no pyqtgraph exporter)."""
    from PySide6.QtCore import QRect, QRectF
    from PySide6.QtGui import QPainter
    from PySide6.QtSvg import QSvgGenerator

    source = item.sceneBoundingRect()
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    gen = QSvgGenerator()
    gen.setOutputDevice(buf)
    views = item.scene().views()
    if views:  # same resolution as the screen: cached QPictures (axes) replay at their recorded scale
        gen.setResolution(views[0].logicalDpiX())
    w, h = max(1, int(source.width())), max(1, int(source.height()))
    gen.setSize(QRect(0, 0, w, h).size())
    gen.setViewBox(QRect(0, 0, w, h))
    painter = QPainter(gen)
    item.scene().render(painter, QRectF(0, 0, w, h), source)
    painter.end()
    atomic_write_bytes(Path(path), bytes(buf.data()))


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


def filter_suffixes(filters: str) -> list[str]:
    """['.png', '.svg'] from 'PNG image (*.png);;SVG (*.svg)' (wildcards like '*' are left out)."""
    import re

    return [m.lower() for m in re.findall(r"\*(\.[A-Za-z0-9]+)", filters)]


def with_filter_suffix(path: str, chosen_filter: str, filters: str) -> str:
    """A name typed without one of the offered extensions gets the one the chosen filter implies
    (Qt's non-native dialogs, and some native ones, return the name exactly as typed)."""
    offered = filter_suffixes(filters)
    if Path(path).suffix.lower() in offered:
        return path
    implied = filter_suffixes(chosen_filter) or offered
    return path + implied[0] if implied else path


def ask_save_path(parent: QWidget, title: str, default_name: str, filters: str) -> str | None:
    """File dialog for saving: opens in the last folder used, gives the name the extension of the
    chosen filter when it has none, remembers the folder; None when the user cancels."""
    from .. import settings as app_settings

    folder = app_settings.last_folder()
    start = str(Path(folder) / default_name) if folder else default_name
    path, chosen = QFileDialog.getSaveFileName(parent, title, start, filters)
    if not path:
        return None
    path = with_filter_suffix(path, chosen or "", filters)
    app_settings.set_last_folder(Path(path).parent)
    return path


# -- views: one export path for every panel view (added for the attention and layers panels) --


def save_widget_svg(widget: QWidget, path: str | Path) -> None:
    """Vector SVG of any Qt widget (tables, labels): QSvgGenerator records its paint calls."""
    from PySide6.QtCore import QPoint, QRect, QSize
    from PySide6.QtGui import QPainter
    from PySide6.QtSvg import QSvgGenerator

    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    gen = QSvgGenerator()
    gen.setOutputDevice(buf)
    gen.setResolution(widget.logicalDpiX())  # as on screen: cached QPictures replay at their recorded scale
    size = widget.size() if widget.width() > 0 else QSize(800, 600)
    gen.setSize(size)
    gen.setViewBox(QRect(0, 0, size.width(), size.height()))
    painter = QPainter(gen)
    QWidget.render(widget, painter, QPoint())  # QWidget's overload, also for QGraphicsViews
    painter.end()
    atomic_write_bytes(Path(path), bytes(buf.data()))


EXPORT_SUFFIXES = (".png", ".svg", ".csv", ".npz")


def export_view(view, path: str | Path) -> None:
    """Write what `view` shows to `path`, by suffix: .png, .svg (vector), .csv or .npz (the numbers).

    A view provides export_widget() (the QWidget drawn in PNG and SVG), optionally svg_item() (a
    pyqtgraph item for pyqtgraph's SVG exporter), export_arrays() -> {name: array}, optionally
    csv_table() -> (header, rows) and optionally export_unavailable() -> None, or one line saying why
    there is nothing to export yet (then nothing is written: a blank image or an empty .npz says nothing).
    """
    path = Path(path)
    why = export_unavailable(view)
    if why:
        raise ValueError(why)
    check_output_file(path, overwrite=True)  # the dialog asked about replacing; never a link or special file
    suffix = path.suffix.lower()
    if suffix == ".png":
        save_widget_png(view.export_widget(), path)
    elif suffix == ".svg":
        item = view.svg_item() if hasattr(view, "svg_item") else None
        if item is not None:
            save_plot_svg(item, path)
        else:
            save_widget_svg(view.export_widget(), path)
    elif suffix == ".csv":
        table = view.csv_table() if hasattr(view, "csv_table") else None
        if table is None:
            raise ValueError(f"{path}: this view has no table; export its numbers as .npz")
        save_csv(path, *table)
    elif suffix == ".npz":
        save_npz(path, **view.export_arrays())
    else:
        raise ValueError(f"{path}: unknown export format {suffix!r} (use {', '.join(EXPORT_SUFFIXES)})")


def export_unavailable(view) -> str | None:
    """None when `view` has something to export, else the one line its export_unavailable() gives."""
    check = getattr(view, "export_unavailable", None)
    return check() if callable(check) else None


def show_saved(widget: QWidget, path: str | Path) -> None:
    """'Saved /path/file.png' in the status bar of the window holding `widget` (every export says where it saved)."""
    say_in_status_bar(widget, f"Saved {path}")


def say_in_status_bar(widget: QWidget, message: str) -> None:
    from PySide6.QtWidgets import QMainWindow

    window = widget.window()
    if isinstance(window, QMainWindow):
        window.statusBar().showMessage(message, 8000)


class ExportBar(QWidget):
    """PNG / SVG / Data / Copy buttons acting on whatever view `current_view()` returns.

    The buttons are disabled, their tooltip saying why, while the view has nothing to export (its
    export_unavailable()); a saved export says where in the window's status bar.

    One rule keeps the buttons true to the view: the bar follows its views. A view whose export_unavailable()
    can change has a `drawn` signal that it emits whenever what it shows changes (drawn, cleared); the bar
    checks again on the `drawn` of every view it is given (`views`; by default the one current_view() returns
    when the bar is made) and when it is shown. A panel whose current view changes with its tab connects the
    tab change to refresh(); nothing calls refresh() after drawing (a missed call left buttons disabled)."""

    TIPS = {"PNG": "Save the view as a PNG image", "SVG": "Save the view as a vector SVG figure",
            "Data": "Save the numbers behind the view (CSV or NPZ)", "Copy": "Copy the view's image to the clipboard"}

    def __init__(self, current_view, default_name, parent: QWidget | None = None, views=None) -> None:
        from PySide6.QtWidgets import QHBoxLayout, QMessageBox, QToolButton

        super().__init__(parent)
        self._current_view = current_view
        self._default_name = default_name
        self._message_box = QMessageBox
        self.buttons: dict[str, QToolButton] = {}
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        for text, slot in (("PNG", lambda: self._save("PNG image (*.png)", ".png")),
                           ("SVG", lambda: self._save("SVG (*.svg)", ".svg")),
                           ("Data", self._save_data),
                           ("Copy", self.copy)):
            b = QToolButton(self)
            b.setText(text)
            b.setToolTip(self.TIPS[text])
            b.clicked.connect(slot)
            lay.addWidget(b)
            self.buttons[text] = b
        for view in (views if views is not None else [current_view()]):
            self.follow(view)
        self.refresh()

    def follow(self, view) -> None:
        """Check again whenever `view` emits `drawn`. A view that may have nothing to export and has no
        `drawn` is refused here, when the panel is built, rather than leaving its buttons stale."""
        drawn = getattr(view, "drawn", None)
        if drawn is not None:
            drawn.connect(self.refresh)
        elif hasattr(view, "export_unavailable"):
            raise TypeError(f"{type(view).__name__} has export_unavailable() but no drawn signal: "
                            "an export bar could not follow what it shows")

    def refresh(self) -> None:
        """Enable the buttons when the view has something to export; else disable them and say why."""
        why = export_unavailable(self._current_view())
        for text, b in self.buttons.items():
            b.setEnabled(not why)
            b.setToolTip(why or self.TIPS[text])

    def showEvent(self, event) -> None:  # noqa: N802 (Qt)
        super().showEvent(event)
        self.refresh()

    def _unavailable(self) -> bool:
        """A click that comes before refresh() (or File > Export Current View): say why, write nothing."""
        why = export_unavailable(self._current_view())
        if why:
            say_in_status_bar(self, why)
            self.refresh()
        return bool(why)

    def copy(self) -> None:
        if self._unavailable():
            return
        copy_widget_image(self._current_view().export_widget())
        say_in_status_bar(self, "Copied the view's image to the clipboard")

    def _save_data(self) -> None:
        view = self._current_view()
        if hasattr(view, "csv_table") and view.csv_table() is not None:
            self._save("CSV table (*.csv);;NumPy arrays (*.npz)", ".csv")
        else:  # arrays with no table form (e.g. one matrix per head)
            self._save("NumPy arrays (*.npz)", ".npz")

    def save_any(self) -> None:
        """Every format this view can be saved in, in one dialog (File > Export Current View)."""
        if self._unavailable():
            return
        view = self._current_view()
        filters = ["PNG image (*.png)", "SVG (*.svg)"]
        if hasattr(view, "csv_table") and view.csv_table() is not None:
            filters.append("CSV table (*.csv)")
        if hasattr(view, "export_arrays"):
            filters.append("NumPy arrays (*.npz)")
        self._save(";;".join(filters), ".png")

    def _save(self, filters: str, suffix: str) -> None:
        if self._unavailable():
            return
        path = ask_save_path(self, "Export", self._default_name() + suffix, filters)
        if not path:
            return
        try:
            export_view(self._current_view(), path)
        except Exception as exc:  # a failed export must not take the app down
            self._message_box.warning(self, "Export failed", str(exc))
            return
        show_saved(self, path)
