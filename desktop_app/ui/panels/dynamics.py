"""Dynamics panel (issue 18): tokens as particles moving under attention, beside a real model's
tokens layer by layer.

The simulation (core.dynamics.Simulation) only ever runs in a worker (AppState.run): Play
starts a timer that asks for the next frame whenever none is being computed, so the UI thread only
draws. The 3-D view is an orthographic projection drawn by pyqtgraph's 2-D scatter (it renders
offscreen, unlike pyqtgraph.opengl), rotated by dragging with the mouse; d > 3 is shown through the
top principal directions of the initial cloud (a fixed basis). A simulation started from the model
(its layer's tokens, or one of its heads) is a result of that model and input: the panel is a
ResultView, and another model (or text, for the tokens) clears it; its late frames are dropped.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QFormLayout,
                               QHBoxLayout, QLabel, QLineEdit, QPushButton, QScrollArea, QSlider, QSpinBox, QSplitter,
                               QVBoxLayout, QWidget)

from ...app.dynamics import stack_layer_curves, stack_trace
from ...core import dynamics as dy
from ...core.views.dynamics import DynamicsViewState
from ..state import EDITS, INPUT, MODEL, ResultView
from ..widgets.after_first_paint import AfterFirstPaint
from ..widgets.export import ExportBar, export_view, say_in_status_bar
from ..widgets.form_fields import keyed_combo
from ..widgets.menu_on_demand import MenuOnDemandViewBox
from . import key_buttons
from .dynamics_plots import CURVE_FIELDS, DynamicsCurves, PointCloud

INIT_LABELS = [("uniform on the sphere", "sphere"), ("uniform in the ball", "ball"), ("Gaussian", "gaussian"),
               ("clusters", "clusters"), ("tokens of the current text", "tokens")]
QKV_LABELS = [("Q = K = V = I", "identity"), ("random (chosen norms)", "random"), ("from an .npz file", "file"),
              ("a head of the loaded model", "model")]
MAX_FRAMES_KEPT = 600  # for the time slider; oldest dropped first
# clusters are counted among this many particles (a fixed random subset) when n is larger: the count
# costs O(n^2), three times a step at n = 2,000 (measured), and few clusters are found all the same
CLUSTER_SAMPLE = 500
MAX_D = 4096  # the d box follows a model's width
TRAIL_LENGTH = 12
START_YAW, START_PITCH = 0.6, 0.35  # the 3-D view's rotation at first (radians), and after Reset rotation


# the smallest the particle view gets: with the form's column and the curves (CURVES_MIN) it fits 1024 x 700
PARTICLES_MIN = (220, 220)


_DRAG_EVENTS = (QEvent.Type.MouseButtonPress, QEvent.Type.MouseMove, QEvent.Type.MouseButtonRelease)

STACK_LABELS = [("encoder self-attention", "encoder"), ("decoder self-attention (causal)", "decoder")]


def build_simulation(cfg: dy.DynamicsConfig, qkv: str, matrices: str, model, layer: int, head: int,
                     tokens: np.ndarray | None, stack: str | None = None) -> tuple[dy.Simulation, dy.Frame]:
    """Worker side of Reset: parameters, initial positions and the first records (an encoder-decoder's
    head from `stack`'s self-attention)."""
    h = None
    if qkv == "file":
        if not matrices:
            raise ValueError("choose an .npz file with Q, K and V (or A and V) first")
        h = dy.load_head(matrices)
    elif qkv == "model":
        if model is None:
            raise ValueError("open a model first to use one of its heads")
        h = dy.model_head(model, layer, head, stack=stack)
    sim = dy.Simulation(cfg, h, tokens)
    return sim, dy.Frame(sim.t, sim.steps, sim.shown().numpy().copy(), list(sim.records))


class DynamicsPanel(QWidget, ResultView):
    drawn = Signal()  # what its exports would write changed (its ExportBar follows this)
    title = "Dynamics"
    help_text = (
        "<b>Tokens as particles.</b> With attention and residual connections only, a deep transformer moves each "
        "token x<sub>i</sub> by dx<sub>i</sub>/dt = &Gamma;<sub>&mu;</sub>(x<sub>i</sub>) = &Sigma;<sub>j</sub> "
        "P<sub>ij</sub> V x<sub>j</sub>, P the attention kernel: softmax of &lt;A x<sub>i</sub>, x<sub>j</sub>&gt; "
        "(A = K<sup>T</sup>Q/&radic;d), of -|Qx<sub>i</sub> - Kx<sub>j</sub>|<sup>2</sup> (L2), or that kernel made "
        "doubly stochastic (Sinkhorn). Euler with step 1 is a residual network. <i>Sphere</i>: LayerNorm, the velocity "
        "projected on the sphere. <i>Renormalise</i>: show z = exp(-tV) x. Curves: clusters (connected groups closer "
        "than tol &times; the largest |position|), mean pairwise cosine, max |x<sub>i</sub>| against "
        "R(t) = exp(&int;||V||<sub>2</sub>) R<sub>0</sub>, and (with the twin run switched on: twice the work) W2 to a "
        "twin started 10<sup>-3</sup> away (particle i coupled with particle i: an upper bound). Above 500 particles "
        "the clusters are counted among 500 of them (a fixed random subset). The bottom row measures the loaded model's tokens "
        "after each layer's attention sublayer (blocks.l.resid_mid).<br>"
        "<b>Encoder-decoders</b> (T5, BART, Marian): <i>Stack</i> picks the encoder's self-attention (the source's "
        "tokens) or the decoder's causal self-attention ([start] + the target's tokens): the model head, the token "
        "layer and the bottom row's curves are that stack's. Cross-attention is not offered: its keys and values are "
        "the encoder's output, fixed, so it does not move a set of particles by their own attention.")
    # the Play and Step buttons' keys (panels.key_buttons: they work while the panel is on show, after a click on
    # its tab too), listed in Help; keyPressEvent has them where the panel is a window of its own
    shortcuts = [("Space", "play / pause"), ("Right", "one step")]

    def __init__(self, state, parent=None) -> None:
        super().__init__(parent)
        self.state = state
        self.sim: dy.Simulation | None = None
        self._job = None
        self._build_job = None
        self._shown_once = False
        self._reset_asked = False  # reset() ran (a click, Play, the first look): the first look has nothing to do
        # a Reset from the text's tokens waits for the current model's (and edits') trace: built when it arrives
        self._awaiting_trace = False
        # that trace was cancelled (the status says so, and that Reset traces the text again: it asks
        # AppState.trace_was_cancelled); its end says so once the text is traced after all
        self._trace_cancelled = False
        self._failed = False  # the status says a build failed (cleared when what it was built from changes)
        self._frames: list[dy.Frame] = []
        self._records: list[dy.Record] = []
        self._layer_curves: dy.LayerCurves | None = None
        self._basis: np.ndarray | None = None
        self._yaw, self._pitch = START_YAW, START_PITCH
        self._drag_from = None
        self._view_radius = 0.0
        self._guide_drawn = None  # what the sphere guide shows now (redrawn when that changes)
        self.screen_xy = np.zeros((0, 2))
        self._matrices = ""
        self._pending_steps = 0  # Play's steps asked while the particles were being built
        # Step clicks not run yet: each runs once the one before has drawn its frame (a click while a step ran
        # was dropped: 20 quick clicks made one step)
        self._steps_asked = 0
        self._restore_on_model: DynamicsViewState | None = None  # set_view_state's form, shown again on a model
        self._sim_parts: tuple[str, ...] = ()  # what of AppState's inputs the particles were built from
        self._build_ui()
        self.timer = QTimer(self)
        self.timer.setInterval(33)
        self.timer.timeout.connect(self._tick)
        state.trace_changed.connect(self._on_trace_changed)
        state.trace_cancelled.connect(self._on_trace_cancelled)
        # the model's cluster counts use the same threshold as the simulation's
        self.cluster_tol.valueChanged.connect(lambda _: self._on_trace_changed(self._current_trace()))
        state.model_changed.connect(self._on_model_changed)
        self.watch_inputs(state)  # clear_results: a simulation of another model's tokens or head goes
        self._on_model_changed(getattr(state, "loaded", None))
        # the model's curves and the starting particles are computed in workers started after the panel's first
        # paint (started in a tab's click, they took the cores from it): here and showEvent
        self._curves_job = None
        self._after_paint = AfterFirstPaint(self)
        self._after_paint.call(lambda: self._on_trace_changed(self._current_trace()))

    # -- layout ----------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        form = QFormLayout()
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)  # a field too wide goes under its label
        self.attention = QComboBox()
        self.attention.addItems(list(dy.ATTENTION_KINDS))
        self.d = QSpinBox(minimum=2, maximum=MAX_D, value=3)
        self.n = QSpinBox(minimum=2, maximum=5000, value=400, singleStep=100)
        self.init = keyed_combo(INIT_LABELS)
        self.covariance = QLineEdit("1")
        self.covariance.setPlaceholderText("covariance (rows ; separated)")
        self.covariance.setToolTip("Gaussian: one number (s I), d numbers (the diagonal), or the full matrix as d rows "
                                   "separated by ';', e.g. 2 0.5 0; 0.5 1 0; 0 0 1")
        self.n_clusters = QSpinBox(minimum=1, maximum=50, value=3)
        self.token_layer = QSpinBox(minimum=0, maximum=0)
        self.token_layer.setToolTip("0: the embeddings; l + 1: after layer l's attention sublayer")
        self.qkv = keyed_combo(QKV_LABELS)
        self.norm_qk = QDoubleSpinBox(minimum=0.0, maximum=20.0, value=1.0, singleStep=0.25)
        self.norm_v = QDoubleSpinBox(minimum=0.0, maximum=20.0, value=1.0, singleStep=0.25)
        self.file_button = QPushButton("Matrices…")
        self.file_button.clicked.connect(self.choose_matrices)
        self.model_layer = QSpinBox(minimum=0, maximum=0)
        self.model_head = QSpinBox(minimum=0, maximum=0)
        # an encoder-decoder's: whose self-attention and tokens (hidden for other models)
        self.stack = keyed_combo(STACK_LABELS, "An encoder-decoder's stack: the head, the tokens and the model curves "
                                 "are the encoder's (source) or the decoder's ([start] + target). Cross-attention has "
                                 "no dynamics of its own: its keys are the encoder's output, fixed.")
        self.time_dependent = QCheckBox("time-dependent (a = 0.5)")
        self.sphere = QCheckBox("on the sphere (LayerNorm)")
        self.sphere.setChecked(True)
        self.renormalise = QCheckBox("renormalise z = exp(-tV) x")
        self.twin = QCheckBox("twin run for W2 (twice the work)")  # off: the frame rate first
        self.integrator = QComboBox()
        self.integrator.addItems(list(dy.INTEGRATORS))
        self.dt = QDoubleSpinBox(minimum=0.001, maximum=2.0, value=0.1, singleStep=0.05, decimals=3)
        self.steps_per_frame = QSpinBox(minimum=1, maximum=100, value=1)
        self.record_every = QSpinBox(minimum=1, maximum=1000, value=10)
        self.record_every.setToolTip("curves are measured every this many steps (clusters cost O(n²))")
        self.cluster_tol = QDoubleSpinBox(minimum=0.001, maximum=1.0, value=0.05, singleStep=0.01, decimals=3)
        self.seed = QSpinBox(minimum=0, maximum=10**6, value=0)
        for label, w in (("Attention", self.attention), ("d", self.d), ("Particles n", self.n),
                         ("Initial condition", self.init), ("Covariance", self.covariance),
                         ("Clusters k", self.n_clusters), ("Stack", self.stack), ("Token layer", self.token_layer),
                         ("Q, K, V", self.qkv),
                         ("||Q||, ||K||", self.norm_qk), ("||V||", self.norm_v), ("File", self.file_button),
                         ("Model layer", self.model_layer), ("Model head", self.model_head), ("", self.time_dependent),
                         ("", self.sphere), ("", self.renormalise), ("", self.twin), ("Integrator", self.integrator),
                         ("Step dt", self.dt), ("Steps / frame", self.steps_per_frame),
                         ("Curves every", self.record_every), ("Cluster tol", self.cluster_tol), ("Seed", self.seed)):
            if isinstance(w, QComboBox):  # long item texts do not widen the column (the list shows them)
                w.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
                w.setMinimumContentsLength(16)
            if w in (self.init, self.qkv):  # each choice whole ('a head of the loa…'): under its label, as wide as
                # the column (which keeps its width: the particles' room at 1024 px)
                w.setMinimumContentsLength(max(len(w.itemText(i)) for i in range(w.count())))
            if w is self.qkv:  # (a short label: the form would not wrap its row, it would cut the box)
                form.addRow(QLabel(label))
                form.addRow(w)
            elif label:
                form.addRow(label, w)
            else:  # a check box takes the whole row: its text is its label
                form.addRow(w)
        self._form = form
        self.reset_button = QPushButton("Reset")
        self.play_button = QPushButton("Play")
        self.play_button.setCheckable(True)
        self.step_button = QPushButton("Step")
        self.reset_button.clicked.connect(self._reset_clicked)
        self.play_button.toggled.connect(self._on_play_toggled)
        self.step_button.clicked.connect(self.step_once)
        key_buttons(self.shortcuts, (self.play_button, self.step_button))
        buttons = QHBoxLayout()
        for b in (self.reset_button, self.play_button, self.step_button):
            buttons.addWidget(b)
        self.png_button = QPushButton("Export frames as PNGs…")
        self.png_button.setToolTip("every frame kept for the time slider, as frame_0000.png, … in a new or empty folder")
        self.png_button.clicked.connect(self.choose_png_folder)
        self.view3d = QCheckBox("3-D view (drag to rotate)")
        self.view3d.setChecked(True)
        self.trails = QCheckBox("trails")
        self.view3d.toggled.connect(self._redraw)
        self.trails.toggled.connect(self._redraw)
        self.status = QLabel("Reset builds the particles.")
        self.status.setWordWrap(True)
        left = QVBoxLayout()
        left.addLayout(form)
        left.addWidget(self.png_button)
        left.addWidget(self.view3d)
        left.addWidget(self.trails)
        left.addStretch(1)
        left_w = QWidget()
        left_w.setLayout(left)
        self.form_scroll = scroll = QScrollArea()
        scroll.setWidget(left_w)
        scroll.setWidgetResizable(True)
        # scrolled up and down only: the column is as wide as its widest row (and its scroll bar)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(left_w.minimumSizeHint().width() + scroll.verticalScrollBar().sizeHint().width()
                               + 2 * scroll.frameWidth())
        scroll.setMaximumWidth(scroll.minimumWidth())  # (its long boxes under their labels: the particles' room)
        # Reset / Play / Step and what they say stay in sight under the scrolled form (at 1024x640 the form
        # is taller than the window: they were below its fold)
        column = QVBoxLayout()
        column.addWidget(scroll, 1)
        column.addLayout(buttons)
        column.addWidget(self.status)

        self.particles = pg.PlotWidget(background="w",  # (its menu: made at the first right-click)
                                       viewBox=MenuOnDemandViewBox(fill_menu=self._fill_particles_menu))
        self.particles.setMinimumSize(*PARTICLES_MIN)
        self.particles.setAspectLocked(True)
        self.particles.hideButtons()
        self.guide = pg.PlotDataItem(pen=pg.mkPen((170, 170, 170), width=1))
        self.trail_item = PointCloud((120, 150, 220, 90), 2)
        self.back = PointCloud((140, 160, 215, 160), 4)  # 3-D: the far half, lighter (a depth cue)
        self.scatter = PointCloud((30, 70, 180, 220), 5)
        for item in (self.guide, self.trail_item, self.back, self.scatter):
            self.particles.addItem(item)
        self.particles.viewport().installEventFilter(self)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(0, 0)
        self.slider.valueChanged.connect(self._redraw)
        self.time_label = QLabel("t = 0")

        self.curves = DynamicsCurves()
        for name in CURVE_FIELDS:  # its plots and curves, as panel.p_radius, panel.c_w2... (tests read them)
            setattr(self, name, getattr(self.curves, name))
        self._update_hints()

        self.view_area = QWidget()
        va = QVBoxLayout(self.view_area)
        va.setContentsMargins(0, 0, 0, 0)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.particles)
        split.addWidget(self.curves)
        split.setChildrenCollapsible(False)  # neither goes below its minimum size
        split.setSizes([500, 600])
        va.addWidget(split, 1)
        self.export_bar = ExportBar(lambda: self, lambda: "dynamics")
        slider_row = QHBoxLayout()
        slider_row.addWidget(self.time_label)
        slider_row.addWidget(self.slider, 1)
        slider_row.addWidget(self.export_bar)
        right = QVBoxLayout()
        right.addWidget(self.view_area, 1)
        right.addLayout(slider_row)
        lay = QHBoxLayout(self)
        lay.addLayout(column)
        lay.addLayout(right, 1)
        for w in (self.init, self.qkv):
            w.currentIndexChanged.connect(self._update_enabled)
        self.stack.currentIndexChanged.connect(self._stack_chosen)
        self.sphere.toggled.connect(self._update_enabled)
        self._update_enabled()

    def _update_enabled(self) -> None:
        init, qkv = self.init.currentData(), self.qkv.currentData()
        self.covariance.setEnabled(init == "gaussian")
        self.n_clusters.setEnabled(init == "clusters")
        self.token_layer.setEnabled(init == "tokens")
        self.n.setEnabled(init != "tokens")
        self.d.setEnabled(init != "tokens" and qkv not in ("model", "file"))
        self.norm_qk.setEnabled(qkv == "random")
        self.norm_v.setEnabled(qkv == "random")
        self.file_button.setEnabled(qkv == "file")
        self.model_layer.setEnabled(qkv == "model")
        self.model_head.setEnabled(qkv == "model")
        self.renormalise.setEnabled(not self.sphere.isChecked())  # exp(-tV) x would leave the sphere: not shown there
        self._follow_d()

    def _follow_d(self) -> None:
        """The d box shows the dimension the particles will have when tokens or a model head fix it (a file's
        V sets it once Reset has read it)."""
        init, qkv = self.init.currentData(), self.qkv.currentData()
        trace = self._current_trace()
        loaded = getattr(self.state, "loaded", None)
        d = None
        if init == "tokens" and trace is not None:
            trace = stack_trace(trace, self._stack())
            names = [n for n in dy.layer_names(trace) if n in trace]
            d = int(trace[names[0]].shape[-1]) if names else None
        elif qkv == "model" and loaded is not None:
            d = int(loaded.config.d_model)
        if d is not None:
            self.d.setValue(d)

    # -- state ------------------------------------------------------------------------------------
    def _current_trace(self):
        """The trace on show if it is the current model's (and edits'): after another model opens, the previous
        one's stays on show until the new one's arrives, and its tokens are not the new model's."""
        return self.state.trace if self.state.trace_is_current() else None

    def _stack(self) -> str | None:
        """The encoder-decoder's stack chosen (None for a one-stack model)."""
        loaded = getattr(self.state, "loaded", None)
        if loaded is None or not loaded.config.is_encoder_decoder:
            return None
        return self.stack.currentData()

    def _follow_stack(self) -> None:
        """The Stack row shown for an encoder-decoder only; the layer boxes within the chosen stack's layers."""
        loaded = getattr(self.state, "loaded", None)
        self._form.setRowVisible(self.stack, self._stack() is not None)
        if loaded is None:
            return
        cfg = loaded.config
        layers = cfg.n_decoder_layers if self._stack() == "decoder" else cfg.n_layers
        self.model_layer.setMaximum(max(0, layers - 1))
        self.token_layer.setMaximum(layers)

    def _stack_chosen(self, *_) -> None:
        self._follow_stack()
        self._on_trace_changed(self._current_trace())  # that stack's tokens and curves

    def _on_model_changed(self, loaded) -> None:
        self._follow_stack()
        if loaded is None:
            return
        cfg = loaded.config
        self.model_head.setMaximum(max(0, cfg.n_heads - 1))
        if self._restore_on_model is not None:  # a workspace's form came before its model
            self._show_view_state(self._restore_on_model)
            self._restore_on_model = None
        self._follow_d()

    def _on_trace_changed(self, trace) -> None:
        self._layer_curves = None
        self._draw_model_curves()
        self._follow_d()
        if self._trace_cancelled and self.state.trace_is_current():  # traced since (another text, model...)
            self._trace_cancelled = False
            self.status.setText("The text is traced: Reset builds the particles from its tokens.")
        if self._awaiting_trace:  # a Reset waits for this trace
            if self.state.trace_is_current():
                self.reset()
            elif self.state.trace_running():  # its first layers only: it says how far it is
                self.status.setText(self.state.no_trace_message())
            else:  # none came (the text cannot be traced by this model, or its trace was cancelled): it says why
                self._awaiting_trace, self._steps_asked = False, 0  # (no particles to step)
                self._trace_cancelled = self.state.trace_was_cancelled()  # after its first layers showed
                self.status.setText(self.state.no_trace_message() + (". Press Reset to trace the text again."
                                                                     if self._trace_cancelled else ""))
        if trace is None:
            return
        # AppState.run: curves of a trace no longer shown (another model or text meanwhile) are dropped
        def finished() -> None:
            if self._curves_job is job:  # (not a newer trace's)
                self._curves_job = None

        self._curves_job = job = self.state.run(
            stack_layer_curves, trace, self._stack(), self.cluster_tol.value(), on_result=self._on_layer_curves,
            on_error=lambda exc, tb: self.status.setText(f"Model curves failed: {exc}"), on_finished=finished,
            owner=self, parts=("model", "input"))

    def _on_trace_cancelled(self) -> None:
        """The trace a Reset waits for was cancelled before any of it showed (no trace_changed comes): the wait
        ends now, and the status says so and what to press."""
        self._update_hints()  # (the model's curves: none are being measured)
        if not self._awaiting_trace:
            return
        self._awaiting_trace, self._trace_cancelled, self._steps_asked = False, True, 0
        self.status.setText("The text's trace was cancelled before it arrived: no tokens to build the particles "
                            "from. Press Reset to trace the text again.")

    @staticmethod
    def _parts_of(cfg: dy.DynamicsConfig, qkv: str) -> tuple[str, ...]:
        """What of AppState's inputs a simulation is built from: a layer's tokens are the traced input's
        (with the edits), a head is the model's; the rest (sphere, Gaussian..., identity, random, a file) none."""
        parts = (MODEL, INPUT, EDITS) if cfg.init == "tokens" else ()
        return parts + ((MODEL,) if qkv == "model" and MODEL not in parts else ())

    def clear_results(self, changed: frozenset) -> None:
        """AppState.inputs_changed: particles built from the previous model's tokens or head are not this
        model's: the simulation stops and goes (Play or Reset builds it again from the new ones). The model's
        curves of a trace no longer current go too (its trace, not the new model's, stays on show until that
        one's arrives)."""
        if self._layer_curves is not None and not self.state.trace_is_current():
            self._layer_curves = None
            self._draw_model_curves()
        if not changed & set(self._sim_parts):
            return
        what = "model" if MODEL in changed else "text" if INPUT in changed else "what-if edits"
        if self.sim is None and self._build_job is None:
            if self._failed and not self._awaiting_trace:  # why the previous inputs' particles failed: not these
                self._failed = False
                self.status.setText(f"The {what} changed: Reset builds the particles from the new one.")
            return
        self.play_button.setChecked(False)
        self._cancel_jobs()
        self._steps_asked = 0  # (for the previous particles)
        self.sim, self._frames, self._records, self._basis, self._sim_parts = None, [], [], None, ()
        for item in (self.scatter, self.back, self.trail_item):
            item.setData(np.zeros((0, 2)))
        self.screen_xy = np.zeros((0, 2))
        self.curves.clear_records()
        self.guide.setData([], [])
        self._guide_drawn = None
        self.slider.setRange(0, 0)
        self.time_label.setText("t = 0")
        self._update_hints()
        self.drawn.emit()
        self.status.setText(self._waiting_text() if self._awaiting_trace else
                            f"The {what} changed: the particles came from the previous one. "
                            "Press Reset (or Play) to start from the new one.")

    def _on_layer_curves(self, curves: dy.LayerCurves) -> None:
        self._layer_curves = curves
        self._draw_model_curves()

    def choose_matrices(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Q, K, V matrices", "", "NumPy arrays (*.npz)")
        if path:
            self.set_matrices(path)

    def _name_matrices_file(self, path: str) -> None:
        """The file's name on its button, elided to the button's width (a long name must not widen the
        form's column past the window: it scrolls only up and down); the whole path in the tooltip."""
        width = max(self.file_button.width() - 16, 140)
        self.file_button.setText(self.file_button.fontMetrics().elidedText(Path(path).name,
                                                                          Qt.TextElideMode.ElideMiddle, width))
        self.file_button.setToolTip(str(path))

    def set_matrices(self, path: str) -> None:
        self._matrices = path
        self._name_matrices_file(path)
        self.qkv.setCurrentIndex([k for _, k in QKV_LABELS].index("file"))

    def config(self) -> dy.DynamicsConfig:
        """The form's DynamicsConfig, through the set-up `dynamics` uses (app.dynamics): the same
        covariance and memory checks, ValueError (one line) shown in the status line by Reset. The
        head of a file or a model is read by the worker (build_simulation); play has no fixed length."""
        from ...app.dynamics import dynamics_setup

        init = self.init.currentData()
        cfg, _ = dynamics_setup(
            self.attention.currentText(), self.d.value(), self.n.value(), init,
            variances=self.covariance.text() if init == "gaussian" else None,
            qkv=self.qkv.currentData() if self.qkv.currentData() in ("identity", "random") else "identity",
            norm_v=self.norm_v.value(), amplitude=0.5 if self.time_dependent.isChecked() else 0.0,
            dt=self.dt.value(), perturbation=1e-3 if self.twin.isChecked() else 0.0,
            integrator=self.integrator.currentText(), n_clusters=self.n_clusters.value(),
            norm_qk=self.norm_qk.value(), sphere=self.sphere.isChecked(), renormalise=self.renormalise.isChecked(),
            seed=self.seed.value(), cluster_tol=self.cluster_tol.value(), cluster_sample=CLUSTER_SAMPLE,
            dtype=_play_dtype())
        return cfg

    # -- workspace (MainWindow saves view_state and gives it back with set_view_state) ----------
    VIEW_TABLE = None  # no views table: the form is the panel's whole view state

    @property
    def view_state(self) -> DynamicsViewState:
        """The form's choices (not the particles: a restored form waits for Reset)."""
        return DynamicsViewState(
            attention=self.attention.currentText(), d=self.d.value(), n=self.n.value(),
            init=self.init.currentData(), covariance=self.covariance.text(), n_clusters=self.n_clusters.value(),
            token_layer=self.token_layer.value(), qkv=self.qkv.currentData(), norm_qk=self.norm_qk.value(),
            norm_v=self.norm_v.value(), matrices_file=self._matrices, model_layer=self.model_layer.value(),
            model_head=self.model_head.value(), time_dependent=self.time_dependent.isChecked(),
            sphere=self.sphere.isChecked(), renormalise=self.renormalise.isChecked(), twin=self.twin.isChecked(),
            integrator=self.integrator.currentText(), dt=self.dt.value(),
            steps_per_frame=self.steps_per_frame.value(), record_every=self.record_every.value(),
            cluster_tol=self.cluster_tol.value(), seed=self.seed.value(), view_3d=self.view3d.isChecked(),
            trails=self.trails.isChecked(), stack=self.stack.currentData())

    def set_view_state(self, state: DynamicsViewState) -> None:
        """Fill the form now, and its model rows again when a model arrives: before one, the token
        layer, model layer and head boxes only go to 0, which would clamp the restored values."""
        self._show_view_state(state)
        self._restore_on_model = state

    def _show_view_state(self, state: DynamicsViewState) -> None:
        def pick(combo: QComboBox, names: list[str], name: str) -> None:  # a name this version lacks: kept
            if name in names:
                combo.setCurrentIndex(names.index(name))

        pick(self.attention, list(dy.ATTENTION_KINDS), state.attention)
        pick(self.init, [k for _, k in INIT_LABELS], state.init)
        pick(self.qkv, [k for _, k in QKV_LABELS], state.qkv)
        pick(self.integrator, list(dy.INTEGRATORS), state.integrator)
        pick(self.stack, [k for _, k in STACK_LABELS], state.stack)
        if state.matrices_file:  # named, not read: Reset reads it (and says so if it is gone)
            self._matrices = state.matrices_file
            self._name_matrices_file(state.matrices_file)
        self.covariance.setText(state.covariance)
        for spin, value in ((self.d, state.d), (self.n, state.n), (self.n_clusters, state.n_clusters),
                            (self.token_layer, state.token_layer), (self.norm_qk, state.norm_qk),
                            (self.norm_v, state.norm_v), (self.model_layer, state.model_layer),
                            (self.model_head, state.model_head), (self.dt, state.dt),
                            (self.steps_per_frame, state.steps_per_frame), (self.record_every, state.record_every),
                            (self.cluster_tol, state.cluster_tol), (self.seed, state.seed)):
            spin.setValue(value)
        for box, on in ((self.time_dependent, state.time_dependent), (self.sphere, state.sphere),
                        (self.renormalise, state.renormalise), (self.twin, state.twin),
                        (self.view3d, state.view_3d), (self.trails, state.trails)):
            box.setChecked(on)
        self._update_enabled()  # (d follows tokens or a model head, as when chosen by hand)

    # -- running ---------------------------------------------------------------------------------
    def reset(self) -> None:
        self._reset_asked = True
        self._awaiting_trace = self._failed = self._trace_cancelled = False
        self.play_button.setChecked(False)
        self._cancel_jobs()
        try:
            cfg = self.config()
            tokens = None
            if cfg.init == "tokens":
                trace = self._current_trace()
                if trace is None and self.state.trace_was_cancelled():  # before or after its first layers showed
                    self.state.set_text(self.state.text)  # as the status said: the same text traced again
                    self._update_hints()  # (the model's curves: measured once it arrives)
                if trace is None and self.state.trace_running():
                    # (another model just opened, or the edits changed): its trace is on its way. Waited for
                    # rather than refused: one Reset is what was asked, and it says what it waits for
                    self._awaiting_trace, self.sim = True, None  # (as a build: the old frames stay until it)
                    self.status.setText(self._waiting_text())
                    return
                if trace is None:
                    raise ValueError(self.state.no_trace_message())
                trace = stack_trace(trace, self._stack())
                names = dy.layer_names(trace)
                tokens = dy.trace_tokens(trace, names[min(self.token_layer.value(), len(names) - 1)])
        except ValueError as exc:
            self.status.setText(str(exc))
            self._steps_asked = 0  # (no particles to step)
            return
        loaded = getattr(self.state, "loaded", None)
        self.sim = None
        self._sim_parts = self._parts_of(cfg, self.qkv.currentData())
        self.status.setText("Building the particles…")
        # AppState.run: particles of a model, text or edits no longer current are dropped (and errors too)
        self._build_job = self.state.run(build_simulation, cfg, self.qkv.currentData(), self._matrices,
                                         None if loaded is None else loaded.model, self.model_layer.value(),
                                         self.model_head.value(), tokens, self._stack(), on_result=self._on_built,
                                         on_error=self._on_error, owner=self, parts=self._sim_parts)

    def _waiting_text(self) -> str:
        if self.state.tracing is not None:  # its first layers on show: how far it is
            return self.state.no_trace_message()
        return "Tracing the text… the particles are built from its tokens as soon as its trace arrives."

    def _on_built(self, result) -> None:
        self.sim, frame = result
        self._build_job = None
        self._basis = dy.projection_basis(frame.shown, 3)
        self.d.setValue(self.sim.config.d)  # from the tokens, a model head or a file's V
        self.curves.set_titles(None if self.sim.cluster_index is None else len(self.sim.cluster_index),
                               twin=self.sim.twin is not None)
        self._frames, self._records = [frame], list(frame.records)
        self._view_radius = 0.0  # the view's range only grows: a steady frame, and no axis relayout per frame
        self._guide_drawn = None
        self._set_status()
        self._show_last()
        self.drawn.emit()
        if self._pending_steps:
            self._request(self._pending_steps)
        else:
            self._next_step()

    def _on_error(self, exc: BaseException, tb: str) -> None:
        self._build_job = self._job = None
        self.play_button.setChecked(False)
        self._steps_asked = 0
        self.status.setText(f"Failed: {exc}")
        self._failed = True

    def _cancel_jobs(self) -> None:
        for job in (self._job, self._build_job):
            if job is not None:
                job.detach()
        self._job = self._build_job = None
        self._pending_steps = 0

    def is_running(self) -> bool:
        return self._job is not None or self._build_job is not None

    def _request(self, steps: int) -> None:
        """Ask the worker for `steps` more steps unless it is busy (then the next tick asks again)."""
        if self.sim is None:
            self._pending_steps = steps
            if self._build_job is None:
                self.reset()
            return
        self._pending_steps = 0
        if self._job is not None:
            return
        self._job = self.state.run(self.sim.advance, steps, self.record_every.value(), on_result=self._on_frame,
                                   on_error=self._on_error, owner=self, parts=self._sim_parts)

    def _on_frame(self, frame: dy.Frame) -> None:
        self._job = None
        if self.timer.isActive():  # playing: the worker steps on while this frame is drawn (a copy), not after
            self._request(self.steps_per_frame.value())
        self._frames.append(frame)
        if len(self._frames) > MAX_FRAMES_KEPT:
            del self._frames[1]  # keep the start
        new_records = len(frame.records) != len(self._records)
        self._records = frame.records
        self._show_last(curves=new_records)
        # a word-wrapped label's new text relayouts the side column: not on every frame while playing (its
        # pause says where it stopped), on every Step's frame (the t it names is the particles')
        if new_records or not self.timer.isActive():
            self._set_status()
        self._next_step()

    def step_once(self) -> None:
        """One frame more (of 'Steps / frame' steps) for each click, the clicks made while a step runs included:
        they wait their turn (one worker at a time, each step its own frame for the time slider)."""
        if self.timer.isActive():  # playing: frames come anyway (a click asks for one unless one is on its way)
            self._request(self.steps_per_frame.value())
            return
        self._steps_asked += 1
        self._next_step()

    def _next_step(self) -> None:
        """The next Step click waiting, once no step or build runs (no particles: they are built first)."""
        if not self._steps_asked or self.timer.isActive() or self._job is not None or self._build_job is not None:
            return
        if self.sim is None:
            if not self._awaiting_trace:  # (else the trace's arrival builds them, then the steps run)
                self.reset()
            return
        self._steps_asked -= 1
        self._request(self.steps_per_frame.value())

    def _reset_clicked(self) -> None:
        self._steps_asked = 0  # the Steps clicked were for the particles on show, not the new ones
        self.reset()

    def _on_play_toggled(self, on: bool) -> None:
        self.play_button.setText("Pause" if on else "Play")
        if on:
            self._steps_asked = 0  # Play steps on by itself
            self.timer.start()
            self._tick()
        else:
            self.timer.stop()
            self._set_status()  # the t it paused at (a frame still on its way says its own)

    def _tick(self) -> None:
        self._request(self.steps_per_frame.value())

    def keyPressEvent(self, event) -> None:
        if event.key() == Qt.Key.Key_Space:
            self.play_button.toggle()
        elif event.key() == Qt.Key.Key_Right:
            self.step_once()
        else:
            super().keyPressEvent(event)

    def _set_status(self) -> None:
        if self.sim is None or not self._records:
            return
        r = self._records[-1]
        # the particles' t; the curves are measured every 'Curves every' steps: at an earlier t, said so
        t = self._frames[-1].t if self._frames else r.t
        at = f"t = {t:g}: " if f"{t:g}" == f"{r.t:g}" else f"t = {t:g}; at t = {r.t:g}: "
        self.status.setText(f"{self.sim.head.name}; n = {self.sim.config.n}, d = {self.sim.config.d}. "
                            f"{at}{r.clusters} cluster(s), mean cosine {r.mean_cosine:.3f}, "
                            f"radius {r.radius:.3g} ≤ R(t) = {r.radius_bound:.3g}")

    # -- drawing ---------------------------------------------------------------------------------
    def _show_last(self, curves: bool = True) -> None:
        self.slider.blockSignals(True)
        self.slider.setRange(0, len(self._frames) - 1)
        self.slider.setValue(len(self._frames) - 1)
        self.slider.blockSignals(False)
        self._redraw()
        if curves:
            self._draw_curves()

    def current_frame(self) -> dy.Frame | None:
        if not self._frames:
            return None
        return self._frames[min(self.slider.value(), len(self._frames) - 1)]

    def _screen(self, P: np.ndarray, with_depth: bool = False):
        """[n, 2] screen coordinates: the basis projection, then the rotation in 3-D (and the depth, larger
        nearer, zero in 2-D, with `with_depth`)."""
        Y = P @ self._basis
        if self.view3d.isChecked() and Y.shape[1] >= 3 and self._basis.shape[0] >= 3:
            xy, depth = dy.view_3d(Y[:, :3], self._yaw, self._pitch)
        else:
            xy, depth = Y[:, :2], np.zeros(len(Y))
        return (xy, depth) if with_depth else xy

    def _redraw(self, *_) -> None:
        frame = self.current_frame()
        if frame is None or self._basis is None:
            return
        self.time_label.setText(f"t = {frame.t:.3g}")
        xy, depth = self._screen(frame.shown, with_depth=True)
        near = depth >= 0
        self.screen_xy = xy  # every particle's screen position, in particle order
        self.scatter.setData(pos=xy[near])
        self.back.setData(pos=xy[~near])
        three_d = self.view3d.isChecked() and self._basis.shape[0] >= 3
        self.particles.setMouseEnabled(not three_d, not three_d)
        for axis in ("left", "bottom"):  # a rotated projection has no meaningful axes
            self.particles.getPlotItem().showAxis(axis, not three_d)
        guide = (self.sim is not None and self.sim.config.sphere and not self.sim.config.renormalise,
                 three_d, self._yaw, self._pitch, self._basis.shape[0])
        extent = float(np.abs(xy).max()) if len(xy) else 1.0
        if guide[0]:  # the unit sphere's outline in view too (a model's tokens, projected, lie well inside it)
            extent = max(extent, 1.0)
        if extent > self._view_radius or not np.isfinite(self._view_radius):
            self._view_radius = 1.15 * extent if extent > 0 else 1.0
            self.particles.getPlotItem().enableAutoRange(False)
            r = self._view_radius
            self.particles.setRange(xRange=(-r, r), yRange=(-r, r), padding=0)
        if guide != self._guide_drawn:  # it moves only with the view: not redrawn on every frame
            self._guide_drawn = guide
            if guide[0]:
                self._draw_sphere_guide(three_d)
            else:
                self.guide.setData([], [])
        if self.trails.isChecked():
            i = self.slider.value()
            past = self._frames[max(0, i - TRAIL_LENGTH):i]
            self.trail_item.setData(pos=np.concatenate([self._screen(f.shown) for f in past]) if past else np.zeros((0, 2)))
        else:
            self.trail_item.setData(pos=np.zeros((0, 2)))
        self.curves.mark(frame.t if self.slider.value() < len(self._frames) - 1 else None)

    def _draw_sphere_guide(self, three_d: bool) -> None:
        """The unit circle (2-D) or the sphere's outline and equator (3-D), for orientation."""
        s = np.linspace(0, 2 * math.pi, 121)
        circle = np.stack([np.cos(s), np.sin(s)], 1)
        if not three_d or self._basis.shape[0] > 3:
            self.guide.setData(circle[:, 0], circle[:, 1])
            return
        equator = np.stack([np.cos(s), np.zeros_like(s), np.sin(s)], 1)
        eq = dy.view_3d(equator, self._yaw, self._pitch)[0]
        both = np.concatenate([circle, [[np.nan, np.nan]], eq])
        self.guide.setData(both[:, 0], both[:, 1], connect="finite")

    def _update_hints(self) -> None:
        """A hint instead of empty axes in each plot with nothing to draw (the first look draws the
        starting particles, but one record makes no curve)."""
        self.curves.show_hints(running=len(self._records) >= 2,
                               # the records drawn (kept while a Reset waits for a trace) have no W2 (nan)
                               twin_off=bool(self._records) and math.isnan(self._records[0].w2),
                               model_curves=self._layer_curves is not None,
                               # the curves come from a worker (a trace not current: the new model's is on its way)
                               measuring=self.state.trace is not None or self.state.trace_running(),
                               cancelled=self.state.trace_was_cancelled())

    def _draw_curves(self) -> None:
        self._update_hints()
        self.curves.draw_records(self._records)

    def _draw_model_curves(self) -> None:
        self._update_hints()
        self.curves.draw_layer_curves(self._layer_curves)

    def eventFilter(self, obj, event) -> bool:
        """A left-button drag in the 3-D view rotates it (yaw with horizontal motion, pitch with vertical); the
        other buttons go on to the plot (a right-click: its menu, Export and Reset rotation among it).

        Mouse events only are looked at, before any widget is touched: the viewport sends other events
        through this filter while the application tears down, when this panel's widgets are already
        deleted (touching them raised there, and shiboken crashed reporting it)."""
        kind = event.type()
        if kind not in _DRAG_EVENTS:
            return False
        if obj is self.particles.viewport() and self._three_d():
            if kind == QEvent.Type.MouseButtonPress and event.button() == Qt.MouseButton.LeftButton:
                self._drag_from = event.position()
                return True
            if kind == QEvent.Type.MouseMove and self._drag_from is not None:
                delta = event.position() - self._drag_from
                self._drag_from = event.position()
                self.rotate(delta.x() * 0.01, delta.y() * 0.01)
                return True
            if kind == QEvent.Type.MouseButtonRelease and event.button() == Qt.MouseButton.LeftButton:
                self._drag_from = None
                return True
        return False

    def _three_d(self) -> bool:
        """The particles are drawn rotated in 3-D (the box ticked and three dimensions at least to show)."""
        return self.view3d.isChecked() and self._basis is not None and self._basis.shape[0] >= 3

    def _fill_particles_menu(self, menu) -> None:
        """The particle view's right-click menu (pyqtgraph's: View All, Export...) has Reset rotation in 3-D."""
        reset = menu.addAction("Reset rotation")
        reset.triggered.connect(self.reset_rotation)
        menu.aboutToShow.connect(lambda: reset.setVisible(self._three_d()))

    def reset_rotation(self) -> None:
        self._yaw, self._pitch = START_YAW, START_PITCH
        self._redraw()

    def rotate(self, d_yaw: float, d_pitch: float) -> None:
        self._yaw += d_yaw
        self._pitch = max(-math.pi / 2, min(math.pi / 2, self._pitch + d_pitch))
        self._redraw()

    # -- export (ExportBar view protocol) -------------------------------------------------------
    def export_widget(self) -> QWidget:
        return self.view_area

    def export_unavailable(self) -> str | None:
        return None if self._frames else "Nothing to export yet: Reset builds the particles."

    def csv_table(self):
        if not self._records:
            return None
        return list(dy.CSV_COLUMNS), [r.row() for r in self._records]

    def export_arrays(self) -> dict:
        out = {}
        if self._records:
            out["curves"] = np.array([r.row() for r in self._records], dtype=float)
        frame = self.current_frame()
        if frame is not None:
            out["positions"] = frame.shown
            out["t"] = np.array(frame.t)
            # the animation: every frame kept for the time slider (the first and the last MAX_FRAMES_KEPT - 1)
            out["frames"] = np.stack([f.shown for f in self._frames])
            out["frame_t"] = np.array([f.t for f in self._frames])
        if self._layer_curves is not None:
            out["model_layers"] = np.array([[c, r, m] for c, r, m in zip(self._layer_curves.clusters,
                                                                         self._layer_curves.radius,
                                                                         self._layer_curves.mean_cosine)])
        return out

    def export(self, path) -> None:
        export_view(self, path)

    def choose_png_folder(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "New folder for the PNG frames", "dynamics_frames")
        if path:
            self.export_png_sequence(path)

    def export_png_sequence(self, folder) -> None:
        """Every kept frame drawn as the particle view shows it (the UI thread draws: Qt paints only there),
        then written as one folder by a worker (core.dynamics.write_png_sequence). A folder holding files the
        app did not write is refused before any drawing."""
        from PySide6.QtCore import QBuffer, QByteArray, QIODevice

        from ...core.files import OutputFolderError, WriteError
        from ..workers import run_job

        if not self._frames:
            self.status.setText("Nothing to export: Reset builds the particles.")
            return
        try:
            dy.check_png_sequence_folder(folder)
        except (OutputFolderError, WriteError) as exc:
            self.status.setText(f"PNG frames not written: {exc}")
            return
        was_playing = self.play_button.isChecked()
        self.play_button.setChecked(False)
        shown = self.slider.value()
        pngs, times = [], []
        for i in range(len(self._frames)):
            self.slider.setValue(i)  # redraws the view
            data = QByteArray()
            buf = QBuffer(data)
            buf.open(QIODevice.OpenModeFlag.WriteOnly)
            self.particles.grab().save(buf, "PNG")
            pngs.append(bytes(data))
            times.append(self._frames[i].t)
        self.slider.setValue(shown)
        self.play_button.setChecked(was_playing)
        self.status.setText(f"Writing {len(pngs)} PNG frames…")
        self._png_job = run_job(dy.write_png_sequence, folder, pngs, times,
                                on_result=lambda path: self._say(f"Wrote {len(pngs)} PNG frames to {path}"),
                                on_error=lambda exc, tb: self.status.setText(f"PNG frames not written: {exc}"),
                                owner=self)

    def _say(self, message: str) -> None:
        """In the panel's status line and the window's status bar (where an export saved)."""
        self.status.setText(message)
        say_in_status_bar(self, message)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if not self._shown_once:  # a first look shows the starting particles, not empty axes
            self._shown_once = True
            # not once Reset was pressed: particles another model's arrival cleared meanwhile stay cleared (the
            # status asks for Reset), rather than built from the new model's head and the old trace's tokens
            self._after_paint.call(lambda: not self._reset_asked and self.reset())

    def screenshot_ready(self) -> bool:
        """The starting particles and the model's curves are drawn (or said to have failed)."""
        return not self._after_paint.pending and self._build_job is None and self._curves_job is None

    def closeEvent(self, event) -> None:
        self.timer.stop()
        self._cancel_jobs()
        self._steps_asked = 0
        self._awaiting_trace = self._trace_cancelled = False
        super().closeEvent(event)


def _play_dtype():
    import torch

    return torch.float32  # twice as fast as float64 at n = 2000; the tests' known answers use the core in float64
