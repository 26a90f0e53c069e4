"""Decode image files (PNG, JPEG, BMP, ...) with Qt's QImage: the one piece of Qt that both front ends
need below their own layer (QtGui only; no QApplication, no display).

app/images.py reads image files without Qt (a .npy array as it is) and is handed this decoder for the
other formats: the front ends register it (ui/ and commands/ do on import, app.images.set_image_codec).
app/ and core/ never import this module.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path


@contextmanager
def native_stderr_kept(lines: list[str]):
    """While a C library runs (libpng through Qt), what it writes to stderr (file descriptor 2, which Python's
    sys.stderr does not see) goes to a temporary file and then into `lines`, not before the app's own message."""
    import os
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as kept:
        os.dup2(kept.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            kept.seek(0)
            lines.extend(kept.read().decode("utf-8", "replace").splitlines())


def decode_image(path: str | Path, channels: int):
    """The image file at `path` as a uint8 array H x W x C (C = 1 for channels == 1, else 3);
    ValueError naming the file when Qt cannot decode it."""
    import numpy as np
    from PySide6.QtGui import QImage

    from PySide6.QtGui import QImageReader

    from .core.devices import check_memory

    p = Path(path)
    said: list[str] = []
    with native_stderr_kept(said):  # libpng's own lines ("libpng error: Read Error") before the app's one line
        reader = QImageReader(str(p))
        size = reader.size()  # from the file's header, before anything is decoded
        if size.isValid():
            # Qt decodes into 4 bytes a pixel, then the 1- or 3-byte copy and its array: estimated and checked
            # against this machine's memory first; Qt's own allocation limit (256 MB) is then raised to fit
            w, h = size.width(), size.height()
            check_memory(w * h * (4 + 2 * (1 if channels == 1 else 3)), f"{p} ({w} x {h} pixels)", "to decode")
            QImageReader.setAllocationLimit(max(QImageReader.allocationLimit(), (w * h * 4 >> 20) + 1))
        image = reader.read()
    if image.isNull():
        why = next((line.split("libpng error: ", 1)[1] for line in reversed(said) if "libpng error: " in line), "")
        raise ValueError(f"{p}: not an image Qt can decode (PNG, JPEG, BMP, ...): {reader.errorString()}"
                         + (f" (libpng: {why})" if why else ""))
    grey = channels == 1
    image = image.convertToFormat(QImage.Format.Format_Grayscale8 if grey else QImage.Format.Format_RGB888)
    c, w, h = (1 if grey else 3), image.width(), image.height()
    rows = np.frombuffer(image.constBits(), np.uint8, count=image.bytesPerLine() * h).reshape(h, -1)
    return rows[:, : w * c].reshape(h, w, c).copy()  # rows are padded to 4 bytes
