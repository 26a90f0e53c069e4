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
from ..widgets.export import ExportBar
from ..widgets.prob_bars import ProbBars, format_prob
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


def _lens(session, node):
    return node, session.logit_lens(node)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


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
        self._lens_node = None  # the step the logit-lens table shows (or is being computed for)
        self._auto_prompt = ""  # the prompt the panel filled in (replaced on a model change unless edited)
        self._unavailable: str | None = None  # why this model cannot generate (no head, no [MASK])
        self._shown = None  # (Distribution, chosen token) the bars show: for the CSV export
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
        # Every action is connected through a lambda: `clicked` sends `checked`, which must never land
        # in an optional parameter such as start(then=...).
        self.prompt.returnPressed.connect(lambda: self.start())
        self.start_button = QPushButton("Start")
        self.start_button.setToolTip("Run the prompt and start a new generation tree")
        self.start_button.clicked.connect(lambda: self._clicked(self.start))
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
        self.back_button.clicked.connect(lambda: self._clicked(self.back))
        self.step_button = QPushButton("Step \u2192")
        self.step_button.clicked.connect(lambda: self._clicked(self.step))
        self.run_n = QSpinBox(minimum=1, maximum=4096, value=20, prefix="N = ")
        self.run_button = QPushButton("Run N")
        self.run_button.clicked.connect(lambda: self._clicked(self.run_or_stop))
        self.reset_button = QPushButton("Reset")
        self.reset_button.clicked.connect(lambda: self._clicked(self.reset))
        self.mask_button = QPushButton("Mask / unmask selected")
        self.mask_button.setToolTip("Encoder models: toggle [MASK] on the selected token and restart")
        self.mask_button.clicked.connect(lambda: self._clicked(self.toggle_mask))
        # Clicking an action button leaves the focus on the panel (see _clicked): a focused button
        # that gets disabled while the job runs would hand the focus to "N = 20", which eats the arrows.
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        for b in (self.start_button, self.back_button, self.step_button, self.run_button, self.reset_button,
                  self.mask_button):
            b.setFocusPolicy(Qt.FocusPolicy.TabFocus)
        self.export_bar = ExportBar(lambda: self, self._export_name)
        controls = QHBoxLayout()
        for w in (self.back_button, self.step_button, self.run_n, self.run_button, self.reset_button, self.mask_button):
            controls.addWidget(w)
        controls.addStretch(1)
        controls.addWidget(self.export_bar)

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
        self._trail = None
        enc = self._is_encoder()
        self.order.setVisible(enc)
        self.mask_button.setVisible(enc)
        self.beams.setVisible(not enc)
        self.prompt.setPlaceholderText(
            "text with [MASK] tokens to fill (or select tokens and press Mask)" if enc and loaded.tokenizer else
            "prompt: token ids separated by spaces (this model has no tokenizer)" if loaded.tokenizer is None else
            "prompt")
        self._unavailable = self._why_unavailable(loaded)
        if self.prompt.text() in ("", self._auto_prompt):  # never replace what the user typed
            self._auto_prompt = self._default_prompt(loaded)
            self.prompt.setText(self._auto_prompt)
        if self._unavailable:
            self.status.setText(f"{loaded.name}: {self._unavailable}")
        else:
            self.status.setText(f"{loaded.name}: " + ("encoder model - press Step to fill the [MASK] positions."
                                                      if enc else "press Step (Right arrow) to generate."))
        self.refresh()

    @staticmethod
    def _why_unavailable(loaded) -> str | None:
        """Why this model cannot generate at all, said as soon as it opens (the controls are disabled)."""
        enc = not loaded.config.causal
        if not loaded.config.lm_head:
            return ("this encoder has no masked-language-model head, so it cannot predict tokens: Generate "
                    "needs a model with an MLM head (Attention and Layers still work)." if enc else
                    "this model has no language-model head, so it cannot predict tokens: Generate needs a "
                    "model with one (Attention and Layers still work).")
        if enc and loaded.tokenizer is None:
            return ("this encoder has no tokenizer (its text box takes token ids), so it has no [MASK] token "
                    "to fill: Generate needs a tokenizer.json with a [MASK] token.")
        if enc and loaded.tokenizer.mask_token_id is None:
            return "this encoder's tokenizer has no [MASK] token, so there is nothing to fill."
        return None

    def _default_prompt(self, loaded) -> str:
        """A prompt that works at once: the start of the current text (or of the demo text); with no
        tokenizer, a few of the text's ids (or the first ids of the vocabulary); an encoder gets one
        word replaced by its mask token."""
        text = self.state.text.strip()
        tok = loaded.tokenizer
        if tok is None:
            try:
                ids = [int(p) for p in text.replace(",", " ").split()]
            except ValueError:
                ids = []
            ids = [i for i in ids if 0 <= i < loaded.config.vocab_size][:6] or list(range(min(4, loaded.config.vocab_size)))
            return " ".join(map(str, ids))
        if not text:
            from ..app import demo_text
            text = demo_text()
        words = text.split()[:8 if not loaded.config.causal else 6]
        if not loaded.config.causal and tok.mask_token_id is not None and len(words) > 1:
            words[len(words) // 2] = tok.tok.id_to_token(tok.mask_token_id)
        return " ".join(words)

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
        usable = self.state.loaded is not None and not self._unavailable
        for w in (self.step_button, self.back_button, self.reset_button, self.start_button, self.mask_button):
            w.setEnabled(not busy and usable)
        self.run_button.setEnabled(usable and (running or not busy))
        self.run_button.setText("Stop" if running else "Run N")
        for w in (self.prompt, self.strategy, self.order, self.beams, self.seed, self.run_n, self.temperature,
                  self.top_k, self.top_p):
            w.setEnabled(usable or self.state.loaded is None)

    def _clicked(self, action) -> None:
        """A button's action, with the keyboard focus left on the panel so the arrows keep stepping."""
        self.setFocus(Qt.FocusReason.OtherFocusReason)
        action()

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
        if self._unavailable:
            self.status.setText(self._unavailable)
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
            mask_id = loaded.tokenizer.mask_token_id  # _why_unavailable: a tokenizer with a [MASK]
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
        loaded = self.state.loaded
        if loaded is None or session.model is not loaded.model:
            return  # started on a model that has since been replaced (another model, another device)
        self.session = session
        self._trail = None
        self._session_prompt = self._started_prompt
        self._apply_settings()  # sliders moved while the prompt ran
        self.session_changed.emit()
        self.refresh()
        self.status.setText(self._describe())
        if then is not None:
            then()

    def step(self) -> None:
        if self.busy or self.state.loaded is None:
            return
        if self.session is None or self._stale():
            self.start(then=self.step)
            return
        self.selected_node, self.selected_position = None, None
        self._submit(_mutate, self.session, "step", on_result=self._changed)

    def back(self) -> None:
        if self.busy or self.session is None:
            return
        self.selected_node, self.selected_position = None, None
        if isinstance(self.session, GenerationSession):
            # repeated Backs keep the deepest node left, so the bars highlight the branch we came from
            left = self.session.current
            if self._trail is None or left not in self._trail.path():
                self._trail = left
        self._submit(_mutate, self.session, "back", on_result=self._changed)

    def reset(self) -> None:
        if self.busy or self.session is None:
            return
        self.selected_node, self.selected_position = None, None
        self._trail = None
        self._submit(_mutate, self.session, "reset", self.seed.value(),  # the seed in the box, not the first one
                     on_result=self._changed)

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
            self._submit(_mutate, s, "choose", int(token_id), pos, on_result=self._changed)
            return
        base = self.selected_node.parent if self.selected_node is not None else s.current
        if base is not s.current:
            s.goto(base)  # pure navigation, no model work
        self.selected_node = None
        self._submit(_mutate, s, "choose", int(token_id), on_result=self._changed)

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
        session = self.session

        def ended(message_fn):
            def handler(*args) -> None:
                self._running = False
                if self.session is session:  # not dropped meanwhile (another model opened)
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
        self.status.setText(f"Stopped: {reason}." if reason else f"Done. {self._describe()}")

    def _changed(self, _result) -> None:
        """After a step, back, choice or reset: the view and the status line describe the new step."""
        self.refresh()
        if self.session is not None:  # else dropped meanwhile (another model): keep what that said
            self.status.setText(self._describe())

    def _describe(self) -> str:
        """One line about where the session is now (the status line after every action)."""
        s = self.session
        if s is None:
            return ""
        if isinstance(s, MaskedFillSession):
            total, done = len(s.masked), len(s.history)
            if s.finished:
                return f"Every masked position is filled ({total} of {total}); Back undoes the last fill."
            return (f"{done} of {plural(total, 'masked position')} filled: Step (Right arrow) fills the next, "
                    "click a bar to fill it with that token.")
        node = s.current
        if node.parent is None:
            return (f"Ready: a prompt of {plural(len(s.prompt), 'token')}. Step (Right arrow), Back (Left arrow), "
                    "click a bar to force a token.")
        how = {"greedy": "greedy", "sampled": "sampled", "chosen": "forced", "beam": "beam search"}
        text = (f"Step {node.depth}: {self._token_label(node.token)} ({how.get(node.how, node.how)}), "
                f"model p = {format_prob(node.model_prob)}")
        if node.stop:
            text += "; a stop token ended this branch"
        elif len(s.prompt) + node.depth >= s.model.cfg.context_length:
            text += f"; the context length ({plural(s.model.cfg.context_length, 'token')}) is reached"
        return text + "."

    def _token_label(self, token: int) -> str:
        """A token as the user reads it: quoted (spaces visible) with its id; with no tokenizer, the id."""
        if self.state.loaded is None or self.state.loaded.tokenizer is None:
            return f"id {token}"
        return f"{self.state.token_strings([token])[0]!r} ({token})"

    def _tokens_text(self, ids: list[int]) -> str:
        """Several tokens as one quoted string (a space token stays visible); with no tokenizer, the ids
        separated by spaces."""
        if self.state.loaded is None or self.state.loaded.tokenizer is None:
            return " ".join(map(str, ids))
        return repr("".join(self.state.token_strings(ids)))

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
        if not self.busy:
            self._clear_lens()
            self._lens_node = self.selected_node  # _inspect brings this step's lens (and its trace)
            self.refresh()
            self._submit(_inspect, s, self.selected_node, on_result=self._inspected)
        else:
            self.refresh()

    def _show_filled(self, result) -> None:
        ids, trace = result
        self.refresh()
        if trace is not None:
            self.state.show_trace(trace, ids)

    def _inspected(self, result) -> None:
        node, lens, trace, ids = result
        self._lens_node = node
        self._show_lens(node, lens)
        self.tabs.setCurrentWidget(self.lens_table)
        self.status.setText(f"Step {node.depth}: picked {self._token_label(node.token)} with p = "
                            f"{format_prob(node.model_prob)}; its attention is in the Attention panel.")
        self.state.show_trace(trace, ids)

    def _show_lens(self, node, lens) -> None:
        self.lens_rows = lens
        self.lens_table.setRowCount(len(lens))
        for i, r in enumerate(lens):
            cells = ["embed" if r.layer < 0 else f"block {r.layer}", self._token_label(r.top_token),
                     format_prob(r.top_prob), format_prob(r.chosen_prob)]
            for j, c in enumerate(cells):
                self.lens_table.setItem(i, j, QTableWidgetItem(c))
        self.tabs.setTabText(self.tabs.indexOf(self.lens_table), f"Logit lens (step {node.depth})")

    def _clear_lens(self) -> None:
        self.lens_rows = []
        self.lens_table.setRowCount(0)
        self.tabs.setTabText(self.tabs.indexOf(self.lens_table), "Logit lens")

    def _follow_lens(self, s: GenerationSession) -> None:
        """The lens table shows the selected step, else the current one: never a step left behind."""
        node = self.selected_node if self.selected_node is not None else s.current
        if node is self._lens_node:
            return
        self._clear_lens()
        self._lens_node = None
        if node.parent is None or not s.record or self._running:
            return  # at the prompt there is no step; a run refreshes again when it ends
        self._lens_node = node

        def shown(result) -> None:
            lens_node, lens = result
            if lens_node is self._lens_node and self.session is s:
                self._show_lens(lens_node, lens)

        # Not a session job (no busy flag, actions stay available): it only reads the node's recorded
        # residuals, which never change, and the model's unembedding.
        # A failed lens leaves the table empty: the step itself stands and its status line says so.
        run_job(_lens, s, node, on_result=shown, on_error=lambda *_: None, owner=self)

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
        if s is None:  # nothing of a previous session or model stays on screen
            self.bars.set_distribution([], [], [])
            self._shown = None
            self.dist_label.setText("")
            self.tree.clear()
            self.beam_table.setRowCount(0)
            self.strip.set_tokens([], [])
            self._clear_lens()
            self._lens_node = None
            return
        if isinstance(s, MaskedFillSession):
            self._clear_lens()
            self._refresh_encoder(s)
        else:
            self._refresh_decoder(s)
            self._follow_lens(s)

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
        if self.state.loaded is not None and self.state.loaded.tokenizer is None:
            labels = [str(t) for t in tokens]  # ProbBars shows the id once
        else:
            labels = [repr(x) for x in self.state.token_strings(tokens)]
        self.bars.set_distribution(tokens, labels, [float(dist.probs[t]) for t in tokens],
                                   [float(dist.model_probs[t]) for t in tokens], chosen)
        self._shown = (dist, chosen)
        kept = int(dist.kept.sum())
        text = (f"entropy {format_prob(dist.entropy)} nats (model: {format_prob(dist.model_entropy)}); "
                f"{kept} of {dist.kept.numel()} tokens kept; candidates for step {depth}")
        if chosen is not None:
            text += (f"; picked {self._token_label(chosen)}: p = {format_prob(float(dist.probs[chosen]))} "
                     f"(model {format_prob(float(dist.model_probs[chosen]))})")
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
            text = self._tokens_text(toks) if toks else "(prompt)"
            item = QTreeWidgetItem([text, str(end.depth), f"{end.score:.3f}"])
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
            cells = [self._tokens_text(toks), f"{b.score:.3f}", "yes" if b.stop else ""]
            for j, c in enumerate(cells):
                self.beam_table.setItem(i, j, QTableWidgetItem(c))

    def _refresh_encoder(self, s: MaskedFillSession) -> None:
        ids = s.ids()
        filled = {st.position: st for st in s.history}
        values = [filled[i].model_prob if i in filled else None for i in range(len(ids))]
        self.strip.set_tokens(self.state.token_strings(ids), ids, values, vmin=0.0, vmax=1.0)
        self.strip.set_selected(self.selected_position)
        self.tree.clear()  # the fills so far, also once every position is filled
        for st in s.history:
            self.tree.addTopLevelItem(QTreeWidgetItem([f"position {st.position}: {self._token_label(st.token)}", "",
                                                       f"{math.log(max(st.model_prob, 1e-300)):.3f}"]))
        pos = self._shown_position()
        logits = s.cached_logits()
        if pos is None or logits is None:
            self.bars.set_distribution([], [], [])
            self._shown = None
            self.dist_label.setText("every masked position is filled" if s.finished else "")
            return
        dist = process_logits(logits[pos], *self._processing())
        chosen = filled[pos].token if pos in filled else None
        if pos in filled:  # show the distribution it was filled from
            dist = process_logits(filled[pos].logits, *self._processing())
        self._show_distribution(dist, chosen, len(s.history) + (pos not in filled), False)
        self.dist_label.setText(f"position {pos}: " + self.dist_label.text())

    # -- export (ExportBar view protocol; File > Export Current View takes export_widget) ---------
    def export_widget(self) -> QWidget:
        return self.bars.plot

    def svg_item(self):
        return self.bars.plot.getPlotItem()

    def _export_name(self) -> str:
        s = self.session
        if isinstance(s, GenerationSession):
            node = self.selected_node.parent if self.selected_node is not None else s.current
            return f"generate-step{node.depth + 1}"
        return "generate"

    def csv_table(self):
        """The distribution the bars show, every token of the vocabulary from the most probable down,
        then the generated steps of the current path (the `step` column tells the two apart)."""
        header = ["section", "rank_or_step", "token_id", "token", "p", "p_model", "kept", "picked"]
        rows = []
        if self._shown is not None:
            dist, chosen = self._shown
            strings = self.state.token_strings(list(range(dist.probs.numel())))
            order = sorted(range(dist.probs.numel()), key=lambda t: -float(dist.tempered_probs[t]))
            for rank, t in enumerate(order, 1):
                rows.append(["distribution", rank, t, strings[t], f"{float(dist.probs[t]):.6g}",
                             f"{float(dist.model_probs[t]):.6g}", int(bool(dist.kept[t])), int(t == chosen)])
        if isinstance(self.session, GenerationSession):
            path = self.session.current.path()[1:]
            strings = self.state.token_strings([n.token for n in path])
            for n, name in zip(path, strings):
                rows.append(["step", n.depth, n.token, name, f"{n.prob:.6g}", f"{n.model_prob:.6g}", 1, n.how])
        elif isinstance(self.session, MaskedFillSession):
            strings = self.state.token_strings([st.token for st in self.session.history])
            for i, (st, name) in enumerate(zip(self.session.history, strings), 1):
                rows.append(["step", i, st.token, name, "", f"{st.model_prob:.6g}", 1, f"position {st.position}"])
        return header, rows

    def export_arrays(self) -> dict:
        import numpy as np

        out = {}
        if self._shown is not None:
            dist, _ = self._shown
            out.update(probs=dist.probs.numpy(), model_probs=dist.model_probs.numpy(), kept=dist.kept.numpy())
        if isinstance(self.session, GenerationSession):
            path = self.session.current.path()[1:]
            out.update(ids=np.array(self.session.ids()), step_model_probs=np.array([n.model_prob for n in path]))
        return out

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
