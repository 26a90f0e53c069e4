"""Image classification tasks for vision transformers: the 8 x 8 handwritten digits, and a folder of
images arranged one sub-folder per class (the image-folder task).

The digits are scikit-learn's copy of the UCI optical digits (1,797 images, 8 x 8, grey levels 0..16,
ten classes), read from a file inside the scikit-learn package (no download), without importing
scikit-learn (see load_digits).

A batch of an image task is inputs = pixel values [B, C, H, W] float32 (what the model reads in place
of token ids) and targets [B, 1] = the class, scored at position 0, the [CLS] token the classifier
reads. Pixel values are made exactly as the app makes them from an image file: uint8 grey levels ->
core.vit.preprocess_image with the settings a trained model's preprocessor_config.json records, so
an image opened in the app (or by transformers' ViTImageProcessor) meets the model as in training.

Held-out split: a fixed seeded permutation of the 1,797 images, the last fifth (360 images) held out;
the same for every run, so the app's "held-out digit" spin box shows images the model never saw.

The image-folder task: class names are the sub-folder names, sorted; each image is resized to the
model's image size (the images' own size unless one is given) as grey or RGB. Core reads no image
files (it never imports Qt): the CLI registers a decoder (set_image_decoder, Qt's QImage) that turns a
file into a uint8 array; only .npy arrays are read here without one. Held out: a seeded fifth of each
class (at least one image), so a small folder still scores every class.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..vit import PREPROCESSOR, ImageSettings, default_image_settings, image_settings, preprocess_image
from .tasks import Batch, Task, TaskError, declare_task

DIGITS_SIZE = 8
DIGITS_PATCH = 2  # 4 x 4 = 16 patches + [CLS]: the default patch of a model trained on the digits
HELDOUT_FRACTION = 0.2
SPLIT_SEED = 0


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [1797, 8, 8] with 0..255 grey levels, labels int64 [1797]).

    The 0..16 levels are scaled by 255/16 and rounded: the image a PNG of the digit would hold. The
    file is read from scikit-learn's package folder without importing scikit-learn: its compiled
    modules bring their own OpenMP runtime, and two runtimes in one process beside torch's can crash
    a later torch call (a segfault in a worker thread was seen once the digits had been loaded)."""
    import gzip
    from importlib.util import find_spec

    spec = find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise TaskError("the digits task needs scikit-learn's copy of the digits (pip install scikit-learn)")
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
    try:
        with gzip.open(path, "rt") as fh:
            table = np.loadtxt(fh, delimiter=",")
    except (OSError, ValueError) as exc:
        raise TaskError(f"{path}: cannot read the digits ({exc})") from exc
    images = np.clip(np.round(table[:, :-1].reshape(-1, 8, 8) * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    return images, table[:, -1].astype(np.int64)


def digits_split(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(training indices, held-out indices) of n images: a fixed permutation, its last fifth held out."""
    order = np.random.default_rng(SPLIT_SEED).permutation(n)
    n_heldout = int(round(HELDOUT_FRACTION * n))
    return np.sort(order[: n - n_heldout]), np.sort(order[n - n_heldout:])


pixel_settings = default_image_settings  # what the digits task trains with: the defaults at 8 x 8, one channel


def heldout_digit(loaded, index: int) -> tuple[np.ndarray, int, int]:
    """(pixel values for `loaded`, true label, number of held-out digits) of held-out digit `index`."""
    images, labels = load_digits()
    _, held = digits_split(len(images))
    i = held[min(max(index, 0), len(held) - 1)]
    pixels = preprocess_image(images[i], image_settings(loaded.path, loaded.config), loaded.config.num_channels)
    return pixels, int(labels[i]), len(held)


def preprocessor_config(settings: ImageSettings) -> dict[str, Any]:
    """The preprocessor_config.json of `settings`, as ViTImageProcessor writes it (core.vit reads it back)."""
    return {"image_processor_type": "ViTImageProcessor", "do_resize": settings.do_resize,
            "size": {"height": settings.height, "width": settings.width},
            "resample": {"bilinear": 2, "bicubic": 3}[settings.resample], "do_rescale": settings.do_rescale,
            "rescale_factor": settings.rescale_factor, "do_normalize": settings.do_normalize,
            "image_mean": list(settings.image_mean), "image_std": list(settings.image_std)}


class ImageClassificationTask(Task):
    """Images with one class each, a fixed held-out split; batches of pixel values and [CLS] targets."""

    def __init__(self, name: str, images: np.ndarray, labels: np.ndarray, class_names: list[str],
                 heldout_indices: np.ndarray, channels: int = 1, patch_size: int = DIGITS_PATCH,
                 options: dict[str, Any] | None = None, image_size: int | None = None) -> None:
        # images: uint8 arrays (a list when their sizes differ); each is resized to image_size (default: the first's)
        size = int(image_size or images[0].shape[0])
        self.settings = pixel_settings(size, channels)
        self.images, self.labels, self.class_names = images, labels, list(class_names)
        self.pixels = torch.from_numpy(np.stack([preprocess_image(im, self.settings, channels) for im in images]))
        self.targets = torch.from_numpy(labels)[:, None]
        held = np.zeros(len(images), dtype=bool)
        held[heldout_indices] = True
        self.train_indices = torch.from_numpy(np.flatnonzero(~held))
        self.heldout_indices = torch.from_numpy(np.flatnonzero(held))
        self.image_size, self.channels = size, channels
        super().__init__(name=name, tokenizer=None, seq_len=1 + (size // patch_size) ** 2,
                         options=dict(options or {}), val_size=len(self.heldout_indices))
        # what a model for the task must read: model_config_for applies these over the family preset
        self.model_settings = {"image_size": size, "num_channels": channels, "patch_size": patch_size,
                               "extra": {"id2label": {str(i): c for i, c in enumerate(self.class_names)}}}

    @property
    def vocab_size(self) -> int:  # the number of classes: the classifier's outputs
        return len(self.class_names)

    def train_batch(self, batch_size: int, gen: torch.Generator) -> Batch:
        pick = self.train_indices[torch.randint(0, len(self.train_indices), (batch_size,), generator=gen)]
        return Batch(self.pixels[pick], self.targets[pick])

    def val_set(self, seed: int = 0) -> Batch:
        return Batch(self.pixels[self.heldout_indices], self.targets[self.heldout_indices])

    def extra_files(self) -> dict[str, bytes]:
        """Files a model folder trained on the task carries: how its images become pixel values."""
        return {PREPROCESSOR: json.dumps(preprocessor_config(self.settings), indent=2).encode()}

    def describe(self) -> dict[str, Any]:
        return {"task": self.name, **self.options, "image_size": self.image_size, "channels": self.channels,
                "classes": len(self.class_names), "train_images": len(self.train_indices),
                "heldout_images": len(self.heldout_indices), "vocab_size": self.vocab_size}


def digits_task(patch_size: int = DIGITS_PATCH, **_: Any) -> ImageClassificationTask:
    images, labels = load_digits()
    _, heldout = digits_split(len(images))
    if patch_size < 1 or DIGITS_SIZE % patch_size:
        raise TaskError(f"the digits are {DIGITS_SIZE} x {DIGITS_SIZE}: patch size {patch_size} does not divide it "
                        "(1, 2, 4 or 8)")
    return ImageClassificationTask("digits", images, labels, [str(i) for i in range(10)], heldout,
                                   channels=1, patch_size=patch_size)


# -- a folder of images, one sub-folder per class ------------------------------------------------

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".npy")
ImageDecoder = Callable[[Path, int], np.ndarray]  # (file, channels) -> uint8 H x W x C; ValueError naming the file
_image_decoder: ImageDecoder | None = None


def set_image_decoder(decoder: ImageDecoder | None) -> None:
    """Register how image files become arrays (the CLI registers Qt's QImage; core never imports Qt)."""
    global _image_decoder
    _image_decoder = decoder


def _decode(path: Path, channels: int) -> np.ndarray:
    if path.suffix.lower() == ".npy" and _image_decoder is None:
        from ..files import read_npy_file

        try:
            return read_npy_file(path)  # the header first: a claimed (100000, 100000) array is refused unread
        except (ValueError, OSError) as exc:
            raise TaskError(str(exc)) from None
    if _image_decoder is None:
        raise TaskError(f"{path}: no image decoder here (core reads only .npy; train from the CLI or the app, "
                        "which decode images with Qt)")
    try:
        return _image_decoder(path, channels)
    except ValueError as exc:
        message = str(exc)
        raise TaskError(message if str(path) in message else f"{path}: {message}") from None


def image_folder_files(folder: str | Path) -> list[tuple[str, list[Path]]]:
    """[(class name, its image files sorted)] for the class sub-folders of `folder`, sorted by name.
    TaskError (one line naming the folder) when there are fewer than two classes or a class has no image."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise TaskError(f"{root}: not a folder (the image-folder task needs a folder with one sub-folder per class)")
    classes = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if len(classes) < 2:
        raise TaskError(f"{root}: {len(classes)} class sub-folder(s); the image-folder task needs at least 2 "
                        "(one sub-folder of images per class)")
    out = []
    for d in classes:
        files = sorted(f for f in d.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
        if len(files) < 2:  # one to train on and one held out
            raise TaskError(f"{d}: {len(files)} image file(s); each class needs at least 2 "
                            f"({', '.join(IMAGE_SUFFIXES)})")
        out.append((d.name, files))
    return out


def load_image_folder(folder: str | Path, channels: int = 3,
                      image_size: int | None = None) -> tuple[list[np.ndarray], np.ndarray, list[str], list[Path]]:
    """(images uint8 H x W x C, labels int64, class names, files) of a class-per-sub-folder folder.

    Without image_size every image must have the first's size, square; with it, sizes may differ (each
    is resized). TaskError, one line naming the file, for an undecodable image or a size that does not fit."""
    if channels not in (1, 3):
        raise TaskError(f"channels {channels}: 1 (grey) or 3 (RGB)")
    images, labels, files = [], [], []
    classes = image_folder_files(folder)
    for label, (_, paths) in enumerate(classes):
        for path in paths:
            a = np.asarray(_decode(path, channels))
            if a.dtype != np.uint8 or a.ndim not in (2, 3) or min(a.shape[:2]) < 1:
                raise TaskError(f"{path}: an array of {a.dtype} {list(a.shape)}; expected uint8 H x W or H x W x C")
            if image_size is None:
                first = images[0].shape[:2] if images else a.shape[:2]
                if a.shape[0] != a.shape[1]:
                    raise TaskError(f"{path}: {a.shape[0]} x {a.shape[1]} is not square; give an image size "
                                    "(--image-size) to resize every image to it")
                if a.shape[:2] != first:
                    raise TaskError(f"{path}: {a.shape[0]} x {a.shape[1]}, but {files[0]} is {first[0]} x {first[1]}; "
                                    "give an image size (--image-size) to resize every image to it")
            images.append(a)
            labels.append(label)
            files.append(path)
    return images, np.asarray(labels, dtype=np.int64), [name for name, _ in classes], files


def stratified_split(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(training indices, held-out indices): a seeded fifth of each class held out, at least one image."""
    rng = np.random.default_rng(SPLIT_SEED)
    held = []
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        held.extend(members[: max(1, int(round(HELDOUT_FRACTION * len(members))))])
    held_idx = np.sort(np.asarray(held, dtype=np.int64))
    return np.setdiff1d(np.arange(len(labels)), held_idx), held_idx


def image_folder_task(image_folder: str | None = None, channels: int = 3, image_size: int | None = None,
                      patch_size: int | None = None, **_: Any) -> ImageClassificationTask:
    if not image_folder:
        raise TaskError("the image-folder task needs a folder of images, one sub-folder per class (--image-folder)")
    images, labels, class_names, _ = load_image_folder(image_folder, int(channels), image_size)
    size = int(image_size or images[0].shape[0])
    if patch_size is None:  # the largest patch leaving at least 4 x 4 patches, as the digits' 2 (the model's --patch-size wins)
        patch_size = max(p for p in range(1, max(1, size // 4) + 1) if size % p == 0)
    if patch_size < 1 or size % patch_size:
        raise TaskError(f"{image_folder}: patch size {patch_size} does not divide the image size {size}")
    _, heldout = stratified_split(labels)
    options = {"image_folder": str(image_folder), "channels": int(channels)}
    if image_size:
        options["image_size"] = int(image_size)
    return ImageClassificationTask("image-folder", images, labels, class_names, heldout, channels=int(channels),
                                   patch_size=patch_size, options=options, image_size=size)


# -- the declarations (image tasks train the image families, vit, only) --------------------------


@declare_task("image-folder", options=("image_folder", "channels", "image_size"), image=True)
def _make_image_folder(options, causal, tokenizer):
    return image_folder_task(**options)


@declare_task("digits", image=True)  # 8 x 8 images; its patch size is a model setting
def _make_digits(options, causal, tokenizer):
    return digits_task(**options)
