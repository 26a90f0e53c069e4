"""The timeline: a step slider under the menu bar for a training run that kept checkpoints (issue 30).

Shown while the model on show is a run folder or one of its kept steps (app.timeline.timeline_of; a run
without kept steps, or any other model: hidden). The slider walks the run's kept steps still on disk;
moving it asks AppState.open_step, which puts every panel on the model at that step (the same text traced
again, in a worker, recent steps cached). Beside it the run's loss curve with the kept steps marked and
the step on show as a line; a click on the curve goes to the nearest kept step. Play steps through the
kept steps, each once it is on show. The timeline is read again at every model change, so kept steps a
running training writes appear. "Across training" opens AcrossTraining (widgets/across_training.py): each
head's induction, previous-token, entropy and distance scores against step, and a per-layer metric chosen
there (weight norms, Lipschitz constant, logit lens, gradient norms), exportable with the shared export bar.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSlider, QWidget

from ...app.timeline import nearest_step, run_of, timeline_of
from ..workers import run_job

PLAY_MS = 700  # between two steps of Play (once the previous one is on show)


class TimelineBar(QWidget):
    def __init__(self, state, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.timeline = None  # core.training.timeline.Timeline of the run on show
        self.steps: list[int] = []  # its kept steps still there, in order (the slider's positions)
        self.shown_step: int | None = None  # the step of the model on show
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 2, 8, 2)
        self.title = QLabel("Training step")
        self.play_button = QPushButton("Play")
        self.play_button.setCheckable(True)
        self.play_button.setToolTip("Step through the kept checkpoints, every panel following")
        self.play_button.toggled.connect(self._play_toggled)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setTickPosition(QSlider.TickPosition.TicksBelow)
        self.slider.setPageStep(1)
        self.slider.setToolTip("The run's kept checkpoints: every panel shows the model at the step chosen")
        self.slider.valueChanged.connect(self._slider_moved)
        self.step_label = QLabel()
        self.step_label.setMinimumWidth(150)
        self.plot = None  # the loss curve, built when a run is first shown (pyqtgraph is not needed at start-up)
        row.addWidget(self.title)
        row.addWidget(self.play_button)
        row.addWidget(self.slider, 1)
        row.addWidget(self.step_label)
        self.across_button = QPushButton("Across training…")
        self.across_button.setToolTip("Each head's induction, previous-token, entropy and distance scores, and "
                                      "each layer's weight norm, Lipschitz constant or logit lens, at every kept "
                                      "step, in a window of their own")
        self.across_button.clicked.connect(self.show_across_training)
        self.across: AcrossTraining | None = None
        row.addWidget(self.across_button)
        self.play_timer = QTimer(self)
        self.play_timer.setInterval(PLAY_MS)
        self.play_timer.timeout.connect(self._play_tick)
        self.setVisible(False)
        state.model_changed.connect(self._model_changed)

    @property
    def run_dir(self):
        return self.timeline.run_dir if self.timeline is not None else None

    # -- the model on show -------------------------------------------------------------------
    def _model_changed(self, loaded) -> None:
        path = loaded.path
        if run_of(path) is None:  # not a run: no timeline (names only, no file read)
            self._hide()
            return
        run_job(timeline_of, path, on_result=lambda result: self._show(result, path), owner=self)

    def _show(self, result, path) -> None:
        if self.state.loaded is None or self.state.loaded.path != path:
            return  # another model is on show already
        if result is None:  # a run without kept steps to scrub
            self._hide()
            return
        self.timeline, self.shown_step = result
        self.steps = [k.step for k in self.timeline.openable()]
        self.slider.blockSignals(True)
        self.slider.setRange(0, len(self.steps) - 1)
        if self.shown_step in self.steps and self.state.loading is None:  # else a step asked for is on its way
            self.slider.setValue(self.steps.index(self.shown_step))
        elif self.shown_step is None:  # a cached model's revision that is no step (main): the slider at the end
            self.slider.setValue(len(self.steps) - 1)
        self.slider.blockSignals(False)
        if self.plot is None:
            self._build_plot()
        self._draw()
        self.setVisible(True)

    def _build_plot(self) -> None:
        import pyqtgraph as pg

        self.plot = pg.PlotWidget(background="w")
        self.plot.setFixedHeight(64)
        self.plot.setMinimumWidth(260)
        self.plot.setMenuEnabled(False)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideButtons()
        self.plot.getAxis("left").setWidth(28)
        self.plot.getAxis("bottom").setHeight(18)
        self.plot.setToolTip("The run's training loss; dots: kept steps; the line: the step on show. "
                             "Click to go to the nearest kept step.")
        self.loss_curve = self.plot.plot(pen=pg.mkPen("#0072B2", width=1.5))
        self.kept_marks = pg.ScatterPlotItem(size=6, brush=pg.mkBrush("#D55E00"), pen=None)
        self.plot.addItem(self.kept_marks)
        self.marker = pg.InfiniteLine(angle=90, pen=pg.mkPen("#222", width=1.5))
        self.plot.addItem(self.marker)
        self.plot.scene().sigMouseClicked.connect(self._plot_clicked)
        self.layout().insertWidget(self.layout().indexOf(self.step_label) + 1, self.plot, 1)
        from .. import settings as app_settings
        if app_settings.palette_is_dark():  # built after the theme was applied (pyqtgraph's own colours)
            app_settings.restyle_plots(self.plot)

    def _hide(self) -> None:
        self.play_button.setChecked(False)
        self.timeline, self.steps, self.shown_step = None, [], None
        self.setVisible(False)

    def _draw(self) -> None:
        curve = self.timeline.curve
        self.loss_curve.setData(curve.steps, curve.train_loss)
        if curve.steps:
            ys = np.interp(self.steps, curve.steps, curve.train_loss)
        else:
            ys = np.zeros(len(self.steps))
        self.kept_marks.setData(self.steps, ys)
        self.marker.setVisible(self.shown_step is not None)  # None: a cached model's revision that is no step
        if self.shown_step is not None:
            self.marker.setValue(self.shown_step)
        loss = ""
        if curve.steps and self.shown_step is not None:
            loss = f" · loss {float(np.interp(self.shown_step, curve.steps, curve.train_loss)):.3f}"
        self.step_label.setText(f"step {self.shown_step} of {self.steps[-1]}{loss}" if self.shown_step is not None
                                else f"not a step revision (steps {self.steps[0]} to {self.steps[-1]})")
        missing = [k.step for k in self.timeline.missing()]
        self.step_label.setToolTip(f"{len(self.steps)} kept steps in {self.run_dir}"
                                   + (f"; deleted: {', '.join(map(str, missing))}" if missing else ""))

    # -- choosing a step ---------------------------------------------------------------------
    def _slider_moved(self, index: int) -> None:
        if not self.steps:
            return
        step = self.steps[index]
        self.marker.setValue(step)
        self.marker.setVisible(True)
        self.step_label.setText(f"step {step} of {self.steps[-1]} (loading…)" if step != self.shown_step else
                                self.step_label.text())
        self.state.open_step(self.run_dir, step)  # also the step on show: a step loading is then not wanted

    def go_to(self, step: float) -> None:
        """Show the kept step nearest to `step`."""
        if self.steps:
            self.slider.setValue(self.steps.index(nearest_step(self.steps, step)))

    def _plot_clicked(self, ev) -> None:
        vb = self.plot.getPlotItem().vb
        if self.steps and vb.sceneBoundingRect().contains(ev.scenePos()):
            self.go_to(vb.mapSceneToView(ev.scenePos()).x())

    def show_across_training(self) -> None:
        """The per-head metrics of the run on show against step (computed again for another run)."""
        if self.run_dir is None:
            return
        if self.across is None or self.across.run_dir != self.run_dir:
            if self.across is not None:
                self.across.close()
            from .across_training import AcrossTraining  # pyqtgraph: imported when first asked for

            self.across = AcrossTraining(self.run_dir)
        self.across.show()
        self.across.raise_()

    # -- Play --------------------------------------------------------------------------------
    def _play_toggled(self, on: bool) -> None:
        self.play_button.setText("Pause" if on else "Play")
        if on:
            if self.steps and self.slider.value() == len(self.steps) - 1:
                self.slider.setValue(0)  # from the start again
            self.play_timer.start()
        else:
            self.play_timer.stop()

    def _play_tick(self) -> None:
        """The next kept step, once the one asked for is on show (a slow load is waited for, not skipped)."""
        if not self.steps or self.state.loading is not None or self.steps[self.slider.value()] != self.shown_step:
            return
        if self.slider.value() >= len(self.steps) - 1:
            self.play_button.setChecked(False)
            return
        self.slider.setValue(self.slider.value() + 1)
