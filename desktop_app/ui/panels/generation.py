"""Generate panel: step through generation token by token and see every choice the model had.

Decoder models: Step (Right arrow), Back (Left arrow), Run N / Stop, Reset; the next-token
distribution as bars (temperature / top-k / top-p sliders reshape it live, from the stored logits,
without running the model); clicking a bar forces that token (a branch); the branches as a tree;
the text as a token strip coloured by the probability each token had. Selecting a generated token
shows the distribution it was picked from, the logit lens of that step, and hands that step's
attention to the Attention panel. Encoder models fill [MASK] positions instead.

All model work runs in workers (run_job); the UI thread only re-processes stored logits.
"""
from __future__ import annotations

import math

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFont, QKeySequence, QShortcut
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QPushButton, QSlider,
                               QSpinBox, QSplitter, QTableWidget, QTableWidgetItem, QTabWidget, QTreeWidget,
                               QTreeWidgetItem, QVBoxLayout, QWidget)

from ...core.generation import (STRATEGIES, GenerationError, GenerationSession, GenerationSettings,
                                MaskedFillSession, process_logits)
from ..widgets.prob_bars import ProbBars
from ..widgets.token_strip import TokenStrip
from ..state import tokenize_and_trace
from ..workers import run_job

TOP_BARS = 15


# -- worker functions (run off the UI thread) ------------------------------------------------


def _start_decoder(loaded, ids, settings, seed):
    return GenerationSession(loaded, ids, settings, seed=seed)


def _start_encoder(loaded, ids, masked, mask_id, settings, order, seed):
    s = MaskedFillSession(loaded, ids, masked, mask_id, settings, order, seed)
    s.all_logits()  # the view reads cached logits only
    return s


def _mutate(session, action: str, *args):
    """One session change; for encoders also the logits of the new sequence."""
    result = getattr(session, action)(*args)
    if isinstance(session, MaskedFillSession):
        session.all_logits()
    return result


def _run(session, n: int, job=None):
    for _ in session.run(n, job):
        if isinstance(session, MaskedFillSession):
            session.all_logits()
    return session.stop_reason if isinstance(session, GenerationSession) else None


def _inspect(session, node):
    """Logit lens of the step that picked `node` and the Trace of the path up to that step."""
    lens = session.logit_lens(node)
    trace, ids = session.step_trace(node.parent)
    return node, lens, trace, ids


class GenerationPanel(QWidget):
    title = "Generate"
    shortcuts = (("Right", "Step"), ("Left", "Back"))  # (key, what): made below, listed in Help
    help_text = (
        "<b>Generate</b>: the model predicts a distribution over the next token; a strategy picks one.<br>"
        "Temperature T: p<sub>i</sub> &prop; exp(logit<sub>i</sub>/T) (T&rarr;0 greedy, T&rarr;&infin; uniform). "
        "Top-k keeps the k most probable tokens; top-p (nucleus) keeps the smallest set whose mass "
        "reaches p; what is kept is renormalised. Temperature never changes top-k's set but can change "
        "top-p's.<br>Filled bars: the processed distribution; dashed outlines: the model's own "
        "probabilities; orange: the token picked. Entropy H = -&sum; p log p (nats).<br>"
        "Greedy takes the most probable token; beam search keeps the B sequences with the highest "
        "total log-probability. Click a bar to force a token (a new branch); Right/Left arrows step "
        "and go back. Select a generated token to see the logit lens of that step (final norm + "
        "unembedding of each layer's residual) and its attention in the Attention panel.<br>"
        "Encoder (BERT) models: [MASK] positions are filled one at a time, most confident first or "
        "left to right.")

    session_changed = Signal()

    def __init__(self, state, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.session: GenerationSession | MaskedFillSession | None = None
        # Busy flags live on the UI thread and drop when a job's result (or cancel/error) has been
        # handled there, not when the worker returns: no action can slip in between.
        self._job = None  # the one job touching the session
        self._run_job = None
        self._job_active = False
        self._running = False
        self.selected_node = None  # decoder: a generated node picked in the strip
        self.selected_position: int | None = None  # encoder: a position picked in the strip
        self.lens_rows = []
        self._session_prompt = self._started_prompt = ""
        self._extra_masks: set[int] = set()
        self._settings_pending = False  # sliders moved while a job held the session
        self._trail = None  # decoder: the deepest node left by Back (its branch is highlighted)
        self._refresh_timer = QTimer(self, singleShot=True, interval=40)
        self._refresh_timer.timeout.connect(self.refresh)
        self._build()
        state.model_changed.connect(self._on_model)
        state.device_changed.connect(lambda _: self._drop_session("device changed: press Step to start again"))
        if state.loaded is not None:
            self._on_model(state.loaded)

    # -- layout ----------------------------------------------------------------------------
    def _build(self) -> None:
        self.prompt = QLineEdit()
        self.prompt.setPlaceholderText("prompt (token ids separated by spaces if the model has no tokenizer)")
        self.prompt.returnPressed.connect(self.start)
        self.start_button = QPushButton("Start")
        self.start_button.setToolTip("Run the prompt and start a new generation tree")
        self.start_button.clicked.connect(self.start)
        self.strategy = QComboBox()
        self.strategy.addItems(STRATEGIES)
        self.strategy.currentTextChanged.connect(self._settings_changed)
        self.order = QComboBox()
        self.order.addItems(MaskedFillSession.ORDERS)
        self.order.setToolTip("Encoder models: which masked position to fill next")
        self.order.currentTextChanged.connect(lambda _: self.start() if self._is_encoder() and self.session else None)
        self.beams = QSpinBox(minimum=1, maximum=16, value=4, prefix="beams ")
        self.beams.valueChanged.connect(self._settings_changed)
        self.seed = QSpinBox(minimum=0, maximum=2**31 - 1, value=0, prefix="seed ")
        self.seed.setToolTip("Random seed for sampling; Reset regenerates with it")
        self.seed.valueChanged.connect(self._seed_changed)
        top = QHBoxLayout()
        top.addWidget(self.prompt, 1)
        for w in (self.start_button, self.strategy, self.order, self.beams, self.seed):
            top.addWidget(w)

        self.back_button = QPushButton("\u2190 Back")
        self.back_button.clicked.connect(self.back)
        self.step_button = QPushButton("Step \u2192")
        self.step_button.clicked.connect(self.step)
        self.run_n = QSpinBox(minimum=1, maximum=4096, value=20, prefix="N = ")
        self.run_button = QPushButton("Run N")
        self.run_button.clicked.connect(self.run_or_stop)
        self.reset_button = QPushButton("Reset")
        self.reset_button.clicked.connect(self.reset)
        self.mask_button = QPushButton("Mask / unmask selected")
        self.mask_button.setToolTip("Encoder models: toggle [MASK] on the selected token and restart")
        self.mask_button.clicked.connect(self.toggle_mask)
        controls = QHBoxLayout()
        for w in (self.back_button, self.step_button, self.run_n, self.run_button, self.reset_button, self.mask_button):
            controls.addWidget(w)
        controls.addStretch(1)

        self.temperature = self._slider(0, 300, 100)
        self.top_k = self._slider(0, 100, 0)
        self.top_p = self._slider(1, 100, 100)
        self.temperature_label, self.top_k_label, self.top_p_label = QLabel(), QLabel(), QLabel()
        sliders = QHBoxLayout()
        for lab, s in ((self.temperature_label, self.temperature), (self.top_k_label, self.top_k),
                       (self.top_p_label, self.top_p)):
            lab.setMinimumWidth(95)
            sliders.addWidget(lab)
            sliders.addWidget(s, 1)
        self._update_slider_labels()

        self.bars = ProbBars()
        self.bars.token_clicked.connect(self.choose)
        self.dist_label = QLabel()
        self.dist_label.setWordWrap(True)
        left = QWidget()
        lv = QVBoxLayout(left)
        lv.setContentsMargins(0, 0, 0, 0)
        lv.addWidget(self.dist_label)
        lv.addWidget(self.bars, 1)

        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["branch", "tokens", "log p"])
        self.tree.header().setStretchLastSection(False)
        self.tree.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in (1, 2):
            self.tree.header().setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        self.tree.itemClicked.connect(self._tree_clicked)
        self.beam_table = self._table(["beam", "log p", "ended"], stretch=0)
        self.lens_table = self._table(["layer", "top prediction", "p(top)", "p(picked)"], stretch=1)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.lens_table, "Logit lens")
        self.tabs.addTab(self.beam_table, "Beams")
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.tree)
        right.addWidget(self.tabs)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)

        self.strip = TokenStrip()
        self.strip.setMinimumHeight(70)
        self.strip.token_selected.connect(self._strip_selected)
        self.status = QLabel("Open a model, type a prompt and press Step.")
        self.status.setWordWrap(True)

        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addLayout(controls)
        lay.addLayout(sliders)
        lay.addWidget(split, 1)
        lay.addWidget(QLabel("Text (colour: probability the model gave each generated token; click one to inspect it)"))
        lay.addWidget(self.strip)
        lay.addWidget(self.status)

        ctx = Qt.ShortcutContext.WidgetWithChildrenShortcut
        for (key, _), slot in zip(self.shortcuts, (self.step, self.back)):
            sc = QShortcut(QKeySequence(key), self)
            sc.setContext(ctx)
            sc.activated.connect(slot)
        self._update_enabled()

    def _slider(self, lo: int, hi: int, value: int) -> QSlider:
        s = QSlider(Qt.Orientation.Horizontal)
        s.setRange(lo, hi)
        s.setValue(value)
        s.valueChanged.connect(self._settings_changed)
        return s

    @staticmethod
    def _table(headers: list[str], stretch: int) -> QTableWidget:
        t = QTableWidget(0, len(headers))
        t.setHorizontalHeaderLabels(headers)
        t.horizontalHeader().setStretchLastSection(False)
        for col in range(len(headers)):
            t.horizontalHeader().setSectionResizeMode(
                col, QHeaderView.ResizeMode.Stretch if col == stretch else QHeaderView.ResizeMode.ResizeToContents)
        t.verticalHeader().setVisible(False)
        t.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        return t

    # -- state -----------------------------------------------------------------------------
    def settings(self) -> GenerationSettings:
        strategy = self.strategy.currentText()
        if self._is_encoder() and strategy == "beam":
            strategy = "greedy"
        return GenerationSettings(strategy, self.temperature.value() / 100.0, self.top_k.value(),
                                  self.top_p.value() / 100.0, self.beams.value())

    def _is_encoder(self) -> bool:
        return self.state.loaded is not None and not self.state.loaded.config.causal

    @property
    def busy(self) -> bool:
        return self._job_active or self._running

    def _on_model(self, loaded) -> None:
        if self._running:
            self._run_job.cancel()
        self.session = None
        self.selected_node, self.selected_position = None, None
        self._extra_masks = set()
        enc = self._is_encoder()
        self.order.setVisible(enc)
        self.mask_button.setVisible(enc)
        self.beams.setVisible(not enc)
        if enc and not self.prompt.text():
            self.prompt.setPlaceholderText("text with [MASK] tokens to fill (or select tokens and press Mask)")
        self.status.setText(f"{loaded.name}: " + ("encoder model - fills [MASK] positions." if enc else
                                                  "type a prompt and press Step (Right arrow)."))
        self.refresh()

    def _drop_session(self, message: str) -> None:
        if self._running:
            self._run_job.cancel()
        self.session = None
        self.selected_node, self.selected_position = None, None
        self.status.setText(message)
        self.refresh()

    def _stale(self) -> bool:
        """The prompt box no longer holds the prompt the session was started from."""
        return self.session is not None and self.prompt.text() != self._session_prompt

    def _update_slider_labels(self) -> None:
        self.temperature_label.setText(f"temperature {self.temperature.value() / 100:.2f}")
        k = self.top_k.value()
        self.top_k_label.setText(f"top-k {k if k else 'off'}")
        p = self.top_p.value() / 100
        self.top_p_label.setText(f"top-p {p:.2f}" if p < 1 else "top-p off")

    def _settings_changed(self, *_):
        self._update_slider_labels()
        self._settings_pending = True
        self._apply_settings()
        self.refresh()  # the bars are re-processed from stored logits: no model run

    def _apply_settings(self) -> None:
        """Hand pending slider/strategy changes to the session; a worker holding it gets them
        when it finishes (the session is not touched under a running job)."""
        if not self._settings_pending or self.session is None or self.busy:
            return
        self._settings_pending = False
        try:
            self.session.set_settings(self.settings())
        except GenerationError as exc:
            self.status.setText(str(exc))

    def _seed_changed(self, seed: int) -> None:
        if self.session is not None:
            self.status.setText(f"Seed {seed}: press Reset to generate again with it.")

    def _update_enabled(self) -> None:
        running = self._running
        busy = self.busy
        for w in (self.step_button, self.back_button, self.reset_button, self.start_button, self.mask_button):
            w.setEnabled(not busy and self.state.loaded is not None)
        self.run_button.setEnabled(self.state.loaded is not None and (running or not busy))
        self.run_button.setText("Stop" if running else "Run N")

    # -- actions ---------------------------------------------------------------------------
    def _prompt_ids(self) -> list[int]:
        loaded = self.state.loaded
        text = self.prompt.text()
        if loaded.tokenizer is not None:
            return loaded.tokenizer.encode(text)
        try:
            return [int(p) for p in text.replace(",", " ").split()]
        except ValueError:
            raise GenerationError("this model has no tokenizer.json: type token ids separated by spaces") from None

    def start(self, then=None) -> None:
        """Run the prompt (in a worker) and start a fresh tree; `then` runs after it is ready."""
        loaded = self.state.loaded
        if loaded is None or self.busy:
            return
        try:
            ids = self._prompt_ids()
            if not ids:
                raise GenerationError("the prompt is empty")
        except GenerationError as exc:
            self.status.setText(str(exc))
            return
        self.selected_node, self.selected_position = None, None
        self._started_prompt = self.prompt.text()
        if self._is_encoder():
            mask_id = loaded.tokenizer.mask_token_id if loaded.tokenizer is not None else None
            if mask_id is None:
                self.status.setText("this encoder's tokenizer has no [MASK] token")
                return
            masked = sorted({i for i, t in enumerate(ids) if t == mask_id} | {p for p in self._extra_masks if p < len(ids)})
            if not masked:
                self.status.setText("put [MASK] in the text, or select a token and press Mask / unmask")
                self._show_plain_tokens(ids)
                return
            self._submit(_start_encoder, loaded, ids, masked, mask_id, self.settings(), self.order.currentText(),
                         self.seed.value(), on_result=lambda s: self._session_ready(s, then))
        else:
            self._submit(_start_decoder, loaded, ids, self.settings(), self.seed.value(),
                         on_result=lambda s: self._session_ready(s, then))

    def _session_ready(self, session, then) -> None:
        self.session = session
        self._trail = None
        self._session_prompt = self._started_prompt
        self._apply_settings()  # sliders moved while the prompt ran
        self.session_changed.emit()
        self.status.setText("Ready: Step (Right arrow), Back (Left arrow), click a bar to force a token.")
        self.refresh()
        if then is not None:
            then()

    def step(self) -> None:
        if self.busy or self.state.loaded is None:
            return
        if self.session is None or self._stale():
            self.start(then=self.step)
            return
        self.selected_node, self.selected_position = None, None
        self._submit(_mutate, self.session, "step")

    def back(self) -> None:
        if self.busy or self.session is None:
            return
        self.selected_node, self.selected_position = None, None
        if isinstance(self.session, GenerationSession):
            # repeated Backs keep the deepest node left, so the bars highlight the branch we came from
            left = self.session.current
            if self._trail is None or left not in self._trail.path():
                self._trail = left
        self._submit(_mutate, self.session, "back")

    def reset(self) -> None:
        if self.busy or self.session is None:
            return
        self.selected_node, self.selected_position = None, None
        self._trail = None
        self._submit(_mutate, self.session, "reset", self.seed.value())  # the seed in the box, not the first one

    def choose(self, token_id: int) -> None:
        """Force a token: after the node whose distribution is shown (a branch if it differs)."""
        if self.busy or self.session is None:
            return
        s = self.session
        if isinstance(s, MaskedFillSession):
            pos = self._shown_position()
            if pos is None or pos not in s.remaining:
                self.status.setText("select a masked position (or let the order pick one) to fill it")
                return
            self.selected_position = None
            self._submit(_mutate, s, "choose", int(token_id), pos)
            return
        base = self.selected_node.parent if self.selected_node is not None else s.current
        if base is not s.current:
            s.goto(base)  # pure navigation, no model work
        self.selected_node = None
        self._submit(_mutate, s, "choose", int(token_id))

    def run_or_stop(self) -> None:
        if self._running:
            self._run_job.cancel()  # the worker checks between tokens
            return
        if self.busy or self.state.loaded is None:
            return
        if self.session is None or self._stale():
            self.start(then=self.run_or_stop)
            return
        self.selected_node, self.selected_position = None, None
        n = self.run_n.value()

        def ended(message_fn):
            def handler(*args) -> None:
                self._running = False
                message_fn(*args)
                self.refresh()
            return handler

        def finished() -> None:
            self._running = False
            self._apply_settings()
            self.refresh()

        def progress(*_) -> None:
            if not self._refresh_timer.isActive():  # a throttle: restarting it per token would starve it
                self._refresh_timer.start()

        self._running = True
        self._run_job = run_job(_run, self.session, n, on_result=ended(self._run_done), on_error=ended(self._job_failed),
                                on_progress=progress,
                                on_cancelled=ended(lambda: self.status.setText("Stopped.")), on_finished=finished)
        self._update_enabled()

    def _run_done(self, reason) -> None:
        self.status.setText(f"Stopped: {reason}." if reason else "Done.")

    def toggle_mask(self) -> None:
        if self.busy:  # restarting would drop the session under a running job
            self.status.setText("wait for the current job to finish (or Stop it) before masking")
            return
        pos = self.strip.selected_index
        if pos is None:
            self.status.setText("select a token in the strip first")
            return
        self._extra_masks ^= {pos}
        self.session = None
        self.start()

    def _submit(self, fn, *args, on_result=None) -> None:
        def done(result) -> None:
            self._job_active = False
            if on_result is not None:
                on_result(result)
            else:
                self.refresh()

        def failed(exc, tb) -> None:
            self._job_active = False
            self._job_failed(exc, tb)

        def finished() -> None:
            if self._job is job:  # not a follow-up job started by on_result (start -> step)
                self._job_active = False
                self._apply_settings()
            self._update_enabled()

        self._job_active = True
        self._job = job = run_job(fn, *args, on_result=done, on_error=failed, on_finished=finished)
        self._update_enabled()

    def _job_failed(self, exc: BaseException, tb: str) -> None:
        self.status.setText(str(exc))
        self.refresh()

    # -- selection and inspection ----------------------------------------------------------
    def _strip_selected(self, index: int) -> None:
        s = self.session
        if s is None:
            return
        if isinstance(s, MaskedFillSession):
            self.selected_position = index
            self.refresh()
            if not self.busy:  # the inspecting panels show the sequence as filled so far
                self._submit(tokenize_and_trace, self.state.loaded, "", s.ids(),
                             on_result=self._show_filled)
            return
        n_prompt = len(s.prompt)
        path = s.current.path()
        if index < n_prompt:
            self.selected_node = None
            if s.record and not self.busy:
                trace, ids = s.step_trace(s.root)
                self.state.show_trace(trace, ids)
            self.refresh()
            return
        self.selected_node = path[index - n_prompt + 1]
        self.refresh()
        if not self.busy:
            self._submit(_inspect, s, self.selected_node, on_result=self._inspected)

    def _show_filled(self, result) -> None:
        ids, trace = result
        self.refresh()
        if trace is not None:
            self.state.show_trace(trace, ids)

    def _inspected(self, result) -> None:
        node, lens, trace, ids = result
        self.lens_rows = lens
        names = self.state.token_strings([r.top_token for r in lens])
        self.lens_table.setRowCount(len(lens))
        for i, (r, name) in enumerate(zip(lens, names)):
            cells = ["embed" if r.layer < 0 else f"block {r.layer}", f"{name!r} ({r.top_token})",
                     f"{r.top_prob:.3f}", f"{r.chosen_prob:.3f}"]
            for j, c in enumerate(cells):
                self.lens_table.setItem(i, j, QTableWidgetItem(c))
        self.tabs.setCurrentWidget(self.lens_table)
        picked = self.state.token_strings([node.token])[0]
        self.status.setText(f"Step {node.depth}: picked {picked!r} ({node.token}) with p = {node.model_prob:.3f}; "
                            "its attention is in the Attention panel.")
        self.state.show_trace(trace, ids)

    def _tree_clicked(self, item: QTreeWidgetItem, column: int) -> None:
        node = item.data(0, Qt.ItemDataRole.UserRole)
        if node is None or self.session is None or self.busy:
            return
        self.selected_node = None
        self.session.goto(node)  # pure navigation; the cache is rebuilt lazily on the next step
        self.refresh()

    def _shown_position(self) -> int | None:
        s = self.session
        if not isinstance(s, MaskedFillSession):
            return None
        if self.selected_position is not None:
            return self.selected_position
        if s.finished or s.cached_logits() is None:
            return None
        return s.next_position()

    # -- rendering -------------------------------------------------------------------------
    def refresh(self) -> None:
        self._update_enabled()
        s = self.session
        if s is None:
            self.bars.set_distribution([], [], [])
            self.dist_label.setText("")
            self.tree.clear()
            self.beam_table.setRowCount(0)
            return
        if isinstance(s, MaskedFillSession):
            self._refresh_encoder(s)
        else:
            self._refresh_decoder(s)

    def _show_plain_tokens(self, ids: list[int]) -> None:
        self.strip.set_tokens(self.state.token_strings(ids), ids)

    def _refresh_decoder(self, s: GenerationSession) -> None:
        ids = s.ids()
        path = s.current.path()
        values = [None] * len(s.prompt) + [n.model_prob for n in path[1:]]
        self.strip.set_tokens(self.state.token_strings(ids), ids, values, vmin=0.0, vmax=1.0)
        sel = self.selected_node
        if sel is not None and sel in path:
            self.strip.set_selected(len(s.prompt) + path.index(sel) - 1)
            base, chosen = sel.parent, sel.token
        else:
            self.selected_node = None
            self.strip.set_selected(None)
            base = s.current
            chosen = self._forward_child(base)
        try:
            dist = process_logits(base.next_logits, *self._processing())
        except GenerationError as exc:
            self.dist_label.setText(str(exc))
            return
        self._show_distribution(dist, chosen, base.depth + 1, base is s.current and s.current.stop)
        self._refresh_tree(s)
        self._refresh_beams(s)

    def _forward_child(self, base):
        """Token to highlight after `base`: the one on the branch Back left, else the newest child."""
        if self._trail is not None:
            path = self._trail.path()
            if base in path[:-1]:
                return path[path.index(base) + 1].token
        return base.children[-1].token if base.children else None

    def _processing(self) -> tuple[float, int, float]:
        st = self.settings()
        st = st.validated()
        return st.temperature, st.top_k, st.top_p

    def _show_distribution(self, dist, chosen: int | None, depth: int, ended: bool) -> None:
        top = dist.top(TOP_BARS, by="tempered_probs")
        if chosen is not None and chosen not in [t for t, _ in top]:
            top.append((chosen, float(dist.tempered_probs[chosen])))
        tokens = [t for t, _ in top]
        labels = [repr(x) for x in self.state.token_strings(tokens)]
        self.bars.set_distribution(tokens, labels, [float(dist.probs[t]) for t in tokens],
                                   [float(dist.model_probs[t]) for t in tokens], chosen)
        kept = int(dist.kept.sum())
        text = (f"entropy {dist.entropy:.3f} nats (model: {dist.model_entropy:.3f}); "
                f"{kept} of {dist.kept.numel()} tokens kept; step {depth}")
        if chosen is not None:
            name = self.state.token_strings([chosen])[0]
            text += (f"; picked {name!r} ({chosen}): p = {float(dist.probs[chosen]):.3f} "
                     f"(model {float(dist.model_probs[chosen]):.3f})")
        if ended:
            text += " - a stop token ended this branch"
        self.dist_label.setText(text)

    def _refresh_tree(self, s: GenerationSession) -> None:
        """Branches as a compressed tree: one item per run of tokens between forks."""
        self.tree.clear()
        current_path = set(map(id, s.current.path()))
        bold = QFont()
        bold.setBold(True)

        def add(parent_item, start) -> None:
            seg = [start]
            while len(seg[-1].children) == 1:
                seg.append(seg[-1].children[0])
            end = seg[-1]
            toks = [n.token for n in seg if n.token is not None]
            text = "".join(self.state.token_strings(toks)) if toks else "(prompt)"
            item = QTreeWidgetItem([text.replace("\n", "\u21b5"), str(end.depth), f"{end.score:.2f}"])
            item.setData(0, Qt.ItemDataRole.UserRole, end)
            item.setToolTip(0, f"ends at step {end.depth}; click to go there")
            if id(end) in current_path or id(start) in current_path:
                item.setFont(0, bold)
            if parent_item is None:
                self.tree.addTopLevelItem(item)
            else:
                parent_item.addChild(item)
            for c in list(end.children):
                add(item, c)

        add(None, s.root)
        self.tree.expandAll()

    def _refresh_beams(self, s: GenerationSession) -> None:
        beams = sorted(s.beams, key=lambda b: -b.score) if s.settings.strategy == "beam" else []
        self.beam_table.setRowCount(len(beams))
        for i, b in enumerate(beams):
            toks = [n.token for n in b.path()[1:]]
            cells = ["".join(self.state.token_strings(toks)), f"{b.score:.3f}", "yes" if b.stop else ""]
            for j, c in enumerate(cells):
                self.beam_table.setItem(i, j, QTableWidgetItem(c))

    def _refresh_encoder(self, s: MaskedFillSession) -> None:
        ids = s.ids()
        filled = {st.position: st for st in s.history}
        values = [filled[i].model_prob if i in filled else None for i in range(len(ids))]
        self.strip.set_tokens(self.state.token_strings(ids), ids, values, vmin=0.0, vmax=1.0)
        self.strip.set_selected(self.selected_position)
        pos = self._shown_position()
        logits = s.cached_logits()
        if pos is None or logits is None:
            self.bars.set_distribution([], [], [])
            self.dist_label.setText("every masked position is filled" if s.finished else "")
            return
        dist = process_logits(logits[pos], *self._processing())
        chosen = filled[pos].token if pos in filled else None
        if pos in filled:  # show the distribution it was filled from
            dist = process_logits(filled[pos].logits, *self._processing())
        self._show_distribution(dist, chosen, len(s.history) + (pos not in filled), False)
        self.dist_label.setText(f"position {pos}: " + self.dist_label.text())
        self.tree.clear()
        for st in s.history:
            name = self.state.token_strings([st.token])[0]
            self.tree.addTopLevelItem(QTreeWidgetItem([f"position {st.position}: {name!r}", "", f"{math.log(max(st.model_prob, 1e-300)):.2f}"]))

    # -- --screenshot ----------------------------------------------------------------------
    def screenshot_demo(self) -> None:
        """Mid-generation with a branch, as in the README: six steps, back two, force the runner-up
        candidate (a second branch), three more steps, then inspect the forced token."""
        from ..demo import ScriptedDemo

        if self._is_encoder():
            self._demo = ScriptedDemo([self.step, self.step], lambda: self.busy, self)
            return
        if not self.prompt.text():
            self.prompt.setText("So she was considering")
        forced = {}

        def force_runner_up() -> None:
            runner_up = next((t for t in self.bars.token_ids if t != self.bars.chosen), None)
            if self.session is not None and runner_up is not None:
                forced["index"] = len(self.session.prompt) + self.session.current.depth
                self.choose(runner_up)

        def inspect_forced() -> None:
            if "index" in forced:
                self._strip_selected(forced["index"])

        self._demo = ScriptedDemo([self.step] * 6 + [self.back] * 2 + [force_runner_up] + [self.step] * 3
                                  + [inspect_forced], lambda: self.busy, self)

    def screenshot_ready(self) -> bool:
        return self._demo.done
