"""Train, dictionary mode: a run's events are drawn together, not one redraw each (ui.panels.training_sae)."""
from __future__ import annotations

from desktop_app.ui.panels.training_sae import DictionaryPlots


def test_a_burst_of_step_events_is_drawn_in_one_redraw_with_every_point(qtbot):
    """On one core a fast run's events (one every 10 steps, each redraw setting a whole series) outpaced the UI
    thread: test_training_dictionary after test_train_seq2seq_panel under taskset -c 0 timed out at 150 s
    inside its 60 s waitUntil. A burst now costs one redraw per curve."""
    plots = DictionaryPlots()
    qtbot.addWidget(plots)
    plots.show()
    sets = []
    for name, curve in plots.curves.items():
        real = curve.setData
        curve.setData = lambda *a, _real=real, _name=name, **k: (sets.append(_name), _real(*a, **k))[1]
    for step in range(10, 5_010, 10):
        plots.add({"event": "step", "step": step, "mse": 1.0 / step, "l0": 4.0, "variance_explained": 0.5,
                   "dead": step // 1000})
    plots.add({"event": "eval", "step": 5_000, "mse": 0.1, "l0": 4.0, "variance_explained": 0.6})
    qtbot.waitUntil(lambda: len(plots.curves["l0"].getData()[0] if plots.curves["l0"].getData()[0] is not None
                                else []) == 500, timeout=10_000)
    assert sorted(sets) == sorted(["mse", "l0", "variance_explained", "dead", "held-out mse", "held-out l0",
                                   "held-out variance_explained"])  # once each (it was 500 times each)
    xs, ys = plots.curves["dead"].getData()
    assert list(xs) == list(range(10, 5_010, 10)) and ys[-1] == 5
    assert plots.dead_plot.getViewBox().viewRange()[1][1] >= 5  # its y range follows the counts


def test_a_burst_of_model_step_events_is_drawn_in_one_redraw_with_every_point(qtbot):
    """Train, model mode (ui.panels.training_plots): each step event set the loss, learning-rate and every layer's
    gradient-norm series whole, as the dictionary mode's did before its throttle (the same RedrawSoon now)."""
    from desktop_app.ui.panels.training_plots import TrainingPlots

    plots = TrainingPlots()
    qtbot.addWidget(plots)
    plots.show()
    sets = []

    def counted(name, curve):
        real = curve.setData
        curve.setData = lambda *a, _real=real, **k: (sets.append(name), _real(*a, **k))[1]

    for name in ("train_curve", "lr_curve", "val_curve", "acc_curve"):
        counted(name, getattr(plots, name))
    layers = ("embed", "blocks.0", "head")
    steps = range(1, 501)
    for s in steps:
        plots.add({"event": "step", "step": s, "train_loss": 1.0 / s, "lr": 1e-3,
                   "grad_norms": {layer: 0.5 for layer in layers}})
        if s == 1:  # (each layer's curve is made at its first event, in the event's order)
            for layer in layers:
                counted(layer, plots.grad_curves[layer])
    qtbot.waitUntil(lambda: plots.train_curve.getData()[0] is not None and len(plots.train_curve.getData()[0]) == 500,
                    timeout=10_000)
    assert sorted(sets) == sorted(["train_curve", "lr_curve", *layers])  # once each (it was 500 times each)
    xs, ys = plots.train_curve.getData()
    assert list(xs) == list(steps) and ys[-1] == 1.0 / 500
    assert all(len(plots.grad_curves[layer].getData()[0]) == 500 for layer in layers)
    plots.add({"event": "step", "step": 501, "train_loss": 0.001, "lr": 1e-3, "grad_norms": {}})
    plots.add({"event": "eval", "step": 501, "val_loss": 0.5, "val_accuracy": 0.9})  # drawn at once, the step too
    assert len(plots.train_curve.getData()[0]) == 501 and list(plots.val_curve.getData()[1]) == [0.5]


def test_the_train_panels_plots_show_their_titles_only_until_a_run_draws_on_them(qtbot):
    """Train, both modes, before a run: bare 0-1 axes, grids and legends of curves not drawn ("batches", "held
    out") around nothing (widgets.empty_plot's rule); each plot's axes come with its first points."""
    from desktop_app.ui.panels.training import TrainingPanel
    from desktop_app.ui.state import AppState

    from .walkthrough import choose_item

    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    panel.resize(1280, 800)
    panel.show()
    qtbot.waitExposed(panel)

    def empty(plot) -> bool:
        item = plot.getPlotItem()
        return not item.getAxis("left").isVisible() and not item.getAxis("bottom").isVisible() and \
            (item.legend is None or not item.legend.isVisible()) and item.titleLabel.text != ""

    model = panel.plots
    assert all(empty(p) for p in (model.loss_plot, model.acc_plot, model.lr_plot, model.grad_plot))
    choose_item(qtbot, panel.mode, "a sparse dictionary")
    dictionary = panel.dictionary.plots
    plots = (dictionary.mse_plot, dictionary.l0_plot, dictionary.fve_plot, dictionary.dead_plot)
    assert all(p.isVisible() and empty(p) for p in plots)
    dictionary.add({"event": "step", "step": 10, "mse": 0.5, "l0": 4.0, "variance_explained": 0.5, "dead": 0})
    dictionary.draw()
    assert not any(empty(p) for p in plots)
    model.add({"event": "step", "step": 10, "train_loss": 2.0, "lr": 1e-3, "grad_norms": {"head": 1.0}})
    model.draw()
    assert not any(empty(p) for p in (model.loss_plot, model.lr_plot, model.grad_plot)) and empty(model.acc_plot)
