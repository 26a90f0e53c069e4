"""Vision transformers outside the model: image preprocessing and the lectures' three ViT figures.

Images are numpy arrays here (H x W or H x W x C, uint8): core reads no image files (no PIL or
imageio in the environment, and no Qt in core); the UI and CLI decode PNG/JPEG and hand over arrays.

- preprocess_image: what Hugging Face's ViTImageProcessor does (resize, rescale to [0, 1],
  normalise with image_mean / image_std) -> pixel values [C, H, W] float32.
- patch_embedding_filters: the patch-embedding Conv2d's filters (or their principal components)
  as small images.
- position_similarity: cosine of each patch's position embedding with every other's, [gh, gw, gh, gw].
- mean_attention_distance: per layer and head, the attention-weighted distance in pixels between a
  query patch and the patches it attends to.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .config import ModelConfig

PREPROCESSOR = "preprocessor_config.json"
# PIL's resampling codes, as preprocessor_config.json writes them
RESAMPLE = {2: "bilinear", 3: "bicubic"}


class ImageInputError(ValueError):
    """An image or a preprocessor_config.json that cannot be used, and why (one line)."""


@dataclass(frozen=True)
class ImageSettings:
    """What preprocessor_config.json asks for (ViTImageProcessor's defaults when it is absent)."""

    height: int
    width: int
    do_resize: bool = True
    resample: str = "bilinear"
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)


def default_image_settings(size: int, channels: int) -> ImageSettings:
    """ViTImageProcessor's defaults (rescale to [0, 1], normalise with mean 0.5 and std 0.5) for
    `channels` channels at size x size."""
    return ImageSettings(size, size, image_mean=(0.5,) * channels, image_std=(0.5,) * channels)


def image_settings(folder: str | Path | None, cfg: ModelConfig) -> ImageSettings:
    """The folder's preprocessor_config.json, or ViTImageProcessor's defaults at the model's image
    size, one mean and std per channel of the model."""
    defaults = default_image_settings(cfg.image_size, cfg.num_channels)
    path = Path(folder) / PREPROCESSOR if folder is not None else None
    if path is None or not path.is_file():
        return defaults
    from .files import JsonFileError, read_json

    try:  # read_json's cap (a 2 GB one is refused unread); a key given twice keeps its last value, as transformers
        d = read_json(path, duplicates=True)
    except JsonFileError as exc:
        raise ImageInputError(str(exc)) from None
    if not isinstance(d, dict):
        raise ImageInputError(f"{path}: expected a JSON object")
    size = d.get("size", {"height": cfg.image_size, "width": cfg.image_size})
    if isinstance(size, int):
        size = {"height": size, "width": size}
    if not (isinstance(size, dict) and "height" in size and "width" in size):
        raise ImageInputError(f"{path}: size {size!r} is not supported (only {{'height', 'width'}})")
    resample = d.get("resample", 2)
    if resample not in RESAMPLE:
        raise ImageInputError(f"{path}: resample {resample!r} is not supported (2 bilinear, 3 bicubic)")
    mean, std = d.get("image_mean", list(defaults.image_mean)), d.get("image_std", list(defaults.image_std))
    mean = tuple(float(m) for m in (mean if isinstance(mean, list) else [mean] * cfg.num_channels))
    std = tuple(float(s) for s in (std if isinstance(std, list) else [std] * cfg.num_channels))
    if len(mean) != cfg.num_channels or len(std) != cfg.num_channels or not all(s > 0 for s in std):
        raise ImageInputError(f"{path}: image_mean and image_std need {cfg.num_channels} values (std > 0)")
    return ImageSettings(int(size["height"]), int(size["width"]), bool(d.get("do_resize", True)),
                         RESAMPLE[resample], bool(d.get("do_rescale", True)), float(d.get("rescale_factor", 1 / 255)),
                         bool(d.get("do_normalize", True)), mean, std)


def preprocess_image(image: np.ndarray, settings: ImageSettings, channels: int = 3) -> np.ndarray:
    """An H x W (grey) or H x W x C (C = 1, 3 or 4; alpha dropped) uint8 image -> pixel values
    [channels, height, width] float32: resize, rescale, normalise, as ViTImageProcessor.

    The resize is torch's antialiased interpolation, which follows PIL's filters (support widened by
    the scale when shrinking), then rounded to uint8 as PIL's own resize of a uint8 image is. It can
    differ from PIL by one grey level where PIL's fixed-point arithmetic rounds the other way; for
    bicubic, PIL's kernel uses a = -0.5 and torch's a = -0.75, so values differ a little more.
    """
    a = np.asarray(image)
    if a.dtype != np.uint8:
        raise ImageInputError(f"image of dtype {a.dtype}: expected uint8 (0..255)")
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3 or a.shape[2] not in (1, 3, 4) or min(a.shape[:2]) < 1:
        raise ImageInputError(f"image of shape {list(a.shape)}: expected H x W or H x W x (1, 3 or 4)")
    if a.shape[2] == 4:
        a = a[:, :, :3]
    if a.shape[2] != channels:
        if a.shape[2] == 1:
            a = np.repeat(a, channels, axis=2)
        else:
            raise ImageInputError(f"a colour image for a model of {channels} channel(s)")
    x = torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1).float()[None]
    if settings.do_resize and tuple(x.shape[2:]) != (settings.height, settings.width):
        x = F.interpolate(x, size=(settings.height, settings.width), mode=settings.resample,
                          align_corners=False, antialias=True).round().clamp(0, 255)
    x = x[0]
    if settings.do_rescale:
        x = x * settings.rescale_factor
    if settings.do_normalize:
        x = (x - torch.tensor(settings.image_mean)[:, None, None]) / torch.tensor(settings.image_std)[:, None, None]
    return x.numpy().astype(np.float32)


# -- the figures -----------------------------------------------------------------------------


def _grid(cfg: ModelConfig) -> int:
    if cfg.input_kind != "patches":
        raise ValueError("not a vision model: it has no image patches")
    return cfg.image_size // cfg.patch_size


def patch_embedding_filters(model, principal_components: int | None = None) -> np.ndarray:
    """The patch embedding's filters as images [N, P, P, C], each scaled to [0, 1] on its own
    ((w - min) / (max - min); a constant filter is 0.5).

    Without principal_components: every filter of the Conv2d (N = d_model), the weights that map a
    patch to one coordinate of its embedding. With k: the first k principal components of the
    filters (rows of V from the SVD of the centred [d_model, C P P] matrix), the lectures' figure.
    """
    _grid(model.cfg)
    w = model.patch_embed.weight.detach().float().cpu()  # [D, C, P, P]
    D, C, P, _ = w.shape
    if principal_components is not None:
        flat = w.reshape(D, -1)
        _, _, vt = torch.linalg.svd(flat - flat.mean(0, keepdim=True), full_matrices=False)
        w = vt[:principal_components].reshape(-1, C, P, P)
    lo = w.amin(dim=(1, 2, 3), keepdim=True)
    span = w.amax(dim=(1, 2, 3), keepdim=True) - lo
    scaled = torch.where(span > 0, (w - lo) / span.clamp_min(1e-30), torch.full_like(w, 0.5))
    return scaled.permute(0, 2, 3, 1).numpy()


def position_similarity(model) -> np.ndarray:
    """Cosine similarity of every patch's position embedding with every other's, [gh, gw, gh, gw]:
    entry [i, j] is the small gh x gw image of patch (i, j)'s similarity to all patches. [CLS]'s
    position embedding is left out. Symmetric: s[i, j, k, l] = s[k, l, i, j]."""
    g = _grid(model.cfg)
    pos = model.pos_embed.weight.detach().float().cpu()[1:]  # [patches, d], row by row
    unit = F.normalize(pos, dim=-1)
    return (unit @ unit.T).reshape(g, g, g, g).numpy()


def patch_distances(grid: int, patch_size: int) -> np.ndarray:
    """Pixel distance between the centres of every two patches of a grid x grid image, [N, N]."""
    rows, cols = np.divmod(np.arange(grid * grid), grid)
    centres = np.stack([rows, cols], axis=1).astype(np.float64) * patch_size
    return np.sqrt(((centres[:, None] - centres[None]) ** 2).sum(-1))


def mean_attention_distance(patterns: Sequence[np.ndarray] | np.ndarray, grid: int, patch_size: int) -> np.ndarray:
    """Mean attention distance in pixels, [layers, heads].

    patterns: per layer an attention pattern [heads, T, T] or [batch, heads, T, T] over
    T = 1 + grid^2 tokens ([CLS] first, then the patches row by row). Convention: [CLS] is left
    out as query and as key, and each patch's row is renormalised over the patches (so the weight
    a patch gives [CLS] is spread over the patches in proportion); then for each query patch q,
    sum over key patches k of a[q, k] x |centre(q) - centre(k)| in pixels, averaged over the
    query patches (and over the batch). A row that gives no weight to any patch counts as 0.
    """
    distances = patch_distances(grid, patch_size)
    n = grid * grid
    out = []
    for p in patterns:
        a = np.asarray(p, dtype=np.float64)
        if a.ndim == 3:
            a = a[None]
        if a.ndim != 4 or a.shape[-1] != n + 1 or a.shape[-2] != n + 1:
            raise ValueError(f"attention pattern of shape {list(a.shape)}: expected [..., heads, {n + 1}, {n + 1}] "
                             f"for a {grid} x {grid} grid plus [CLS]")
        patches = a[..., 1:, 1:]
        total = patches.sum(-1, keepdims=True)
        rows = np.divide(patches, total, out=np.zeros_like(patches), where=total > 0)
        out.append((rows * distances).sum(-1).mean(-1).mean(0))  # [heads]
    return np.stack(out)


def attention_distance_of_trace(trace, cfg: ModelConfig) -> np.ndarray:
    """mean_attention_distance over every layer a trace recorded (blocks.L.attn.pattern)."""
    patterns = [trace.pattern(layer).float().cpu().numpy() for layer in range(cfg.n_layers)]
    return mean_attention_distance(patterns, _grid(cfg), cfg.patch_size)
