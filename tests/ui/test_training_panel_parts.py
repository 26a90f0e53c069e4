"""The Train panel's parts (issue 26: form, run controller, live plots) wired as one panel: an event the run
controller reads reaches the plots as the process wrote it."""
from __future__ import annotations

from desktop_app.ui.panels.training import TrainingPanel
from desktop_app.ui.state import AppState

LAYERS = ["head", "embed", "blocks.0", "blocks.1"]  # the trainer's order, not sorted


def test_an_event_read_from_the_process_keeps_its_layers_order(qtbot):
    """The gradient-norm legend lists the layers in the order of the process's event (a signal typed dict
    would hand the panel a copy with its keys sorted: blocks.0, blocks.1, embed, head)."""
    panel = TrainingPanel(AppState())
    qtbot.addWidget(panel)
    ev = {"event": "step", "step": 1, "steps": 10, "train_loss": 2.0, "lr": 1e-3, "tokens_per_s": 100.0,
          "elapsed": 0.1, "eta": 1.0, "grad_norms": {name: 0.5 for name in LAYERS}}
    with qtbot.waitSignal(panel.run_event, timeout=5000):
        panel.run.event.emit(ev)  # what TrainingRun does with each line of the process's output
    assert list(panel.grad_curves) == LAYERS
    assert list(panel.events[-1]["grad_norms"]) == LAYERS
    assert [label.text for _, label in panel.grad_plot.getPlotItem().legend.items] == LAYERS
