"""Lipschitz panel: the local Lipschitz constant of attention against sequence length.

Controls pick the function (a model layer's attention sublayer or one head, masked or not, or a
synthetic head with chosen d, ||A||, ||V||, R, attention kind and seed, or with A and V loaded from
an .npz file) and the data (real windows,
the adversarial construction, a gradient-ascent search); Run calls core.lipschitz.run_sweep in a
worker, whose per-n results stream back through a queued signal. Each run is drawn on one
log-log plot (points, median per n, fitted exponent with its 95% CI in the legend, Theorem 3.1
bounds when they apply) with reference slopes C n^(1/4) and C n^(1/2); runs overlay until cleared.
"""
from __future__ import annotations

import html
import logging
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout, QHBoxLayout,
                               QHeaderView, QLabel, QLineEdit, QProgressBar, QPushButton, QSpinBox, QSplitter,
                               QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from ...app.lipschitz import plan_lengths
from ...core import lipschitz as lip
from ...core.jobs import Cancelled
from ...core.views.lipschitz import LipschitzViewState
from ..widgets.export import ExportBar, export_view
from ..widgets.legend_place import keep_legend_clear
from . import CANCEL_KEY, key_buttons

log = logging.getLogger("desktop_app")

RUN_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]


class _Stream(QObject):
    """Carries per-n results from the worker thread to the UI thread (queued connection)."""
    length_done = Signal(object, object, object)  # (_Run, LengthResult, SweepResult)


DEFAULT_LENGTHS = (4, 8, 16, 32, 64, 128)


def error_sentence(exc: BaseException) -> str:
    """One sentence for the user: our own ValueErrors already are one; a library's raw message
    (torch, numpy) is not shown, it goes to the log with its traceback."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return "not enough memory for this sweep: try shorter lengths or fewer samples"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror.lower()}" if exc.filename else exc.strerror
    if isinstance(exc, ValueError) and str(exc).strip():
        return str(exc).strip().splitlines()[0]
    return f"the sweep stopped on an unexpected error ({type(exc).__name__}); the details are in the log"


def _cell(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{v:.6g}" if np.isfinite(v) else ""  # an undefined bound is an empty cell, not "nan"
    return str(v)


def _two(x: float) -> str:
    """x to two decimals, a tiny negative exponent as 0.00 (not -0.00)."""
    text = f"{x:.2f}"
    return "0.00" if text == "-0.00" else text


def _first_words(text: str, words: int = 4, chars: int = 28) -> str:
    """The start of a text, quoted, to tell runs on different texts apart in the legend."""
    head = " ".join(text.split()[:words])
    if len(head) > chars:
        head = head[:chars].rstrip()
    return f"\u201c{head}\u2026\u201d" if head != " ".join(text.split()) else f"\u201c{head}\u201d"


class _Run:
    def __init__(self, label: str, colour: str) -> None:
        self.label, self.colour = label, colour
        self.notes: list[str] = []  # lengths skipped, samples reduced: said with the result
        self.result: lip.SweepResult | None = None
        self.items: list = []
        self.finished = False


class LipschitzPanel(QWidget):
    title = "Lipschitz"
    shortcuts = (("Ctrl+Return", "Run"), (CANCEL_KEY, "Cancel"))  # (key, what): the buttons' keys, listed in Help
    help_text = (
        "<b>What am I looking at?</b> How smooth self-attention is (Castin, Ablin, Peyré, ICML 2024). "
        "One head: f(X)<sub>i</sub> = V &Sigma;<sub>j</sub> P<sub>ij</sub> x<sub>j</sub>, "
        "P<sub>ij</sub> = softmax<sub>j</sub>(x<sub>i</sub><sup>T</sup>A<sup>T</sup>x<sub>j</sub>), "
        "A = W<sub>K</sub><sup>T</sup>W<sub>Q</sub>/&radic;d<sub>k</sub>; masked: f<sup>m</sup>(X)<sub>i</sub> = "
        "f(x<sub>1</sub>..x<sub>i</sub>)<sub>i</sub>. A model layer is measured as it is applied (input after "
        "the pre-attention norm, output before the residual add, biases, mask and rotary included). "
        "Each point is the <b>local Lipschitz constant</b> ||D<sub>X</sub>f||<sub>2</sub> at one input X of n "
        "tokens: the largest singular value of the Jacobian (Frobenius norm on (R<sup>d</sup>)<sup>n</sup>), "
        "estimated by Lanczos to a relative tolerance of 10<sup>-4</sup>.<br>"
        "<b>Theorem 3.1</b> on B<sub>R</sub><sup>n</sup> (tokens of norm &le; R): "
        "Lip(f) &le; &radic;3 ||V||<sub>2</sub> (||A||<sub>2</sub><sup>2</sup>R<sup>4</sup>(4n+1) + n)<sup>1/2</sup> "
        "and Lip(f) &ge; &radic;(n&minus;1) / (1 + (n&minus;1) e<sup>&minus;2R<sup>2</sup>&gamma;</sup>), "
        "&gamma; = max(&minus;&gamma;<sub>min</sub>, &gamma;<sub>max</sub>/8) over the real eigenvalues of A "
        "(V = I; drawn only where the theorem covers the function: softmax, no rotary, no query bias; the "
        "upper bound holds for masked attention too; the lower bound, for one unmasked head, is scaled by "
        "&sigma;<sub>min</sub>(V) and absent when V is singular, as for one head of a model). "
        "<b>Real</b> text grows roughly like n<sup>1/4</sup>; the <b>adversarial</b> construction "
        "(x<sub>1</sub> = Ru, x<sub>2..n</sub> = Ru/2, u the extreme real eigenvector of A) like n<sup>1/2</sup>. "
        "The legend gives each run's fitted exponent (least squares on log L vs log n) with its 95% CI; "
        "the grey reference lines are C n<sup>1/4</sup> (short light dashes) and C n<sup>1/2</sup> (long dark "
        "dashes).<br>"
        "<b>Encoder-decoders</b> (T5, BART, Marian): <i>Stack</i> picks what is measured. <i>Encoder "
        "self-attention</i>: a layer of the encoder on windows of the source text. <i>Decoder "
        "self-attention</i>: a layer of the decoder (causal) on windows of the decoder's input "
        "([start] + the target, or the chosen text file), the decoder reading the encoder's output on the "
        "source text. T5's relative position bias is a fixed bias of the scores (no Theorem 3.1 bounds then). "
        "<i>Cross-attention</i>: X &#8614; &Sigma;<sub>h</sub> W<sub>O,h</sub> softmax(X W<sub>Q,h</sub> "
        "(Y W<sub>K,h</sub>)<sup>T</sup>/&radic;d<sub>k</sub>) Y W<sub>V,h</sub>, a function of the decoder's "
        "input X (n decoder positions) with the encoder's output Y on the current source text held fixed: "
        "the Jacobian in X only. Each position's output reads its own query only, so the Jacobian is block "
        "diagonal and the constant is the largest over positions: it grows with n only as positions are "
        "added. No mask and no Theorem 3.1 (a self-attention theorem); the adversarial construction does "
        "not apply either (real data or the search).")

    def __init__(self, state, parent=None) -> None:
        super().__init__(parent)
        self.state = state
        self.runs: list[_Run] = []
        self._job = None
        self._current: _Run | None = None
        self._stream = _Stream()
        self._stream.length_done.connect(self._on_length)
        self._text_file: str | None = None
        self._matrices: tuple | None = None  # user (A, V) for the synthetic head
        self._matrices_file: str | None = None
        self.notes: list[str] = []  # what the last spec() skipped or reduced, said when the run ends
        # a workspace's form, shown again once the model it opens arrives (a new model resets the form)
        self._restore_on_model: LipschitzViewState | None = None

        # -- controls -----------------------------------------------------------------------
        self.source = QComboBox()
        self.source.addItems(["Model layer", "Synthetic head"])
        self.layer = QSpinBox()
        self.stack = QComboBox()  # an encoder-decoder's: which stack's attention (hidden for other models)
        for key, label in (("encoder", "Encoder self-attention"), ("decoder", "Decoder self-attention"),
                           ("cross", "Cross-attention")):
            self.stack.addItem(label, key)
        self.stack.setToolTip("Cross-attention is measured as a function of the decoder's input, with the "
                              "encoder's output on the source text held fixed")
        self.head = QComboBox()
        self.masked = QCheckBox("masked (causal)")
        # the input sources are the core's registry, in its order (the CLI's --data choices too)
        self.model_sources = lip.sources_for(lip.MODEL)
        self.synthetic_sources = lip.sources_for(lip.SYNTHETIC)
        self.data = QComboBox()
        self.data.addItems([source.label for source in self.model_sources])
        self.search_start = QComboBox()
        self.search_start.addItems(["random", "real"])
        self.text_button = QPushButton("Current text")
        self.text_button.setToolTip("Real windows come from the current text; click to choose a text file")
        self.d = QSpinBox()
        self.d.setRange(2, 1024)
        self.d.setValue(16)
        self.norm_A = self._double(1.0, 0.0, 1e3)
        self.norm_V = self._double(1.0, 0.0, 1e3)
        self.radius = self._double(0.0, 0.0, 1e4)
        self.radius.setSpecialValueText("auto")
        self.radius.setToolTip("R; auto = 1 for synthetic, the radius observed on real data for a model")
        self.attention = QComboBox()
        self.attention.addItems(list(lip.ATTENTION_KINDS))
        self.synthetic_data = QComboBox()
        self.synthetic_data.addItems([source.label for source in self.synthetic_sources])
        self.matrices_button = QPushButton("Load A, V\u2026")
        self.matrices_button.setToolTip("Use your own A and V: an .npz file with arrays named A and V, both [d, d] "
                                        "(numpy.savez(path, A=A, V=V)). Cancel the dialog to go back to random "
                                        "matrices with the d, ||A|| and ||V|| above.")
        self.seed = QSpinBox()
        self.seed.setRange(0, 2_147_483_647)
        self.seed.setToolTip("Seeds the random A and V, the inputs drawn in B_R and the estimator's start vectors")
        self.lengths = QLineEdit(",".join(map(str, DEFAULT_LENGTHS)))
        self._lengths_typed = False  # the user's own lengths are kept; the defaults follow the text
        self.lengths.setToolTip("comma-separated, or geom:LO:HI:COUNT (e.g. geom:2:512:10)")
        self.samples = QSpinBox()
        self.samples.setRange(1, 256)
        self.samples.setValue(5)
        self.run_button = QPushButton("Run")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.clear_button = QPushButton("Clear runs")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.status = QLabel("Pick a function and lengths, then Run.")
        self.status.setWordWrap(True)
        self.status.setMinimumHeight(48)
        self.status.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)

        self.form = form = QFormLayout()
        form.addRow("Function", self.source)
        self.model_rows = [("Stack", self.stack), ("Layer", self.layer), ("Head", self.head), ("Data", self.data),
                           ("Search start", self.search_start), ("Text", self.text_button)]
        self.synthetic_rows = [("d", self.d), ("||A||\u2082", self.norm_A), ("||V||\u2082", self.norm_V),
                               ("Matrices", self.matrices_button), ("Attention", self.attention),
                               ("Inputs", self.synthetic_data), ("Seed", self.seed)]
        for label, w in self.model_rows + self.synthetic_rows:
            form.addRow(label, w)
        form.addRow("", self.masked)
        form.addRow("Radius R", self.radius)
        form.addRow("Lengths n", self.lengths)
        form.addRow("Samples K", self.samples)
        buttons = QHBoxLayout()
        for b in (self.run_button, self.cancel_button, self.clear_button):
            buttons.addWidget(b)
        left = QVBoxLayout()
        left.addLayout(form)
        left.addLayout(buttons)
        left.addWidget(self.progress)
        left.addWidget(self.status)
        left.addStretch(1)
        left_w = QWidget()
        left_w.setLayout(left)
        left_w.setMaximumWidth(340)

        # -- plot and table ---------------------------------------------------------------------
        self.plot = pg.PlotWidget(background="w")
        self.plot.setLogMode(True, True)
        self.plot.showGrid(x=True, y=True, alpha=0.25)
        self.plot.setLabel("bottom", "sequence length n")
        self.plot.setLabel("left", "local Lipschitz constant \u2016D\u2093f\u2016\u2082")
        # the constants as they are: a ViT's 0.011 read "10\u00b9 (x0.001)" on the log axis, beside the table's 0.0112
        self.plot.getAxis("left").enableAutoSIPrefix(False)
        self.legend = self.plot.addLegend(offset=(10, 10), labelTextColor="k", brush=(255, 255, 255, 215))
        keep_legend_clear(self.plot)  # in the corner the runs leave free (it was over a T5's points)
        self.table = QTableWidget(0, 8)
        self.table.setHorizontalHeaderLabels(["run"] + list(lip.CSV_COLUMNS))
        header = self.table.horizontalHeader()  # the numbers' columns as wide as they are; the run's label the rest
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self._fit_number_columns()
        # one line a row: a label too long for its cell is cut (its tooltip holds it), never wrapped onto a second line
        # that the row's height cuts ('demo-model …' over 'model L0…' at 1024 px)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.export_bar = ExportBar(lambda: self, lambda: "lipschitz")
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.plot)
        right.addWidget(self.table)
        right.setStretchFactor(0, 3)
        right.setStretchFactor(1, 1)
        right_w = QWidget()
        rl = QVBoxLayout(right_w)
        rl.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        self.summary = QLabel("")
        self.summary.setWordWrap(True)  # many runs' exponents wrap instead of widening the window
        top.addWidget(self.summary, 1)
        top.addWidget(self.export_bar)
        rl.addLayout(top)
        rl.addWidget(right, 1)
        lay = QHBoxLayout(self)
        lay.addWidget(left_w)
        lay.addWidget(right_w, 1)

        self.source.currentIndexChanged.connect(self._update_visibility)
        self.data.currentIndexChanged.connect(self._update_visibility)
        self.stack.currentIndexChanged.connect(self._stack_chosen)
        self.run_button.clicked.connect(self.run)
        self.cancel_button.clicked.connect(self.cancel)
        self.clear_button.clicked.connect(self.clear_runs)
        key_buttons(self.shortcuts, (self.run_button, self.cancel_button))
        self.text_button.clicked.connect(self._choose_text_file)
        self.matrices_button.clicked.connect(self._choose_matrices_file)
        # the model-dependent rows follow the model (AppState's one signal for new inputs); runs already
        # drawn stay as overlays: each is labelled with the model (and text) it was computed on
        state.inputs_changed.connect(self._on_inputs_changed)
        self.lengths.textEdited.connect(lambda *_: setattr(self, "_lengths_typed", True))
        if hasattr(state, "text_changed"):
            state.text_changed.connect(lambda *_: self._fit_default_lengths())
        self._on_model_changed(getattr(state, "loaded", None))

    @staticmethod
    def _double(value: float, lo: float, hi: float) -> QDoubleSpinBox:
        w = QDoubleSpinBox()
        w.setRange(lo, hi)
        w.setDecimals(3)
        w.setValue(value)
        return w

    # -- controls ---------------------------------------------------------------------------
    def _on_inputs_changed(self, _key, changed) -> None:
        if "model" in changed:
            self._on_model_changed(self.state.loaded)

    def _on_model_changed(self, loaded) -> None:
        """A new model: the rows that depend on it are reset to what it supports (its layers and heads,
        the mask it was trained with, the data it reads)."""
        self.head.clear()
        self.head.addItem("whole sublayer")
        if loaded is None:
            self.layer.setRange(0, 0)
            self.source.setCurrentIndex(1)
        else:
            cfg = loaded.config
            self.layer.setRange(0, cfg.n_layers - 1)
            self.head.addItems([f"head {h}" for h in range(cfg.n_heads)])
            self.masked.setChecked(cfg.causal)  # a decoder's causal mask; none for BERT or a ViT
            self.source.setCurrentIndex(0)
            if cfg.is_encoder_decoder:
                self.stack.setCurrentIndex(0)
                self._stack_chosen()
        self._fit_sources_to_model(loaded, reset=True)
        self._update_visibility()
        self._fit_default_lengths()
        if loaded is not None and self._restore_on_model is not None:
            restored, self._restore_on_model = self._restore_on_model, None
            self._show_view_state(restored)

    def _fit_default_lengths(self) -> None:
        """The default lengths, up to the text on screen (and the context): a 51-token text gets
        4,8,16,32, not lengths the first Run would skip. Lengths the user typed are kept."""
        if self._lengths_typed:
            return
        try:
            ids = self._token_ids() if self.state.loaded is not None else None
        except ValueError:  # a text the tokenizer refuses: said when Run plans the sweep
            ids = None
        longest = len(ids) if ids else max(DEFAULT_LENGTHS)
        cfg = self.state.loaded.config if self.state.loaded is not None else None
        if cfg is not None and cfg.positions in ("learned", "sinusoidal"):
            longest = min(longest, cfg.context_length)
        # (not the text's own length: one window of it would reduce Samples K to 1 at every length; a text
        # too short for two of them keeps them all, and Run takes windows from the demo text, as it says)
        fits = [n for n in DEFAULT_LENGTHS if n <= longest]
        self.lengths.setText(",".join(map(str, fits if len(fits) >= 2 else DEFAULT_LENGTHS)))

    def _source_problem(self, name: str, cfg) -> str:
        """Why the model input source `name` cannot feed this model ("" when it can)."""
        images = cfg is not None and cfg.input_kind == "patches"
        if name == "image" and not images:
            return "image patches need a vision transformer (ViT): this model reads tokens"
        if name == "real" and images:
            return "real text windows need a text model: this model reads images (use image patches)"
        return ""

    def _fit_sources_to_model(self, loaded, reset: bool) -> None:
        """Disable the data sources (and the search's real start) that cannot feed this model, saying why
        in their tooltips; with `reset`, or when the choice is one of them, choose the model's own data:
        image patches for a ViT, real text otherwise."""
        from PySide6.QtGui import QStandardItemModel

        cfg = loaded.config if loaded is not None else None
        images = cfg is not None and cfg.input_kind == "patches"
        items = self.data.model()
        for i, source in enumerate(self.model_sources):
            problem = self._source_problem(source.name, cfg)
            if isinstance(items, QStandardItemModel):
                items.item(i).setEnabled(not problem)
            self.data.setItemData(i, problem or source.description, Qt.ItemDataRole.ToolTipRole)
        starts = self.search_start.model()
        if isinstance(starts, QStandardItemModel):
            starts.item(1).setEnabled(not images)  # "real": windows of a text
            self.search_start.setItemData(1, "a ViT reads images: the search starts from random inputs" if images
                                          else "", Qt.ItemDataRole.ToolTipRole)
        if images and self.search_start.currentIndex() == 1:
            self.search_start.setCurrentIndex(0)
        names = [s.name for s in self.model_sources]
        if reset or self._source_problem(self._model_source().name, cfg):
            self.data.setCurrentIndex(names.index("image" if images else "real"))

    def _stack(self) -> str | None:
        """The encoder-decoder's stack chosen (None for a one-stack model)."""
        loaded = self.state.loaded
        if loaded is None or not loaded.config.is_encoder_decoder:
            return None
        return self.stack.currentData()

    def _stack_chosen(self, *_) -> None:
        """The layer box within the stack's layers; the decoder's mask on, cross-attention none."""
        stack, loaded = self._stack(), self.state.loaded
        if stack is None:
            return
        cfg = loaded.config
        self.layer.setRange(0, (cfg.n_layers if stack == "encoder" else cfg.n_decoder_layers) - 1)
        self.masked.setChecked(stack == "decoder")
        self.masked.setEnabled(stack != "cross")
        self.masked.setToolTip("cross-attention has no mask: every decoder position reads the whole source"
                               if stack == "cross" else "")

    def _update_visibility(self) -> None:
        synthetic = self.source.currentIndex() == 1
        form = self.form
        for _label, w in self.model_rows:
            form.setRowVisible(w, not synthetic)
        if not synthetic:
            form.setRowVisible(self.stack, self._stack() is not None)
        for _label, w in self.synthetic_rows:
            form.setRowVisible(w, synthetic)
        if not synthetic:
            form.setRowVisible(self.search_start, self._model_source().name == "search")
            form.setRowVisible(self.text_button, self._model_source().name != "image")  # a ViT's digits, no text

    # -- workspace (MainWindow saves view_state and gives it back with set_view_state) ----------
    VIEW_TABLE = None  # no views table: the form is the panel's whole view state

    @property
    def view_state(self) -> LipschitzViewState:
        """The form's choices (not the results)."""
        head = self.head.currentIndex() - 1
        return LipschitzViewState(
            function=lip.SYNTHETIC if self.source.currentIndex() == 1 else lip.MODEL, layer=self.layer.value(),
            stack=self._stack() or "",
            head=None if head < 0 else head, data=self._model_source().name,
            search_start=self.search_start.currentText(), text_file=self._text_file or "", d=self.d.value(),
            norm_A=self.norm_A.value(), norm_V=self.norm_V.value(), matrices_file=self._matrices_file or "",
            attention=self.attention.currentText(), synthetic_data=self._synthetic_source().name,
            seed=self.seed.value(), masked=self.masked.isChecked(), radius=self.radius.value(),
            lengths=self.lengths.text(), samples=self.samples.value())

    def set_view_state(self, state: LipschitzViewState) -> None:
        """Show a workspace's form now, and again when a model arrives: opening the workspace's model
        resets the model rows (layer range, heads, mask), which would otherwise undo them."""
        self._show_view_state(state)
        # only for a model on its way (a workspace opening its model) or the first one: a later model,
        # opened by the user after the form was shown on this one, gets its own defaults
        waiting = self.state.loaded is None or getattr(self.state, "loading", None)
        self._restore_on_model = state if waiting else None

    def _show_view_state(self, state: LipschitzViewState) -> None:
        # a name this version lacks (a source, an attention kind) keeps the current choice
        def pick(combo: QComboBox, names: list[str], name: str) -> None:
            if name in names:
                combo.setCurrentIndex(names.index(name))

        self.source.setCurrentIndex(1 if state.function == lip.SYNTHETIC else 0)
        if state.stack and self._stack() is not None and self.stack.findData(state.stack) >= 0:
            self.stack.setCurrentIndex(self.stack.findData(state.stack))
        self.layer.setValue(state.layer)  # clamped to the open model's layers
        self.head.setCurrentIndex(0 if state.head is None or state.head + 1 >= self.head.count() else state.head + 1)
        pick(self.data, [s.name for s in self.model_sources], state.data)
        pick(self.search_start, ["random", "real"], state.search_start)
        self.set_text_file(state.text_file or None)
        for spin, value in ((self.d, state.d), (self.norm_A, state.norm_A), (self.norm_V, state.norm_V),
                            (self.seed, state.seed), (self.radius, state.radius), (self.samples, state.samples)):
            spin.setValue(value)
        if state.matrices_file != (self._matrices_file or ""):
            self.set_matrices_file(state.matrices_file or None)  # a file gone since says so in the status line
        pick(self.attention, list(lip.ATTENTION_KINDS), state.attention)
        pick(self.synthetic_data, [s.name for s in self.synthetic_sources], state.synthetic_data)
        self.masked.setChecked(state.masked)
        self.lengths.setText(state.lengths)
        self._lengths_typed = True  # a workspace's lengths are the user's
        self._fit_sources_to_model(self.state.loaded, reset=False)  # a source this model cannot read: its own
        self._update_visibility()

    def _choose_text_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Text for real windows", "", "Text (*.txt);;All files (*)")
        self.set_text_file(path or None)

    def set_text_file(self, path: str | None) -> None:
        self._text_file = path
        self.text_button.setText(Path(path).name if path else "Current text")

    def _choose_matrices_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "A and V of the synthetic head", "",
                                              "NumPy archive with arrays A and V (*.npz);;All files (*)")
        self.set_matrices_file(path or None)

    def set_matrices_file(self, path: str | None) -> bool:
        """Use the A and V of an .npz file for the synthetic head (None: random matrices again).
        A bad file leaves the current choice as it was and says what is wrong in the status line."""
        if not path:
            self._matrices = self._matrices_file = None
            self.matrices_button.setText("Load A, V\u2026")
            for w in (self.d, self.norm_A, self.norm_V):
                w.setEnabled(True)
            return True
        try:
            A, V = lip.load_matrices(path)
        except (ValueError, OSError) as exc:
            self.status.setText(f"<span style='color:#b00'>{html.escape(str(exc), quote=False)}</span>")
            return False
        self._matrices, self._matrices_file = (A, V), str(path)
        d = A.shape[0]
        self.matrices_button.setText(f"A, V: {Path(path).name} (d={d})")
        for w in (self.d, self.norm_A, self.norm_V):  # set by the file
            w.setEnabled(False)
        self.status.setText(html.escape(f"A and V ({d}x{d}) from {path}; the synthetic head uses them.", quote=False))
        return True

    def _model_source(self) -> lip.InputSource:
        return self.model_sources[max(self.data.currentIndex(), 0)]

    def _synthetic_source(self) -> lip.InputSource:
        return self.synthetic_sources[max(self.synthetic_data.currentIndex(), 0)]

    def _token_ids(self) -> list[int] | None:
        """The ids of the chosen text file, else of the current text (typed ids without a tokenizer)."""
        from ...core import inputs

        loaded = self.state.loaded
        if self._stack() in ("decoder", "cross") and not self._text_file:
            return list(self.state.decoder_ids) or None  # the decoder's windows: [start] + the target
        if loaded is None or loaded.tokenizer is None:
            return list(self.state.token_ids) or None
        if self._text_file:
            return inputs.text_file_ids(loaded, self._text_file)
        text = self.state.text
        if not text.strip():
            return self._demo_ids()
        return inputs.encode(loaded.tokenizer, text, loaded.config.vocab_size).ids or None

    def _demo_ids(self) -> list[int] | None:
        """The bundled demo text with the open model's tokenizer (None when it has none or cannot)."""
        from ...core import inputs
        from ...paths import demo_text_path

        loaded = self.state.loaded
        if loaded is None or loaded.tokenizer is None:
            return None
        try:
            return inputs.text_file_ids(loaded, demo_text_path())
        except ValueError:
            return None

    def _plan(self, data: str, lengths: list[int], ids: list[int] | None, samples: int):
        """(lengths, ids, notes, data name): app.lipschitz.plan_lengths for these controls (the CLI's plan too),
        and what the windows come from named for the run's label."""
        loaded = self.state.loaded
        decoder = self._stack() in ("decoder", "cross")  # windows of the decoder's input: [start] + the target
        where = Path(self._text_file).name if self._text_file else ("the target" if decoder else "the text")
        longer = "choose a longer text with the Text button" if loaded.tokenizer else "type more token ids"
        plan = plan_lengths(loaded.config, data, lengths, ids, samples, search_start=self.search_start.currentText(),
                            where=where, fallback=None if self._text_file or decoder else self._demo_ids,
                            longer=f"type a longer target in the Model panel, or {longer}" if decoder else longer)
        name = {"the text": _first_words(self.state.text), "the demo text": "demo text",
                "the target": "target " + _first_words(self.state.target)}.get(plan.where, plan.where)
        return plan.lengths, plan.ids, plan.notes, name

    def spec(self) -> lip.SweepSpec:
        """The sweep the controls describe (raises ValueError with a readable message): the same plain
        options the CLI gives core's build_sweep_spec, with the estimator's tolerance and the search's
        steps at their defaults (no controls for them here)."""
        lengths = lip.parse_lengths(self.lengths.text())
        radius = self.radius.value() or None
        self.notes = []
        common = dict(lengths=lengths, samples=self.samples.value(), radius=radius, masked=self.masked.isChecked(),
                      tol=lip.DEFAULT_TOL)
        if self.source.currentIndex() == 1:
            source = self._synthetic_source()
            self.notes = plan_lengths(None, source.name, lengths, None, self.samples.value(),
                                      function=lip.SYNTHETIC).notes
            matrices = self._matrices
            return lip.build_sweep_spec(dict(
                function=lip.SYNTHETIC, data=source.name, d=self.d.value(), norm_A=self.norm_A.value(),
                norm_V=self.norm_V.value(), matrices=matrices,
                matrices_name=Path(self._matrices_file).name if matrices is not None else "",
                attention=self.attention.currentText(), seed=self.seed.value(), **common))
        loaded = self.state.loaded
        if loaded is None:
            raise ValueError("open a model first, or choose a synthetic head")
        data = self._model_source().name
        needs_text = lip.get_source(data, lip.MODEL).needs_text or (
            data == "search" and self.search_start.currentText() == "real")
        if needs_text:
            ids = self._token_ids()
        else:  # only for the default radius (observed on real data): random tokens stand in without a text
            try:
                ids = self._token_ids() if radius is None else None
            except ValueError:
                ids = None
        common["lengths"], ids, self.notes, data_name = self._plan(data, sorted(set(lengths)), ids,
                                                                    self.samples.value())
        head = self.head.currentIndex() - 1
        stack = self._stack()
        if stack is not None:  # an encoder-decoder: the stack, and the source its decoder reads
            common["stack"], common["source_ids"] = stack, list(self.state.token_ids) or None
            if stack == "cross":
                common["masked"] = False
        # the seed control belongs to the synthetic head's rows (hidden here): a model's sweep uses the default
        return lip.build_sweep_spec(dict(
            function=lip.MODEL, data=data, model=loaded.model, layer=self.layer.value(),
            head=None if head < 0 else head, token_ids=ids, data_name=data_name, search_start=self.search_start.currentText(),
            search_steps=lip.DEFAULT_SEARCH_STEPS, seed=lip.DEFAULT_SEED, **common))

    # -- running ----------------------------------------------------------------------------
    def run(self) -> None:
        if self.is_running():
            return
        try:
            spec = self.spec()
        except (ValueError, OSError) as exc:
            self.status.setText(f"<span style='color:#b00'>{html.escape(error_sentence(exc), quote=False)}</span>")
            return
        from ..workers import run_job

        colour = RUN_COLOURS[len(self.runs) % len(RUN_COLOURS)]
        spec.label = self._label(spec)
        run = _Run(spec.label, colour)
        self.runs.append(run)
        self._current = run
        run.notes = list(self.notes)
        self.progress.setRange(0, len(spec.lengths))
        self.progress.setValue(0)
        running = f"running {spec.label}\u2026" + "".join(f" ({n})" for n in run.notes)
        self.status.setText(html.escape(running, quote=False))
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        stream = self._stream

        def on_length(res, result) -> None:  # worker thread
            try:
                stream.length_done.emit(run, res, result.snapshot())
            except RuntimeError:  # the panel was deleted (the window closed): stop, nobody is watching
                raise Cancelled() from None

        self._job = run_job(lip.run_sweep, spec, on_length=on_length, owner=self,
                            on_result=lambda result: self._on_finished_run(run, result),
                            on_error=lambda exc, tb: self._on_failed(run, exc, tb),
                            on_progress=self._on_progress, on_cancelled=lambda: self._on_cancelled(run))

    def _label(self, spec: lip.SweepSpec) -> str:
        """What the legend and the table call a run (core's sweep_label in its panel form): the
        model's name leads, so runs of several models overlaid on one plot stay told apart."""
        return lip.sweep_label(spec, model_name=getattr(self.state.loaded, "name", "") or "model")

    def cancel(self) -> None:
        if self._job is not None:
            self._job.cancel()
            self.status.setText("cancelling\u2026")

    def _on_progress(self, done: int, total: int, message: str) -> None:
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)

    def _on_length(self, run: _Run, res: lip.LengthResult, result: lip.SweepResult) -> None:
        # the run travels with its results: a queued one may arrive after the next run started
        if run not in self.runs:
            return  # cleared meanwhile
        run.result = result
        self._append_rows(run, res)
        self.redraw()

    def _on_finished_run(self, run: _Run, result: lip.SweepResult) -> None:
        run.result, run.finished = result, True
        e, (lo, hi) = result.exponent, result.exponent_ci
        if np.isfinite(lo):
            fit = f"exponent {e:.3f} [{lo:.3f}, {hi:.3f}] (95% CI)"
        elif np.isfinite(e):
            fit = f"exponent {e:.3f} (too few lengths for a confidence interval)"
        else:
            fit = "one length only: no exponent fitted"
        self._done(html.escape(f"{run.label}: {fit}" + "".join(f". Note: {n}" for n in run.notes), quote=False))
        self.redraw()

    def _on_failed(self, run: _Run, exc: BaseException, tb: str = "") -> None:
        if run.result is None:
            self.runs.remove(run)
        message = error_sentence(exc)
        if message.startswith("the sweep stopped on an unexpected error"):
            log.error("Lipschitz sweep %s failed\n%s", run.label, tb or repr(exc))
        message = html.escape(f"{run.label} failed: {message}", quote=False)
        self._done(f"<span style='color:#b00'>{message}</span>")
        self.redraw()

    def _on_cancelled(self, run: _Run) -> None:
        if run.result is None:
            self.runs.remove(run)
        self._done(f"cancelled {run.label}" + (" (partial results kept)" if run.result is not None else ""))
        self.redraw()

    def _done(self, message: str) -> None:
        self.status.setText(message)
        self.run_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self._current = None

    def is_running(self) -> bool:
        """Until the run's end has been handled here (the worker may be done before its queued
        results and end signal reach the UI thread)."""
        return self._current is not None

    def clear_runs(self) -> None:
        if self.is_running():
            return
        self.runs.clear()
        self.table.setRowCount(0)
        self._fit_number_columns()
        self.redraw()

    # -- drawing ------------------------------------------------------------------------------
    def _append_rows(self, run: _Run, res: lip.LengthResult) -> None:
        for s in range(len(res.lipschitz)):
            r = self.table.rowCount()
            self.table.insertRow(r)
            values = [run.label, res.n, s, res.lipschitz[s], res.radius[s], res.upper_bound[s], res.lower_bound[s],
                      int(res.iterations[s])]
            for c, v in enumerate(values):
                self.table.setItem(r, c, QTableWidgetItem(_cell(v)))
            self.table.item(r, 0).setToolTip(run.label)  # (a long label is cut in its cell)
            self._fit_number_columns(r)

    NUMBER_PADDING = 12  # (a cell draws its text 3 px in from either side)

    def _fit_number_columns(self, row: int | None = None) -> None:
        """Each number column as wide as its title (row None: an empty table) or at least as wide as `row`'s number,
        with room: as wide as '0.00000000' each, they left the run's label ~85 px at 1024 px."""
        fm, header = self.table.fontMetrics(), self.table.horizontalHeader()
        for c in range(1, self.table.columnCount()):
            if row is None:
                header.resizeSection(c, fm.horizontalAdvance(self.table.horizontalHeaderItem(c).text())
                                     + self.NUMBER_PADDING)
            else:
                needed = fm.horizontalAdvance(self.table.item(row, c).text()) + self.NUMBER_PADDING
                if header.sectionSize(c) < needed:
                    header.resizeSection(c, needed)

    def redraw(self) -> None:
        self.plot.clear()
        self.legend.clear()
        anchor = None
        for run in self.runs:
            res = run.result
            if res is None or not res.lengths:
                continue
            ns = np.array([r.n for r in res.lengths], dtype=float)
            pts_n = np.concatenate([np.full(len(r.lipschitz), r.n, dtype=float) for r in res.lengths])
            pts_L = np.concatenate([r.lipschitz for r in res.lengths])
            med = np.array([np.median(r.lipschitz) for r in res.lengths])
            ok = pts_L > 0
            self.plot.plot(pts_n[ok], pts_L[ok], pen=None, symbol="o", symbolSize=5,
                           symbolBrush=pg.mkColor(run.colour + "80"), symbolPen=None)
            e, (lo, hi) = res.exponent, res.exponent_ci
            fit = f"{_two(e)} [{_two(lo)}, {_two(hi)}]" if np.isfinite(lo) else (_two(e) if np.isfinite(e) else "-")
            self.plot.plot(ns, med, pen=pg.mkPen(run.colour, width=2), symbol="s", symbolSize=7,
                           symbolBrush=run.colour, name=f"{run.label}: exponent {fit}")
            if np.isfinite(res.prefactor) and len(ns) > 1:
                self.plot.plot(ns, res.prefactor * ns ** e, pen=pg.mkPen(run.colour, width=1, style=Qt.PenStyle.DotLine))
            R = float(np.median(np.concatenate([r.radius for r in res.lengths])))
            up = np.array([np.median(r.upper_bound) for r in res.lengths])
            if np.isfinite(up).all():  # Theorem 3.1 at the radius observed for each n
                self.plot.plot(ns, up, pen=pg.mkPen(run.colour, width=1, style=Qt.PenStyle.DashDotLine),
                               name=f"{run.label}: Thm 3.1 upper (R≈{R:.3g})")
            low = np.array([np.median(r.lower_bound) for r in res.lengths])
            if np.isfinite(low).all() and (low > 0).all():
                self.plot.plot(ns, low, pen=pg.mkPen(run.colour, width=1, style=Qt.PenStyle.DashDotDotLine),
                               name=f"{run.label}: Thm 3.1 lower")
            if anchor is None:
                anchor = (ns, med)
        if anchor is not None and len(anchor[0]) > 1:
            ns, med = anchor
            grid = np.geomspace(ns.min(), ns.max(), 20)
            # told apart by dash and shade: short grey dashes n^1/4 (real text), long dark dashes n^1/2
            for power, colour, dashes in ((0.25, "#999999", [2, 3]), (0.5, "#444444", [9, 4])):
                C = med[0] / ns[0] ** power
                pen = pg.mkPen(colour, width=1.5)
                pen.setDashPattern(dashes)
                self.plot.plot(grid, C * grid ** power, pen=pen, name=f"C n^{'1/4' if power == 0.25 else '1/2'}")
        # label the lengths actually measured (pyqtgraph's log-axis minor labels collide)
        all_n = sorted({r.n for run in self.runs if run.result is not None for r in run.result.lengths})
        if len(all_n) > 12:
            all_n = all_n[:: int(np.ceil(len(all_n) / 12))]
        self.plot.getAxis("bottom").setTicks([[(float(np.log10(n)), str(n)) for n in all_n], []] if all_n else None)
        done = [r for r in self.runs if r.result is not None]
        self.summary.setText("; ".join(f"<span style='color:{r.colour}'>{html.escape(r.label, quote=False)}: "
                                       f"n^{_two(r.result.exponent)}</span>"
                                       for r in done if np.isfinite(r.result.exponent)))

    # -- export (ExportBar view protocol) -------------------------------------------------------
    def export_widget(self) -> QWidget:
        return self.plot

    def svg_item(self):
        return self.plot.getPlotItem()

    def csv_table(self):
        header = ["run"] + list(lip.CSV_COLUMNS)
        rows = [[run.label, *row] for run in self.runs if run.result is not None for row in run.result.rows()]
        return header, rows

    def export_arrays(self) -> dict:
        out = {}
        for i, run in enumerate(self.runs):
            if run.result is not None:
                out[f"run{i}"] = np.array(run.result.rows(), dtype=float)
                out[f"run{i}_exponent"] = np.array([run.result.exponent, *run.result.exponent_ci])
        return out

    def export(self, path: str | Path) -> None:
        """Write the plot (.png/.svg) or the results (.csv/.npz) to path."""
        export_view(self, path)

    # -- --screenshot ---------------------------------------------------------------------------
    def screenshot_demo(self) -> None:
        """The README's comparison on the open model's layer 0, n = 4..256, five inputs per n: head 1 on
        real text windows, the same head on the paper's adversarial inputs, and the whole masked
        sublayer on real text (synthetic real against adversarial heads when no model is open)."""
        from ..demo import ScriptedDemo

        def configure(source: int, data: str = "real", head: int = 0, masked: bool = False,
                      synthetic_adversarial: bool = False):
            def apply() -> None:
                self.source.setCurrentIndex(source)
                self.data.setCurrentText(data)
                self.synthetic_data.setCurrentIndex(int(synthetic_adversarial))
                self.layer.setValue(0)
                self.head.setCurrentIndex(min(head, self.head.count() - 1))
                self.masked.setChecked(masked)
                self.run()
            return apply

        self.lengths.setText("4,8,16,32,64,128,256")
        self.samples.setValue(5)
        if self.state.loaded is None:
            runs = [configure(1), configure(1, synthetic_adversarial=True)]
        else:
            from ...paths import demo_text_path

            if self.state.loaded.tokenizer is not None and demo_text_path().is_file():
                self.set_text_file(str(demo_text_path()))  # windows of up to 256 tokens of Alice
            runs = [configure(0, "real", head=2), configure(0, "adversarial", head=2), configure(0, "real", masked=True)]
            if self.state.loaded.config.input_kind == "patches":  # a ViT: its own images, attention unmasked
                runs = [configure(0, "image patches", head=2), configure(0, "adversarial", head=2),
                        configure(0, "image patches")]
        self._demo = ScriptedDemo(runs, self.is_running, self)

    def screenshot_ready(self) -> bool:
        """No sweep runs, and the --screenshot demo, if one was started, has played (whatever the panel's state)."""
        demo = getattr(self, "_demo", None)
        return not self.is_running() and (demo is None or demo.done)
