"""Train panel: design a model and a task, start a run, watch it learn, use the result.

The run is a separate process (the `train` CLI with --jsonl --control-stdin) driven by QProcess:
its JSON-lines events feed the plots, Pause/Resume/Stop are lines written to its stdin, and a crash
or out-of-memory ends that process only; the window stays up and the last checkpoint stays on disk.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pyqtgraph as pg
import torch
from PySide6.QtCore import QProcess, Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout, QGridLayout,
                               QGroupBox, QHBoxLayout, QLabel, QLineEdit, QProgressBar, QPushButton, QScrollArea,
                               QSpinBox, QVBoxLayout, QWidget)

from ...core.config import ConfigError
from ...core.training.trainer import (TrainConfig, best_device, default_precision, model_config_for, parameter_count,
                                      task_vocab_size)
from ...paths import user_data_dir
from ..workers import run_job

LAYER_COLOURS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
TASK_OPTIONS = {  # which task options each task shows
    "motif": ("length", "model_kind", "n_train"), "copy": ("length", "symbols"), "reverse": ("length", "symbols"),
    "sort": ("length", "symbols"), "modadd": ("p", "train_fraction"), "induction": ("length", "symbols"),
    "text": ("text_file", "tokenizer", "vocab_size"),
}


def _spin(lo: int, hi: int, value: int, step: int = 1) -> QSpinBox:
    s = QSpinBox()
    s.setRange(lo, hi)
    s.setValue(value)
    s.setSingleStep(step)
    return s


def _dspin(lo: float, hi: float, value: float, decimals: int = 4, step: float = 0.01) -> QDoubleSpinBox:
    s = QDoubleSpinBox()
    s.setDecimals(decimals)
    s.setRange(lo, hi)
    s.setSingleStep(step)
    s.setValue(value)
    return s


def _combo(items, current: str | None = None) -> QComboBox:
    c = QComboBox()
    c.addItems(list(items))
    if current:
        c.setCurrentText(current)
    return c


def train_command() -> list[str]:
    """How to start the train CLI from here (a frozen bundle runs itself with the subcommand)."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "train"]
    return [sys.executable, "-m", "desktop_app", "train"]


LEGEND_STYLE = {"brush": (255, 255, 255, 215), "labelTextColor": "#222"}  # readable over the curves


class TrainingPanel(QWidget):
    title = "Train"
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
        "<p>Accuracy is plotted for the training batches since the previous evaluation and for the validation set. "
        "Schedules: warmup + cosine to 10% of the peak; Noam lr = factor &middot; d<sup>&minus;1/2</sup> "
        "min(t<sup>&minus;1/2</sup>, t &middot; warmup<sup>&minus;3/2</sup>). Clipping rescales g to "
        "&alpha; g / ||g|| when ||g|| &gt; &alpha;. The gradient-norm plot shows ||g|| per layer before clipping. "
        "The run is a separate process: checkpoints every N steps and at Stop; a crash keeps the last one.</p>")

    run_event = Signal(dict)  # every event of the running process (tests and other views listen)

    def __init__(self, state, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.process: QProcess | None = None
        self._buffer = b""
        self._stderr = b""
        self.events: list[dict] = []
        self.paused = False
        self.out_dir: Path | None = None
        self._build_form()
        self._build_live()
        layout = QHBoxLayout(self)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.form_widget)
        scroll.setMinimumWidth(360)
        scroll.setMaximumWidth(440)
        layout.addWidget(scroll)
        layout.addWidget(self.live_widget, 1)
        self._on_task_changed()
        self._on_family_changed()
        self._update_buttons()

    # -- form ------------------------------------------------------------------------------
    def _build_form(self) -> None:
        self.form_widget = QWidget()
        v = QVBoxLayout(self.form_widget)

        model_box = QGroupBox("Model")
        f = QFormLayout(model_box)
        self.family = _combo(["gpt2", "bert", "llama"])
        self.layers = _spin(1, 48, 2)
        self.heads = _spin(1, 32, 4)
        self.d_model = _spin(8, 2048, 64, 8)
        self.d_ff = _spin(8, 8192, 256, 32)
        self.context = _spin(4, 4096, 128, 16)
        self.norm_placement = _combo(["pre", "post"])
        self.norm = _combo(["layernorm", "rmsnorm"])
        self.activation = _combo(["gelu_tanh", "gelu", "relu", "swiglu"])
        self.positions = _combo(["learned", "sinusoidal", "rotary", "none"])
        self.attention = _combo(["softmax", "l2", "sinkhorn"])
        self.init = _combo(["default", "glorot", "he"])
        self.dropout = _dspin(0.0, 0.9, 0.0, 2, 0.05)
        self.param_label = QLabel("")
        self.param_label.setStyleSheet("font-weight: bold")
        for label, w in (("Family", self.family), ("Layers", self.layers), ("Heads", self.heads),
                         ("d_model", self.d_model), ("d_ff", self.d_ff), ("Context", self.context),
                         ("Norm placement", self.norm_placement), ("Norm", self.norm),
                         ("Activation", self.activation), ("Positions", self.positions),
                         ("Attention", self.attention), ("Init", self.init), ("Dropout", self.dropout),
                         ("Parameters", self.param_label)):
            f.addRow(label, w)
        self.family.currentTextChanged.connect(self._on_family_changed)
        v.addWidget(model_box)

        task_box = QGroupBox("Task")
        tf = QFormLayout(task_box)
        self.task = _combo(["motif", "copy", "reverse", "sort", "modadd", "induction", "text"])
        self.length = _spin(2, 512, 20)
        self.symbols = _spin(2, 1000, 10)
        self.p = _spin(2, 1000, 97)
        self.train_fraction = _dspin(0.05, 0.95, 0.5, 2, 0.05)
        self.text_file = QLineEdit()
        browse = QPushButton("…")
        browse.setMaximumWidth(30)
        browse.clicked.connect(self._browse_text)
        row = QHBoxLayout()
        row.addWidget(self.text_file)
        row.addWidget(browse)
        self.text_row = QWidget()
        self.text_row.setLayout(row)
        row.setContentsMargins(0, 0, 0, 0)
        self.tokenizer = _combo(["char", "bpe"])
        self.vocab_size = _spin(260, 65536, 512, 64)
        self.model_kind = _combo(["transformer", "MLP baseline"])
        self.model_kind.setToolTip("The lectures' MLP (embedding 32, 20*32 -> 64 -> 4) on the same batches and "
                                   "held-out set, for the comparison; it writes no checkpoint")
        self.n_train = _spin(0, 1_000_000, 0, 500)
        self.n_train.setSpecialValueText("fresh samples")
        self.n_train.setToolTip("A fixed training set of this many samples (the lectures use 1500); "
                                "0 draws fresh samples for every batch")
        self._task_rows = {"length": self.length, "symbols": self.symbols, "p": self.p,
                           "train_fraction": self.train_fraction, "text_file": self.text_row,
                           "tokenizer": self.tokenizer, "vocab_size": self.vocab_size,
                           "model_kind": self.model_kind, "n_train": self.n_train}
        tf.addRow("Task", self.task)
        for name, label in (("model_kind", "Model"), ("length", "Length"), ("n_train", "Training-set size"),
                            ("symbols", "Symbols"), ("p", "Modulus p"),
                            ("train_fraction", "Train fraction"), ("text_file", "Text file"),
                            ("tokenizer", "Tokenizer"), ("vocab_size", "BPE vocabulary")):
            tf.addRow(label, self._task_rows[name])
        self.task_form = tf
        self.task.currentTextChanged.connect(self._on_task_changed)
        self.model_kind.currentTextChanged.connect(self._on_model_kind_changed)
        self.model_box = model_box
        v.addWidget(task_box)

        opt_box = QGroupBox("Optimisation")
        of = QFormLayout(opt_box)
        self.optimizer = _combo(["adamw", "adam", "sgd", "lion"])
        self.lr = _dspin(1e-6, 10.0, 1e-3, 6, 1e-4)
        self.weight_decay = _dspin(0.0, 10.0, 0.01, 4, 0.01)
        self.schedule = _combo(["cosine", "noam", "constant"])
        self.warmup = _spin(0, 100_000, 50, 10)
        self.batch_size = _spin(1, 4096, 32, 8)
        self.grad_clip = _dspin(0.0, 1000.0, 1.0, 2, 0.5)
        self.steps = _spin(1, 10_000_000, 1000, 100)
        self.eval_every = _spin(1, 1_000_000, 100, 50)
        self.checkpoint_every = _spin(1, 1_000_000, 500, 100)
        self.seed = _spin(0, 2**31 - 1, 0)
        from ...core.devices import available_devices
        self.device = _combo(available_devices(), best_device())
        self.precision = _combo(["float32", "bfloat16", "float16"], default_precision(self.device.currentText()))
        self.precision.setToolTip("Autocast precision; weights and checkpoints stay float32. Default: bfloat16 on "
                                  "CUDA (float16 with loss scaling without bfloat16 support), float32 elsewhere")
        self.device.currentTextChanged.connect(lambda d: self.precision.setCurrentText(default_precision(d)))
        self.lr_label = QLabel("Learning rate")
        for label, w in (("Optimizer", self.optimizer), (self.lr_label, self.lr),
                         ("Weight decay", self.weight_decay), ("Schedule", self.schedule), ("Warmup", self.warmup),
                         ("Batch size", self.batch_size), ("Grad clip (0 = off)", self.grad_clip),
                         ("Steps", self.steps), ("Eval every", self.eval_every),
                         ("Checkpoint every", self.checkpoint_every), ("Seed", self.seed),
                         ("Device", self.device), ("Precision", self.precision)):
            of.addRow(label, w)
        self.schedule.currentTextChanged.connect(self._on_schedule_changed)
        self._on_schedule_changed()
        v.addWidget(opt_box)

        out_box = QGroupBox("Output")
        ob = QFormLayout(out_box)
        self.out_edit = QLineEdit(str(user_data_dir() / "runs" / "run"))
        self.resume_check = QCheckBox("Resume from the checkpoint in this folder")
        ob.addRow("Folder", self.out_edit)
        ob.addRow(self.resume_check)
        v.addWidget(out_box)
        v.addStretch(1)

        for w in (self.layers, self.heads, self.d_model, self.d_ff, self.context, self.p, self.symbols,
                  self.length, self.vocab_size, self.dropout):
            w.valueChanged.connect(self._update_param_count)
        for w in (self.norm_placement, self.norm, self.activation, self.positions, self.attention, self.init,
                  self.tokenizer, self.family):
            w.currentTextChanged.connect(self._update_param_count)
        self.text_file.editingFinished.connect(self._update_param_count)

    def _build_live(self) -> None:
        self.live_widget = QWidget()
        v = QVBoxLayout(self.live_widget)
        buttons = QHBoxLayout()
        self.start_button = QPushButton("Start")
        self.pause_button = QPushButton("Pause")
        self.stop_button = QPushButton("Stop")
        self.use_button = QPushButton("Use this model")
        self.use_button.setToolTip("Load the last checkpoint as the current model of every panel")
        self.start_button.clicked.connect(self.start)
        self.pause_button.clicked.connect(self.toggle_pause)
        self.stop_button.clicked.connect(self.stop)
        self.use_button.clicked.connect(self.use_model)
        for b in (self.start_button, self.pause_button, self.stop_button, self.use_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
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

        grid = QGridLayout()
        self.loss_plot = self._plot("Loss", "cross-entropy")
        self.acc_plot = self._plot("Accuracy", "accuracy")
        self.lr_plot = self._plot("Learning rate", "lr")
        self.grad_plot = self._plot("Gradient norm per layer", "||g||")
        self.grad_plot.setLogMode(y=True)
        self.loss_plot.addLegend(offset=(-10, 10), **LEGEND_STYLE)
        self.grad_plot.addLegend(offset=(-10, 10), colCount=2, **LEGEND_STYLE)
        self.acc_plot.addLegend(offset=(-10, -10), **LEGEND_STYLE)
        self.train_curve = self.loss_plot.plot(pen=pg.mkPen("#0072B2", width=2), name="train")
        self.val_curve = self.loss_plot.plot(pen=pg.mkPen("#D55E00", width=2), symbol="o", symbolSize=6,
                                             symbolBrush="#D55E00", name="validation")
        self.train_acc_curve = self.acc_plot.plot(pen=pg.mkPen("#0072B2", width=2), symbol="t", symbolSize=6,
                                                  symbolBrush="#0072B2", name="train")
        self.acc_curve = self.acc_plot.plot(pen=pg.mkPen("#009E73", width=2), symbol="o", symbolSize=6,
                                            symbolBrush="#009E73", name="validation")
        self.acc_plot.setYRange(0, 1)
        self.lr_curve = self.lr_plot.plot(pen=pg.mkPen("#CC79A7", width=2))
        self.grad_curves: dict[str, pg.PlotDataItem] = {}
        grid.addWidget(self.loss_plot, 0, 0)
        grid.addWidget(self.acc_plot, 0, 1)
        grid.addWidget(self.lr_plot, 1, 0)
        grid.addWidget(self.grad_plot, 1, 1)
        v.addLayout(grid, 1)

    def _plot(self, title: str, ylabel: str) -> pg.PlotWidget:
        w = pg.PlotWidget(background="w")
        w.setTitle(title, color="#222")
        w.setLabel("bottom", "step")
        w.setLabel("left", ylabel)
        w.showGrid(x=True, y=True, alpha=0.3)
        w.setMinimumHeight(160)
        return w

    # -- form logic ------------------------------------------------------------------------
    def _browse_text(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Text file", "", "Text (*.txt *.md);;All files (*)")
        if path:
            self.text_file.setText(path)
            self._update_param_count()

    def _on_task_changed(self) -> None:
        task = self.task.currentText()
        shown = TASK_OPTIONS[task]
        for name, w in self._task_rows.items():
            self.task_form.setRowVisible(w, name in shown)
        self.model_box.setEnabled(not self.baseline())
        defaults = {"motif": 20, "copy": 8, "reverse": 8, "sort": 8, "induction": 16}
        if task in defaults:
            self.length.setValue(defaults[task])
        self.symbols.setValue(32 if task == "induction" else 10)
        self._update_param_count()

    def _on_family_changed(self) -> None:
        fam = self.family.currentText()
        presets = {"gpt2": ("pre", "layernorm", "gelu_tanh", "learned"),
                   "bert": ("post", "layernorm", "gelu", "learned"),
                   "llama": ("pre", "rmsnorm", "swiglu", "rotary")}[fam]
        for w, value in zip((self.norm_placement, self.norm, self.activation, self.positions), presets):
            w.setCurrentText(value)
        self._update_param_count()

    def _on_model_kind_changed(self) -> None:
        self.model_box.setEnabled(not self.baseline())  # the MLP's shape is fixed (the lectures')
        self._update_param_count()

    def _on_schedule_changed(self) -> None:
        noam = self.schedule.currentText() == "noam"
        self.lr_label.setText("Noam factor" if noam else "Learning rate")
        self.lr.setToolTip("Noam: lr = factor · d_model^-1/2 · min(t^-1/2, t · warmup^-3/2); 1.0 is the paper's "
                           "schedule" if noam else "Peak learning rate")

    def baseline(self) -> str | None:
        """"mlp" when the motif task trains the lectures' MLP baseline instead of the transformer."""
        return "mlp" if self.task.currentText() == "motif" and self.model_kind.currentIndex() == 1 else None

    def config(self) -> TrainConfig:
        """The TrainConfig the form describes (also what the CLI arguments encode)."""
        task = self.task.currentText()
        opts: dict = {}
        for name in TASK_OPTIONS[task]:
            if name == "text_file":  # absolute: the run's process has its own working folder
                text_file = self.text_file.text().strip()
                opts["text_file"] = str(Path(text_file).expanduser().absolute()) if text_file else ""
            elif name == "tokenizer":
                opts["tokenizer"] = self.tokenizer.currentText()
            elif name == "model_kind":
                continue  # not a task option: see baseline()
            elif name == "n_train":
                if self.n_train.value():
                    opts["n_train"] = self.n_train.value()
            else:
                opts[name] = self._task_rows[name].value()
        model = {"n_layers": self.layers.value(), "n_heads": self.heads.value(), "d_model": self.d_model.value(),
                 "d_ff": self.d_ff.value(), "context_length": self.context.value(),
                 "norm_placement": self.norm_placement.currentText(), "norm": self.norm.currentText(),
                 "activation": self.activation.currentText(), "positions": self.positions.currentText(),
                 "attention_kind": self.attention.currentText(), "init": self.init.currentText(),
                 "dropout": self.dropout.value()}
        return TrainConfig(task=task, task_options=opts, family=self.family.currentText(), model=model,
                           optimizer=self.optimizer.currentText(), lr=self.lr.value(),
                           weight_decay=self.weight_decay.value(), schedule=self.schedule.currentText(),
                           warmup_steps=self.warmup.value(), batch_size=self.batch_size.value(),
                           steps=self.steps.value(), eval_every=self.eval_every.value(),
                           checkpoint_every=self.checkpoint_every.value(), grad_clip=self.grad_clip.value() or None,
                           seed=self.seed.value(), device=self.device.currentText(),
                           precision=self.precision.currentText())

    def cli_args(self) -> list[str]:
        cfg = self.config()
        m = cfg.model
        args = ["--task", cfg.task, "--family", cfg.family, "--layers", str(m["n_layers"]),
                "--heads", str(m["n_heads"]), "--d-model", str(m["d_model"]), "--d-ff", str(m["d_ff"]),
                "--context", str(m["context_length"]), "--norm-placement", m["norm_placement"],
                "--norm", m["norm"], "--activation", m["activation"], "--positions", m["positions"],
                "--attention", m["attention_kind"], "--init", m["init"], "--dropout", str(m["dropout"]),
                "--optimizer", cfg.optimizer, "--lr", repr(cfg.lr), "--weight-decay", repr(cfg.weight_decay),
                "--schedule", cfg.schedule, "--warmup", str(cfg.warmup_steps), "--batch-size", str(cfg.batch_size),
                "--grad-clip", repr(cfg.grad_clip or 0), "--steps", str(cfg.steps),
                "--eval-every", str(cfg.eval_every), "--checkpoint-every", str(cfg.checkpoint_every),
                "--seed", str(cfg.seed), "--device", cfg.device, "--precision", cfg.precision]
        o = cfg.task_options
        for key, flag in (("length", "--length"), ("symbols", "--symbols"), ("p", "--p"),
                          ("train_fraction", "--train-fraction"), ("text_file", "--text-file"),
                          ("tokenizer", "--tokenizer"), ("vocab_size", "--vocab-size"), ("n_train", "--train-size")):
            if key in o:
                args += [flag, str(o[key])]
        if self.baseline():
            args += ["--baseline", self.baseline()]
        args += ["--out", str(self._out_path())]
        if self.resume_check.isChecked():
            args.append("--resume")
        return args

    def _update_param_count(self) -> None:
        if self.baseline() == "mlp":
            from ...core.training.baselines import MotifMLP
            with torch.device("meta"):
                n = sum(p.numel() for p in MotifMLP(length=self.length.value()).parameters())
            self.param_label.setText(f"{n:,} (MLP)")
            self.param_label.setStyleSheet("font-weight: bold")
            self.param_label.setToolTip("")
            return
        try:
            cfg = self.config()
            vocab = task_vocab_size(cfg)
            note = ""
            if vocab is None:  # char-level text: the distinct characters of the file
                try:
                    text = Path(cfg.task_options.get("text_file", "")).read_text(encoding="utf-8")
                    vocab = len(set(text)) + (1 if cfg.family == "bert" else 0)  # + [MASK] for MLM
                except (OSError, UnicodeDecodeError):
                    vocab, note = 256, " (vocabulary not known yet)"
            seq = {"motif": cfg.task_options.get("length", 20), "modadd": 4}.get(cfg.task, 0)
            if cfg.task in ("copy", "reverse", "sort", "induction"):
                seq = 2 * cfg.task_options.get("length", 8)
            mcfg = model_config_for(cfg, vocab_size=vocab)
            if seq > mcfg.context_length:
                mcfg = mcfg.replace(context_length=seq)
            self.param_label.setText(f"{parameter_count(mcfg):,}{note}")
            self.param_label.setStyleSheet("font-weight: bold")
            self.param_label.setToolTip("")
        except (ConfigError, ValueError) as exc:
            self.param_label.setText("invalid")
            self.param_label.setStyleSheet("font-weight: bold; color: #b00020")
            self.param_label.setToolTip(str(exc))

    # -- run control -----------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.process is not None and self.process.state() != QProcess.ProcessState.NotRunning

    def _update_buttons(self) -> None:
        running = self.running
        self.start_button.setEnabled(not running)
        self.pause_button.setEnabled(running)
        self.stop_button.setEnabled(running)
        self.pause_button.setText("Resume" if self.paused else "Pause")
        self.use_button.setEnabled(self.out_dir is not None and (self.out_dir / "config.json").is_file())
        self.form_widget.setEnabled(not running)

    def start(self) -> None:
        if self.running:
            return
        args = self.cli_args()
        self.out_dir = None if self.baseline() else self._out_path()  # the MLP baseline writes no checkpoint
        self.events.clear()
        self._series = {"train": ([], []), "val": ([], []), "acc": ([], []), "train_acc": ([], []), "lr": ([], [])}
        self._grad_series: dict[str, tuple[list, list]] = {}
        for curve in (self.train_curve, self.val_curve, self.acc_curve, self.train_acc_curve, self.lr_curve):
            curve.setData([], [])
        for curve in self.grad_curves.values():
            self.grad_plot.removeItem(curve)
        self.grad_curves.clear()
        self.grad_plot.clear()
        self.grad_plot.addLegend(offset=(-10, 10), colCount=2, **LEGEND_STYLE)
        self._buffer, self._stderr = b"", b""
        self.paused = False
        cmd = train_command() + args + ["--jsonl", "--control-stdin"]
        self.command_label.setText(" ".join(["python -m desktop_app train"] + args))
        self.command_label.setCursorPosition(0)
        self.progress.setRange(0, self.steps.value())
        self.progress.setValue(0)
        self.status_label.setText("Starting…")
        proc = QProcess(self)
        proc.setProgram(cmd[0])
        proc.setArguments(cmd[1:])
        from ...paths import resources_dir
        proc.setWorkingDirectory(str(resources_dir().parent))
        proc.readyReadStandardOutput.connect(self._read_stdout)
        proc.readyReadStandardError.connect(lambda: self._read_stderr(proc))
        proc.finished.connect(self._on_finished)
        proc.errorOccurred.connect(self._on_process_error)
        self.process = proc
        self._started_at = time.time()
        proc.start()
        self._update_buttons()

    def _out_path(self) -> Path:
        return Path(self.out_edit.text().strip() or str(user_data_dir() / "runs" / "run")).expanduser().absolute()

    def _send(self, line: str) -> None:
        if self.running:
            self.process.write((line + "\n").encode())

    def toggle_pause(self) -> None:
        self.paused = not self.paused
        self._send("pause" if self.paused else "resume")
        self.status_label.setText("Paused." if self.paused else "Resumed.")
        self._update_buttons()

    def stop(self) -> None:
        self.paused = False
        self._send("stop")
        self.status_label.setText("Stopping: writing a checkpoint…")

    def use_model(self) -> None:
        from ...core.checkpoints import load_model_folder

        if self.out_dir is None:
            return
        self.use_button.setEnabled(False)
        self.status_label.setText(f"Loading {self.out_dir}…")

        def done(loaded) -> None:
            self.use_button.setEnabled(True)
            self.status_label.setText(f"Now using {self.out_dir} in every panel.")
            self.state.set_model(loaded)

        def failed(exc, tb) -> None:
            self.use_button.setEnabled(True)
            self.status_label.setText(f"Could not load the checkpoint: {exc}")

        run_job(load_model_folder, str(self.out_dir), self.state.device, on_result=done, on_error=failed)

    # -- process output --------------------------------------------------------------------
    def _read_stdout(self) -> None:
        proc = self.sender() if isinstance(self.sender(), QProcess) else self.process
        self._buffer += bytes(proc.readAllStandardOutput())
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            line = line.strip()
            if not line:
                continue
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(ev, dict) and "event" in ev:
                self._on_event(ev)

    def _read_stderr(self, proc: QProcess) -> None:
        self._stderr = (self._stderr + bytes(proc.readAllStandardError()))[-20_000:]

    def _on_event(self, ev: dict) -> None:
        self.events.append(ev)
        kind = ev["event"]
        if kind == "start":
            self.status_label.setText(f"Training {ev['parameters']:,} parameters on {ev['device']}…")
            self.progress.setRange(0, ev["steps"])
            self.progress.setValue(ev["step"])
        elif kind == "step":
            s = ev["step"]
            self._append("train", s, ev["train_loss"])
            self._append("lr", s, ev["lr"])
            for i, (layer, value) in enumerate(ev.get("grad_norms", {}).items()):
                xs, ys = self._grad_series.setdefault(layer, ([], []))
                xs.append(s)
                ys.append(max(value, 1e-12))
                if layer not in self.grad_curves:
                    colour = LAYER_COLOURS[i % len(LAYER_COLOURS)]
                    self.grad_curves[layer] = self.grad_plot.plot(pen=pg.mkPen(colour, width=1.5), name=layer)
                self.grad_curves[layer].setData(xs, ys)
            self.train_curve.setData(*self._series["train"])
            self.lr_curve.setData(*self._series["lr"])
            self.progress.setValue(s)
            self.status_label.setText(
                f"step {s}/{ev['steps']} · train loss {ev['train_loss']:.4f} · {ev['tokens_per_s']:,.0f} tokens/s · "
                f"elapsed {_fmt_time(ev['elapsed'])} · ETA {_fmt_time(ev['eta'])}")
        elif kind == "eval":
            self._append("val", ev["step"], ev["val_loss"])
            self._append("acc", ev["step"], ev["val_accuracy"])
            self.val_curve.setData(*self._series["val"])
            self.acc_curve.setData(*self._series["acc"])
            if ev.get("train_accuracy") is not None:
                self._append("train_acc", ev["step"], ev["train_accuracy"])
                self.train_acc_curve.setData(*self._series["train_acc"])
        elif kind == "checkpoint":
            self._update_buttons()
        elif kind == "error":
            self.status_label.setText(ev["message"])
        elif kind in ("done", "stopped"):
            acc, train_acc = ev.get("val_accuracy"), ev.get("train_accuracy")
            acc_text = f", validation accuracy {acc:.3f}" if acc is not None else ""
            acc_text += f", training accuracy {train_acc:.3f}" if train_acc is not None else ""
            where = f" Checkpoint: {self.out_dir}" if self.out_dir is not None else " (no checkpoint: MLP baseline)"
            self.status_label.setText(f"{'Finished' if kind == 'done' else 'Stopped'} at step {ev['step']}"
                                      f"{acc_text}.{where}")
        self.run_event.emit(ev)

    def _append(self, key: str, x, y) -> None:
        xs, ys = self._series[key]
        xs.append(x)
        ys.append(y)

    def _on_finished(self, code: int, status) -> None:
        self._read_stdout()
        crashed = status == QProcess.ExitStatus.CrashExit or code not in (0,)
        if crashed and not any(e["event"] == "error" for e in self.events):
            tail = self._stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
            self.status_label.setText(f"The training process ended with code {code}: {' '.join(tail)}. "
                                      f"The last checkpoint in {self.out_dir} is kept.")
        self.paused = False
        self._update_buttons()

    def _on_process_error(self, error) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self.status_label.setText("Could not start the training process.")
            self._update_buttons()

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt name
        if self.running:
            self._send("stop")
            self.process.waitForFinished(5000)
        super().closeEvent(event)


    # -- --screenshot ----------------------------------------------------------------------
    def screenshot_demo(self) -> None:
        """A run in progress, as in the README: the lectures' motif transformer (3 blocks, 1 head,
        width 32, pre-LN), shown once a few evaluations are plotted."""
        import tempfile

        for combo, value in ((self.family, "bert"), (self.norm_placement, "pre"), (self.task, "motif")):
            combo.setCurrentText(value)
        for spin, value in ((self.layers, 3), (self.heads, 1), (self.d_model, 32), (self.d_ff, 128),
                            (self.context, 20), (self.length, 20), (self.lr, 3e-3), (self.warmup, 100), (self.batch_size, 64),
                            (self.steps, 3000), (self.eval_every, 100), (self.checkpoint_every, 500)):
            spin.setValue(value)
        self.out_edit.setText(str(Path(tempfile.mkdtemp(prefix="te-screenshot-run-")) / "motif"))
        self.start()

    def screenshot_ready(self) -> bool:
        return sum(e["event"] == "eval" for e in self.events) >= 4 or not self.running

def _fmt_time(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
