"""`python -m desktop_app render MODEL_DIR (--text T | --ids ... | --image FILE) --view V --out FILE.png|.svg`

Headless figures: the very views of the Attention, Layers and Image panels, drawn offscreen and written
with the same export code as their buttons (.png, vector .svg, or the numbers as .csv / .npz). A vision
model (ViT) takes --image: the Image panel's views, or the attention/layers views of its [CLS] + patches.
"""
from __future__ import annotations

import os

from . import add_model_and_text_arguments
from .args import add_overwrite_argument, layer_or_head

from ..core.analysis import STAT_NAMES
from ..core.views import attention as attention_views
from ..core.views import layers as layers_views
from ..core.views import view_names
from ..ui.offscreen import dispose

# the panels' VIEWS tables: a view added there is a `--view` here (the attention heatmap listed first)
ATTENTION_VIEWS = ("attention",) + tuple(n for n in view_names(attention_views.VIEWS) if n != "attention")
LAYERS_VIEWS = view_names(layers_views.VIEWS)
VIEWS = ATTENTION_VIEWS + LAYERS_VIEWS  # the views of a text (or of a ViT's image tokens)
# the Image panel's tabs, in its order: a ViT and --image only
IMAGE_VIEWS = ("image-heads", "image-filters", "image-position-similarity", "image-distance")
STATS = tuple(STAT_NAMES)


def add_parser(sub) -> None:
    p = sub.add_parser("render", help="draw an attention or layers view of a text to PNG / SVG (headless)")
    g = add_model_and_text_arguments(p)
    g.add_argument("--image", help="for a vision model (ViT): an image (PNG, JPEG, BMP) or a uint8 .npy array")
    p.add_argument("--view", required=True, choices=VIEWS + IMAGE_VIEWS,
                   help="image-heads: each head's attention from --token (0 = [CLS], default) over the image at "
                        "--layer; image-filters, image-position-similarity, image-distance: the Image panel's figures")
    p.add_argument("--layer", type=layer_or_head, default=None,
                   help="layer (attention views; default 0); for pca/cosine the block whose output is shown "
                        "(default: the last)")
    p.add_argument("--head", type=layer_or_head, default=0, help="head for --view attention")
    p.add_argument("--depth", type=layer_or_head, default=None, help="pca/cosine: residual depth, 0 = embedding (overrides --layer)")
    p.add_argument("--token", type=layer_or_head, default=None,
                   help="highlight this query token (position; for a ViT 0 = [CLS], 1.. the patches row by row)")
    p.add_argument("--stat", choices=STATS, default="entropy", help="statistic for --view head-stats")
    p.add_argument("--size", default="1200x900", help="figure size in pixels, WxH")
    p.add_argument("--out", required=True, help="output file: .png, .svg (also .csv or .npz for the numbers)")
    add_overwrite_argument(p)
    p.set_defaults(func=run)


def _ensure_qt_platform() -> None:
    """Offscreen rendering when there is no display (servers, CI)."""
    if "QT_QPA_PLATFORM" not in os.environ and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ["QT_QPA_PLATFORM"] = "offscreen"


def _parse_size(text: str) -> tuple[int, int]:
    from ..core.numbers import parse_int

    try:
        w, h = (parse_int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--size must look like 1200x900, got {text!r}") from None
    if not (100 <= w <= 10000 and 100 <= h <= 10000):
        raise ValueError(f"--size {text}: each side must be between 100 and 10000 pixels")
    return w, h


def _check(value: int | None, n: int, what: str) -> None:
    if value is not None and not 0 <= value < n:
        raise ValueError(f"--{what} {value} is out of range: this model has {n} ({what} 0..{n - 1})")


def render_view(loaded, ids: list[int], view: str, out: str, layer: int | None = None, head: int = 0,
                depth: int | None = None, token: int | None = None, stat: str = "entropy",
                size: tuple[int, int] = (1200, 900), trace=None):
    """Draw one view of `ids` through `loaded` and write it to `out`; returns the panel (for tests).
    With `trace` (e.g. a ViT's image trace, ids its positions) it is drawn instead of tracing `ids`."""
    import torch
    from PySide6.QtWidgets import QApplication

    from ..app.tracing import trace_names
    from ..ui.state import AppState
    from ..ui.widgets.export import EXPORT_SUFFIXES, export_view

    suffix = os.path.splitext(out)[1].lower()
    if suffix not in EXPORT_SUFFIXES:
        raise ValueError(f"{out}: the output must end in {', '.join(EXPORT_SUFFIXES)}")
    cfg = loaded.config
    _check(layer, cfg.n_layers, "layer")
    _check(head, cfg.n_heads, "head")
    _check(depth, cfg.n_layers + 1, "depth")
    _check(token, len(ids), "token")
    app = QApplication.instance() or QApplication(["transformer-explorer-render"])
    if trace is None:
        names = trace_names(cfg, len(ids), final_logits=False)  # the views drawn here never read the logits
        _, trace = loaded.model.run_with_trace(torch.tensor([ids], device=loaded.model.device), names=names)
    state = AppState()  # the panel's source of token strings and the model's causality
    state.loaded = loaded
    state.token_ids = list(ids)  # state.trace stays None: the panel gets the trace below, synchronously
    if view in ATTENTION_VIEWS:
        from ..ui.panels.attention import AttentionPanel

        panel = AttentionPanel(state)
        panel.set_trace(trace, ids, sync=True)
        panel.set_view_state(attention_views.AttentionViewState(view=view, layer=layer or 0, head=head, statistic=stat,
                                                                selected_token=token))
    else:
        from ..ui.panels.layers import LayersPanel

        if depth is None:
            depth = cfg.n_layers if layer is None else layer + 1
        panel = LayersPanel(state)
        panel.set_trace(trace, ids, sync=True)
        panel.set_view_state(layers_views.LayersViewState(view=view, depth=depth, selected_token=token))
    panel.resize(*size)
    panel.show()
    app.processEvents()
    try:
        export_view(panel.current_view(), out)
    except BaseException:
        dispose(panel)  # a failed write must not leave a visible window behind (in-process callers, tests)
        raise
    return panel


def render_image_view(loaded, image: str, view: str, out: str, layer: int | None = None, token: int | None = None,
                      size: tuple[int, int] = (1200, 900)):
    """Draw one of the Image panel's views of the image file `image` and write it to `out`; returns the panel."""
    from PySide6.QtWidgets import QApplication

    from ..app.images import image_pixel_values
    from ..ui.panels.image import ImagePanel
    from ..ui.state import AppState
    from ..ui.widgets.export import EXPORT_SUFFIXES, export_view

    suffix = os.path.splitext(out)[1].lower()
    if suffix not in EXPORT_SUFFIXES:
        raise ValueError(f"{out}: the output must end in {', '.join(EXPORT_SUFFIXES)}")
    cfg = loaded.config
    _check(layer, cfg.n_layers, "layer")
    _check(token, 1 + (cfg.image_size // cfg.patch_size) ** 2, "token")
    app = QApplication.instance() or QApplication(["transformer-explorer-render"])
    pixels = image_pixel_values(loaded, image)
    panel = ImagePanel(AppState())  # no model in its state: it is handed this one and draws synchronously
    try:
        panel.draw_now(loaded, pixels, os.path.basename(image), layer or 0, None if not token else token - 1)
        panel.tabs.setCurrentIndex(IMAGE_VIEWS.index(view))
        panel.resize(*size)
        panel.show()
        app.processEvents()
        export_view(panel.views[panel.tabs.currentIndex()], out)
    except BaseException:
        dispose(panel)
        raise
    return panel


def run(args) -> int:
    _ensure_qt_platform()
    from . import load_model
    from . import input_ids

    from ..core.files import check_output_file

    size = _parse_size(args.size)
    check_output_file(args.out, args.overwrite)  # refused or unwritable now, not after the drawing
    loaded = load_model(args.model_dir, special_tokens=args.special_tokens, dtype=args.dtype)
    if loaded.config.is_encoder_decoder:
        raise ValueError(f"{args.model_dir}: render does not draw encoder-decoders yet: open it in the Attention or "
                         "Layers panel (each view exports there), or write the numbers with trace --target-text")
    if args.view in layers_views.MIXTURE_VIEWS and not getattr(loaded.config, "num_experts", 0):
        raise ValueError(f"--view {args.view}: {args.model_dir} is not a mixture of experts (it has no router to draw)")
    image = getattr(args, "image", None)
    vision = loaded.config.input_kind == "patches"
    if args.view in IMAGE_VIEWS and not (vision and image):
        raise ValueError(f"--view {args.view} draws a vision model (ViT) on an image: give a ViT folder and --image FILE")
    if image is not None and not vision:
        raise ValueError(f"{args.model_dir}: not a vision model; --image needs a ViT folder (give --text or --ids)")
    if args.view in IMAGE_VIEWS:
        panel = render_image_view(loaded, image, args.view, args.out, layer=args.layer, token=args.token, size=size)
        print(f"wrote {args.out} ({args.view}, {image})")
        dispose(panel)
        return 0
    trace = None
    if vision:  # the attention / layers views of the image's [CLS] + patches, as the app traces it
        if image is None:
            raise ValueError(f"{args.model_dir}: a vision model reads images: give --image FILE")
        from ..app.images import image_pixel_values
        from ..app.tracing import trace_image

        ids, trace = trace_image(loaded, image_pixel_values(loaded, image))
    else:
        ids = input_ids(loaded, args.text, args.ids)
    panel = render_view(loaded, ids, args.view, args.out, layer=args.layer, head=args.head, depth=args.depth,
                        token=args.token, stat=args.stat, size=size, trace=trace)
    print(f"wrote {args.out} ({args.view}, {len(ids)} tokens)")
    dispose(panel)
    return 0

