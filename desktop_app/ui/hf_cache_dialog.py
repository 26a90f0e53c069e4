"""File > Open from Hugging Face Cache…: the models in the local cache, listed by a worker.

Every snapshot is shown; one the app cannot open is greyed out with the reason, and Open stays off
for it. Nothing here downloads: the list is what is already on disk. ModelListDialog is that dialog
for any such list (local_stores_dialog: Ollama's and LM Studio's models)."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QPalette
from PySide6.QtWidgets import (QAbstractItemView, QDialog, QDialogButtonBox, QHeaderView, QLabel, QPushButton,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from ..core.hf_cache import CachedModel, cache_roots, format_size, list_cached_models
from .workers import run_job

COLUMNS = ("Repository", "Revision", "Family", "Weights", "Supported")


class ModelListDialog(QDialog):
    """A list of models on disk (filled by a worker) to open one from; emits model_chosen(path) for the
    row the user opens (Open, Enter or double-click). Subclasses say what is listed and how."""

    model_chosen = Signal(str)
    listed = Signal()  # the table is filled (or the listing failed): for tests and the status line
    title = ""
    columns: tuple[str, ...] = ()

    def looking(self) -> str:  # the status line while the worker lists
        raise NotImplementedError

    def list_models(self) -> list:  # runs in the worker
        raise NotImplementedError

    def cells(self, m) -> tuple[str, ...]:
        raise NotImplementedError

    def summary(self, models: list) -> str:  # the status line once listed
        raise NotImplementedError

    def path_of(self, m) -> str:
        raise NotImplementedError

    def name_of(self, m) -> str:
        raise NotImplementedError

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(self.title)
        self.models: list = []
        layout = QVBoxLayout(self)
        self.status = QLabel(self.looking())
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.status)
        self.table = QTableWidget(0, len(self.columns))
        self.table.setHorizontalHeaderLabels(self.columns)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.table.setMinimumSize(760, 260)
        self.table.itemSelectionChanged.connect(self._on_selection)
        self.table.cellDoubleClicked.connect(lambda row, _col: self.open_row(row))
        layout.addWidget(self.table)
        self.reason = QLabel("")  # why the selected row cannot be opened
        self.reason.setWordWrap(True)
        layout.addWidget(self.reason)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.open_button = QPushButton("&Open")
        self.open_button.setDefault(True)
        self.open_button.setEnabled(False)
        self.open_button.clicked.connect(lambda: self.open_row(self.table.currentRow()))
        buttons.addButton(self.open_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        # Scanning follows links and reads every model's header: off the UI thread.
        self._job = run_job(self.list_models, on_result=self._fill, on_error=self._failed)

    def _fill(self, models: list) -> None:
        self.models = models
        self.table.setRowCount(len(models))
        grey = QBrush(self.palette().color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text))
        for row, m in enumerate(models):
            for col, text in enumerate(self.cells(m)):
                item = QTableWidgetItem(text)
                item.setToolTip(self.path_of(m) if m.supported else m.reason)
                if not m.supported:
                    item.setForeground(grey)
                self.table.setItem(row, col, item)
        self.status.setText(self.summary(models))
        self.listed.emit()

    def _failed(self, exc: BaseException, _tb: str) -> None:
        self.status.setText(f"Could not list the models: {exc}")
        self.listed.emit()

    def _on_selection(self) -> None:
        row = self.table.currentRow()
        m = self.models[row] if 0 <= row < len(self.models) else None
        self.open_button.setEnabled(m is not None and m.supported)
        self.reason.setText("" if m is None or m.supported else f"{self.name_of(m)} cannot be opened: {m.reason}")

    def open_row(self, row: int) -> None:
        if not 0 <= row < len(self.models) or not self.models[row].supported:
            return  # an unsupported row: the reason is already shown under the table
        self.model_chosen.emit(self.path_of(self.models[row]))
        self.accept()


class HfCacheDialog(ModelListDialog):
    """The snapshots in the local Hugging Face cache."""

    title = "Open from Hugging Face Cache"
    columns = COLUMNS

    def looking(self) -> str:
        return "Looking in " + ", ".join(str(r) for r in cache_roots()) + " …"

    def list_models(self) -> list[CachedModel]:
        return list_cached_models()

    def cells(self, m: CachedModel) -> tuple[str, ...]:
        revision = m.revision[:12] + (f" ({', '.join(m.refs)})" if m.refs else "")
        return (m.repo_id, revision, m.model_type or "?", format_size(m.weights_bytes),
                "yes" if m.supported else f"no — {m.reason}")

    def summary(self, models: list[CachedModel]) -> str:
        roots = ", ".join(str(r) for r in cache_roots())
        if not models:
            return f"No models in the local Hugging Face cache (looked in: {roots})."
        n_ok = sum(m.supported for m in models)
        return f"{len(models)} cached model revision(s), {n_ok} the app can open, in {roots}. Nothing is downloaded."

    def path_of(self, m: CachedModel) -> str:
        return str(m.folder)

    def name_of(self, m: CachedModel) -> str:
        return m.ref_text
