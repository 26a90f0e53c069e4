"""The Train panel's dictionary mode: train a sparse dictionary (an SAE or a transcoder) on the loaded model's
activations over a text file, watch it learn, open it in the Features panel.

Three parts, as the model mode has: the form (DictionaryForm: core.training.sae's SAE_OPTIONS and the shared
run options' boxes, what it describes as a SaeTrainConfig, its checks from app.features.dictionary_problems),
the run (DictionaryRun: app.features.train_dictionary in a worker of ui/workers.py, on the model in memory,
with a TrainControl that Pause / Resume / Stop drive; its events come back one by one) and the live plots
(DictionaryPlots: reconstruction error, L0, variance explained, dead features; the training batches and the
held-out tokens). DictionaryMode wires them to the panel's own buttons, progress bar and status line.
"""
from __future__ import annotations

from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QGroupBox, QLabel, QLineEdit, QPushButton,
                               QVBoxLayout, QWidget)

from ...app.features import (dictionary_control, dictionary_problems, dictionary_resume_problems,
                             dictionary_settings_from_dict, resumed_dictionary_config, train_dictionary)
from ...core.features.hooks import default_hook, hook_names
from ...core.training.sae import DEAD_STEPS, SAE_OPTIONS, SaeTrainConfig
from ..widgets.empty_plot import show_empty
from ..widgets.form_fields import ask_text_file, path_row
from ..workers import run_job
from .training_form import _box, _combo, _dspin, _error_label, _show_error, _spin
from .training_plots import LEGEND_STYLE, RedrawSoon, step_plot
from .training_run import new_run_dir, runs_root

SAE_OPTION = {o.key: o for o in SAE_OPTIONS}
NO_TRANSCODER = "none (a sparse autoencoder)"
# what the form trains (SaeTrainConfig.task): one dictionary at a hook, or transcoders at every layer for graphs
KINDS = {"sae": "a dictionary (SAE)", "transcoder": "transcoders, per layer", "clt": "a cross-layer transcoder"}


def _option_box(key: str) -> QWidget:
    """The box of a dictionary option (core.training.sae.SAE_OPTIONS): its choices or range, default and help."""
    option = SAE_OPTION[key]
    if option.choices:
        box = _combo([str(c) for c in option.choices], str(option.default))
    elif option.kind is int:
        box = _spin(int(option.limit.lo), int(min(option.limit.hi, 2**31 - 1)), option.default)
    else:
        box = _dspin(float(option.limit.lo), float(option.limit.hi), option.default, 4, 0.1)
    box.setToolTip(option.help.removeprefix("sae: ").capitalize())
    return box


class DictionaryForm(QWidget):
    """The dictionary mode's settings column."""

    checked = Signal()  # the settings changed and were checked: problems() is current

    def __init__(self, state, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        defaults = SaeTrainConfig(text_file="")
        v = QVBoxLayout(self)
        box = QGroupBox("Sparse dictionary")
        f = QFormLayout(box)
        self.model_label = QLabel("")
        self.model_label.setWordWrap(True)
        self.kind = QComboBox()
        for task, label in KINDS.items():
            self.kind.addItem(label, task)
        self.kind.setToolTip("A dictionary at one hook, saved in SAELens' format; or transcoders at every MLP, "
                             "reading its input after its norm (mlp.hook_in) and reconstructing its output, saved in "
                             "circuit-tracer's format: `graph --transcoders FOLDER` draws attribution graphs over "
                             "their features (a cross-layer transcoder's layer l writes to every MLP output from l on)")
        self.hook = QComboBox()
        self.hook.setEditable(True)
        self.hook.setToolTip(SAE_OPTION["hook"].help.removeprefix("sae: ").capitalize())
        self.hook_out = QComboBox()
        self.hook_out.setEditable(True)
        self.hook_out.setToolTip("A transcoder reads the activation above and reconstructs this one (e.g. a layer's "
                                 "ln2.hook_normalized -> hook_mlp_out); it trains with relu")
        self.architecture = _option_box("architecture")
        self.d_sae, self.k, self.l1_coefficient, self.max_tokens = (
            _option_box(k) for k in ("d_sae", "k", "l1_coefficient", "max_tokens"))
        self.text_file = QLineEdit()
        self.text_row = path_row(self.text_file, "a UTF-8 text file", self._browse_text)
        for label, w in (("Model", self.model_label), ("Train", self.kind), ("Reads", self.hook), ("Writes", self.hook_out),
                         ("Architecture", self.architecture), ("Features (d_sae)", self.d_sae),
                         ("Active per token (k)", self.k), ("L1 coefficient", self.l1_coefficient),
                         ("Text file", self.text_row), ("At most tokens", self.max_tokens)):
            f.addRow(label, w)
        self.dictionary_form = f
        v.addWidget(box)

        opt = QGroupBox("Optimisation (Adam, 5% warmup)")
        of = QFormLayout(opt)
        # the shared run options' boxes (core.training.options), at the dictionary's own defaults
        self.steps, self.batch_size, self.lr, self.seed, self.eval_every, self.checkpoint_every = (
            _box(k) for k in ("steps", "batch_size", "lr", "seed", "eval_every", "checkpoint_every"))
        for w, key in ((self.steps, "steps"), (self.batch_size, "batch_size"), (self.lr, "lr"), (self.seed, "seed"),
                       (self.eval_every, "eval_every"), (self.checkpoint_every, "checkpoint_every")):
            w.setValue(getattr(defaults, key))
        self.batch_size.setToolTip("Tokens per step")
        for label, w in (("Steps", self.steps), ("Batch (tokens)", self.batch_size), ("Learning rate", self.lr),
                         ("Seed", self.seed), ("Held-out every", self.eval_every),
                         ("Save every", self.checkpoint_every)):
            of.addRow(label, w)
        v.addWidget(opt)

        out = QGroupBox("Output")
        ob = QFormLayout(out)
        self.out_edit = QLineEdit(str(runs_root()))
        self.out_edit.setMinimumWidth(60)
        self.out_edit.setToolTip("Every dictionary gets a new folder in here (SAELens' format), named by its start "
                                 "time (e.g. 2026-11-24_1012_sae); none replaces another")
        # as the model form resumes a run: the run's folder, its saved settings shown (resumed_dictionary_config)
        self.resume_check = QCheckBox("Resume this run instead:")
        self.resume_edit = QLineEdit()
        self.resume_edit.setMinimumWidth(60)
        self.resume_edit.setPlaceholderText("a dictionary run folder with a checkpoint")
        self.resume_edit.setToolTip("A dictionary run stopped here or by train --task sae: it goes on from its "
                                    "checkpoint with its own text, hook and shape (more steps may be given)")
        ob.addRow("Runs folder", self.out_edit)
        ob.addRow(self.resume_check)
        ob.addRow(self.resume_edit)
        self._filled_from: Path | None = None  # the run whose saved settings the form shows
        v.addWidget(out)
        self.error = _error_label()
        v.addWidget(self.error)
        v.addStretch(1)

        for w in (self.d_sae, self.k, self.max_tokens, self.steps, self.batch_size, self.seed, self.eval_every,
                  self.checkpoint_every):
            w.valueChanged.connect(self.check)
        for w in (self.lr, self.l1_coefficient):
            w.valueChanged.connect(self.check)
        for w in (self.hook, self.hook_out, self.architecture):
            w.currentTextChanged.connect(self.check)
        self.architecture.currentTextChanged.connect(self._on_architecture_changed)
        self.kind.currentIndexChanged.connect(self._on_architecture_changed)
        self.kind.currentIndexChanged.connect(self.check)
        self.text_file.textChanged.connect(self.check)
        self.out_edit.textChanged.connect(self.check)
        for signal in (self.resume_check.toggled, self.resume_edit.textChanged):
            signal.connect(self._fill_from_resumed_run)
            signal.connect(self.check)
        state.model_changed.connect(self.refresh_model)
        self.refresh_model()
        self._on_architecture_changed()

    def refresh_model(self, *_) -> None:
        """The hooks of the model now loaded (its layers); the chosen ones kept where they still exist."""
        loaded = self.state.loaded
        self.model_label.setText(f"{loaded.name} (its activations, in memory)" if loaded is not None else
                                 "no model open: open one first")
        names = hook_names(loaded.config) if loaded is not None else []
        for combo, first in ((self.hook, []), (self.hook_out, [NO_TRANSCODER])):
            current = combo.currentText()
            combo.blockSignals(True)
            combo.clear()
            combo.addItems(first + names)
            if current and (current in names or current == NO_TRANSCODER):
                combo.setCurrentText(current)
            elif combo is self.hook and names:  # the middle layer's residual stream, a usual first choice
                combo.setCurrentText(default_hook(loaded.config))
            combo.blockSignals(False)
        self.check()

    def task(self) -> str:
        return self.kind.currentData()

    def _on_architecture_changed(self, *_) -> None:
        layered = self.task() != "sae"  # transcoders at every layer: MLP in -> out, relu
        for w in (self.hook, self.hook_out, self.architecture):
            self.dictionary_form.setRowVisible(w, not layered)
        topk = self.architecture.currentText() == "topk" and not layered
        self.dictionary_form.setRowVisible(self.k, topk)
        self.dictionary_form.setRowVisible(self.l1_coefficient, not topk)

    def _browse_text(self) -> None:
        path = ask_text_file(self)
        if path:
            self.text_file.setText(path)

    def config(self) -> SaeTrainConfig:
        text = self.text_file.text().strip()
        hook_out = self.hook_out.currentText().strip()
        steps = self.steps.value()
        loaded = self.state.loaded
        layered = self.task() != "sae"
        return SaeTrainConfig(
            text_file=str(Path(text).expanduser().absolute()) if text else "", task=self.task(),
            hook=self.hook.currentText().strip(), hook_out=None if hook_out in ("", NO_TRANSCODER) or layered else hook_out,
            architecture="relu" if layered else self.architecture.currentText(), d_sae=self.d_sae.value(), k=self.k.value(),
            l1_coefficient=self.l1_coefficient.value(), max_tokens=self.max_tokens.value(), steps=steps,
            batch_size=self.batch_size.value(), lr=self.lr.value(), seed=self.seed.value(),
            eval_every=self.eval_every.value(), checkpoint_every=self.checkpoint_every.value(),
            log_every=max(1, min(10, steps // 100)),
            device=str(loaded.model.device) if loaded is not None else "cpu")

    def set_config(self, cfg: SaeTrainConfig) -> None:
        """Show `cfg` in the form (config()'s inverse): a resumed run's saved settings, a workspace's form."""
        self.text_file.setText(cfg.text_file)
        if self.kind.findData(cfg.task) >= 0:
            self.kind.setCurrentIndex(self.kind.findData(cfg.task))
        self.hook.setCurrentText(cfg.hook)
        self.hook_out.setCurrentText(cfg.hook_out or NO_TRANSCODER)
        if self.architecture.findText(cfg.architecture) >= 0:
            self.architecture.setCurrentText(cfg.architecture)
        for key in ("d_sae", "k", "l1_coefficient", "max_tokens", "steps", "batch_size", "lr", "seed", "eval_every",
                    "checkpoint_every"):
            getattr(self, key).setValue(getattr(cfg, key))

    # the workspace's part of the form (TrainingPanel.view_state): its settings and runs folder
    def settings(self) -> dict:
        from dataclasses import asdict

        return {**{k: v for k, v in asdict(self.config()).items() if k not in ("device", "log_every")},
                "runs_folder": self.out_edit.text()}

    def set_settings(self, data: dict) -> None:
        self.set_config(dictionary_settings_from_dict(data))
        if isinstance(data, dict) and isinstance(data.get("runs_folder"), str):
            self.out_edit.setText(data["runs_folder"])

    def resuming(self) -> bool:
        return self.resume_check.isChecked()

    def _fill_from_resumed_run(self, *_) -> None:
        """Resuming a run shows that run's saved settings, once per chosen run (as the model form does)."""
        if not self.resuming():
            self._filled_from = None
            return
        text = self.resume_edit.text().strip()
        folder = Path(text).expanduser().absolute() if text else None
        if folder is None or folder == self._filled_from:
            return
        cfg = resumed_dictionary_config(folder)
        if cfg is not None:
            self._filled_from = folder
            self.set_config(cfg)

    def problems(self) -> list[str]:
        cfg = self.config()
        problems = dictionary_problems(self.state.loaded, cfg)
        if self.resuming():
            return problems + dictionary_resume_problems(self.state.loaded, cfg, self.resume_edit.text())
        root = Path(self.out_edit.text().strip() or str(runs_root())).expanduser()
        if root.exists() and not root.is_dir():
            problems.append(f"{root}: not a folder.")
        return problems

    def next_run_dir(self) -> Path:
        """The folder the next run writes: the chosen run when resuming, else a new one in the runs folder."""
        if self.resuming():
            return Path(self.resume_edit.text().strip()).expanduser().absolute()
        root = Path(self.out_edit.text().strip() or str(runs_root())).expanduser().absolute()
        return new_run_dir(root, self.task())

    def check(self, *_) -> None:
        _show_error(self.error, "\n".join(self.problems()))
        self.checked.emit()


class DictionaryPlots(QWidget):
    """Reconstruction error, L0, variance explained (the batches and the held-out tokens) and dead features."""

    def __init__(self, parent: QWidget | None = None) -> None:
        from PySide6.QtWidgets import QGridLayout

        super().__init__(parent)
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        self.mse_plot = step_plot("Reconstruction error", "|x − x̂|² per token")
        self.l0_plot = step_plot("L0: active features per token", "features")
        self.fve_plot = step_plot("Variance explained", "fraction")
        self.dead_plot = step_plot(f"Dead (silent {DEAD_STEPS} steps)", "features")  # (a longer title was cut at 1024x640)
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.plot_of: dict[str, pg.PlotWidget] = {}  # each curve's plot
        for plot in (self.mse_plot, self.l0_plot, self.fve_plot, self.dead_plot):
            plot.getAxis("left").enableAutoSIPrefix(False)  # "fraction (x0.001)" would read as wrong numbers
        for plot, key in ((self.mse_plot, "mse"), (self.l0_plot, "l0"), (self.fve_plot, "variance_explained")):
            # the error and L0 fall from the top left, the variance explained rises to the top right
            plot.addLegend(offset=(-10, -10) if key == "variance_explained" else (-10, 10), **LEGEND_STYLE)
            self.curves[key] = plot.plot(pen=pg.mkPen("#0072B2", width=2), name="batches")
            self.plot_of[key] = self.plot_of["held-out " + key] = plot
            self.curves["held-out " + key] = plot.plot(pen=pg.mkPen("#D55E00", width=2), symbol="o", symbolSize=6,
                                                       symbolBrush="#D55E00", name="held out")
        self.curves["dead"] = self.dead_plot.plot(pen=pg.mkPen("#CC79A7", width=2))
        self.plot_of["dead"] = self.dead_plot
        grid.addWidget(self.mse_plot, 0, 0)
        grid.addWidget(self.l0_plot, 0, 1)
        grid.addWidget(self.fve_plot, 1, 0)
        grid.addWidget(self.dead_plot, 1, 1)
        self._redraw = RedrawSoon(self, self._set_curves)  # (at each event the UI thread did nothing else)
        self.clear()

    def clear(self) -> None:
        self.series: dict[str, tuple[list, list]] = {key: ([], []) for key in self.curves}
        self._redraw.forget()
        for curve in self.curves.values():
            curve.setData([], [])
        for plot in (self.mse_plot, self.l0_plot, self.fve_plot, self.dead_plot):
            show_empty(plot.getPlotItem(), True)  # its title only, until the run's points (bare 0-1 axes before)

    def draw(self) -> None:
        """Every point added so far on the plots now (the export calls it: nothing is left out)."""
        self._redraw.now()

    def _set_curves(self, names: set) -> None:
        for name in names:
            xs, ys = self.series[name]
            show_empty(self.plot_of[name].getPlotItem(), False)
            self.curves[name].setData(xs, ys)
            if name == "dead":  # counts from 0 (all zeros would centre the axis on 0)
                self.dead_plot.setYRange(0, max(max(ys), 1) * 1.05)

    def add(self, ev: dict) -> None:
        """Record a "step" (the batch's numbers) or an "eval" (the held-out tokens') event, drawn within
        RedrawSoon.REDRAW_MS."""
        kind = ev["event"]
        if kind not in ("step", "eval"):
            return
        keys = ("mse", "l0", "variance_explained", "dead") if kind == "step" else ("mse", "l0", "variance_explained")
        for key in keys:
            name = key if kind == "step" else "held-out " + key
            value = ev.get(key)
            if value is None:
                continue
            xs, ys = self.series[name]
            xs.append(ev["step"])
            ys.append(value)
            self._redraw.changed(name)


class DictionaryRun(QObject):
    """One dictionary training at a time, in a worker on the model in memory, and what it said."""

    event = Signal(object)  # each event of the run (emitted from the worker, delivered on the UI thread)
    ended = Signal(str)  # the run ended: "" when its last event said how, else one line

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.job = None
        self.control = None  # the running job's pause / resume / stop (app.features.dictionary_control)
        self.events: list[dict] = []
        self.paused = False
        self.out_dir: Path | None = None
        self.saved = False  # a dictionary of this run is on disk (a checkpoint, a stop or the end)

    @property
    def running(self) -> bool:
        return self.job is not None

    def start(self, loaded, cfg: SaeTrainConfig, out_dir: Path, resume: bool = False) -> None:
        """Train into the new folder `out_dir`, or with `resume` go on from the checkpoint there (the events of
        this run kept when it is the one just stopped here: its curves go on)."""
        if not (resume and out_dir == self.out_dir):
            self.events.clear()
        self.paused, self.saved, self.out_dir = False, resume, out_dir
        self.layered = cfg.layered  # transcoders at every layer: for `graph`, not the Features panel
        holder: list = []

        def from_worker(ev: dict) -> None:  # the worker's thread: hand it to the UI thread
            if not (holder and holder[0].detached):
                self.event.emit(ev)

        self.control = dictionary_control()
        self.job = run_job(train_dictionary, loaded, cfg, str(out_dir), on_event=from_worker, control=self.control,
                           resume=resume, on_result=self._on_result, on_error=self._on_error, on_cancelled=self._on_cancelled)
        holder.append(self.job)

    def record(self, ev: dict) -> None:
        if ev["event"] == "start" and ev.get("resumed"):  # the steps after its checkpoint are taken again
            self.events[:] = [e for e in self.events if e["event"] in ("step", "eval") and e["step"] <= ev["step"]]
        self.events.append(ev)
        if ev["event"] == "checkpoint":
            self.saved = True

    def toggle_pause(self) -> None:
        if self.job is None:
            return
        self.paused = not self.paused
        (self.control.pause if self.paused else self.control.resume)()

    def stop(self) -> None:
        """Stop at the next step; the dictionary so far is saved (and resumable from its folder)."""
        if self.job is not None:
            self.paused = False
            self.control.resume()
            self.control.cancel()

    def _finish(self, message: str) -> None:
        self.job, self.paused = None, False
        self.ended.emit(message)

    def _on_result(self, summary: dict) -> None:
        self._finish("")

    def _on_error(self, exc, tb) -> None:
        self._finish(f"Could not train the dictionary: {exc}")

    def _on_cancelled(self) -> None:  # stopped while reading the activations, before any step
        self._finish("Stopped before the first step; nothing was saved.")


class DictionaryMode(QObject):
    """The dictionary mode's form, run and plots, wired to the Train panel's buttons, progress and status."""

    def __init__(self, panel) -> None:
        super().__init__(panel)
        self.panel = panel
        self.form = DictionaryForm(panel.state)
        self.plots = DictionaryPlots()
        self.run = DictionaryRun(self)
        self.run.event.connect(self.on_event)
        self.run.ended.connect(self.on_ended)
        self.open_button = QPushButton("Open in Features")
        self.open_button.setToolTip("Attach the dictionary this run saved to the model and show the Features panel")
        self.open_button.clicked.connect(self.open_in_features)

    def start(self) -> None:
        p = self.panel
        if self.run.running or self.form.problems():
            return
        out = self.form.next_run_dir()
        cfg = self.form.config()
        resume = self.form.resuming()
        p.command_label.setText(" ".join(self.command(cfg, out) + (["--resume"] if resume else [])))
        p.command_label.setCursorPosition(0)
        p.progress.setRange(0, cfg.steps)
        p.progress.setValue(0)
        p.status_label.setText(f"{'Resuming ' + str(out) + ': reading' if resume else 'Reading'} "
                               f"{p.state.loaded.name}'s activations at "
                               f"{'every MLP' if cfg.layered else cfg.hook} over {cfg.text_file}…")
        self.run.start(p.state.loaded, cfg, out, resume=resume)
        p.drawn.emit()  # a new run's events are cleared: nothing to export until its first step

    def command(self, cfg: SaeTrainConfig, out: Path) -> list[str]:
        """The same run from a terminal (the model's folder: the CLI reads it from disk)."""
        loaded = self.panel.state.loaded
        where = [] if cfg.layered else ["--hook", cfg.hook, *(["--hook-out", cfg.hook_out] if cfg.hook_out else []),
                                        "--architecture", cfg.architecture]
        args = [f"python -m desktop_app train --task {cfg.task}", "--model", str(loaded.path or loaded.name),
                *where, "--d-sae", str(cfg.d_sae),
                *(["--k", str(cfg.k)] if cfg.architecture == "topk" else ["--l1-coefficient", f"{cfg.l1_coefficient:g}"]),
                "--text-file", cfg.text_file, "--max-tokens", str(cfg.max_tokens), "--steps", str(cfg.steps),
                "--batch-size", str(cfg.batch_size), "--lr", f"{cfg.lr:g}", "--seed", str(cfg.seed),
                "--eval-every", str(cfg.eval_every), "--checkpoint-every", str(cfg.checkpoint_every), "--out", str(out)]
        return args

    def metric_columns(self) -> tuple[list[str], list[list]]:
        """The run's numbers by step (what the panel's CSV and data exports write): the batches' and the
        held-out tokens', empty cells where a step logged neither."""
        header = ["step", "mse", "l0", "variance_explained", "dead", "heldout_mse", "heldout_l0",
                  "heldout_variance_explained", "heldout_dead"]
        rows: dict[int, dict] = {}
        for ev in self.run.events:
            if ev["event"] in ("step", "eval"):
                prefix = "" if ev["event"] == "step" else "heldout_"
                rows.setdefault(ev["step"], {}).update({prefix + k: ev.get(k) for k in
                                                        ("mse", "l0", "variance_explained", "dead")})
        return header, [[step, *(rows[step].get(h) for h in header[1:])] for step in sorted(rows)]

    def toggle_pause(self) -> None:
        self.run.toggle_pause()
        self.panel.status_label.setText("Paused." if self.run.paused else "Resumed.")

    def stop(self) -> None:
        self.run.stop()
        self.panel.status_label.setText("Stopping: saving the dictionary so far…")

    def open_in_features(self) -> None:
        if not self.run.saved or self.run.out_dir is None:
            return
        state = self.panel.state
        state.open_dictionary(Path(self.run.out_dir).expanduser().absolute())  # attached to the open model
        state.panel_wanted.emit("Features")  # and shown, where there is a Features panel

    def on_event(self, ev: dict) -> None:
        p = self.panel
        self.run.record(ev)
        kind = ev["event"]
        if kind == "start":
            self.plots.clear()
            for kept in self.run.events:  # a resumed run's curves so far (record kept them)
                self.plots.add(kept)
            p.progress.setRange(0, ev["steps"])
            p.progress.setValue(ev["step"])
            p.status_label.setText(f"{'Resumed at step ' + str(ev['step']) + ': t' if ev.get('resumed') else 'T'}"
                                   f"raining a {ev['architecture']} dictionary of {ev['d_sae']:,} features on "
                                   f"{ev['hook']} ({ev['tokens']:,} tokens, {ev['heldout_tokens']:,} held out)…")
        elif kind == "step":
            self.plots.add(ev)
            p.progress.setValue(ev["step"])
            fve = ev.get("variance_explained")
            p.status_label.setText(
                f"step {ev['step']}/{ev['steps']} · error {ev['mse']:.4g} · L0 {ev['l0']:.1f} · variance explained "
                f"{'—' if fve is None else f'{fve:.3f}'} · dead {ev['dead']}")
        elif kind == "eval":
            self.plots.add(ev)
        elif kind == "paused":  # (a step logged before the pause reached the loop may have said otherwise)
            p.status_label.setText(f"Paused at step {ev['step']}.")
        elif kind in ("done", "stopped"):
            if ev.get("step") is not None:
                p.progress.setValue(ev["step"])
            how = "Done" if kind == "done" else "Stopped"
            score = ev.get("replacement_score")
            use = ("Open in Features to see its features on your text" if "replacement_score" not in ev else
                   f"graph prompts with python -m desktop_app graph MODEL --transcoders {self.run.out_dir}")
            p.status_label.setText(
                f"{how} at step {ev.get('step')}: on the held-out tokens, variance explained "
                f"{ev.get('variance_explained', float('nan')):.3f} at L0 {ev.get('l0', float('nan')):.1f}, "
                f"{ev.get('dead', 0)} dead features"
                + (f", replacement score {score:.3f}" if score is not None else "")
                + f". Saved in {self.run.out_dir} ("
                + ("SAELens'" if "replacement_score" not in ev else "circuit-tracer's") + f" format): {use}"
                + (", or tick Resume this run and Start to go on." if kind == "stopped" else "."))
        if kind in ("step", "eval"):
            p.drawn.emit()
        p._update_buttons()

    def on_ended(self, message: str) -> None:
        if message:
            self.panel.status_label.setText(message)
        if self.run.saved and self.run.out_dir is not None:  # ready to be resumed (as the model mode offers)
            self.form.resume_edit.setText(str(self.run.out_dir))
        self.panel._update_buttons()
