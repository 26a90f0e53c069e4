"""Render resources/icons/transformer-explorer.svg to PNGs of the usual icon sizes (and an .ico).

    python packaging/make_icons.py

Run it after editing the SVG; the PNGs are committed so installing needs no rendering step.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
ICONS = Path(__file__).resolve().parents[1] / "resources" / "icons"
SVG = ICONS / "transformer-explorer.svg"


def render(size: int):
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    renderer = QSvgRenderer(str(SVG))
    if not renderer.isValid():
        raise SystemExit(f"{SVG}: not a valid SVG")
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    return image


def main() -> int:
    if sys.platform.startswith("linux") and not os.environ.get("DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication.instance() or QGuiApplication([])  # QImage's text and SVG need one until the end
    for size in SIZES:
        out = ICONS / f"transformer-explorer-{size}.png"
        if not render(size).save(str(out), "PNG"):
            raise SystemExit(f"{out}: cannot write")
        print(f"wrote {out}")
    ico = ICONS / "transformer-explorer.ico"  # Windows installer and PyInstaller --icon
    if render(256).save(str(ico), "ICO"):
        print(f"wrote {ico}")
    else:
        print("note: this Qt has no ICO writer; the Windows recipe converts the 256 px PNG instead")
    del app  # (held until here)
    return 0


if __name__ == "__main__":
    sys.exit(main())
