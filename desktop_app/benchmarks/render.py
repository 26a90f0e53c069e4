"""Switching the selected head on a long input, against one plain pyqtgraph ImageItem.setImage.

    python -m desktop_app bench render [--tokens 1024] [--repeat 15]

A GPT-2-style model (4 layers x 4 heads, random weights, context = tokens) runs one text of
`--tokens` tokens; the Attention panel shows it offscreen at 1200 x 900 on its heatmap tab. Ours:
the time from setting the head spin box to the end of a synchronous repaint of the heatmap (new
values uploaded to the one texture, colour bar levels, title, drawn). Reference: the same array
set on a bare ImageItem in a PlotWidget of the same size, then the same synchronous repaint: the
least any ImageItem heatmap can cost. Median of `--repeat` switches each. Target: ours < 100 ms.
Also printed: a layer switch (new labels and mask), selecting a query token (every view), and
the UI-thread time when a new trace arrives (thumbnails and the visible view; the rest in a worker).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from ..commands.args import OneLineParser, int_in


def _median_time(fn, repeat: int) -> float:
    times = []
    for i in range(repeat):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str]) -> dict:
    ap = OneLineParser(prog="bench render")
    ap.add_argument("--tokens", type=int_in(1, 10**5), default=1024)
    ap.add_argument("--repeat", type=int_in(1, 1000), default=15)
    args = ap.parse_args(argv)
    if "QT_QPA_PLATFORM" not in os.environ and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ["QT_QPA_PLATFORM"] = "offscreen"

    import pyqtgraph as pg
    import torch
    from PySide6.QtWidgets import QApplication

    from ..ui.offscreen import dispose
    from ..core.checkpoints import LoadedModel, new_model
    from ..core.config import ModelConfig
    from ..ui.panels.attention import AttentionPanel
    from ..ui.state import AppState

    app = QApplication.instance() or QApplication(["bench-render"])
    t = args.tokens
    cfg = ModelConfig.gpt2(vocab_size=256, d_model=64, n_layers=4, n_heads=4, d_ff=256, context_length=t,
                           init_std=0.2)
    loaded = LoadedModel(new_model(cfg, seed=0).eval(), cfg, None, None, "bench")
    ids = torch.randint(0, cfg.vocab_size, (t,), generator=torch.Generator().manual_seed(0)).tolist()
    _, trace = loaded.model.run_with_trace(torch.tensor([ids]), names=("blocks.*.attn.pattern",))

    state = AppState()
    state.loaded = loaded
    panel = AttentionPanel(state)
    panel.resize(1200, 900)
    panel.show()
    panel.set_trace(trace, ids, sync=True)
    panel.show_view("attention")
    app.processEvents()
    hm = panel.heatmap
    n_heads = cfg.n_heads

    def switch_head(i: int) -> None:
        panel.head_spin.setValue((panel.head + 1) % n_heads)
        hm.viewport().repaint()

    def switch_layer(i: int) -> None:
        panel.layer_spin.setValue((panel.layer + 1) % cfg.n_layers)
        hm.viewport().repaint()

    def select_token(i: int) -> None:
        panel.select_token((37 * (i + 1)) % t)
        hm.viewport().repaint()

    # a new trace arriving (what the UI thread pays; rollout and statistics go to a worker)
    t0 = time.perf_counter()
    panel.set_trace(trace, ids)
    hm.viewport().repaint()
    arrival_s = time.perf_counter() - t0
    while panel.stats is None:  # let the worker finish before timing switches
        app.processEvents()
        time.sleep(0.01)

    switch_head(0)  # warm up
    ours = _median_time(switch_head, args.repeat)
    layer_s = _median_time(switch_layer, max(3, args.repeat // 3))
    select_s = _median_time(select_token, max(3, args.repeat // 3))

    # reference: the bare minimum, one ImageItem in a PlotWidget of the same size
    arrays = [trace.pattern(0)[0, h].numpy() for h in range(n_heads)]
    ref_widget = pg.PlotWidget()
    ref_widget.resize(hm.size())
    ref_image = pg.ImageItem(axisOrder="row-major")
    ref_image.setLookupTable(pg.colormap.get("viridis").getLookupTable(nPts=256))
    ref_widget.addItem(ref_image)
    ref_widget.show()
    ref_image.setImage(arrays[0], levels=(0.0, 1.0))
    app.processEvents()

    def reference(i: int) -> None:
        m = arrays[(i + 1) % n_heads]
        ref_image.setImage(m, levels=(0.0, float(m.max())), autoLevels=False)
        ref_widget.viewport().repaint()

    reference(0)
    ref = _median_time(reference, args.repeat)
    dispose(panel)
    ref_widget.close()
    return {"name": "render", "tokens": t, "heads": n_heads, "layers": cfg.n_layers,
            "ours_s": round(ours, 5), "reference_s": round(ref, 5), "ratio": round(ours / ref, 3),
            "target_s": 0.1, "meets_target": ours < 0.1,
            "layer_switch_s": round(layer_s, 5), "select_token_s": round(select_s, 5),
            "new_trace_ui_s": round(arrival_s, 5),
            "what": "head switch on the attention heatmap (set + synchronous repaint) vs bare ImageItem.setImage + repaint"}
