"""Image classification tasks for vision transformers: the 8 x 8 handwritten digits.

The digits are scikit-learn's copy of the UCI optical digits (1,797 images, 8 x 8, grey levels 0..16,
ten classes), read from a file inside the scikit-learn package (no download). scikit-learn is
imported only here, and only when the digits are asked for.

A batch of an image task is inputs = pixel values [B, C, H, W] float32 (what the model reads in place
of token ids) and targets [B, 1] = the class, scored at position 0, the [CLS] token the classifier
reads. Pixel values are made exactly as the app makes them from an image file: uint8 grey levels ->
core.vit.preprocess_image with the settings a trained model's preprocessor_config.json records, so
an image opened in the app (or by transformers' ViTImageProcessor) meets the model as in training.

Held-out split: a fixed seeded permutation of the 1,797 images, the last fifth (360 images) held out;
the same for every run, so the app's "held-out digit" spin box shows images the model never saw.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from ..vit import PREPROCESSOR, ImageSettings, preprocess_image
from .tasks import Batch, Task, TaskError

IMAGE_TASKS = ("digits",)
DIGITS_SIZE = 8
DIGITS_PATCH = 2  # 4 x 4 = 16 patches + [CLS]: the default patch of a model trained on the digits
HELDOUT_FRACTION = 0.2
SPLIT_SEED = 0


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [1797, 8, 8] with 0..255 grey levels, labels int64 [1797]).

    The 0..16 levels are scaled by 255/16 and rounded: the image a PNG of the digit would hold."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise TaskError("the digits task needs scikit-learn (pip install scikit-learn)") from None
    data = sklearn_digits()
    images = np.clip(np.round(data.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    return images, data.target.astype(np.int64)


def digits_split(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(training indices, held-out indices) of n images: a fixed permutation, its last fifth held out."""
    order = np.random.default_rng(SPLIT_SEED).permutation(n)
    n_heldout = int(round(HELDOUT_FRACTION * n))
    return np.sort(order[: n - n_heldout]), np.sort(order[n - n_heldout:])


def pixel_settings(size: int, channels: int) -> ImageSettings:
    """ViTImageProcessor's defaults (rescale to [0, 1], normalise with mean 0.5 and std 0.5) for
    `channels` channels at size x size."""
    return ImageSettings(size, size, image_mean=(0.5,) * channels, image_std=(0.5,) * channels)


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
                 options: dict[str, Any] | None = None) -> None:
        size = int(images.shape[1])
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


def make_image_task(name: str, options: dict[str, Any] | None = None) -> ImageClassificationTask:
    if name == "digits":
        return digits_task(**dict(options or {}))
    raise TaskError(f"unknown image task {name!r} (known: {', '.join(IMAGE_TASKS)})")
