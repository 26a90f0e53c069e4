"""The Train panel's form: the settings column (model, task, optimisation, output), what it describes as a
TrainConfig (config / set_config), its checks shown beside the settings and the parameter count.

Every option's box takes its range, first value and help from core.training.options; the form never
starts anything: the panel (training.py) reads config() and problems() and hands them to its run
controller (training_run.py). `checked` is emitted after each change has been checked.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtWidgets import (QApplication, QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout, QGroupBox,
                               QLabel, QLineEdit, QScrollArea, QSpinBox, QVBoxLayout, QWidget)

from ...app.training import BUILDER_SWITCHES, DEFAULT_ENCODER_DECODER, config_to_flags, families_for_task
from ...core.checkpoints import ModelLoadError
from ...core.config import ConfigError
from ...core.families import REGISTRY
from ...core.training import checkpoint_step
from ...core.training.options import MODEL_OPTIONS, OPTION, RUN_OPTIONS
from ...core.training.tasks import (DECLARED_TASKS, TaskError, TextTask, image_task_names, make_task,
                                    read_text_file, task_dimensions, task_names)
from ...core.training.trainer import (TrainConfig, best_device, default_precision, model_config_for, parameter_count,
                                      read_run_config, task_for, task_options_for, trains_causal, trains_seq2seq)
from ..widgets.form_fields import ask_text_file, path_row
from .training_run import new_run_dir, runs_root


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


# the form's boxes and rows that the panel shows as its own attributes (panel.task, panel.layers...)
MOE_OPTIONS = ("num_experts", "experts_per_token", "router_aux_loss_coef")  # TrainConfig.model keys
FORM_FIELDS = ("family", "layers", "decoder_layers", "heads", "d_model", "d_ff", "experts", "top_k", "aux_loss",
               "context", "norm_placement", "norm", "activation",
               "positions", "attention", "init", "dropout", "patch_size", "param_label", "model_error", "model_form",
               "model_box", "task", "length", "symbols", "p", "train_fraction", "text_file", "text_row", "tokenizer",
               "vocab_size", "image_folder", "image_folder_row", "channels", "image_size", "model_kind", "n_train",
               "task_error", "task_form", "optimizer", "lr", "lr_label", "weight_decay", "schedule", "warmup",
               "batch_size", "grad_clip", "steps", "eval_every", "checkpoint_every", "keep_every", "keep_spacing",
               "keep_max_gb", "seed", "device", "precision",
               "out_edit", "resume_check", "resume_edit", "out_error", "out_box")


class TrainingForm(QWidget):
    """The settings column of the Train panel (its scroll area and the wheel guard are the panel's)."""

    checked = Signal()  # the settings changed and were checked: problems() and the count are current

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._filled_from: Path | None = None  # the run whose saved settings the form shows (resume)
        self._task_check: tuple | None = None  # (key, message): the text file's check, cached
        self._counts: dict[str, int] = {}  # a model config's parameter count (built on the meta device: ~0.1 s)
        self._quiet = False  # several boxes change at once (a family's switches): checked once, after them
        defaults = TrainConfig()  # the settings the form has no box for: kept from the last config shown
        self._unboxed = {"momentum": defaults.momentum, "log_every": defaults.log_every, "betas": defaults.betas}
        self._build()
        self._on_task_changed()
        self._on_family_changed()

    def _build(self) -> None:
        v = QVBoxLayout(self)

        model_box = QGroupBox("Model")
        f = QFormLayout(model_box)
        self.family = _combo(families_for_task(task_names()[0]))
        # the model options' boxes (core.training.options), by TrainConfig.model key
        self._model_boxes = {o.key: _box(o.key) for o in MODEL_OPTIONS}
        (self.layers, self.decoder_layers, self.heads, self.d_model, self.d_ff, self.context, self.norm_placement,
         self.norm, self.activation, self.positions, self.attention, self.init, self.dropout, self.patch_size) = (
            self._model_boxes[k] for k in ("n_layers", "n_decoder_layers", "n_heads", "d_model", "d_ff",
                                           "context_length", "norm_placement", "norm", "activation", "positions",
                                           "attention_kind", "init", "dropout", "patch_size"))
        # a mixture of experts' (shown for the MoE families only)
        self.experts, self.top_k, self.aux_loss = (self._model_boxes[k] for k in MOE_OPTIONS)
        self.layers_label = QLabel("Layers")  # "Encoder layers" for an encoder-decoder
        self.param_label = QLabel("")
        self.param_label.setStyleSheet("font-weight: bold")
        self.param_label.setWordWrap(True)  # "(vocabulary not known yet)" must not widen the column
        for label, w in (("Family", self.family), (self.layers_label, self.layers),
                         ("Decoder layers", self.decoder_layers), ("Heads", self.heads),
                         ("d_model", self.d_model), ("d_ff", self.d_ff), ("Experts", self.experts),
                         ("Top-k experts", self.top_k), ("Router aux loss", self.aux_loss), ("Context", self.context),
                         ("Norm placement", self.norm_placement), ("Norm", self.norm),
                         ("Activation", self.activation), ("Positions", self.positions),
                         ("Attention", self.attention), ("Init", self.init), ("Dropout", self.dropout),
                         ("Patch size", self.patch_size), ("Parameters", self.param_label)):
            f.addRow(label, w)
        self.model_form = f
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
        self.text_row = path_row(self.text_file, "a UTF-8 text file", self._browse_text)
        self.tokenizer = _box("tokenizer")
        self.vocab_size = _box("vocab_size")
        self.image_folder = QLineEdit()  # the image-folder task: one sub-folder of images per class
        self.image_folder_row = path_row(self.image_folder, "a folder, one sub-folder of images per class",
                                         self._browse_image_folder)
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
        self.min_length = _box("min_length")  # the induction task's shortest repeat (0: always the length)
        self.min_length.setSpecialValueText("always the length")
        self.min_length.setToolTip(OPTION["min_length"].help)
        self._task_rows = {"length": self.length, "min_length": self.min_length, "symbols": self.symbols, "p": self.p,
                           "train_fraction": self.train_fraction, "text_file": self.text_row,
                           "tokenizer": self.tokenizer, "vocab_size": self.vocab_size,
                           "model_kind": self.model_kind, "n_train": self.n_train,
                           "image_folder": self.image_folder_row, "channels": self.channels,
                           "image_size": self.image_size}
        tf.addRow("Task", self.task)
        for name, label in (("model_kind", "Model"), ("length", "Length"), ("min_length", "Shortest repeat"),
                            ("n_train", "Training-set size"),
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
        self._run_boxes = {o.key: _box(o.key) for o in RUN_OPTIONS
                           if o.form or o.key in ("optimizer", "schedule", "keep_spacing")}
        (self.optimizer, self.lr, self.weight_decay, self.schedule, self.warmup, self.batch_size, self.grad_clip,
         self.steps, self.eval_every, self.checkpoint_every, self.seed) = (
            self._run_boxes[k] for k in ("optimizer", "lr", "weight_decay", "schedule", "warmup_steps", "batch_size",
                                         "grad_clip", "steps", "eval_every", "checkpoint_every", "seed"))
        from ...core.devices import available_devices
        self.device = _combo(available_devices(), best_device())
        self.precision = _combo(OPTION["precision"].choices, default_precision(self.device.currentText()))
        self.precision.setToolTip("Autocast precision; weights and checkpoints stay float32. Default: bfloat16 on "
                                  "CUDA (float16 with loss scaling without bfloat16 support), float32 elsewhere. "
                                  "On a CPU with AVX-512 BF16 or AMX, bfloat16 trains about 1.5x faster than "
                                  "float32 at width 128 and up (bench training); the smallest models gain nothing")
        self.device.currentTextChanged.connect(lambda d: self.precision.setCurrentText(default_precision(d)))
        self.lr_label = QLabel("Learning rate")
        for label, w in (("Optimizer", self.optimizer), (self.lr_label, self.lr),
                         ("Weight decay", self.weight_decay), ("Schedule", self.schedule), ("Warmup", self.warmup),
                         ("Batch size", self.batch_size), ("Grad clip (0 = off)", self.grad_clip),
                         ("Steps", self.steps), ("Eval every", self.eval_every),
                         ("Checkpoint every", self.checkpoint_every), ("Seed", self.seed),
                         ("Device", self.device), ("Precision", self.precision)):
            of.addRow(label, w)
        # kept checkpoints (core.training.timeline): what the loss curve's clicks and Across training open
        self.keep_every, self.keep_spacing, self.keep_max_gb = (
            self._run_boxes[k] for k in ("keep_every", "keep_spacing", "keep_max_gb"))
        for label, w in (("Keep every (0 = none)", self.keep_every), ("Keep spacing", self.keep_spacing),
                         ("Keep at most (GB)", self.keep_max_gb)):
            of.addRow(label, w)
        self.schedule.currentTextChanged.connect(self._on_schedule_changed)
        self._on_schedule_changed()
        v.addWidget(opt_box)
        # what the MLP baseline ignores (it trains with Adam, a constant rate, float32, on the CPU, no checkpoint)
        self._baseline_ignores = (self.optimizer, self.schedule, self.warmup, self.grad_clip, self.checkpoint_every,
                                  self.device, self.precision, self.keep_every, self.keep_spacing, self.keep_max_gb)

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

        for w in (self.layers, self.decoder_layers, self.heads, self.d_model, self.d_ff, self.context, self.p,
                  self.symbols,
                  self.length, self.vocab_size, self.dropout, self.patch_size, self.experts, self.top_k):
            w.valueChanged.connect(self._update_param_count)
        for w in (self.norm_placement, self.norm, self.activation, self.positions, self.attention, self.init,
                  self.tokenizer, self.family):
            w.currentTextChanged.connect(self._update_param_count)
        self.text_file.textChanged.connect(self._update_param_count)
        self.image_folder.textChanged.connect(self._update_param_count)
        self.channels.currentTextChanged.connect(self._update_param_count)
        self.image_size.valueChanged.connect(self._update_param_count)

    # -- form logic ------------------------------------------------------------------------
    def _browse_text(self) -> None:
        path = ask_text_file(self)
        if path:
            self.text_file.setText(path)
            self._update_param_count()  # also for the same path again, where textChanged does not fire

    def _browse_image_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Image folder (one sub-folder per class)")
        if path:
            self.image_folder.setText(path)

    def _on_task_changed(self) -> None:
        task = self.task.currentText()
        shown = task_options_shown(task)
        for name, w in self._task_rows.items():
            self.task_form.setRowVisible(w, name in shown)
        self._set_families(task)
        self._on_tokenizer_changed()
        self._apply_baseline()
        own = DECLARED_TASKS[task].defaults if task in DECLARED_TASKS else {}  # the task's own defaults
        if "length" in own:
            self.length.setValue(own["length"])
        self.symbols.setValue(own.get("symbols", OPTION["symbols"].initial))
        self._update_param_count()

    def _set_families(self, task: str) -> None:
        """The family list is the task's (app.training.families_for_task): an image task trains the image
        families (vit) only, translate the encoder-decoders only (marian first chosen), copy / reverse / sort
        every text family (an encoder-decoder trains their sequence-to-sequence version). An image task shows
        the patch size and hides what a ViT has no choice of (its context is 1 + patches; positions are learned)."""
        image = task in image_task_names()
        families = families_for_task(task)
        if [self.family.itemText(i) for i in range(self.family.count())] != families:
            previous = self.family.currentText()
            self.family.blockSignals(True)
            self.family.clear()
            self.family.addItems(families)
            if previous in families:
                self.family.setCurrentText(previous)
            elif DEFAULT_ENCODER_DECODER in families and not any(
                    not REGISTRY[name].encoder_decoder for name in families):
                self.family.setCurrentText(DEFAULT_ENCODER_DECODER)
            self.family.blockSignals(False)
            self._on_family_changed()
        for w in (self.context, self.positions, self.attention):
            self.model_form.setRowVisible(w, not image)
        self.model_form.setRowVisible(self.patch_size, image)

    def _on_tokenizer_changed(self) -> None:
        # the BPE vocabulary size means nothing to the character tokenizer
        shown = "vocab_size" in task_options_shown(self.task.currentText()) and self.tokenizer.currentText() == "bpe"
        self.task_form.setRowVisible(self.vocab_size, shown)

    def encoder_decoder(self) -> bool:
        """Whether the chosen family builds an encoder-decoder (then Layers are its encoder's and the decoder's
        layers have their own box)."""
        family = REGISTRY.get(self.family.currentText())
        return bool(family is not None and family.encoder_decoder)

    def mixture(self) -> bool:
        """Whether the chosen family builds a mixture of experts (then its experts, top-k and aux loss show)."""
        family = REGISTRY.get(self.family.currentText())
        return bool(family is not None and family.preset().num_experts)

    def _on_family_changed(self) -> None:
        family = self.family.currentText()
        preset = REGISTRY[family].preset()  # the family's own switches, with the builder's (BUILDER_SWITCHES)
        switches = {"norm_placement": preset.norm_placement, "norm": preset.norm, "activation": preset.activation,
                    "positions": preset.positions, **BUILDER_SWITCHES.get(family, {})}
        self._quiet = True  # each box's change would check the whole form: once, below
        try:
            for w, key in ((self.norm_placement, "norm_placement"), (self.norm, "norm"),
                           (self.activation, "activation"), (self.positions, "positions")):
                w.setCurrentText(switches[key])
        finally:
            self._quiet = False
        moe = self.mixture()
        for box, key in zip((self.experts, self.top_k, self.aux_loss), MOE_OPTIONS):
            self.model_form.setRowVisible(box, moe)
            if moe:  # the family's own (Mixtral: 8 experts, top-2, 0.001)
                box.setValue(getattr(preset, key))
        seq2seq = self.encoder_decoder()
        self.layers_label.setText("Encoder layers" if seq2seq else "Layers")
        self.model_form.setRowVisible(self.decoder_layers, seq2seq)
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
        if not self.encoder_decoder():  # one stack: no decoder layers to give
            del model["n_decoder_layers"]
        if not self.mixture():  # a dense MLP: no experts
            for key in MOE_OPTIONS:
                del model[key]
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
        if self.resuming():
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

    def _fill_from_resumed_run(self) -> None:
        """Resuming a run shows that run's saved settings (its run_config.json), once per chosen run."""
        if not self.resuming():
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
        return config_to_flags(self.config()) + self.launch_args(out or self.next_run_dir())

    def resuming(self) -> bool:
        return self.resume_check.isChecked() and not self.baseline()

    def next_run_dir(self) -> Path:
        """The folder the next run writes: the chosen run when resuming, else a new one in the runs folder."""
        if self.resuming():
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
            try:  # synthetic tasks build in milliseconds (an encoder-decoder's: their sequence-to-sequence version)
                make_task(cfg.task, cfg.task_options, encoder_decoder=trains_seq2seq(cfg))
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
        if self.resuming():
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

    def _parameters(self, model_cfg) -> int:
        """parameter_count(model_cfg), remembered: the form counts on every change, and an encoder-decoder
        built on the meta device takes a good part of a second (typing into a combo box must keep up)."""
        key = json.dumps(model_cfg.to_dict(), sort_keys=True, default=str)
        if key not in self._counts:
            if len(self._counts) > 256:
                self._counts.clear()
            self._counts[key] = parameter_count(model_cfg)
        return self._counts[key]

    def _update_param_count(self) -> None:
        """The parameter count and the checks of every settings group (they share the config)."""
        if not hasattr(self, "out_error") or self._quiet:  # still building the form: checked once it is complete
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
        self.checked.emit()

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
                self.param_label.setText(f"{self._parameters(mcfg):,}")
                self.param_label.setStyleSheet("font-weight: bold")
                self.param_label.setToolTip("")
                return ""
            if trains_seq2seq(cfg):  # the sequence-to-sequence task, built (milliseconds): its specials are the model's
                try:
                    mcfg = model_config_for(cfg, task_for(cfg, causal, encoder_decoder=True))
                except TaskError:  # said beside the task
                    self.param_label.setText("—")
                    self.param_label.setStyleSheet("")
                    return ""
                self.param_label.setText(f"{self._parameters(mcfg):,}")
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
            self.param_label.setText(f"{self._parameters(mcfg):,}{note}")
            self.param_label.setStyleSheet("font-weight: bold")
            self.param_label.setToolTip("")
            return ""
        except (ConfigError, ValueError) as exc:
            self.param_label.setText("invalid")
            self.param_label.setStyleSheet("font-weight: bold; color: #b00020")
            self.param_label.setToolTip(str(exc))
            return str(exc)
