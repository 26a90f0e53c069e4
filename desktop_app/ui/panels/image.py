"""Image panel: a vision transformer (ViT) on one image, and the lectures' three ViT figures.

An image comes from a file (PNG / JPEG..., decoded by Qt; or dropped on the panel) or from the held-out
8 x 8 digits. The model's prediction (top classes, id2label), the image as the model sees it (after
preprocessing) with its patch grid; a click on a patch, or [CLS], shows where every head of the chosen
layer looks from there: that query's attention over the patches, as a heat overlay on the image.

Figures (core/vit.py): the patch embedding's filters (first principal components, as small images),
the position-embedding similarity (one small map per patch: cosine with every patch's position
embedding), and the mean attention distance in pixels of every head against depth, for this image.
Model code runs in workers through AppState.run (a result or error of a job started for another model,
or other what-if edits, is dropped); the panel is a ResultView: another model clears what it shows, other
edits analyse the image again with them. The widgets only draw numbers they are handed.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PySide6.QtCore import QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QImage, QPainter, QPen
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QLabel, QPushButton, QScrollArea, QSpinBox, QTabWidget,
                               QVBoxLayout, QWidget)

from ...app.images import image_pixel_values
from ...app.tracing import analyse_image  # the model's forward runs below ui/
from ...core.views.image import TABS as IMAGE_TABS, ImageViewState
from ..state import EDITS, MODEL, ResultView
from ..widgets.export import ExportBar

NOT_YET = "Nothing to export yet: the figure is being computed."
NOT_A_VIT = ("Nothing to export: the Image panel's figures are for vision transformers (ViT); "
             "the open model reads text.")
FILTER_COMPONENTS = 28  # the lectures' figure shows the first 28 principal components
TOP_CLASSES = 5


# -- work done in workers (no Qt) --------------------------------------------------------------


# an image file as the model's pixel values [C, H, W], read as `trace --image` reads it (ValueError: one line)
file_pixels = image_pixel_values


def model_figures(loaded) -> dict:
    """The figures of the weights alone: patch-embedding principal components, position similarity."""
    from ...core.vit import patch_embedding_filters, position_similarity

    k = min(FILTER_COMPONENTS, loaded.config.d_model, loaded.config.num_channels * loaded.config.patch_size ** 2)
    return {"filters": patch_embedding_filters(loaded.model, principal_components=k),
            "similarity": position_similarity(loaded.model)}


# -- drawing helpers ---------------------------------------------------------------------------


def colormap_rgb(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """values -> viridis RGB uint8 [..., 3] over [lo, hi]."""
    import pyqtgraph as pg

    span = (hi - lo) or 1.0
    t = np.clip((np.asarray(values, dtype=np.float64) - lo) / span, 0, 1)
    lut = pg.colormap.get("viridis").getLookupTable(0.0, 1.0, 256, alpha=False)
    return lut[(t * 255).round().astype(int)].astype(np.uint8)


def shown_image(pixels: np.ndarray, settings) -> np.ndarray:
    """Pixel values [C, H, W] back to the RGB uint8 image [H, W, 3] the model reads (normalisation undone)."""
    x = np.asarray(pixels, dtype=np.float64)
    if settings.do_normalize:
        x = x * np.asarray(settings.image_std)[:, None, None] + np.asarray(settings.image_mean)[:, None, None]
    if settings.do_rescale:
        x = x / settings.rescale_factor
    x = np.clip(x, 0, 255).round().astype(np.uint8).transpose(1, 2, 0)
    return np.repeat(x, 3, axis=2) if x.shape[2] == 1 else x[:, :, :3]


def heat_over(image: np.ndarray, weights: np.ndarray, patch: int) -> np.ndarray:
    """The image in grey with a heat colour over each patch, as strong as its weight (max weight = full)."""
    grey = image.astype(np.float64).mean(-1, keepdims=True).repeat(3, -1)
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.max() if w.max() > 0 else w
    heat = colormap_rgb(w, 0, 1).astype(np.float64)
    alpha = 0.75 * np.kron(w, np.ones((patch, patch)))[:, :, None]
    heat = np.kron(heat, np.ones((patch, patch, 1)))
    return ((1 - alpha) * grey * 0.7 + alpha * heat).clip(0, 255).astype(np.uint8)


def to_qimage(rgb: np.ndarray) -> QImage:
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    h, w = rgb.shape[:2]
    return QImage(rgb.data, w, h, 3 * w, QImage.Format.Format_RGB888).copy()


class ImageCanvas(QWidget):
    """The image the model reads, drawn large, with its patch grid; a click picks a patch (query)."""

    patch_clicked = Signal(int)  # patch index, row by row

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.rgb: np.ndarray | None = None
        self.grid = 1
        self.selected: int | None = None  # None: [CLS] is the query
        self.setMinimumSize(240, 240)
        self.setCursor(Qt.CursorShape.PointingHandCursor)

    def set_image(self, rgb: np.ndarray | None, grid: int) -> None:
        self.rgb, self.grid = rgb, max(grid, 1)
        self.update()

    def image_rect(self) -> QRect:
        side = min(self.width(), self.height()) - 8
        return QRect((self.width() - side) // 2, (self.height() - side) // 2, side, side)

    def patch_center(self, index: int) -> QPoint:
        """Where patch `index` (row by row) is drawn: what a test clicks."""
        r, c = divmod(index, self.grid)
        rect, cell = self.image_rect(), self.image_rect().width() / self.grid
        return QPoint(int(rect.left() + (c + 0.5) * cell), int(rect.top() + (r + 0.5) * cell))

    def mousePressEvent(self, event) -> None:  # noqa: N802 (Qt)
        rect, p = self.image_rect(), event.position()
        if self.rgb is None or not rect.contains(p.toPoint()):
            return
        cell = rect.width() / self.grid
        c = min(int((p.x() - rect.left()) / cell), self.grid - 1)
        r = min(int((p.y() - rect.top()) / cell), self.grid - 1)
        self.patch_clicked.emit(r * self.grid + c)

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt)
        painter = QPainter(self)
        painter.fillRect(self.rect(), self.palette().window())
        if self.rgb is None:
            painter.drawText(self.rect(), Qt.AlignmentFlag.AlignCenter, "No image")
            return
        rect = self.image_rect()
        painter.drawImage(rect, to_qimage(self.rgb))
        painter.setPen(QPen(QColor(255, 255, 255, 120), 1))
        cell = rect.width() / self.grid
        for i in range(1, self.grid):
            x, y = int(rect.left() + i * cell), int(rect.top() + i * cell)
            painter.drawLine(x, rect.top(), x, rect.bottom())
            painter.drawLine(rect.left(), y, rect.right(), y)
        if self.selected is not None:
            r, c = divmod(self.selected, self.grid)
            painter.setPen(QPen(QColor(255, 60, 60), 3))
            painter.drawRect(QRect(int(rect.left() + c * cell), int(rect.top() + r * cell), int(cell), int(cell)))
        painter.end()


class Mosaic(QWidget):
    """Small images in a grid, each with a title: heads, filters, position-similarity maps."""
    drawn = Signal()  # set_tiles changed what is on show (an ExportBar follows it)

    def __init__(self, cell: int = 96, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.cell = cell
        self.tiles: list[tuple[str, np.ndarray]] = []
        self.columns = 1
        self.caption = ""
        self.room = 0  # the width it is shown in (its scroll area's): the caption wraps to it (0: one line)

    def set_tiles(self, tiles: list[tuple[str, np.ndarray]], columns: int, caption: str = "") -> None:
        self.tiles, self.columns, self.caption = tiles, max(columns, 1), caption
        self.setFixedSize(self.sizeHint())
        self.update()
        self.drawn.emit()

    def fit_width(self, room: int) -> None:
        """Shown `room` pixels wide: the caption wraps there, never cut (at 1024x640 the Heads caption ran past
        the view, under a horizontal scroll bar)."""
        if room != self.room:
            self.room = room
            self.setFixedSize(self.sizeHint())
            self.update()

    def _caption_rect(self, width: int) -> QRect:
        flags = Qt.AlignmentFlag.AlignLeft | Qt.TextFlag.TextWordWrap
        box = self.fontMetrics().boundingRect(QRect(6, 2, width - 12, 10_000), flags, self.caption)
        return QRect(6, 2, width - 12, max(22, box.height() + 4))

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt)
        rows = -(-len(self.tiles) // self.columns) if self.tiles else 1
        tiles = self.columns * (self.cell + 6) + 6
        one_line = self.fontMetrics().horizontalAdvance(self.caption) + 12
        width = max(tiles, self.room) if self.room else max(tiles, one_line)  # the caption is never cut
        return QSize(width, rows * (self.cell + 20) + self._caption_rect(width).height() + 6)

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt)
        painter = QPainter(self)
        if not self.tiles and not self.caption:  # nothing to show yet: no blank white card
            painter.fillRect(self.rect(), self.palette().window())
            painter.end()
            return
        painter.fillRect(self.rect(), QColor("white"))
        painter.setPen(QColor("black"))
        caption = self._caption_rect(self.width())
        painter.drawText(caption, Qt.AlignmentFlag.AlignLeft | Qt.TextFlag.TextWordWrap, self.caption)
        for i, (title, rgb) in enumerate(self.tiles):
            r, c = divmod(i, self.columns)
            x, y = 6 + c * (self.cell + 6), caption.bottom() + 6 + r * (self.cell + 20)
            painter.drawText(QRect(x, y, self.cell, 16), Qt.AlignmentFlag.AlignCenter, title)
            painter.drawImage(QRect(x, y + 17, self.cell, self.cell), to_qimage(rgb))
        painter.end()


class MosaicView(QWidget):
    """A Mosaic in a scroll area, with what its exports write (export_widget, csv_table, export_arrays)."""

    def __init__(self, cell: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.mosaic = Mosaic(cell)
        self.drawn = self.mosaic.drawn  # what this view exports is what its mosaic shows
        self.scroll = scroll = QScrollArea()
        scroll.setWidget(self.mosaic)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(scroll)
        self.header: list[str] = []
        self.rows: list[list] = []
        self.arrays: dict[str, np.ndarray] = {}
        self.empty_reason = NOT_A_VIT  # why there is nothing to export while the mosaic is empty

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt)
        super().resizeEvent(event)
        self.mosaic.fit_width(self.scroll.viewport().width())

    def clear(self, reason: str) -> None:
        """Nothing shown (another model, or none yet): nothing exported, `reason` says why."""
        self.mosaic.set_tiles([], 1)
        self.header, self.rows, self.arrays, self.empty_reason = [], [], {}, reason

    def export_unavailable(self) -> str | None:
        return None if self.mosaic.tiles else self.empty_reason

    def export_widget(self) -> QWidget:
        return self.mosaic

    def csv_table(self):
        return (self.header, self.rows) if self.header else None

    def export_arrays(self) -> dict[str, np.ndarray]:
        return dict(self.arrays)


class DistanceView(QWidget):
    """Mean attention distance (pixels) of every head against depth: one dot per head, for this image."""
    drawn = Signal()  # clear or set_distance changed what is on show (an ExportBar follows it)

    def __init__(self, parent: QWidget | None = None) -> None:
        import pyqtgraph as pg

        super().__init__(parent)
        self.plot = pg.PlotWidget(background="w")
        self.plot.setLabel("bottom", "network depth (layer)")
        self.plot.setLabel("left", "mean attention distance (pixels)")
        self.plot.showGrid(x=True, y=True, alpha=0.3)
        self.scatter = pg.ScatterPlotItem(size=9, brush=pg.mkBrush(60, 90, 200, 200), pen=None)
        self.plot.addItem(self.scatter)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.plot)
        self.distance = np.zeros((0, 0))
        self.empty_reason = NOT_A_VIT

    def clear(self, reason: str) -> None:
        self.distance, self.empty_reason = np.zeros((0, 0)), reason
        self.scatter.setData(x=[], y=[])
        self.drawn.emit()

    def export_unavailable(self) -> str | None:
        return None if self.distance.size else self.empty_reason

    def set_distance(self, distance: np.ndarray) -> None:
        self.distance = np.asarray(distance, dtype=np.float64)
        layers, heads = self.distance.shape
        x = np.repeat(np.arange(layers), heads).astype(float)
        self.scatter.setData(x=x, y=self.distance.reshape(-1))
        self.plot.setXRange(-0.5, max(layers - 0.5, 0.5))
        self.plot.setYRange(0, max(float(self.distance.max()) * 1.1, 1.0) if self.distance.size else 1.0)
        self.drawn.emit()

    def export_widget(self) -> QWidget:
        return self.plot

    def svg_item(self):
        return self.plot.getPlotItem()

    def csv_table(self):
        layers, heads = self.distance.shape if self.distance.size else (0, 0)
        return (["layer", "head", "mean_attention_distance_px"],
                [[l, h, float(self.distance[l, h])] for l in range(layers) for h in range(heads)])

    def export_arrays(self) -> dict[str, np.ndarray]:
        return {"mean_attention_distance": self.distance}


# -- the panel ---------------------------------------------------------------------------------


class ImagePanel(QWidget, ResultView):
    title = "Image"
    help_text = ("A vision transformer (ViT) reads an image as patches: a Conv2d cuts it into P x P patches, "
                 "each becomes one token, a learned [CLS] token goes first and the classifier reads [CLS]. "
                 "Click a patch (or [CLS]) to see where each head of the chosen layer looks from there: "
                 "row q of softmax(QK^T / sqrt(d_head)) over the patches, drawn on the image. "
                 "Mean attention distance of a head = sum_k a[q, k] |centre(q) - centre(k)| in pixels, "
                 "averaged over the query patches ([CLS] left out, rows renormalised over the patches).")
    result_parts = (MODEL, EDITS)  # what its figures and analysis are computed for (the image is its own)

    def __init__(self, state, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.loaded = None
        self.settings = None
        self.pixels: np.ndarray | None = None
        self.result: dict | None = None
        self.source = ""
        self.setAcceptDrops(True)

        self.open_button = QPushButton("Open image…")
        self.open_button.clicked.connect(self._browse)
        self.digit = QSpinBox()
        self.digit.setRange(0, 358)
        self.digit.setPrefix("held-out digit ")
        self.digit.setToolTip("One of the 8 x 8 handwritten digits the digits task holds out (never trained on)")
        self.digit.valueChanged.connect(self.show_digit)
        self.cls_button = QPushButton("[CLS]")
        self.cls_button.setToolTip("Show where each head looks from the [CLS] token (what the classifier reads)")
        self.cls_button.clicked.connect(lambda: self.select_query(None))
        self.layer = QSpinBox()
        self.layer.setPrefix("layer ")
        self.layer.valueChanged.connect(lambda _: self._draw_heads())
        self.message = QLabel("")
        self.message.setWordWrap(True)
        self.message.setStyleSheet("color: #b00020")
        self.source_label = QLabel("")
        self.source_label.setWordWrap(True)
        self.prediction = QLabel("")
        self.prediction.setTextFormat(Qt.TextFormat.PlainText)
        self.prediction.setStyleSheet("font-family: monospace")
        self.canvas = ImageCanvas()
        self.canvas.patch_clicked.connect(self.select_query)

        left = QVBoxLayout()
        row = QHBoxLayout()
        row.addWidget(self.open_button)
        row.addWidget(self.digit)
        left.addLayout(row)
        left.addWidget(self.source_label)
        left.addWidget(self.canvas, 1)
        row = QHBoxLayout()
        row.addWidget(self.cls_button)
        row.addWidget(self.layer)
        left.addLayout(row)
        left.addWidget(QLabel("Prediction (top classes):"))
        left.addWidget(self.prediction)
        left.addWidget(self.message)

        self.heads_view = MosaicView(110)
        self.filters_view = MosaicView(56)
        self.similarity_view = MosaicView(40)
        self.distance_view = DistanceView()
        self.views = [self.heads_view, self.filters_view, self.similarity_view, self.distance_view]
        self.tabs = QTabWidget()
        for view, name in zip(self.views, ("Heads", "Patch filters", "Position similarity", "Attention distance")):
            self.tabs.addTab(view, name)
        self.export_bar = ExportBar(self.current_view,
                                    lambda: "vit_" + ("heads", "filters", "position_similarity",
                                                      "attention_distance")[self.tabs.currentIndex()],
                                    views=self.views)
        self.tabs.currentChanged.connect(lambda _: self.export_bar.refresh())
        right = QVBoxLayout()
        right.addWidget(self.tabs, 1)
        right.addWidget(self.export_bar, 0, Qt.AlignmentFlag.AlignRight)  # compact, as on the other panels

        top = QHBoxLayout(self)
        top.addLayout(left, 2)
        top.addLayout(right, 3)

        self._wanted: tuple | None = None  # (pixels, source) last asked for: an older image's analysis is not shown
        self.watch_inputs(state)
        state.model_changed.connect(self.set_model)
        if getattr(state, "loaded", None) is not None:
            self.set_model(state.loaded)
        else:
            self._enable(False, "Open a vision transformer (ViT) model folder to look at images.")

    # -- workspace (MainWindow saves view_state and gives it back with set_view_state) ----------
    VIEW_TABLE = None  # no views table: these choices are the panel's whole view state

    @property
    def view_state(self) -> ImageViewState:
        """The digit, layer, query patch and tab (the figures are recomputed from them)."""
        return ImageViewState(digit=self.digit.value(), layer=self.layer.value(), patch=self.canvas.selected,
                              tab=IMAGE_TABS[self.tabs.currentIndex()])

    def set_view_state(self, state: ImageViewState) -> None:
        """Show a workspace's choices. Before its ViT opens (a workspace opens the model last) the
        patch cannot be checked against the grid: it is checked when the model arrives, before any
        worker has drawn with it."""
        if state.tab in IMAGE_TABS:
            self.tabs.setCurrentIndex(IMAGE_TABS.index(state.tab))
        self.layer.setValue(state.layer)  # clamped to the open model's layers (again when one opens)
        self.canvas.selected = state.patch
        if not self._patch_checked_on_model:
            self._patch_checked_on_model = True
            self.state.model_changed.connect(self._drop_patch_outside_grid)  # after set_model
        self._drop_patch_outside_grid(self.loaded)
        self.digit.setValue(state.digit)  # shows (and analyses) that digit when a ViT is open
        self.select_query(self.canvas.selected)

    _patch_checked_on_model = False

    def _drop_patch_outside_grid(self, loaded) -> None:
        """A patch the model has not (another model, a hand-edited file) becomes [CLS]."""
        if loaded is None or loaded.config.input_kind != "patches" or self.canvas.selected is None:
            return
        g = loaded.config.image_size // loaded.config.patch_size
        if not 0 <= self.canvas.selected < g * g:
            self.canvas.selected = None

    def current_view(self):
        """The tab shown: what the export bar and File > Export Current View save."""
        return self.views[self.tabs.currentIndex()]

    # -- model -----------------------------------------------------------------------------
    def _enable(self, on: bool, why: str = "") -> None:
        for w in (self.open_button, self.digit, self.cls_button, self.layer):
            w.setEnabled(on)
        self.message.setText(why)

    def clear_results(self, changed: frozenset) -> None:
        """AppState.inputs_changed: another model's image, prediction, heads and figures go (its late
        results and errors are dropped by AppState.run); other edits analyse the image again."""
        if MODEL in changed:
            self._clear(NOT_YET)
            self.message.setText("")
        elif self._wanted is not None and self.loaded is not None:  # (also one whose analysis was dropped)
            self._analyse(self.loaded, *self._wanted)

    def _clear(self, reason: str) -> None:
        self.result, self.pixels, self._wanted = None, None, None
        self.canvas.set_image(None, 1)
        self.source_label.setText("")
        self.prediction.setText("")
        for view in self.views:  # the previous model's figures are not this one's: never exported as such
            view.clear(reason)

    def set_model(self, loaded) -> None:
        self.loaded = loaded
        is_vit = loaded is not None and loaded.config.input_kind == "patches"
        self._clear(NOT_YET if is_vit else NOT_A_VIT)
        if not is_vit:
            self._enable(False, "The Image view is for vision transformers (ViT): open a ViT model folder "
                                "(e.g. one trained on the digits task in the Train panel).")
            return
        self._enable(True)
        cfg = loaded.config
        self.layer.setRange(0, cfg.n_layers - 1)
        try:
            from ...core.vit import image_settings
            self.settings = image_settings(loaded.path, loaded.config)
        except ValueError as exc:  # a broken preprocessor_config.json: one line naming it
            self._enable(False, str(exc))
            for view in self.views:
                view.clear(f"Nothing to export: {exc}")
            return
        self.state.run(model_figures, loaded, on_result=lambda figs: self._show_figures(loaded, figs),
                       on_error=self._failed, owner=self, parts=(MODEL,))
        self.show_digit(self.digit.value())

    # -- images ----------------------------------------------------------------------------
    def show_digit(self, index: int) -> None:
        if self.loaded is None or self.loaded.config.input_kind != "patches":
            return
        loaded = self.loaded

        def done(result) -> None:
            pixels, label, _ = result
            self._analyse(loaded, pixels, f"held-out digit #{index} (true label {label})")

        from ...core.training.image_tasks import heldout_digit
        self.state.run(heldout_digit, loaded, index, on_result=done, on_error=self._failed, owner=self, parts=(MODEL,))

    def open_image(self, path: str) -> None:
        if self.loaded is None or self.loaded.config.input_kind != "patches":
            return
        loaded = self.loaded
        self.state.run(file_pixels, loaded, path, on_result=lambda pixels: self._analyse(loaded, pixels, Path(path).name),
                       on_error=self._failed, owner=self, parts=(MODEL,))

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open image", "",
                                              "Images (*.png *.jpg *.jpeg *.bmp *.gif *.webp);;All files (*)")
        if path:
            self.open_image(path)

    def dragEnterEvent(self, event) -> None:  # noqa: N802 (Qt)
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 (Qt)
        urls = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        if urls:
            event.acceptProposedAction()
            self.open_image(urls[0])

    def _analyse(self, loaded, pixels: np.ndarray, source: str) -> None:
        if loaded is not self.loaded:
            return
        if hasattr(self.state, "set_image") and pixels is not self.state.image:  # the app's input: Attention
            self.state.set_image(pixels, source)  # and Layers trace this image too
        self._wanted = (pixels, source)

        def done(result) -> None:
            if pixels is self._wanted[0]:  # else another image was asked for meanwhile
                self._show(loaded, pixels, source, result)

        self.state.run(analyse_image, loaded, pixels, list(self.state.interventions), on_result=done,
                       on_error=self._failed, owner=self, parts=self.result_parts)

    def _failed(self, exc: BaseException, tb: str) -> None:
        self.message.setText(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    # -- drawing ---------------------------------------------------------------------------
    def _show(self, loaded, pixels, source: str, result: dict) -> None:
        if loaded is not self.loaded:
            return
        self.pixels, self.result, self.source = pixels, result, source
        self.message.setText("")
        self.source_label.setText(source)
        cfg = loaded.config
        self.canvas.set_image(shown_image(pixels, self.settings), cfg.image_size // cfg.patch_size)
        probs = result["probs"]
        if probs is None:
            self.prediction.setText("(no classifier: a headless ViTModel)")
        else:
            names = cfg.extra.get("id2label") or {}
            top = np.argsort(-probs)[:TOP_CLASSES]
            self.prediction.setText("\n".join(f"{names.get(str(i), str(i)):>12}  {probs[i]:6.1%}" for i in top))
        self.distance_view.set_distance(result["distance"])
        self._draw_heads()

    def draw_now(self, loaded, pixels: np.ndarray, source: str, layer: int = 0, query: int | None = None) -> None:
        """Everything the panel shows for `pixels`, computed here on the calling thread (the CLI's
        render draws offscreen with no event loop to deliver workers' results): query None is [CLS],
        else a patch index (row by row)."""
        from ...core.vit import image_settings
        self.loaded, self.settings = loaded, image_settings(loaded.path, loaded.config)
        self._enable(True)
        self.layer.blockSignals(True)
        self.layer.setRange(0, loaded.config.n_layers - 1)
        self.layer.setValue(layer)
        self.layer.blockSignals(False)
        self._show_figures(loaded, model_figures(loaded))
        self.canvas.selected = query
        self._show(loaded, pixels, source, analyse_image(loaded, pixels))

    def select_query(self, patch: int | None) -> None:
        """Show every head's attention from `patch` (row by row; None: [CLS])."""
        self.canvas.selected = patch
        self.canvas.update()
        self._draw_heads()

    def query_weights(self) -> np.ndarray:
        """[heads, grid, grid]: the chosen layer's attention from the query over the patches."""
        cfg = self.loaded.config
        g = cfg.image_size // cfg.patch_size
        q = 0 if self.canvas.selected is None else self.canvas.selected + 1
        return self.result["patterns"][self.layer.value(), :, q, 1:].reshape(-1, g, g)

    def _draw_heads(self) -> None:
        if self.result is None or self.pixels is None:
            return
        cfg = self.loaded.config
        image = shown_image(self.pixels, self.settings)
        weights = self.query_weights()
        scale = max(1, 96 // cfg.image_size)  # tiny images are enlarged before blending, so edges stay sharp
        big = np.kron(image, np.ones((scale, scale, 1), dtype=np.uint8))
        # each head coloured over its own largest weight (heat_over), which its title gives: a near-uniform head
        # (every weight ~1/patches) was as bright as one looking at a single patch, with nothing to tell them apart
        tiles = [(f"head {h}: {w.max():.2f}", heat_over(big, w, cfg.patch_size * scale)) for h, w in enumerate(weights)]
        g = weights.shape[1]
        query = "[CLS]" if self.canvas.selected is None else "patch (%d, %d)" % divmod(self.canvas.selected, g)
        view = self.heads_view
        view.mosaic.set_tiles(tiles, min(len(tiles), 4),
                              f"layer {self.layer.value()}: attention from {query} over the patches "
                              "(full colour: the head's largest weight, after its name)")
        view.header = ["layer", "query", "head", "patch_row", "patch_col", "weight"]
        view.rows = [[self.layer.value(), query, h, r, c, float(weights[h, r, c])]
                     for h in range(len(weights)) for r in range(g) for c in range(g)]
        view.arrays = {"attention": weights, "image": image}

    def _show_figures(self, loaded, figs: dict) -> None:
        if loaded is not self.loaded:
            return
        filters = figs["filters"]  # [k, P, P, C] in [0, 1]
        rgb = (filters * 255).round().astype(np.uint8)
        rgb = np.repeat(rgb, 3, axis=3) if rgb.shape[3] == 1 else rgb[..., :3]
        self.filters_view.mosaic.set_tiles([(f"PC {i + 1}", t) for i, t in enumerate(rgb)], 7,
                                           "Patch embedding: principal components of the filters")
        k, p = filters.shape[0], filters.shape[1]
        self.filters_view.header = ["component", "row", "col", "channel", "value"]
        self.filters_view.rows = [[i, r, c, ch, float(filters[i, r, c, ch])] for i in range(k) for r in range(p)
                                  for c in range(p) for ch in range(filters.shape[3])]
        self.filters_view.arrays = {"filters": filters}
        sim = figs["similarity"]  # [g, g, g, g]
        g = sim.shape[0]
        tiles = [(f"({i}, {j})", colormap_rgb(sim[i, j], -1, 1)) for i in range(g) for j in range(g)]
        self.similarity_view.mosaic.cell = max(24, min(64, 480 // g))
        self.similarity_view.mosaic.set_tiles(tiles, g, "Position embedding similarity (cosine, -1 to 1) "
                                                        "of each patch with every patch")
        self.similarity_view.header = ["row", "col", "other_row", "other_col", "cosine"]
        self.similarity_view.rows = [[i, j, k2, l2, float(sim[i, j, k2, l2])] for i in range(g) for j in range(g)
                                     for k2 in range(g) for l2 in range(g)]
        self.similarity_view.arrays = {"position_similarity": sim}
