"""Small dialogs of the main window: help text, keyboard shortcuts, about, preferences."""
from __future__ import annotations

import platform
import sys
from pathlib import Path

from PySide6.QtGui import QAction
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFormLayout, QLabel,
                               QSpinBox, QTableWidget, QTableWidgetItem, QTextBrowser, QVBoxLayout, QWidget)

from .settings import DEFAULT_DTYPES, MAX_FONT_SIZE, THEMES, Preferences


def app_version() -> str:
    """The installed distribution's version, else the one in the source checkout's pyproject.toml."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version("transformer-explorer")
        except PackageNotFoundError:
            pass
    except ImportError:
        pass
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        import tomllib
        return tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]
    except (OSError, KeyError, ValueError):
        return "unknown"


def versions_text(device: str) -> str:
    from PySide6 import __version__ as pyside_version
    from PySide6.QtCore import qVersion

    import torch  # loaded already by the time the About box can be opened

    lines = [
        f"Transformer Explorer {app_version()}",
        f"Python {platform.python_version()} ({sys.platform})",
        f"PySide6 {pyside_version}, Qt {qVersion()}",
        f"torch {torch.__version__}",
        f"Device: {device_description(device)}",
    ]
    return "\n".join(lines)


def device_description(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        return f"{device} ({torch.cuda.get_device_name(index)}, CUDA {torch.version.cuda})"
    if device == "mps":
        return "mps (Apple Metal)"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


class HelpDialog(QDialog):
    """'What am I looking at?': the current panel's help_text (plain text or simple HTML)."""

    def __init__(self, title: str, text: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"What am I looking at? — {title}")
        layout = QVBoxLayout(self)
        self.browser = QTextBrowser()
        self.browser.setOpenExternalLinks(False)
        if "<" in text and ">" in text:
            self.browser.setHtml(text)
        else:
            self.browser.setPlainText(text)
        self.browser.setMinimumSize(520, 300)
        layout.addWidget(self.browser)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)


class ShortcutsDialog(QDialog):
    """Every action of the window that has a shortcut, read from the actions themselves, then the
    panels' own keys (`panel_rows`: (what, key) pairs, e.g. from each panel class's `shortcuts`)."""

    def __init__(self, actions: list[QAction], parent: QWidget | None = None,
                 panel_rows: list[tuple[str, str]] = ()) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        rows = []
        for a in actions:
            seq = a.shortcut().toString(a.shortcut().SequenceFormat.NativeText)
            if seq:
                rows.append((a.text().replace("&", "").rstrip("…."), seq))
        rows += list(panel_rows)
        self.table = QTableWidget(len(rows), 2)
        self.table.setHorizontalHeaderLabels(["Action", "Shortcut"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        for r, (name, seq) in enumerate(rows):
            self.table.setItem(r, 0, QTableWidgetItem(name))
            self.table.setItem(r, 1, QTableWidgetItem(seq))
        self.table.resizeColumnsToContents()
        self.table.horizontalHeader().setStretchLastSection(True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.resize(460, 560)


class PreferencesDialog(QDialog):
    """Device, default dtype, theme, font size, session restore."""

    def __init__(self, prefs: Preferences, devices: list[str], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Preferences")
        form = QFormLayout()
        self.device = QComboBox()
        self.device.addItems(["auto"] + devices)
        self.device.setCurrentText(prefs.device if prefs.device in ["auto"] + devices else "auto")
        self.device.setToolTip("Where models run. auto: CUDA or MPS when present, else CPU.")
        form.addRow("Device", self.device)
        self.dtype = QComboBox()
        self.dtype.addItems(list(DEFAULT_DTYPES))
        self.dtype.setCurrentText(prefs.dtype)
        self.dtype.setToolTip("Precision of models opened from now on. auto: what suits the device (the checkpoint's dtype, except a half-precision one on a CPU without matrix instructions for it, e.g. bfloat16 without AVX-512 BF16 or AMX: float32 there when it fits).")
        form.addRow("Default dtype", self.dtype)
        self.theme = QComboBox()
        self.theme.addItems(list(THEMES))
        self.theme.setCurrentText(prefs.theme)
        form.addRow("Theme", self.theme)
        self.font_size = QSpinBox()
        self.font_size.setRange(0, MAX_FONT_SIZE)
        self.font_size.setSpecialValueText("default")
        self.font_size.setValue(prefs.font_size)
        self.font_size.setSuffix(" pt")
        form.addRow("Font size", self.font_size)
        self.restore_session = QCheckBox("Reopen the last model, text and panel at start")
        self.restore_session.setChecked(prefs.restore_session)
        form.addRow("Session", self.restore_session)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        note = QLabel("The dtype applies to models opened after the change.")
        note.setStyleSheet("color: gray")
        layout.addWidget(note)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    def preferences(self) -> Preferences:
        return Preferences(device=self.device.currentText(), dtype=self.dtype.currentText(),
                           theme=self.theme.currentText(), font_size=self.font_size.value(),
                           restore_session=self.restore_session.isChecked())


def about_html(device: str) -> str:
    body = versions_text(device).replace("\n", "<br>")
    return (f"<h3>Transformer Explorer</h3><p>Explore small transformer models offline: attention, layers, "
            f"generation, local Lipschitz constants, training.</p><p>{body}</p>")

