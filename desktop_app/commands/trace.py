from __future__ import annotations

from pathlib import Path

from . import add_model_and_text_arguments
from .args import add_overwrite_argument


def add_parser(sub) -> None:
    p = sub.add_parser("trace", help="run a text through a model and save what it recorded as .npz")
    g = add_model_and_text_arguments(p)
    g.add_argument("--image", help="for a vision model: an image (PNG, JPEG, BMP) or a uint8 .npy array")
    p.add_argument("--out", required=True, help="output .npz")
    add_overwrite_argument(p)
    p.add_argument("--ablate", help="zero-ablate: LAYER.HEAD[,LAYER.HEAD...] (also LAYER.attn, LAYER.mlp)")
    p.set_defaults(func=run)


def trace_arrays(loaded, ids: list[int], interventions=None) -> dict:
    """tokens, attn.{l} [H, T, T], hidden.{i} (Hugging Face's hidden_states), logits [T, vocab];
    of the model with these interventions applied (core/interventions.py), if any."""
    import numpy as np
    import torch

    _, arrays = _traced_arrays(loaded, torch.tensor(ids)[None], interventions)
    return {"tokens": np.asarray(ids, dtype=np.int64), **arrays}


def _traced_arrays(loaded, inputs, interventions=None) -> tuple:
    """(trace, arrays): one run of a batch of one input, and the arrays every trace file holds:
    attn.{l}, hidden.{i}, logits (when the model has them)."""
    names = ["embed", "final_norm.out", "logits", "blocks.*.attn.pattern", "blocks.*.resid_post"]
    _, trace = loaded.model.run_with_trace(inputs, names=names, interventions=interventions)
    arrays = {f"attn.{l}": trace.pattern(l)[0].float().numpy() for l in range(loaded.config.n_layers)}
    for i, h in enumerate(trace.hidden_states()):
        arrays[f"hidden.{i}"] = h[0].float().numpy()
    if "logits" in trace:
        arrays["logits"] = trace["logits"][0].float().numpy()
    return trace, arrays


def read_image_file(path: str | Path, channels: int):
    """An image file as a uint8 array H x W x C (C = 1 for a one-channel model, else 3): a .npy
    array as it is, anything else decoded by Qt's QImage (core reads no image files itself)."""
    import numpy as np

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{p}: no such image file")
    if p.suffix.lower() == ".npy":
        from ..core.files import check_array_file

        check_array_file(p)  # the header first: a claimed (100000, 100000) array is refused unread
        try:
            return np.load(p, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise ValueError(f"{p}: not a readable .npy array ({exc})") from exc
    from PySide6.QtGui import QImage

    image = QImage(str(p))
    if image.isNull():
        raise ValueError(f"{p}: not an image Qt can decode (PNG, JPEG, BMP, ...)")
    grey = channels == 1
    image = image.convertToFormat(QImage.Format.Format_Grayscale8 if grey else QImage.Format.Format_RGB888)
    c, w, h = (1 if grey else 3), image.width(), image.height()
    rows = np.frombuffer(image.constBits(), np.uint8, count=image.bytesPerLine() * h).reshape(h, -1)
    return rows[:, : w * c].reshape(h, w, c).copy()  # rows are padded to 4 bytes


def image_pixel_values(loaded, path: str | Path):
    """The image at `path` as the model's pixel values [C, H, W], preprocessed as its folder's
    preprocessor_config.json says (core/vit.py)."""
    from ..core.vit import ImageInputError, image_settings, preprocess_image

    cfg = loaded.config
    if cfg.input_kind != "patches":
        raise ValueError(f"{loaded.path}: not a vision model; --image needs a ViT folder (give --text or --ids)")
    try:
        return preprocess_image(read_image_file(path, cfg.num_channels), image_settings(loaded.path, cfg),
                                cfg.num_channels)
    except ImageInputError as exc:
        raise ValueError(exc.args[0] if "preprocessor_config" in exc.args[0] else f"{path}: {exc}") from None


def image_trace_arrays(loaded, pixel_values, interventions=None) -> dict:
    """The keys trace_arrays writes, for an image: attn.{l} [H, 1 + P, 1 + P] ([CLS] first, patches
    row by row), hidden.{i}, logits [classes] (with a classifier); pixel_values [C, H, W] in place of
    tokens, and attention_distance [layers, heads] (mean distance in pixels, core/vit.py); of the model
    with these (zero or replace) interventions applied, if any."""
    import numpy as np
    import torch

    from ..core.vit import attention_distance_of_trace

    trace, traced = _traced_arrays(loaded, torch.from_numpy(pixel_values)[None], interventions)
    arrays = {"pixel_values": np.asarray(pixel_values, dtype=np.float32), **traced}
    arrays["attention_distance"] = attention_distance_of_trace(trace, loaded.config).astype(np.float32)
    return arrays


def run(args) -> int:
    import io
    from pathlib import Path

    import numpy as np

    from . import load_model
    from ..core.files import atomic_write_bytes, check_output_file
    from . import input_ids

    check_output_file(args.out, args.overwrite)  # refused or unwritable now, not after the forward pass
    from ..core.interventions import parse_ablations

    loaded = load_model(args.model_dir, special_tokens=args.special_tokens)
    ablate = parse_ablations(args.ablate, loaded.config) if args.ablate else None
    if args.image is not None or loaded.config.input_kind == "patches":
        if args.image is None:
            raise ValueError(f"{args.model_dir}: a vision model reads images: give --image FILE")
        arrays = image_trace_arrays(loaded, image_pixel_values(loaded, args.image), ablate)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        check_output_file(args.out, overwrite=True)  # still not a link or a special file
        atomic_write_bytes(Path(args.out), buf.getvalue())
        print(f"wrote {args.out} ({len(arrays)} arrays)")
        return 0
    arrays = trace_arrays(loaded, input_ids(loaded, args.text, args.ids), ablate)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    check_output_file(args.out, overwrite=True)  # still not a link or a special file
    atomic_write_bytes(Path(args.out), buf.getvalue())
    print(f"wrote {args.out} ({len(arrays)} arrays)")
    return 0
