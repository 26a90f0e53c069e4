"""The one line a panel shows for a model it does not support yet (issue 28: encoder-decoders).

A panel class that sets `supports_encoder_decoder = False` gets, from its tab's page (main_window.PanelSlot),
an UnsupportedBanner above it: while the model open is an encoder-decoder, the banner says so in one line and
the panel is disabled (nothing of it can start work on a model it would misread); for every other model the
banner is hidden and the panel enabled.
"""
from __future__ import annotations

from PySide6.QtWidgets import QLabel, QWidget


def unsupported_line(title: str, loaded) -> str:
    """'' when the panel `title` supports `loaded`, else the one line it shows instead."""
    if loaded is None or not loaded.config.is_encoder_decoder:
        return ""
    return (f"The {title} panel does not support encoder-decoder models yet ({loaded.name} is one): "
            "the Model and Attention panels show its source, target and all three kinds of attention.")


class UnsupportedBanner(QLabel):
    """Above a panel that does not support encoder-decoders: its one line, shown (and the panel disabled)
    while one is open."""

    def __init__(self, title: str, panel: QWidget, state, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.title, self.panel = title, panel
        self.setWordWrap(True)
        self.setStyleSheet("QLabel { background: #fff3cd; color: #5c4400; padding: 6px; }")
        state.model_changed.connect(self.follow)
        self.follow(state.loaded)

    def follow(self, loaded) -> None:
        line = unsupported_line(self.title, loaded)
        self.setText(line)
        self.setVisible(bool(line))
        self.panel.setEnabled(not line)
