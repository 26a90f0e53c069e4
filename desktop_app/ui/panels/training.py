"""Train panel: design a model and a task, start a run, watch it learn, use the result.

The panel composes three parts: its form (training_form.TrainingForm: the settings column, what it
describes as a TrainConfig and its checks), its run controller (training_run.TrainingRun: the `train`
process, its settings file and run folder, its events) and its live plots (training_plots.TrainingPlots).
The panel itself holds the buttons, the progress bar and the status line, and wires the three: Start
hands the form's config to the run; each event of the run is kept, drawn and said here. The run is a
separate process: a crash or out-of-memory ends that process only; the window stays up and the last
checkpoint stays on disk.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QAbstractSpinBox, QComboBox, QHBoxLayout, QLabel, QLineEdit, QMessageBox, QProgressBar,
                               QPushButton, QScrollArea, QStackedWidget, QVBoxLayout, QWidget)

from ...core.training.trainer import TrainConfig
from ...core.views.training import config_from_dict, end_of_run_line
from ..widgets.export import ExportBar, ask_save_path, show_saved
from ..widgets.export import export_view as write_export
from ..workers import run_job
from . import CANCEL_KEY, key_buttons
from .training_form import FORM_FIELDS, TrainingForm, WheelGuard
from .training_plots import SpacedAxis, TrainingPlots  # noqa: F401 - SpacedAxis: imported from here by tests
from .training_sae import DictionaryMode
from .training_run import (TrainingRun, free_launch_config_path, launch_config_path, load_run_model,  # noqa: F401
                           new_run_dir, runs_root)  # the run folders' rules, imported from here by tests

TRAIN_MODES = ("model", "sparse dictionary")  # the mode selector's items, as a workspace saves them


@dataclass
class TrainViewState(TrainConfig):
    """The Train panel's view state in a workspace: the model form's TrainConfig (its keys at the top, as
    before), the mode selector's choice and the dictionary form's settings (DictionaryForm.settings)."""
    mode: str = "model"
    dictionary: dict = field(default_factory=dict)


PLOT_FIELDS = ("loss_plot", "acc_plot", "lr_plot", "grad_plot", "train_curve", "val_curve", "train_acc_curve",
               "acc_curve", "lr_curve", "grad_curves")


START_KEY = "Ctrl+Return"  # the Start button's key; Stop's is every Cancel's (TrainingPanel.shortcuts)


class TrainingPanel(QWidget):
    drawn = Signal()  # what its exports would write changed (its ExportBar follows this)
    title = "Train"
    shortcuts = ((START_KEY, "Start"), (CANCEL_KEY, "Stop (a checkpoint is written)"))  # listed in Help
    help_text = (
        "<p><b>Train</b> a small transformer on a task and watch it learn. The loss is the cross-entropy "
        "&minus;log p(target) averaged over the scored positions (the answer tokens; for motif only the last "
        "position, read as a 4-way classification). <i>Validation</i> uses held-out instances the run never "
        "trains on; <i>accuracy</i> is the share of scored tokens whose arg-max is right.</p>"
        "<p><b>Motif</b> (lectures): 20 letters of A&ndash;D, predict the letter right after the last A "
        "(3 blocks, 1 head, width 32: 95.6% in the lectures, against 56.4% for an MLP: choose <i>MLP baseline</i> "
        "and a training-set size of 1500 for the comparison). <b>modadd</b>: "
        "a + b mod p, with weight decay it groks (validation jumps long after training). <b>induction</b>: a "
        "random sequence repeated; the repeat is predictable only by copying, which grows induction heads.</p>"
        "<p><b>Encoder-decoders</b> (marian: the original Transformer, post-LN, sinusoidal positions, ReLU; t5: "
        "relative position buckets, RMS norm) train on <b>translate</b> (English to French from a grammar: "
        "adjectives move after the noun) and on copy, reverse and sort as sequence to sequence, with teacher "
        "forcing: the decoder reads [START] and the first i &minus; 1 target tokens and the whole encoder output, "
        "and predicts token i. <i>Held-out exact match</i> is the share of held-out sources whose greedy "
        "translation is the whole target, [END] included. Under the plots, the last decoder layer's "
        "cross-attention for one held-out sentence at each evaluation: a row is the target token being written, "
        "a column a source token (mean over heads, or one head).</p>"
        "<p>Accuracy is plotted for the training batches since the previous evaluation and for the validation set. "
        "Schedules: warmup + cosine to 10% of the peak; Noam lr = factor &middot; d<sup>&minus;1/2</sup> "
        "min(t<sup>&minus;1/2</sup>, t &middot; warmup<sup>&minus;3/2</sup>). Clipping rescales g to "
        "&alpha; g / ||g|| when ||g|| &gt; &alpha;. The gradient-norm plot shows ||g|| per layer before clipping. "
        "The run is a separate process: checkpoints every N steps and at Stop; a crash keeps the last one.</p>"
        "<p><b>Train: a sparse dictionary</b> learns the loaded model's activations x at one hook over a text file "
        "(an SAE; a transcoder reconstructs another hook's activation from them): TopK keeps the k largest "
        "features per token, ReLU + L1 penalises &lambda; &Sigma;<sub>i</sub> f<sub>i</sub> ||d<sub>i</sub>||. "
        "<i>Reconstruction error</i> is |x &minus; x&#770;|&sup2; per token, <i>L0</i> the number of active features "
        "per token, <i>variance explained</i> 1 &minus; &Sigma;|x &minus; x&#770;|&sup2; / &Sigma;|x &minus; "
        "mean x|&sup2;, on the batches and on the text's held-out last 10%; a feature is <i>dead</i> when it has "
        "not fired for 200 steps. It is saved in SAELens' format (Stop saves it too: tick <i>Resume this run "
        "instead</i> and Start to go on, as <code>train --task sae --resume</code> does); Open in Features "
        "attaches it.</p>")

    run_event = Signal(dict)  # every event of the running process (tests and other views listen)

    def __init__(self, state, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self._loading = False
        self.form = TrainingForm()
        self.form_widget = self.form
        for name in FORM_FIELDS:  # the form's boxes, as panel.task, panel.layers... (the demo and tests set them)
            setattr(self, name, getattr(self.form, name))
        self.run = TrainingRun(self)
        self.run.event.connect(self._on_event)
        state.model_changed.connect(self._forget_now_using)
        self.run.ended.connect(self._on_finished)
        self.run.failed_to_start.connect(self._on_failed_to_start)
        self.plots = TrainingPlots()
        self.plots_widget = self.plots  # what PNG and SVG exports draw: the four plots
        for name in PLOT_FIELDS:
            setattr(self, name, getattr(self.plots, name))
        self.plots.loss_plot.scene().sigMouseClicked.connect(self._loss_clicked)  # the timeline (issue 30)
        self.dictionary = DictionaryMode(self)  # the dictionary mode (training_sae.py): its form, run and plots
        self._build_live()
        layout = QHBoxLayout(self)
        column = QWidget()  # what to train, then its settings
        column.setMinimumWidth(360)
        column.setMaximumWidth(440)
        cv = QVBoxLayout(column)
        cv.setContentsMargins(0, 0, 0, 0)
        mode_row = QHBoxLayout()
        mode_row.addWidget(QLabel("Train"))
        self.mode = QComboBox()
        self.mode.addItems(["a model", "a sparse dictionary"])
        self.mode.setToolTip("A sparse dictionary (an SAE or a transcoder) learns the loaded model's activations "
                             "at one hook over a text file; it opens in the Features panel")
        mode_row.addWidget(self.mode, 1)
        cv.addLayout(mode_row)
        self.settings_stack = QStackedWidget()
        for form in (self.form, self.dictionary.form):
            scroll = QScrollArea()
            scroll.setWidgetResizable(True)
            scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # the column fits its width
            scroll.setWidget(form)
            guard = WheelGuard(scroll)
            for w in form.findChildren(QWidget):
                if isinstance(w, (QAbstractSpinBox, QComboBox)):
                    w.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
                    w.installEventFilter(guard)
            self.settings_stack.addWidget(scroll)
            if form is self.form:
                self.settings_scroll, self._wheel_guard = scroll, guard
        cv.addWidget(self.settings_stack, 1)
        layout.addWidget(column)
        layout.addWidget(self.live_widget, 1)
        self.mode.currentIndexChanged.connect(self._on_mode_changed)
        self.form.checked.connect(self._update_buttons)
        self.dictionary.form.checked.connect(self._update_buttons)
        self._update_buttons()

    def _build_live(self) -> None:
        self.live_widget = QWidget()
        v = QVBoxLayout(self.live_widget)
        buttons = QHBoxLayout()
        self.start_button = QPushButton("Start")
        self.pause_button = QPushButton("Pause")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop at the next step: what was trained so far is saved first")
        self.use_button = QPushButton("Use this model")
        self.use_button.setToolTip("Load the last checkpoint as the current model of every panel")
        self.start_button.clicked.connect(self.start)
        self.pause_button.clicked.connect(self.toggle_pause)
        self.stop_button.clicked.connect(self.stop)
        self.use_button.clicked.connect(self.use_model)
        key_buttons(self.shortcuts, (self.start_button, self.stop_button))
        for b in (self.start_button, self.pause_button, self.stop_button, self.use_button, self.dictionary.open_button):
            buttons.addWidget(b)
        self.dictionary.open_button.hide()
        buttons.addStretch(1)
        self.export_bar = ExportBar(lambda: self, self._export_name)
        buttons.addWidget(self.export_bar)
        v.addLayout(buttons)
        self.progress = QProgressBar()
        self.progress.setFormat("step %v / %m")
        v.addWidget(self.progress)
        self.status_label = QLabel("Not running.")
        self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.status_label.setWordWrap(True)
        v.addWidget(self.status_label)
        self.command_label = QLineEdit()
        self.command_label.setReadOnly(True)
        self.command_label.setToolTip("The same run from a terminal")
        v.addWidget(self.command_label)
        self.plots_stack = QStackedWidget()  # the model's plots, or the dictionary's
        self.plots_stack.addWidget(self.plots)
        self.plots_stack.addWidget(self.dictionary.plots)
        v.addWidget(self.plots_stack, 1)

    @property
    def dictionary_mode(self) -> bool:
        """Whether the panel trains a sparse dictionary (training_sae.DictionaryMode) rather than a model."""
        return hasattr(self, "mode") and self.mode.currentIndex() == 1  # (the export bar asks while building)

    def _on_mode_changed(self) -> None:
        self.settings_stack.setCurrentIndex(self.mode.currentIndex())
        self.plots_stack.setCurrentIndex(self.mode.currentIndex())
        self.use_button.setVisible(not self.dictionary_mode)
        self.dictionary.open_button.setVisible(self.dictionary_mode)
        self._update_buttons()
        self.drawn.emit()  # the other mode's curves are on show now

    # -- the form's settings (training_form.TrainingForm) -------------------------------------
    def config(self) -> TrainConfig:
        return self.form.config()

    def set_config(self, cfg: TrainConfig) -> None:
        self.form.set_config(cfg)

    def baseline(self) -> str | None:
        return self.form.baseline()

    def problems(self) -> list[str]:
        return self.form.problems()

    def launch_args(self, out: Path) -> list[str]:
        return self.form.launch_args(out)

    def cli_args(self, out: Path | None = None) -> list[str]:
        return self.form.cli_args(out)

    # -- workspace (MainWindow saves view_state and gives it back with set_view_state) ----------
    VIEW_TABLE = None  # no views table: the forms and the mode are the panel's whole view state

    @staticmethod
    def view_state_from_dict(data) -> "TrainViewState":
        """A workspace's dict, read tolerantly: the model form's settings (config_from_dict), the mode and the
        dictionary form's settings (checked as the form sets them: DictionaryForm.set_settings)."""
        cfg = config_from_dict(data)
        data = data if isinstance(data, dict) else {}
        mode = data.get("mode") if data.get("mode") in TRAIN_MODES else TRAIN_MODES[0]
        dictionary = data.get("dictionary") if isinstance(data.get("dictionary"), dict) else {}
        return TrainViewState(**{f.name: getattr(cfg, f.name) for f in fields(cfg)}, mode=mode,
                              dictionary=dictionary)

    @property
    def view_state(self) -> "TrainViewState":
        cfg = self.config()
        return TrainViewState(**{f.name: getattr(cfg, f.name) for f in fields(cfg)},
                              mode=TRAIN_MODES[self.mode.currentIndex()], dictionary=self.dictionary.form.settings())

    def set_view_state(self, cfg: TrainConfig) -> None:
        self.set_config(cfg)  # as a resumed run's settings fill the form
        if isinstance(cfg, TrainViewState):
            if cfg.dictionary:
                self.dictionary.form.set_settings(cfg.dictionary)
            if not (self.running or self.dictionary.run.running):
                self.mode.setCurrentIndex(TRAIN_MODES.index(cfg.mode))

    # -- the run (training_run.TrainingRun) -----------------------------------------------------
    @property
    def process(self):
        return self.run.process

    @process.setter
    def process(self, proc) -> None:
        self.run.process = proc

    @property
    def running(self) -> bool:
        return self.run.running

    @property
    def events(self) -> list[dict]:
        return self.run.events

    @property
    def paused(self) -> bool:
        return self.run.paused

    @property
    def out_dir(self) -> Path | None:
        return self.run.out_dir

    @property
    def run_dir(self) -> Path | None:
        return self.run.run_dir

    @property
    def config_file(self) -> Path | None:
        return self.run.config_file

    def _update_buttons(self) -> None:
        if not hasattr(self, "mode"):  # still building
            return
        self.mode.setEnabled(not self.running and not self.dictionary.run.running)
        if self.dictionary_mode:
            self._update_dictionary_buttons()
            return
        running = self.running
        problems = self.problems()
        self.start_button.setEnabled(not running and not problems)
        self.start_button.setToolTip("\n".join(problems) if problems else f"Start a run in a new folder ({START_KEY})")
        self.pause_button.setEnabled(running)
        self.stop_button.setEnabled(running)
        self.pause_button.setText("Resume" if self.paused else "Pause")
        # only a checkpoint this run wrote: never an older model from another run
        self.use_button.setEnabled(self.run.checkpoint_ready and not self._loading and self.out_dir is not None
                                   and (self.out_dir / "config.json").is_file())
        self.form.setEnabled(not running)

    def _update_dictionary_buttons(self) -> None:
        run = self.dictionary.run
        problems = self.dictionary.form.problems()
        self.start_button.setEnabled(not run.running and not problems)
        self.start_button.setToolTip("\n".join(problems) if problems else
                                     f"Train a dictionary in a new folder ({START_KEY})")
        self.pause_button.setEnabled(run.running)
        self.stop_button.setEnabled(run.running)
        self.pause_button.setText("Resume" if run.paused else "Pause")
        self.dictionary.open_button.setEnabled(run.saved and run.out_dir is not None and not run.running
                                               and not getattr(run, "layered", False))
        self.dictionary.form.setEnabled(not run.running)

    def start(self) -> None:
        if self.dictionary_mode:
            self.dictionary.start()
            self._update_buttons()
            return
        if self.running or self.problems():
            return
        run_dir = self.form.next_run_dir()
        try:
            args = self.run.prepare(self.config().to_json(), run_dir, self.launch_args(run_dir),
                                    baseline=bool(self.baseline()), resuming=self.form.resuming())
        except OSError as exc:  # WriteError too: a read-only runs folder, a full disk...
            self.status_label.setText(f"Could not write the run's settings: {exc}")
            return
        self.drawn.emit()
        self.command_label.setText(" ".join(["python -m desktop_app train"] + args))
        self.command_label.setCursorPosition(0)
        self.command_label.setToolTip("The same run with flags:\n" + " ".join(
            ["python -m desktop_app train", *self.cli_args(run_dir)]))
        self.progress.setRange(0, self.steps.value())
        self.progress.setValue(0)
        self.status_label.setText(f"Starting a run in {run_dir}…")
        self.run.start(args)
        self._update_buttons()

    def toggle_pause(self) -> None:
        if self.dictionary_mode:
            self.dictionary.toggle_pause()
            self._update_buttons()
            return
        self.run.toggle_pause()
        self.status_label.setText("Paused." if self.paused else "Resumed.")
        self._update_buttons()

    def stop(self) -> None:
        if self.dictionary_mode:
            self.dictionary.stop()
            return
        self.run.stop()
        self.status_label.setText("Stopping: writing a checkpoint…")

    def use_model(self) -> None:
        if self.out_dir is None or not self.run.checkpoint_ready:
            return
        path = self.out_dir
        self._loading = True
        self._update_buttons()
        self.status_label.setText(f"Loading {path}…")

        def done(result) -> None:
            loaded, task, sample = result
            self._loading = False
            self._update_buttons()
            # with a sample: the task's own tokens, which the other panels can tokenize
            note = f"; the text is now a sample of the {task} task" if sample is not None else ""
            self.status_label.setText(f"Now using {path} in every panel{note}.")
            self.state.set_model(loaded, text=sample)

        def failed(exc, tb) -> None:
            self._loading = False
            self._update_buttons()
            self.status_label.setText(f"Could not load the checkpoint in {path}: {exc}")

        run_job(load_run_model, str(path), self.state.device, on_result=done, on_error=failed)

    def _loss_clicked(self, ev) -> None:
        """A click on the loss curve puts every panel on the model at the run's kept step nearest to it
        (AppState.open_step; the timeline bar follows), also while the run trains."""
        from ...app.timeline import nearest_step
        from ...core.training.timeline import KeptStepError, kept_steps

        vb = self.loss_plot.getPlotItem().vb
        if self.out_dir is None or not vb.sceneBoundingRect().contains(ev.scenePos()):
            return
        try:
            steps = [k.step for k in kept_steps(self.out_dir).openable()]
        except KeptStepError as exc:  # no checkpoint written yet
            self.status_label.setText(str(exc))
            return
        if not steps:
            self.status_label.setText(f"{self.out_dir}: no kept step is there any more")
            return
        step = nearest_step(steps, vb.mapSceneToView(ev.scenePos()).x())
        self.status_label.setText(f"Opening step {step} of {self.out_dir} in every panel…")
        self.state.open_step(self.out_dir, step)

    # -- the run's events ------------------------------------------------------------------
    def _on_event(self, ev: dict) -> None:
        self.run.record(ev)
        kind = ev["event"]
        if kind == "start":
            self.plots.clear()
            self.status_label.setText(f"Training {ev['parameters']:,} parameters on {ev['device']}…")
            self.progress.setRange(0, ev["steps"])
            self.progress.setValue(ev["step"])
        elif kind == "step":
            s = ev["step"]
            self.plots.add(ev)
            self.progress.setValue(s)
            self.status_label.setText(
                f"step {s}/{ev['steps']} · train loss {ev['train_loss']:.4f} · {ev['tokens_per_s']:,.0f} tokens/s · "
                f"elapsed {_fmt_time(ev['elapsed'])} · ETA {_fmt_time(ev['eta'])}")
        elif kind in ("eval", "cross_attention"):
            self.plots.add(ev)
        elif kind == "checkpoint":
            self._update_buttons()
        elif kind == "error":
            self.status_label.setText(ev["message"])
        elif kind in ("done", "stopped"):
            self.plots.draw()  # (the last steps' points, not REDRAW_MS later)
            # which numbers are the training batches' and which the last evaluation's, at which step
            # (accuracies as percentages with one decimal, as while running and in the help)
            where = f" Checkpoint: {self.out_dir}" if self.out_dir is not None else " (no checkpoint: MLP baseline)"
            if ev.get("step") is not None:  # the bar ends where the text says the run ended
                self.progress.setValue(ev["step"])
            self.status_label.setText(end_of_run_line(ev, self.events) + where)
        if kind in ("step", "eval"):
            self.drawn.emit()
        self.run_event.emit(ev)

    def _on_finished(self, message: str) -> None:
        if message:  # the process ended without saying why (a crash, out of memory)
            self.status_label.setText(message)
        if self.run.checkpoint_ready and self.out_dir is not None:  # ready to be resumed
            self.resume_edit.setText(str(self.out_dir))
        self._update_buttons()

    def _on_failed_to_start(self) -> None:
        self.status_label.setText("Could not start the training process.")
        self._update_buttons()

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt name
        self.run.close()
        self.dictionary.run.stop()
        super().closeEvent(event)

    def _forget_now_using(self, loaded) -> None:
        """"Now using RUN in every panel" holds only while that run's model is the one open."""
        text = self.status_label.text()
        if text.startswith("Now using ") and (loaded is None or loaded.path is None
                                               or not text.startswith(f"Now using {loaded.path} ")):
            self.status_label.setText("")

    # -- export (ExportBar view protocol; File > Export Current View) --------------------------
    def _export_name(self) -> str:
        return f"train-{self.run_dir.name}" if self.run_dir is not None else "train"

    def export_widget(self) -> QWidget:
        if self.dictionary_mode:
            self.dictionary.plots.draw()  # the events of the last REDRAW_MS too
            return self.dictionary.plots
        self.plots.draw()  # (the same)
        return self.plots_widget

    def export_unavailable(self) -> str | None:
        events = self.dictionary.run.events if self.dictionary_mode else self.events
        if any(e["event"] in ("step", "eval") for e in events):
            return None
        return "Nothing to export yet: start a run and its curves are drawn here."

    def _metric_columns(self) -> tuple[list[str], list[list]]:
        """The run's metrics by step: one row per step that logged anything, empty cells where it did not."""
        if self.dictionary_mode:
            return self.dictionary.metric_columns()
        layers = list(self.plots.grad_series)
        exact = ["val_exact_match"] if any(e.get("val_exact_match") is not None for e in self.events) else []
        header = ["step", "train_loss", "lr", "val_loss", "val_accuracy", "train_accuracy", *exact,
                  *(f"grad_norm.{name}" for name in layers)]
        rows: dict[int, dict] = {}
        for ev in self.events:
            if ev["event"] == "step":
                row = rows.setdefault(ev["step"], {})
                row.update(train_loss=ev["train_loss"], lr=ev["lr"])
                row.update({f"grad_norm.{k}": v for k, v in ev.get("grad_norms", {}).items()})
            elif ev["event"] == "eval":
                rows.setdefault(ev["step"], {}).update(val_loss=ev["val_loss"], val_accuracy=ev["val_accuracy"],
                                                       train_accuracy=ev.get("train_accuracy"),
                                                       val_exact_match=ev.get("val_exact_match"))
        table = [[step, *(rows[step].get(h) for h in header[1:])] for step in sorted(rows)]
        return header, table

    def csv_table(self):
        header, rows = self._metric_columns()
        return header, [["" if v is None else v for v in row] for row in rows]

    def export_arrays(self) -> dict:
        import numpy as np

        header, rows = self._metric_columns()
        return {h: np.array([np.nan if row[i] is None else row[i] for row in rows], dtype=float)
                for i, h in enumerate(header)}

    def export_view(self) -> None:
        """File > Export Current View: the plots (PNG, SVG) or the metrics (CSV)."""
        path = ask_save_path(self, "Export the Train view", self._export_name() + ".png",
                             "PNG image (*.png);;SVG (*.svg);;CSV table (*.csv)")
        if not path:
            return
        try:
            write_export(self, path)
        except (OSError, ValueError) as exc:
            QMessageBox.warning(self, "Export failed", str(exc))
            return
        show_saved(self, path)

    # -- --screenshot (the script is ui/demo.py's) ---------------------------------------------
    # --screenshot's default wait for screenshot_ready: a fresh process imports torch, then trains 400 steps
    # (66 s in all at load 10 on 2 cores; the default 30 s of other panels failed there)
    screenshot_wait_s = 240.0

    def screenshot_demo(self) -> None:
        from ..demo import training_demo

        training_demo(self)

    def screenshot_ready(self) -> bool:
        return sum(e["event"] == "eval" for e in self.events) >= 4 or not self.running

def _fmt_time(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
