"""Issue 41: legends drawn over the data (the Train panel's gradient norms). A legend goes to the corner of
its plot the curves leave free (widgets.legend_place), and moves when the curves fill that corner."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPointF, QRectF

from desktop_app.ui.panels.training_plots import TrainingPlots
from desktop_app.ui.widgets.legend_place import CORNERS, _points

from .test_dynamics_panel import panel, state  # noqa: F401 (fixtures)


def _covered(plot) -> tuple[int, dict]:
    """Data points (and points along the lines) under the legend, and under a legend of its size at each
    corner of the view, in view-box pixels."""
    item = plot.getPlotItem() if hasattr(plot, "getPlotItem") else plot
    vb = item.getViewBox()
    (x0, x1), (y0, y1) = vb.viewRange()
    pts = _points(item, x0, x1, y0, y1, vb.width(), vb.height())
    rect = item.legend.mapRectToItem(vb, item.legend.boundingRect())
    under = int(sum(rect.contains(QPointF(x, y)) for x, y in pts))
    corners = {}
    for cx, cy in CORNERS:
        moved = QRectF(rect)
        moved.moveLeft(10 + (vb.width() - rect.width() - 20) * cx)
        moved.moveTop(10 + (vb.height() - rect.height() - 20) * cy)
        corners[(cx, cy)] = int(sum(moved.contains(QPointF(x, y)) for x, y in pts))
    return under, corners


def test_gradient_norm_legend_leaves_the_curves_alone(qtbot, tmp_path):
    plots = TrainingPlots()
    qtbot.addWidget(plots)
    plots.resize(1000, 700)
    plots.show()
    layers = ["embed"] + [f"blocks.{i}" for i in range(6)] + ["head"]
    steps = np.arange(1, 201)
    for s in steps:  # norms that rise to the top-right corner, where the legend used to sit
        plots.add({"event": "step", "step": int(s), "train_loss": 3.0 / s, "lr": 1e-3,
                   "grad_norms": {name: float(0.01 * (1 + i) * s ** 1.5) for i, name in enumerate(layers)}})
    qtbot.wait(100)
    plots.grab().save(str(tmp_path / "plots.png"))
    under, corners = _covered(plots.grad_plot)
    assert under <= min(corners.values()) and 10 * under < corners[(1, 0)], (under, corners)  # top-right: their ends
    under, corners = _covered(plots.loss_plot)
    assert under == 0, (under, corners)


def test_corners_are_tried_top_right_first():
    assert CORNERS[0] == (1, 0)




def test_the_dynamics_model_plot_legend_leaves_its_two_curves_alone(qtbot, panel, state):
    """Clusters along the top, radius along the bottom: every corner holds a curve, the middle of an edge none."""
    import torch

    ids = [i % state.loaded.config.vocab_size for i in range(20)]
    _, trace = state.loaded.model.run_with_trace(torch.tensor(ids)[None])
    state.trace = trace
    state.trace_changed.emit(trace)
    qtbot.waitUntil(lambda: panel._layer_curves is not None, timeout=10000)
    qtbot.wait(100)
    under, corners = _covered(panel.p_model_clusters)
    assert under == 0 and min(corners[c] for c in CORNERS[:4]) > 0, (under, corners)


def test_train_plot_legends_leave_the_curves_alone_at_1024x640(qtbot):
    """At 1024x640 each Train plot's view is ~260 x 90 pixels: the six layers' legend (three rows of two) lay over
    the gradient norms wherever it went. A legend over the data everywhere is made compact (smaller text and
    samples, in fewer rows) and the view makes room above the data for it."""
    plots = TrainingPlots()
    qtbot.addWidget(plots)
    plots.resize(610, 330)  # (the Train panel's plots in a 1024x640 window)
    plots.show()
    layers = ["embed"] + [f"blocks.{i}" for i in range(4)] + ["head"]
    for s in range(1, 301):  # norms that run across the whole plot
        plots.add({"event": "step", "step": s, "train_loss": 5.0 * s ** -0.3, "lr": 1e-3,
                   "grad_norms": {name: float((0.5 + i) * s ** -0.4) for i, name in enumerate(layers)}})
        if s % 30 == 0:
            plots.add({"event": "eval", "step": s, "val_loss": 5.2 * s ** -0.3, "val_accuracy": 1 - 0.9 * s ** -0.3,
                       "train_accuracy": 1 - 0.85 * s ** -0.3})
    for plot in (plots.grad_plot, plots.acc_plot, plots.loss_plot):
        qtbot.waitUntil(lambda plot=plot: _covered(plot)[0] == 0, timeout=5000)  # (the views range when painted)
        under, corners = _covered(plot)
        assert under == 0, (plot.getPlotItem().titleLabel.text, under, corners)
    item = plots.grad_plot.getPlotItem()
    vb, legend = item.getViewBox(), item.legend
    assert [label.text for _, label in legend.items] == layers  # every layer named, each inside the view
    for sample, label in legend.items:
        box = label.mapRectToItem(vb, label.boundingRect())
        assert box.left() >= 0 and box.right() <= vb.width() and box.top() >= 0, (label.text, box, vb.width())
