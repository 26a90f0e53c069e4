"""Image files as arrays, and as a vision model's pixel values: what the Image panel, `trace --image`,
`render` and the image-folder task read.

A .npy array is read here as it is (its header first); every other format is decoded by the codec the
front ends register (set_image_codec: Qt's QImage, desktop_app/image_codec.py), since this layer never
imports Qt.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import numpy as np

ImageCodec = Callable[[Path, int], "np.ndarray"]  # (file, channels) -> uint8 H x W x C; ValueError naming the file
_codec: ImageCodec | None = None


def set_image_codec(codec: ImageCodec | None) -> None:
    """Register how image files other than .npy become arrays (the front ends register Qt's QImage)."""
    global _codec
    _codec = codec


def read_image_file(path: str | Path, channels: int) -> np.ndarray:
    """An image file as a uint8 array H x W x C (C = 1 for a one-channel model, else 3): a .npy
    array as it is, anything else decoded by the registered codec (Qt's QImage). ValueError naming
    the file when it is missing or cannot be read."""
    from ..core.files import read_npy_file, require_file

    try:
        p = require_file(path, "image file")
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from None
    if p.suffix.lower() == ".npy":
        return read_npy_file(p)  # the header first: a claimed (100000, 100000) array is refused unread
    if _codec is None:
        raise ValueError(f"{p}: no image decoder registered here (only .npy arrays are read without one)")
    return _codec(p, channels)


def image_pixel_values(loaded, path: str | Path) -> "np.ndarray":
    """The image at `path` as the model's pixel values [C, H, W], preprocessed as its folder's
    preprocessor_config.json says (core/vit.py). ValueError, one line: naming the model folder when it
    is not a vision model or its preprocessor_config.json is wrong, else naming the image file."""
    from ..core.vit import ImageInputError, image_settings, preprocess_image

    cfg = loaded.config
    if cfg.input_kind != "patches":
        raise ValueError(f"{loaded.path}: not a vision model; --image needs a ViT folder (give --text or --ids)")
    try:
        return preprocess_image(read_image_file(path, cfg.num_channels), image_settings(loaded.path, cfg),
                                cfg.num_channels)
    except ImageInputError as exc:
        raise ValueError(exc.args[0] if "preprocessor_config" in exc.args[0] else f"{path}: {exc}") from None
