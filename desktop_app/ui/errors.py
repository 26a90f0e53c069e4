"""Unexpected errors: log them, show them, keep the application running.

An exception that escapes a slot or an event handler reaches sys.excepthook (PySide6 reports
them there); our hook writes the report to the log file in the user's data folder and shows an
ErrorDialog with the details and a Copy report button. The event loop goes on.
"""
from __future__ import annotations

import logging
import logging.handlers
import platform
import sys
import traceback
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QApplication, QDialog, QDialogButtonBox, QLabel, QPlainTextEdit,
                               QPushButton, QVBoxLayout, QWidget)

from ..paths import user_data_dir

LOGGER_NAME = "desktop_app"
log = logging.getLogger(LOGGER_NAME)


def log_dir() -> Path:
    path = user_data_dir() / "log"
    path.mkdir(parents=True, exist_ok=True)
    return path


def log_file() -> Path:
    return log_dir() / "transformer-explorer.log"


def setup_logging() -> Path:
    """Send the app's log records to a rotating file in the user's data folder (once per file)."""
    path = log_file()
    for h in log.handlers:
        if isinstance(h, logging.FileHandler) and Path(h.baseFilename) == path:
            return path
    for h in [h for h in log.handlers if isinstance(h, logging.FileHandler)]:
        log.removeHandler(h)  # the data folder changed (tests): log to the new place
        h.close()
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=1_000_000, backupCount=3, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return path


def error_report(exc_type, exc, tb) -> str:
    """The text a user can paste into a bug report: versions, platform and the traceback."""
    from PySide6 import __version__ as pyside_version

    from .dialogs import app_version

    torch_version = sys.modules["torch"].__version__ if "torch" in sys.modules else "not loaded"
    lines = [
        f"Transformer Explorer {app_version()}",
        f"Python {platform.python_version()} on {platform.platform()}",
        f"PySide6 {pyside_version}, torch {torch_version}",
        "",
        "".join(traceback.format_exception(exc_type, exc, tb)).rstrip(),
    ]
    return "\n".join(lines)


class ErrorDialog(QDialog):
    """What went wrong, the full report (selectable) and a button to copy it."""

    def __init__(self, summary: str, report: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Unexpected error")
        self.report = report
        self.count = 1
        layout = QVBoxLayout(self)
        self.summary_label = QLabel(
            f"<b>{_escape(summary)}</b><br>The application keeps running; what you were doing may be "
            f"incomplete. The details are also in the log file:<br><code>{_escape(str(log_file()))}</code>")
        self.summary_label.setWordWrap(True)
        self.summary_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.summary_label)
        self.details = QPlainTextEdit(report)
        self.details.setReadOnly(True)
        self.details.setMinimumSize(560, 220)
        layout.addWidget(self.details)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.copy_button = QPushButton("Copy report")
        buttons.addButton(self.copy_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.copy_button.clicked.connect(self.copy_report)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    def copy_report(self) -> None:
        QApplication.clipboard().setText(self.report)

    def add_report(self, report: str) -> None:
        """A further error while the dialog is open: append instead of stacking dialogs."""
        self.count += 1
        self.report += "\n\n" + "-" * 40 + "\n" + report
        self.details.setPlainText(self.report)
        self.setWindowTitle(f"Unexpected errors ({self.count})")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class ExceptionHandler:
    """sys.excepthook replacement: log, show one dialog (reused while open), continue."""

    def __init__(self, parent: QWidget | None = None, show_dialog: bool = True) -> None:
        self.parent = parent
        self.show_dialog = show_dialog
        self.dialog: ErrorDialog | None = None
        self.previous = None

    def install(self) -> "ExceptionHandler":
        setup_logging()
        self.previous = sys.excepthook
        sys.excepthook = self
        return self

    def uninstall(self) -> None:
        if sys.excepthook is self:
            sys.excepthook = self.previous or sys.__excepthook__

    def __call__(self, exc_type, exc, tb) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            QApplication.quit()
            return
        try:
            report = error_report(exc_type, exc, tb)
        except Exception:  # never let the hook itself fail
            report = "".join(traceback.format_exception(exc_type, exc, tb))
        log.error("unhandled exception\n%s", report)
        print(report, file=sys.stderr)
        if not self.show_dialog or QApplication.instance() is None:
            return
        summary = f"{exc_type.__name__}: {exc}"
        if self.dialog is not None and self.dialog.isVisible():
            self.dialog.add_report(report)
            return
        self.dialog = ErrorDialog(summary, report, self.parent)
        self.dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, False)
        self.dialog.show()  # not exec(): no nested event loop inside the hook
