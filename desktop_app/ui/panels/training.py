"""Train panel: design a model and a task, start a run, watch it learn, use the result.

The run is a separate process (the `train` CLI with --jsonl --control-stdin) driven by QProcess:
the panel writes the TrainConfig its form describes to a JSON file beside the run's folder and hands
the process that file (`train --config FILE --out DIR`), so the form and the CLI share one contract;
its JSON-lines events feed the plots, Pause/Resume/Stop are lines written to its stdin, and a crash
or out-of-memory ends that process only; the window stays up and the last checkpoint stays on disk.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pyqtgraph as pg
import torch
from PySide6.QtCore import QEvent, QObject, QProcess, Qt, Signal
from PySide6.QtWidgets import (QAbstractSpinBox, QApplication, QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout,
                               QGridLayout, QGroupBox, QHBoxLayout, QLabel, QLineEdit, QMessageBox, QProgressBar,
                               QPushButton, QScrollArea, QSpinBox, QVBoxLayout, QWidget)

from ...core.checkpoints import ModelLoadError
from ...app.training import config_to_flags
from ...core.config import ConfigError
from ...core.families import REGISTRY, trainable_families
from ...core.training import checkpoint_step
from ...core.files import atomic_write_text
from ...core.training.options import MODEL_OPTIONS, OPTION, RUN_OPTIONS
from ...core.training.tasks import (DECLARED_TASKS, TaskError, TextTask, image_task_names, make_task,
                                    read_text_file, task_dimensions, task_names)
from ...core.training.trainer import (TrainConfig, best_device, default_precision, model_config_for, parameter_count,
                                      read_run_config, run_sample_text, task_options_for, trains_causal)
from ...core.views.training import config_from_dict, end_of_run_line
from ...paths import user_data_dir
from ..widgets.export import ExportBar, ask_save_path, show_saved
from ..widgets.export import export_view as write_export
from ..workers import run_job

LAYER_COLOURS = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]


def task_options_shown(task: str) -> tuple[str, ...]:
    """The option boxes a task shows: its declaration's options, and the model choice (transformer or the
    lectures' MLP baseline) for a task the baseline trains on."""
    declared = DECLARED_TASKS.get(task)
    if declared is None:
        return ()
    return declared.options + (("model_kind",) if declared.baseline else ())


def image_folder_shape(options: dict) -> tuple[list[str], int, int]:
    """(class names, image size, channels) of the image-folder task's options, cheaply: the class
    sub-folders are listed and one image is decoded (its size); the run decodes them all. TaskError
    (one line) when there is no folder or it is not one sub-folder of images per class."""
    from ...app.images import read_image_file
    from ...core.training.image_tasks import image_folder_files

    folder = str(options.get("image_folder") or "")
    if not folder:
        raise TaskError("Choose a folder of images, one sub-folder per class.")
    classes = image_folder_files(folder)
    channels = int(options.get("channels", 3))
    size = options.get("image_size")
    if not size:
        first = classes[0][1][0]
        try:
            size = read_image_file(first, channels).shape[0]
        except ValueError as exc:
            raise TaskError(str(exc)) from None
    return [name for name, _ in classes], int(size), channels


def image_task_stand_in(task: str, patch_size: int, options: dict | None = None):
    """What model_config_for reads of an image task (name, classes, sequence, model_settings), without
    building it: the real digits task loads scikit-learn and preprocesses 1,797 images (seconds), too
    slow for the form's checks on every change. The run builds the real one."""
    from types import SimpleNamespace

    from ...core.training.image_tasks import DIGITS_SIZE

    classes, size, channels = ([str(i) for i in range(10)], DIGITS_SIZE, 1) if task != "image-folder" else \
        image_folder_shape(options or {})
    seq = 1 + (size // patch_size) ** 2 if patch_size > 0 else 1
    return SimpleNamespace(name=task, vocab_size=len(classes), seq_len=seq,
                           model_settings={"image_size": size, "num_channels": channels, "patch_size": patch_size,
                                           "extra": {}})


def _spin(lo: int, hi: int, value: int, step: int = 1) -> QSpinBox:
    s = QSpinBox()
    s.setRange(lo, hi)
    s.setValue(value)
    s.setSingleStep(step)
    return s


class CompactDoubleSpinBox(QDoubleSpinBox):
    """Shows 0.001, 0.01, 0 and 0.5 rather than 0.001000, 0.0100, 0.00 and 0.50: the settings column
    reads with no padding zeros, whatever precision each field accepts."""

    def textFromValue(self, value: float) -> str:  # noqa: N802 - Qt name
        text = f"{value:.{self.decimals()}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text


def _dspin(lo: float, hi: float, value: float, decimals: int = 4, step: float = 0.01) -> QDoubleSpinBox:
    s = CompactDoubleSpinBox()
    s.setDecimals(decimals)
    s.setRange(lo, hi)
    s.setSingleStep(step)
    s.setValue(value)
    return s


def _box(key: str) -> QWidget:
    """The form's box of training option `key` (core.training.options): its range (the form's own where
    narrower), first value, step and help, as declared once for the CLI, the run config and the form."""
    option = OPTION[key]
    if option.choices:
        box = _combo([str(c) for c in option.choices], None if option.initial is None else str(option.initial))
    elif option.kind is int:
        lo, hi, step = option.form
        box = _spin(lo, hi, option.initial, step)
    else:
        lo, hi, step, decimals = option.form
        box = _dspin(lo, hi, option.initial, decimals, step)
    box.setToolTip(option.help[:1].upper() + option.help[1:])
    return box


def _value(box: QWidget):
    """What a box of the form holds, as its option's kind."""
    return box.currentText() if isinstance(box, QComboBox) else box.value()


def _error_label() -> QLabel:
    """A red line under a settings group naming what is wrong there (hidden when nothing is)."""
    label = QLabel("")
    label.setWordWrap(True)
    label.setStyleSheet("color: #b00020")
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    label.hide()
    return label


def _show_error(label: QLabel, message: str) -> None:
    # a break chance after each path separator: a long path wraps instead of widening the column
    label.setText(message.replace("/", "/\u200b").replace("\\", "\\\u200b"))
    label.setToolTip(message)
    label.setVisible(bool(message))


def _combo(items, current: str | None = None) -> QComboBox:
    c = QComboBox()
    c.addItems(list(items))
    if current:
        c.setCurrentText(current)
    return c


def runs_root() -> Path:
    """Where the panel puts its runs by default: one new folder per run inside it."""
    return user_data_dir() / "runs"


def new_run_dir(root: Path, task: str, now: float | None = None) -> Path:
    """A folder for a new run, named by its start time and task, that does not exist yet: a run never
    writes into (or replaces) another run's folder, nor its launch file (launch_config_path) over a file."""
    base = f"{time.strftime('%Y-%m-%d_%H%M', time.localtime(now))}_{task}"
    path, n = root / base, 1
    while path.exists() or launch_config_path(path).exists():
        n += 1
        path = root / f"{base}-{n}"
    return path


def launch_config_path(run_dir: Path) -> Path:
    """Where the panel writes the settings it starts a run with: beside the run's folder, not in it (the
    train command takes only a new or empty folder, and each checkpoint replaces the folder's contents,
    where run_config.json then keeps the same settings)."""
    return run_dir.with_name(run_dir.name + ".train.json")


def free_launch_config_path(run_dir: Path, text: str) -> Path:
    """launch_config_path(run_dir), unless a different file is already there (a resumed run started
    elsewhere, e.g. by `train --config <run>.train.json`): then <run>.train-2.json, -3, ... - the panel
    never writes over a file it did not write with these very settings."""
    path, n = launch_config_path(run_dir), 1
    while path.exists():
        try:
            if path.read_text(encoding="utf-8") == text:
                return path  # the same settings: writing them again changes nothing
        except (OSError, UnicodeDecodeError):
            pass
        n += 1
        path = run_dir.with_name(f"{run_dir.name}.train-{n}.json")
    return path


def load_run_model(path: str, device: str):
    """(model, task name, sample of the task as text) of a run's checkpoint; the task and sample are
    None when the task cannot be rebuilt (e.g. its text file is gone)."""
    from ...core.checkpoints import load_model_folder

    loaded = load_model_folder(path, device)
    task, sample = run_sample_text(path, loaded) or (None, None)
    return loaded, task, sample


class WheelGuard(QObject):
    """Spin boxes and combo boxes of the settings column take the wheel only when focused; otherwise it
    scrolls the column (handed to its scroll bar, as Qt does not pass a filtered wheel event on to the
    parents), so scrolling never changes a value that happens to pass under the pointer."""

    def __init__(self, scroll: QScrollArea) -> None:
        super().__init__(scroll)
        self.scroll = scroll

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt name
        if event.type() == QEvent.Type.Wheel and not obj.hasFocus():
            QApplication.sendEvent(self.scroll.verticalScrollBar(), event)
            return True
        return False


def train_command() -> list[str]:
    """How to start the train CLI from here (a frozen bundle runs itself with the subcommand)."""
    if getattr(sys, "frozen", False):
        return [sys.executable, "train"]
    return [sys.executable, "-m", "desktop_app", "train"]


class SpacedAxis(pg.AxisItem):
    """An axis whose tick labels never overlap: over a decade or two, a log axis labels 0.05, 0.06, 0.07...
    on top of each other. Labels are placed powers of ten first; one that would touch a placed one is left
    out (its tick stays)."""

    def generateDrawSpecs(self, p):  # noqa: N802 - pyqtgraph name
        specs = super().generateDrawSpecs(p)
        if specs is None:
            return None
        axis, ticks, texts = specs

        def decade(spec) -> bool:
            try:
                return float(math.log10(float(spec[2]))).is_integer()
            except ValueError:  # "10⁻⁶" and the like are decades too
                return "10" in spec[2]

        kept: list = []
        for spec in sorted(texts, key=lambda t: not decade(t)):  # stable: pyqtgraph's order otherwise
            rect = spec[0].adjusted(-1, -1, 1, 1)
            if not any(rect.intersects(k[0]) for k in kept):
                kept.append(spec)
        return axis, ticks, kept


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
        self.out_dir: Path | None = None  # the checkpoint folder of the current (or last) run
        self.run_dir: Path | None = None  # the --out folder of the current (or last) run
        self.config_file: Path | None = None  # the --config file the current (or last) run was started with
        self._filled_from: Path | None = None  # the run whose saved settings the form shows (resume)
        self._checkpoint_ready = False  # a checkpoint of THIS run exists: "Use this model" loads it
        self._loading = False
        self._task_check: tuple | None = None  # (key, message): the text file's check, cached
        defaults = TrainConfig()  # the settings the form has no box for: kept from the last config shown
        self._unboxed = {"momentum": defaults.momentum, "log_every": defaults.log_every, "betas": defaults.betas}
        self._build_form()
        self._build_live()
        layout = QHBoxLayout(self)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # the column fits its width
        scroll.setWidget(self.form_widget)
        scroll.setMinimumWidth(360)
        scroll.setMaximumWidth(440)
        self.settings_scroll = scroll
        self._wheel_guard = WheelGuard(scroll)
        for w in self.form_widget.findChildren(QWidget):
            if isinstance(w, (QAbstractSpinBox, QComboBox)):
                w.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
                w.installEventFilter(self._wheel_guard)
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
        self.family = _combo(trainable_families())
        # the model options' boxes (core.training.options), by TrainConfig.model key
        self._model_boxes = {o.key: _box(o.key) for o in MODEL_OPTIONS}
        (self.layers, self.heads, self.d_model, self.d_ff, self.context, self.norm_placement, self.norm,
         self.activation, self.positions, self.attention, self.init, self.dropout, self.patch_size) = (
            self._model_boxes[k] for k in ("n_layers", "n_heads", "d_model", "d_ff", "context_length",
                                           "norm_placement", "norm", "activation", "positions", "attention_kind",
                                           "init", "dropout", "patch_size"))
        self.param_label = QLabel("")
        self.param_label.setStyleSheet("font-weight: bold")
        self.param_label.setWordWrap(True)  # "(vocabulary not known yet)" must not widen the column
        for label, w in (("Family", self.family), ("Layers", self.layers), ("Heads", self.heads),
                         ("d_model", self.d_model), ("d_ff", self.d_ff), ("Context", self.context),
                         ("Norm placement", self.norm_placement), ("Norm", self.norm),
                         ("Activation", self.activation), ("Positions", self.positions),
                         ("Attention", self.attention), ("Init", self.init), ("Dropout", self.dropout),
                         ("Patch size", self.patch_size), ("Parameters", self.param_label)):
            f.addRow(label, w)
        self.model_form = f
        self._text_families = trainable_families()  # the family list of text tasks (image tasks: vit)
        self.model_error = _error_label()
        f.addRow(self.model_error)
        self.family.currentTextChanged.connect(self._on_family_changed)
        v.addWidget(model_box)

        task_box = QGroupBox("Task")
        tf = QFormLayout(task_box)
        self.task = _combo(list(task_names()))  # the task registry (core.training.tasks.declare_task)
        self.length, self.symbols, self.p, self.train_fraction = (
            _box(k) for k in ("length", "symbols", "p", "train_fraction"))
        self.text_file = QLineEdit()
        self.text_file.setMinimumWidth(60)  # a long path scrolls inside the field, not the column
        self.text_file.setPlaceholderText("a UTF-8 text file")
        browse = QPushButton("…")
        browse.setMaximumWidth(30)
        browse.clicked.connect(self._browse_text)
        row = QHBoxLayout()
        row.addWidget(self.text_file)
        row.addWidget(browse)
        self.text_row = QWidget()
        self.text_row.setLayout(row)
        row.setContentsMargins(0, 0, 0, 0)
        self.tokenizer = _box("tokenizer")
        self.vocab_size = _box("vocab_size")
        self.image_folder = QLineEdit()  # the image-folder task: one sub-folder of images per class
        self.image_folder.setMinimumWidth(60)
        self.image_folder.setPlaceholderText("a folder, one sub-folder of images per class")
        folder_browse = QPushButton("…")
        folder_browse.setMaximumWidth(30)
        folder_browse.clicked.connect(self._browse_image_folder)
        folder_row = QHBoxLayout()
        folder_row.setContentsMargins(0, 0, 0, 0)
        folder_row.addWidget(self.image_folder)
        folder_row.addWidget(folder_browse)
        self.image_folder_row = QWidget()
        self.image_folder_row.setLayout(folder_row)
        self.channels = _box("channels")
        self.image_size = _box("image_size")
        self.image_size.setSpecialValueText("the images' own")
        self.image_size.setToolTip("Resize every image to this size; 0 keeps the images' own size (then one square "
                                   "size for all)")
        self.model_kind = _combo(["transformer", "MLP baseline"])
        self.model_kind.setToolTip("The lectures' MLP (embedding 32, 20*32 -> 64 -> 4) on the same batches and "
                                   "held-out set, for the comparison; it writes no checkpoint")
        self.n_train = _box("n_train")
        self.n_train.setSpecialValueText("fresh samples")
        self.n_train.setToolTip("A fixed training set of this many samples (the lectures use 1500); "
                                "0 draws fresh samples for every batch")
        self._task_rows = {"length": self.length, "symbols": self.symbols, "p": self.p,
                           "train_fraction": self.train_fraction, "text_file": self.text_row,
                           "tokenizer": self.tokenizer, "vocab_size": self.vocab_size,
                           "model_kind": self.model_kind, "n_train": self.n_train,
                           "image_folder": self.image_folder_row, "channels": self.channels,
                           "image_size": self.image_size}
        tf.addRow("Task", self.task)
        for name, label in (("model_kind", "Model"), ("length", "Length"), ("n_train", "Training-set size"),
                            ("symbols", "Symbols"), ("p", "Modulus p"),
                            ("train_fraction", "Train fraction"), ("text_file", "Text file"),
                            ("tokenizer", "Tokenizer"), ("vocab_size", "BPE vocabulary"),
                            ("image_folder", "Image folder"), ("channels", "Channels"), ("image_size", "Image size")):
            tf.addRow(label, self._task_rows[name])
        self.task_error = _error_label()
        tf.addRow(self.task_error)
        self.task_form = tf
        self.task.currentTextChanged.connect(self._on_task_changed)
        self.model_kind.currentTextChanged.connect(self._on_model_kind_changed)
        self.tokenizer.currentTextChanged.connect(self._on_tokenizer_changed)
        self.model_box = model_box
        v.addWidget(task_box)

        opt_box = QGroupBox("Optimisation")
        of = QFormLayout(opt_box)
        # the optimisation options' boxes (core.training.options), by TrainConfig field; momentum and
        # log_every have none (the CLI's flags and a --config file give them; the form keeps their defaults)
        self._run_boxes = {o.key: _box(o.key) for o in RUN_OPTIONS if o.form or o.key in ("optimizer", "schedule")}
        (self.optimizer, self.lr, self.weight_decay, self.schedule, self.warmup, self.batch_size, self.grad_clip,
         self.steps, self.eval_every, self.checkpoint_every, self.seed) = (
            self._run_boxes[k] for k in ("optimizer", "lr", "weight_decay", "schedule", "warmup_steps", "batch_size",
                                         "grad_clip", "steps", "eval_every", "checkpoint_every", "seed"))
        from ...core.devices import available_devices
        self.device = _combo(available_devices(), best_device())
        self.precision = _combo(OPTION["precision"].choices, default_precision(self.device.currentText()))
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
        # what the MLP baseline ignores (it trains with Adam, a constant rate, float32, on the CPU, no checkpoint)
        self._baseline_ignores = (self.optimizer, self.schedule, self.warmup, self.grad_clip, self.checkpoint_every,
                                  self.device, self.precision)

        out_box = QGroupBox("Output")
        ob = QFormLayout(out_box)
        self.out_edit = QLineEdit(str(runs_root()))
        self.out_edit.setMinimumWidth(60)
        self.out_edit.setToolTip("Every run gets a new folder in here, named by its start time and task "
                                 "(e.g. 2026-11-24_1012_motif); no run replaces another")
        self.resume_check = QCheckBox("Resume this run instead:")
        self.resume_edit = QLineEdit()
        self.resume_edit.setMinimumWidth(60)
        self.resume_edit.setPlaceholderText("a run folder with a checkpoint")
        self.out_error = _error_label()
        ob.addRow("Runs folder", self.out_edit)
        ob.addRow(self.resume_check)
        ob.addRow(self.resume_edit)
        ob.addRow(self.out_error)
        self.out_box = out_box
        v.addWidget(out_box)
        v.addStretch(1)
        self.resume_check.toggled.connect(self._fill_from_resumed_run)
        self.resume_edit.textChanged.connect(self._fill_from_resumed_run)
        self.resume_check.toggled.connect(self._update_param_count)
        self.resume_edit.textChanged.connect(self._update_param_count)
        self.out_edit.textChanged.connect(self._update_param_count)

        for w in (self.layers, self.heads, self.d_model, self.d_ff, self.context, self.p, self.symbols,
                  self.length, self.vocab_size, self.dropout, self.patch_size):
            w.valueChanged.connect(self._update_param_count)
        for w in (self.norm_placement, self.norm, self.activation, self.positions, self.attention, self.init,
                  self.tokenizer, self.family):
            w.currentTextChanged.connect(self._update_param_count)
        self.text_file.textChanged.connect(self._update_param_count)
        self.image_folder.textChanged.connect(self._update_param_count)
        self.channels.currentTextChanged.connect(self._update_param_count)
        self.image_size.valueChanged.connect(self._update_param_count)

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

        self.plots_widget = QWidget()  # what PNG and SVG exports draw: the four plots
        grid = QGridLayout(self.plots_widget)
        grid.setContentsMargins(0, 0, 0, 0)
        self.loss_plot = self._plot("Loss", "cross-entropy")
        self.acc_plot = self._plot("Accuracy", "accuracy")
        self.lr_plot = self._plot("Learning rate", "lr")
        self.grad_plot = self._plot("Gradient norm per layer", "||g||", left=SpacedAxis("left"))
        self.grad_plot.setLogMode(y=True)
        self.grad_plot.getAxis("left").enableAutoSIPrefix(False)  # in log mode it labels 0.5 as "5·10²"
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
        v.addWidget(self.plots_widget, 1)
        self._clear_plots()

    def _plot(self, title: str, ylabel: str, left: pg.AxisItem | None = None) -> pg.PlotWidget:
        w = pg.PlotWidget(background="w", axisItems={"left": left} if left is not None else None)
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

    def _browse_image_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Image folder (one sub-folder per class)")
        if path:
            self.image_folder.setText(path)

    def _on_task_changed(self) -> None:
        task = self.task.currentText()
        shown = task_options_shown(task)
        for name, w in self._task_rows.items():
            self.task_form.setRowVisible(w, name in shown)
        self._set_image_task(task in image_task_names())
        self._on_tokenizer_changed()
        self._apply_baseline()
        own = DECLARED_TASKS[task].defaults if task in DECLARED_TASKS else {}  # the task's own defaults
        if "length" in own:
            self.length.setValue(own["length"])
        self.symbols.setValue(own.get("symbols", OPTION["symbols"].initial))
        self._update_param_count()

    def _set_image_task(self, image: bool) -> None:
        """An image task trains the image families (vit) only: the family list is theirs, the patch size shows,
        and what a ViT has no choice of is hidden (its context is 1 + patches; positions are learned)."""
        families = trainable_families("patches") if image else self._text_families
        if [self.family.itemText(i) for i in range(self.family.count())] != families:
            previous = self.family.currentText()
            self.family.blockSignals(True)
            self.family.clear()
            self.family.addItems(families)
            if previous in families:
                self.family.setCurrentText(previous)
            self.family.blockSignals(False)
            self._on_family_changed()
        for w in (self.context, self.positions, self.attention):
            self.model_form.setRowVisible(w, not image)
        self.model_form.setRowVisible(self.patch_size, image)

    def _on_tokenizer_changed(self) -> None:
        # the BPE vocabulary size means nothing to the character tokenizer
        shown = "vocab_size" in task_options_shown(self.task.currentText()) and self.tokenizer.currentText() == "bpe"
        self.task_form.setRowVisible(self.vocab_size, shown)

    def _on_family_changed(self) -> None:
        preset = REGISTRY[self.family.currentText()].preset()  # the family's own switches
        for w, value in zip((self.norm_placement, self.norm, self.activation, self.positions),
                            (preset.norm_placement, preset.norm, preset.activation, preset.positions)):
            w.setCurrentText(value)
        self._update_param_count()

    def _on_model_kind_changed(self) -> None:
        self._apply_baseline()
        self._update_param_count()

    def _apply_baseline(self) -> None:
        """The MLP baseline's shape is fixed (the lectures') and it ignores the optimiser, schedule, device,
        precision and output settings: those are disabled while it is chosen."""
        mlp = bool(self.baseline())
        self.model_box.setEnabled(not mlp)
        for w in self._baseline_ignores:
            w.setEnabled(not mlp)
        self.out_box.setEnabled(not mlp)

    def _on_schedule_changed(self) -> None:
        noam = self.schedule.currentText() == "noam"
        self.lr_label.setText("Noam factor" if noam else "Learning rate")
        self.lr.setToolTip("Noam: lr = factor · d_model^-1/2 · min(t^-1/2, t · warmup^-3/2); 1.0 is the paper's "
                           "schedule" if noam else "Peak learning rate")

    def baseline(self) -> str | None:
        """"mlp" when the motif task trains the lectures' MLP baseline instead of the transformer."""
        return "mlp" if self.task.currentText() == "motif" and self.model_kind.currentIndex() == 1 else None

    def config(self) -> TrainConfig:
        """The TrainConfig the form describes (also what the CLI arguments encode): every option of
        core.training.options that has a box, and the settings the form has no box for (momentum, log_every,
        betas) as the last config shown in it (set_config) gave them."""
        task = self.task.currentText()
        opts: dict = {}
        for name in task_options_shown(task):
            if name == "model_kind":
                continue  # not a task option: see baseline()
            option, box = OPTION[name], self._task_rows[name]
            if name in ("text_file", "image_folder"):  # absolute: the run's process has its own working folder
                text = getattr(self, name).text().strip()  # the row's line edit
                opts[name] = str(Path(text).expanduser().absolute()) if text else ""
                continue
            value = option.kind(_value(box))
            if option.form_none is None or value != option.form_none:
                opts[name] = value
        model = {o.key: o.kind(_value(self._model_boxes[o.key])) for o in MODEL_OPTIONS if o.key != "patch_size"}
        if task in image_task_names():  # a ViT's context is 1 + patches; its patch size is the model's
            del model["context_length"]
            model["patch_size"] = self.patch_size.value()
        run = {key: OPTION[key].kind(_value(box)) for key, box in self._run_boxes.items()}
        run["grad_clip"] = run["grad_clip"] or None
        return TrainConfig(task=task, task_options=opts, family=self.family.currentText(), model=model,
                           **self._unboxed, **run, device=self.device.currentText(),
                           precision=self.precision.currentText())

    def launch_args(self, out: Path) -> list[str]:
        """What a launch adds to the settings file: where the run goes and what kind of run it is."""
        args = ["--out", str(out)]
        if self.baseline():
            args += ["--baseline", self.baseline()]
        if self._resuming():
            args.append("--resume")
        return args

    def set_config(self, cfg: TrainConfig) -> None:
        """Show `cfg` in the form (config()'s inverse): a resumed run's saved settings, a workspace's form.
        The task goes first (it decides the family list), then the family (choosing it resets the settings
        that follow from it), then every option's box; a device this machine lacks keeps the current one."""
        self.task.setCurrentText(cfg.task)
        self.family.setCurrentText(cfg.family)
        self.model_kind.setCurrentIndex(0)  # a run with a checkpoint is a transformer's
        boxes = [(self._model_boxes, cfg.model), (self._task_rows, cfg.task_options),
                 (self._run_boxes, {key: getattr(cfg, key) for key in self._run_boxes})]
        for rows, values in boxes:
            for key, box in rows.items():
                option = OPTION.get(key)
                value = values.get(key)
                if option is None:
                    continue  # model_kind: not an option
                if key in ("text_file", "image_folder"):
                    if key in values:
                        getattr(self, key).setText(str(value or ""))  # the row's line edit
                elif value is None and option.form_none is not None and rows is self._task_rows:
                    box.setValue(option.form_none)  # not given: the box's special value ("fresh samples")
                elif key == "grad_clip":
                    box.setValue(value or 0)
                elif value is not None:
                    if isinstance(box, QComboBox):
                        box.setCurrentText(str(value))
                    else:
                        box.setValue(value)
        self._unboxed = {"momentum": cfg.momentum, "log_every": cfg.log_every, "betas": cfg.betas}
        if self.device.findText(cfg.device) >= 0:
            self.device.setCurrentText(cfg.device)  # sets its default precision; the run's own comes next
        if self.device.currentText() == cfg.device:
            self.precision.setCurrentText(cfg.precision)

    # -- workspace (MainWindow saves view_state and gives it back with set_view_state) ----------
    VIEW_TABLE = None  # no views table: the form is the panel's whole view state
    view_state_from_dict = staticmethod(config_from_dict)  # a workspace's dict, read tolerantly

    @property
    def view_state(self) -> TrainConfig:
        return self.config()

    def set_view_state(self, cfg: TrainConfig) -> None:
        self.set_config(cfg)  # as a resumed run's settings fill the form

    def _fill_from_resumed_run(self) -> None:
        """Resuming a run shows that run's saved settings (its run_config.json), once per chosen run."""
        if not self._resuming():
            self._filled_from = None
            return
        text = self.resume_edit.text().strip()
        folder = Path(text).expanduser().absolute() if text else None
        if folder is None or folder == self._filled_from or checkpoint_step(folder) is None:
            return
        try:
            cfg = read_run_config(folder)
        except (ModelLoadError, ValueError, OSError):  # no readable settings saved: the form stays as it is
            return
        self._filled_from = folder
        self.set_config(cfg)

    def cli_args(self, out: Path | None = None) -> list[str]:
        """The same run as train flags (the CLI's own inverse of its flags, config_to_args), for a person to
        read or type; `out` is the run's folder (default: the folder Start would use). Start itself hands
        the process a settings file instead."""
        return config_to_flags(self.config()) + self.launch_args(out or self._next_run_dir())

    def _resuming(self) -> bool:
        return self.resume_check.isChecked() and not self.baseline()

    def _next_run_dir(self) -> Path:
        """The folder the next run writes: the chosen run when resuming, else a new one in the runs folder."""
        if self._resuming():
            return Path(self.resume_edit.text().strip()).expanduser().absolute()
        root = Path(self.out_edit.text().strip() or str(runs_root())).expanduser().absolute()
        return new_run_dir(root, self.task.currentText() + ("_mlp" if self.baseline() else ""))

    # -- checks shown beside the settings --------------------------------------------------
    def _task_problem(self, cfg: TrainConfig) -> str:
        """Why the task cannot be built from these settings ('' when it can), as the run would say it."""
        if cfg.task in image_task_names():  # not built here (seconds): its one setting is checked as the task checks it
            from ...core.training.image_tasks import DIGITS_SIZE

            patch = int(cfg.model.get("patch_size", 2))
            if cfg.task == "image-folder":  # its classes and size, cheaply (the run decodes every image)
                try:
                    _, size, _ = image_folder_shape(cfg.task_options)
                except TaskError as exc:
                    return str(exc)
                return "" if patch >= 1 and size % patch == 0 else \
                    f"the images are {size} x {size}: patch size {patch} does not divide it"
            if patch < 1 or DIGITS_SIZE % patch:
                return (f"the digits are {DIGITS_SIZE} x {DIGITS_SIZE}: patch size {patch} does not divide it "
                        "(1, 2, 4 or 8)")
            return ""
        if cfg.task != "text":
            try:
                make_task(cfg.task, cfg.task_options)  # synthetic tasks build in milliseconds
            except (TaskError, ValueError) as exc:
                return str(exc)
            return ""
        path = cfg.task_options.get("text_file", "")
        if not path:
            return "Choose a text file to train on."
        try:
            st = Path(path).stat()
            key = (path, st.st_mtime_ns, st.st_size, cfg.task_options.get("tokenizer"), cfg.model["context_length"])
        except OSError:
            key = (path,)
        if self._task_check is not None and self._task_check[0] == key:
            return self._task_check[1]
        message = ""
        try:
            text = read_text_file(path)
            seq = cfg.model["context_length"]
            # a character tokenizer gives one token per character; BPE gives fewer, so this is a lower bar
            n_val = max(int(len(text) * 0.1), seq + 1)
            if cfg.task_options.get("tokenizer") == "char":
                TextTask(text, tokenizer="char", seq_len=seq, source=path)
            elif len(text) - n_val < seq + 1:
                message = (f"{path}: {len(text)} characters are too few for a context of {seq}; "
                           f"use a longer text or a shorter context")
        except TaskError as exc:
            message = str(exc)
        self._task_check = (key, message)
        return message

    def _out_problem(self) -> str:
        if self.baseline():
            return ""
        if self._resuming():
            folder = self.resume_edit.text().strip()
            if not folder:
                return "Choose the run folder to resume."
            if checkpoint_step(Path(folder).expanduser()) is None:
                return f"{folder}: no checkpoint to resume from."
            return ""
        root = Path(self.out_edit.text().strip() or str(runs_root())).expanduser()
        if root.exists() and not root.is_dir():
            return f"{root}: not a folder."
        return ""

    def problems(self) -> list[str]:
        """What stops a run from starting with these settings (shown beside the settings, Start disabled)."""
        return [label.toolTip() for label in (self.model_error, self.task_error, self.out_error) if label.toolTip()]

    def _update_param_count(self) -> None:
        """The parameter count and the checks of every settings group (they share the config)."""
        if not hasattr(self, "out_error"):  # still building the form: checked once it is complete
            return
        model_error = task_error = ""
        try:  # the settings' own ranges (TrainConfig.problem, as a --config file meets them), then the task's
            cfg = self.config()
            task_error = cfg.problem() or self._task_problem(cfg)
        except (ConfigError, ValueError) as exc:
            task_error = str(exc)
        if self.baseline() == "mlp":
            from ...core.training.baselines import MotifMLP
            with torch.device("meta"):
                n = sum(p.numel() for p in MotifMLP(length=self.length.value()).parameters())
            self.param_label.setText(f"{n:,} (MLP)")
            self.param_label.setStyleSheet("font-weight: bold")
            self.param_label.setToolTip("")
        else:
            model_error = self._update_transformer_count()
        _show_error(self.model_error, model_error)
        _show_error(self.task_error, task_error)
        _show_error(self.out_error, self._out_problem())
        if hasattr(self, "start_button"):
            self._update_buttons()

    def _update_transformer_count(self) -> str:
        """Show the transformer's parameter count; returns why the model cannot be built ('' if it can)."""
        try:
            cfg = self.config()
            note = ""
            causal = trains_causal(cfg)  # masked or next-token, from the registry (as the run decides)
            if cfg.task in image_task_names():
                try:
                    stand_in = image_task_stand_in(cfg.task, int(cfg.model.get("patch_size", 2)), cfg.task_options)
                except TaskError:  # said beside the task
                    self.param_label.setText("—")
                    self.param_label.setStyleSheet("")
                    return ""
                mcfg = model_config_for(cfg, stand_in)
                self.param_label.setText(f"{parameter_count(mcfg):,}")
                self.param_label.setStyleSheet("font-weight: bold")
                self.param_label.setToolTip("")
                return ""
            try:  # the task's own vocabulary and length, as the run will build it
                vocab, seq = task_dimensions(cfg.task, task_options_for(cfg), causal)
            except TaskError:  # said beside the task; the model's own checks still apply
                vocab, seq, note = 256, 0, " (vocabulary not known yet)"
            mcfg = model_config_for(cfg, vocab_size=vocab)
            if seq > mcfg.context_length:
                mcfg = mcfg.replace(context_length=seq)
            self.param_label.setText(f"{parameter_count(mcfg):,}{note}")
            self.param_label.setStyleSheet("font-weight: bold")
            self.param_label.setToolTip("")
            return ""
        except (ConfigError, ValueError) as exc:
            self.param_label.setText("invalid")
            self.param_label.setStyleSheet("font-weight: bold; color: #b00020")
            self.param_label.setToolTip(str(exc))
            return str(exc)

    # -- run control -----------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.process is not None and self.process.state() != QProcess.ProcessState.NotRunning

    def _update_buttons(self) -> None:
        running = self.running
        problems = self.problems()
        self.start_button.setEnabled(not running and not problems)
        self.start_button.setToolTip("\n".join(problems) if problems else "Start a run in a new folder")
        self.pause_button.setEnabled(running)
        self.stop_button.setEnabled(running)
        self.pause_button.setText("Resume" if self.paused else "Pause")
        # only a checkpoint this run wrote: never an older model from another run
        self.use_button.setEnabled(self._checkpoint_ready and not self._loading and self.out_dir is not None
                                   and (self.out_dir / "config.json").is_file())
        self.form_widget.setEnabled(not running)

    def start(self) -> None:
        if self.running or self.problems():
            return
        run_dir = self._next_run_dir()
        cfg = self.config()
        text = cfg.to_json()
        config_file = free_launch_config_path(run_dir, text)
        try:
            atomic_write_text(config_file, text)
        except OSError as exc:  # WriteError too: a read-only runs folder, a full disk...
            self.status_label.setText(f"Could not write the run's settings: {exc}")
            return
        self.config_file = config_file
        args = ["--config", str(config_file), *self.launch_args(run_dir)]
        self.run_dir = run_dir
        self.out_dir = None if self.baseline() else run_dir  # the MLP baseline writes no checkpoint
        # a resumed run continues its own checkpoint; a new run has none until its first one
        self._checkpoint_ready = self._resuming() and checkpoint_step(run_dir) is not None
        self.events.clear()
        self.export_bar.refresh()
        self._buffer, self._stderr = b"", b""
        self.paused = False
        cmd = train_command() + args + ["--jsonl", "--control-stdin"]
        self.command_label.setText(" ".join(["python -m desktop_app train"] + args))
        self.command_label.setCursorPosition(0)
        self.command_label.setToolTip("The same run with flags:\n" + " ".join(
            ["python -m desktop_app train", *self.cli_args(run_dir)]))
        self.progress.setRange(0, self.steps.value())
        self.progress.setValue(0)
        self.status_label.setText(f"Starting a run in {run_dir}…")
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

    def _clear_plots(self) -> None:
        """Empty the plots for a new run: done at its first event, so a run that cannot start keeps the
        previous run's curves on screen."""
        self._series = {"train": ([], []), "val": ([], []), "acc": ([], []), "train_acc": ([], []), "lr": ([], [])}
        self._grad_series: dict[str, tuple[list, list]] = {}
        for curve in (self.train_curve, self.val_curve, self.acc_curve, self.train_acc_curve, self.lr_curve):
            curve.setData([], [])
        for curve in self.grad_curves.values():
            self.grad_plot.removeItem(curve)
        self.grad_curves.clear()
        self.grad_plot.clear()
        self.grad_plot.addLegend(offset=(-10, 10), colCount=2, **LEGEND_STYLE)

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
        if self.out_dir is None or not self._checkpoint_ready:
            return
        path = self.out_dir
        self._loading = True
        self._update_buttons()
        self.status_label.setText(f"Loading {path}…")

        def done(result) -> None:
            loaded, task, sample = result
            self._loading = False
            self._update_buttons()
            note = ""
            if sample is not None:  # the task's own tokens: the other panels can tokenize it
                self.state.text = sample  # set_model traces it
                note = f"; the text is now a sample of the {task} task"
            self.status_label.setText(f"Now using {path} in every panel{note}.")
            self.state.set_model(loaded)

        def failed(exc, tb) -> None:
            self._loading = False
            self._update_buttons()
            self.status_label.setText(f"Could not load the checkpoint in {path}: {exc}")

        run_job(load_run_model, str(path), self.state.device, on_result=done, on_error=failed)

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
            self._clear_plots()
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
            self._checkpoint_ready = True
            self._update_buttons()
        elif kind == "error":
            self.status_label.setText(ev["message"])
        elif kind in ("done", "stopped"):
            # which numbers are the training batches' and which the last evaluation's, at which step
            # (accuracies as percentages with one decimal, as while running and in the help)
            where = f" Checkpoint: {self.out_dir}" if self.out_dir is not None else " (no checkpoint: MLP baseline)"
            if ev.get("step") is not None:  # the bar ends where the text says the run ended
                self.progress.setValue(ev["step"])
            self.status_label.setText(end_of_run_line(ev, self.events) + where)
        if kind in ("step", "eval"):
            self.export_bar.refresh()
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
            kept = (f" The last checkpoint in {self.out_dir} is kept." if self._checkpoint_ready else "")
            self.status_label.setText(f"The training process ended with code {code}: {' '.join(tail)}.{kept}")
        if self._checkpoint_ready and self.out_dir is not None:  # ready to be resumed
            self.resume_edit.setText(str(self.out_dir))
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


    # -- export (ExportBar view protocol; File > Export Current View) --------------------------
    def _export_name(self) -> str:
        return f"train-{self.run_dir.name}" if self.run_dir is not None else "train"

    def export_widget(self) -> QWidget:
        return self.plots_widget

    def export_unavailable(self) -> str | None:
        if any(e["event"] in ("step", "eval") for e in self.events):
            return None
        return "Nothing to export yet: start a run and its curves are drawn here."

    def _metric_columns(self) -> tuple[list[str], list[list]]:
        """The run's metrics by step: one row per step that logged anything, empty cells where it did not."""
        layers = list(self._grad_series)
        header = ["step", "train_loss", "lr", "val_loss", "val_accuracy", "train_accuracy",
                  *(f"grad_norm.{name}" for name in layers)]
        rows: dict[int, dict] = {}
        for ev in self.events:
            if ev["event"] == "step":
                row = rows.setdefault(ev["step"], {})
                row.update(train_loss=ev["train_loss"], lr=ev["lr"])
                row.update({f"grad_norm.{k}": v for k, v in ev.get("grad_norms", {}).items()})
            elif ev["event"] == "eval":
                rows.setdefault(ev["step"], {}).update(val_loss=ev["val_loss"], val_accuracy=ev["val_accuracy"],
                                                       train_accuracy=ev.get("train_accuracy"))
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
