"""Generate panel: step through generation token by token and see every choice the model had.

Decoder models: Step (Right arrow), Back (Left arrow), Run N / Stop, Reset; the next-token
distribution as bars (temperature / top-k / top-p sliders reshape it live, from the stored logits,
without running the model); clicking a bar forces that token (a branch); the branches as a tree;
the text as a token strip coloured by the probability each token had. Selecting a generated token
shows the distribution it was picked from, the logit lens of that step, and hands that step's
attention to the Attention panel. Encoder models fill [MASK] positions instead. When the what-if
edits change, the history stays and is recomputed for the edited model (with_interventions).

The panel holds the widgets both kinds of model share; what differs lives in two views
(generation_views): DecoderStepView for causal models, EncoderFillView for encoders, the one that
fits the open model shown. An encoder-decoder (T5, BART, Marian) steps through its target the same way
(DecoderStepView): the prompt box is its source, and beside the bars the step's cross-attention over
the source tokens (CrossAttentionStepView: every head of a decoder layer and their mean). The
--screenshot demo is in ui/demo.py.

All model work runs in workers through AppState.run for the model and the what-if edits it started
with (the prompt is the panel's own input): a result, error or progress of a job whose model or edits
are no longer current is dropped. The panel is a ResultView: a new model clears the session, new
edits recompute its history (with_interventions). The UI thread only re-processes stored logits.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (QComboBox, QDoubleSpinBox, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QPushButton,
                               QSlider, QSpinBox, QSplitter, QTableWidget, QTabWidget, QTreeWidget, QTreeWidgetItem,
                               QVBoxLayout, QWidget)

from ...app.generation import (EARLY_STOPPING, LENGTH_PENALTY, check_session_memory, check_start_memory,
                               generation_settings, plain_logits_at, why_cannot_generate)
from ...core.generation import (STRATEGIES, GenerationError, GenerationSession, GenerationSettings,
                                MaskedFillSession, process_logits)
from ...core.devices import MemoryEstimateError
from ...core.views.generation import GenerationViewState
from ...core.inputs import InputError
from ..widgets.export import ExportBar
from ..widgets.made_when_shown import MadeWhenShown
from ..widgets.prob_bars import ProbBars
from ..widgets.readable import format_prob
from ..state import EDITS, MODEL, ResultView
from ..widgets.token_strip import TokenStrip
from . import key_buttons
from .generation_views import CrossAttentionStepView, DecoderStepView, EncoderFillView, GenerationView, _mutate

TOP_BARS = 15
PLAIN_COMPUTING = "computing the model as trained\u2026"  # the line beside the edited bars meanwhile


# -- worker functions (run off the UI thread; the views have the rest) -------------------------


def _run(session, n: int, job=None):
    if isinstance(session, GenerationSession):
        # as generate(max_new_tokens=N) (the CLI's): a forced end token comes at the sequence so far + N;
        # for this run only (a later Step, after Back, is not the end of a run)
        session.max_length = len(session.ids()) + n
    try:
        # every node made in this worker (no lazy_last): the view's refresh reads them on the UI thread
        for _ in session.run(n, job):
            if isinstance(session, MaskedFillSession):
                session.all_logits()
    finally:
        if isinstance(session, GenerationSession):
            session.max_length = None
    return session.stop_reason if isinstance(session, GenerationSession) else None


def _with_edits(session, interventions: list, job=None):
    """The session's history on the model with these what-if edits (a new session)."""
    new = session.with_interventions(interventions or None, job)
    if isinstance(new, MaskedFillSession):
        new.all_logits()  # the view reads cached logits only
    return new


class GenerationPanel(QWidget, ResultView):
    title = "Generate"
    # (key, what): the arrows' shortcuts and the Run N button's key, made below, listed in Help
    shortcuts = (("Right", "Step"), ("Left", "Back"), ("Ctrl+Return", "Run N (Stop while it runs)"))
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
        "unembedding of each layer's residual) and its attention in the Attention panel. What-if edits "
        "(ablations) keep the history: its probabilities are recomputed for the edited model.<br>"
        "Encoder-decoders (T5, BART, Marian): the box is the source, encoded once; the steps write the "
        "target from the decoder's start token, and beside the bars is the cross-attention of the step "
        "shown: the weight each head of a decoder layer puts on each source token while the decoder "
        "predicts that token (each row sums to 1; the last row is the heads' mean).<br>"
        "Encoder (BERT) models: [MASK] positions are filled one at a time, most confident first or "
        "left to right.")

    session_changed = Signal()
    # What a session (and every job on it) is computed for: the model and the what-if edits. A new model
    # clears it; new edits recompute its history (clear_results).
    result_parts = (MODEL, EDITS)

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
        self._edits_pending = False  # the what-if edits changed while a job held the session
        self.view: GenerationView = DecoderStepView(self)  # the one that fits the open model
        self._refresh_timer = QTimer(self, singleShot=True, interval=40)
        self._refresh_timer.timeout.connect(self.refresh)
        self._build()
        state.model_changed.connect(self._on_model)
        state.device_changed.connect(lambda _: self._drop_session("device changed: press Step to start again"))
        self.watch_inputs(state)  # clear_results: a new model clears the session, new edits recompute it
        if state.loaded is not None:
            self._on_model(state.loaded)

    # -- layout ----------------------------------------------------------------------------
    def _build(self) -> None:
        self.prompt_label = QLabel("<b>Source</b>")  # shown for encoder-decoders only
        self.prompt_label.setVisible(False)
        self.prompt = QLineEdit()
        self.prompt.setPlaceholderText("prompt (token ids separated by spaces if the model has no tokenizer)")
        # Every action is connected through a lambda: `clicked` sends `checked`, which must never land
        # in an optional parameter such as start(then=...).
        self.prompt.returnPressed.connect(lambda: self.start())
        self.prompt.textChanged.connect(self._prompt_edited)
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
        # the beam search's options (app.generation: the CLI's --length-penalty and --early-stopping)
        self.length_penalty = QDoubleSpinBox(minimum=LENGTH_PENALTY.lo, maximum=LENGTH_PENALTY.hi, value=1.0,
                                             singleStep=0.1, decimals=2, prefix="length penalty ")
        self.length_penalty.setToolTip("Beam search: a finished sequence scores log p / its length ** this "
                                       "(> 0 favours longer ones; transformers' length_penalty)")
        self.length_penalty.valueChanged.connect(self._settings_changed)
        self.early_stopping = QComboBox()
        self.early_stopping.addItems([f"early stop {w}" for w in EARLY_STOPPING])
        self.early_stopping.setToolTip("Beam search: stop once B sequences have ended (true), once the best "
                                       "running one cannot beat them at its length (false) or at the longest it "
                                       "may become (never); transformers' early_stopping")
        self.early_stopping.currentTextChanged.connect(self._settings_changed)
        self.seed = QSpinBox(minimum=0, maximum=2**31 - 1, value=0, prefix="seed ")
        self.seed.setToolTip("Random seed for sampling; Reset regenerates with it")
        self.seed.valueChanged.connect(self._seed_changed)
        top = QHBoxLayout()
        top.addWidget(self.prompt_label)
        top.addWidget(self.prompt, 1)
        for w in (self.start_button, self.strategy, self.order, self.beams, self.length_penalty, self.early_stopping,
                  self.seed):
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
        self.bars.clear(self.view.EMPTY_BARS)
        self.bars.token_clicked.connect(self.choose)
        self.dist_label = QLabel()
        self.dist_label.setWordWrap(True)
        self.dist_label.setTextFormat(Qt.TextFormat.PlainText)  # it quotes tokens: <s> is a tag to rich text
        # With what-if edits (AppState.interventions): the model as trained, beside the edited one (its bars, a
        # pyqtgraph plot, made when first shown or drawn: widgets.made_when_shown)
        self._plain_bars = MadeWhenShown(ProbBars)
        self.plain_label = QLabel()
        self.plain_label.setWordWrap(True)
        self.plain_label.setTextFormat(Qt.TextFormat.PlainText)
        self.edited_title = QLabel("<b>With the edits</b>")
        self.plain_box = QWidget()
        pv = QVBoxLayout(self.plain_box)
        pv.setContentsMargins(0, 0, 0, 0)
        pv.addWidget(QLabel("<b>Without them</b> (the model as trained)"))
        pv.addWidget(self._plain_bars, 1)
        self.plain_box.setVisible(False)
        self.edited_title.setVisible(False)
        edited = QWidget()
        ev = QVBoxLayout(edited)
        ev.setContentsMargins(0, 0, 0, 0)
        ev.addWidget(self.edited_title)
        ev.addWidget(self.bars, 1)
        self.cross_view = CrossAttentionStepView()  # an encoder-decoder's step over its source
        self.cross_view.setVisible(False)
        self.bars_area = QWidget()  # the bars and what is beside them: PNG and SVG export it when something is
        pair = QHBoxLayout(self.bars_area)
        pair.setContentsMargins(0, 0, 0, 0)
        pair.addWidget(edited, 1)
        pair.addWidget(self.plain_box, 1)
        pair.addWidget(self.cross_view, 1)
        self._plain_logits: dict[tuple, object] = {}  # (context ids, position) -> the plain model's logits there
        self._plain_wanted: tuple | None = None
        self._plain_jobs: dict[tuple, object] = {}  # key -> the job computing its plain logits, until it ends
        left = QWidget()
        lv = QVBoxLayout(left)
        lv.setContentsMargins(0, 0, 0, 0)
        lv.addWidget(self.dist_label)
        lv.addWidget(self.plain_label)
        lv.addWidget(self.bars_area, 1)

        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["branch", "steps", "log p"])
        self.tree.setIndentation(14)
        self.tree.header().setStretchLastSection(False)
        self.tree.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in (1, 2):
            self.tree.header().setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        self.tree.itemClicked.connect(self._tree_clicked)
        self.beam_table = self._table(["beam", "log p", "ended"], stretch=0)
        self.beam_table.horizontalHeaderItem(0).setToolTip(
            "where each beam differs from its nearest one: \u2026the last tokens they share | the rest")
        self.lens_table = self._table(["layer", "top prediction", "p(top)", "p(picked)"], stretch=1)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.lens_table, "Logit lens")
        self.tabs.addTab(self.beam_table, "Beams")
        # the right column at least as wide as a lens row of a short token ('les' (574)): at 1024x640 it had
        # ~225 px and 'top prediction' ~40 of them (the bars' side has room to give)
        fm = self.lens_table.fontMetrics()
        row = ("block 00", "'token' (00000)", "p(top)", "p(picked)")
        self.tabs.setMinimumWidth(sum(fm.horizontalAdvance(text) + 16 for text in row)
                                  + self.lens_table.verticalScrollBar().sizeHint().width() + 16)
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
        self.status.setTextFormat(Qt.TextFormat.PlainText)

        lay = QVBoxLayout(self)
        lay.addLayout(top)
        lay.addLayout(controls)
        lay.addLayout(sliders)
        lay.addWidget(split, 1)
        lay.addWidget(QLabel("Text (colour: probability the model gave each generated token; click one to inspect it)"))
        lay.addWidget(self.strip)
        lay.addWidget(self.status)

        # the window's while the panel is on show: after a click on the panel's tab the focus is on the tab bar,
        # where Right and Left showed the next or previous panel (a text box keeps its own arrows)
        ctx = Qt.ShortcutContext.WindowShortcut
        for (key, _), slot in zip(self.shortcuts[:2], (self.step, self.back)):
            sc = QShortcut(QKeySequence(key), self)
            sc.setContext(ctx)
            sc.activated.connect(slot)
        key_buttons(self.shortcuts[2:], (self.run_button,))
        self._update_enabled()

    plain_bars = property(lambda self: self._plain_bars.widget())  # (made now if not yet)

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
        return generation_settings(strategy, self.temperature.value() / 100.0, self.top_k.value(),
                                   self.top_p.value() / 100.0, self.beams.value(), self.length_penalty.value(),
                                   self._early_stopping_word())

    def _early_stopping_word(self) -> str:
        return self.early_stopping.currentText().removeprefix("early stop ")

    def _is_encoder(self) -> bool:
        return self.state.loaded is not None and not self.state.loaded.config.causal

    def _strings(self, ids: list[int]) -> list[str]:
        """Generated tokens as text: an encoder-decoder's target-side tokenizer (Marian's target.spm),
        else the model's tokenizer (AppState.token_strings)."""
        target = getattr(self.state.loaded.tokenizer, "target", None) if self.state.is_seq2seq() else None
        return target.token_strings(ids) if target is not None else self.state.token_strings(ids)

    def _prompt_edited(self, _text: str) -> None:
        """A new source ends an encoder-decoder's steps: they were written for the old one, and nothing
        of them stays on show as the new source's (a decoder's steps stay until the next Step)."""
        if self.state.is_seq2seq() and self.session is not None and not self.busy and self._stale():
            self._drop_session("the source changed: press Step (Right arrow) to write its target")

    @property
    def busy(self) -> bool:
        return self._job_active or self._running

    def clear_results(self, changed: frozenset) -> None:
        """AppState.inputs_changed (the one mechanism): another model clears the session and everything
        computed for the previous model (AppState.run drops its late results); other what-if edits keep
        the history and recompute it for the edited model."""
        if MODEL in changed:
            self._plain_logits.clear()
            self._plain_jobs.clear()  # (their results are dropped)
            self._drop_session("")  # _on_model (model_changed, next) says what the new model can do
        elif EDITS in changed:
            self._edits_changed()

    def _on_model(self, loaded) -> None:
        """The controls and the prompt for this kind of model (its session was cleared by clear_results)."""
        if self.session is not None and self.session.model is not loaded.model:
            self._drop_session("")  # a model made current without AppState.set_model
        self.selected_node, self.selected_position = None, None
        self._extra_masks = set()
        self._trail = None
        self.view = EncoderFillView(self) if self._is_encoder() else DecoderStepView(self)
        self.view.show(loaded)
        self._unavailable = why_cannot_generate(loaded)  # said as soon as the model opens (controls disabled)
        if self.prompt.text() in ("", self._auto_prompt):  # never replace what the user typed
            self._auto_prompt = self._default_prompt(loaded)
            self.prompt.setText(self._auto_prompt)
        if self._unavailable:
            self.status.setText(f"{loaded.name}: {self._unavailable}")
        else:
            problem = getattr(getattr(loaded, "generation", None), "problem", "")  # a generation_config.json not used
            self.status.setText(f"{loaded.name}: {self.view.ready_message()}" + (f" {problem}" if problem else ""))
        self.refresh()

    def _default_prompt(self, loaded) -> str:
        """A prompt that works at once: the start of the current text (or of the demo text); with no
        tokenizer, a few of the text's ids (or the first ids of the vocabulary); an encoder gets one
        word replaced by its mask token; an encoder-decoder, the whole text (its source)."""
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
        elif loaded.config.is_encoder_decoder and len(text.split()) <= loaded.config.context_length:
            from ...core.inputs import encode  # the Model panel's source, whole when it fits: a translation of it

            if encode(loaded, text).total <= loaded.config.context_length:
                return " ".join(text.split())
        words = text.split()[:8 if not loaded.config.causal else 6]
        if not loaded.config.causal and tok.mask_token_id is not None and len(words) > 1:
            words[len(words) // 2] = tok.tok.id_to_token(tok.mask_token_id)
        return " ".join(words)

    def _edits_changed(self) -> None:
        """New what-if edits: the history stays (every token, branch and beam); what the model says
        about it is recomputed for the edited model in a worker (the session's with_interventions).
        A job holding the session finishes first (a run is stopped; AppState.run drops its result, made
        with the previous edits); edits that change again meanwhile are applied once it is done. A
        session being started with the previous edits is started again with these."""
        if self.session is None and not self.busy:
            if self.state.interventions:
                self.status.setText("the what-if edits changed: press Step to generate with them")
            return
        self._edits_pending = True  # also while a session is being started with the previous edits
        if self._running:
            self._run_job.cancel()  # its end applies the edits (_apply_pending_edits)
        self._apply_pending_edits()

    def _apply_pending_edits(self) -> None:
        if self.session is None:
            self._edits_pending = False  # the next session starts with the edits as they are then
        if not self._edits_pending or self.busy:
            return
        self._edits_pending = False
        session = self.session
        edits = list(self.state.interventions)
        selected = None if self.selected_node is None else [n.token for n in self.selected_node.path()[1:]]
        trail = None if self._trail is None else [n.token for n in self._trail.path()[1:]]
        self.status.setText("the what-if edits changed: recomputing the history for "
                            + ("the edited model…" if edits else "the model as trained…"))

        def done(new) -> None:
            if self.session is not session:  # dropped meanwhile (another model, another device)
                return
            self.session = new
            if isinstance(new, GenerationSession):
                self.selected_node = None if selected is None else new.node_at(selected)
                self._trail = None if trail is None else new.node_at(trail)
            self._lens_node = None  # the lens follows the new nodes
            self.session_changed.emit()
            self._changed(None)
            self.status.setText(("History kept, with the edited model's probabilities. " if edits else
                                 "History kept, with the probabilities of the model as trained. ") + self._describe())

        def failed(exc, tb) -> None:
            if self.session is session:
                self._drop_session(f"the what-if edits changed and the history could not be recomputed "
                                   f"({exc}): press Step to start again")

        self._submit(_with_edits, session, edits, on_result=done, on_error=failed)

    def _drop_session(self, message: str) -> None:
        if self._running:
            self._run_job.cancel()
        self.session = None
        self._edits_pending = False
        self.selected_node, self.selected_position = None, None
        self._trail = None
        self._lens_node = None
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
        for w in (self.prompt, self.strategy, self.order, self.beams, self.length_penalty, self.early_stopping,
                  self.seed, self.run_n, self.temperature, self.top_k, self.top_p):
            w.setEnabled(usable or self.state.loaded is None)

    def _clicked(self, action) -> None:
        """A button's action, with the keyboard focus left on the panel so the arrows keep stepping."""
        self.setFocus(Qt.FocusReason.OtherFocusReason)
        action()

    # -- actions ---------------------------------------------------------------------------
    def _prompt_ids(self) -> list[int]:
        """The prompt as every text box reads it (core.inputs): checked, and not cut at the context."""
        from ...core.inputs import encode_text_or_ids

        return encode_text_or_ids(self.state.loaded, self.prompt.text(), cut=False).ids

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
        except (GenerationError, InputError) as exc:
            self.status.setText(str(exc))
            return
        try:  # before the job: the prompt's records and the weights' copies for one-token steps the session makes
            check_start_memory(loaded, ids, "Starting from this prompt", self.settings())
        except MemoryEstimateError as exc:
            self.status.setText(str(exc))
            return
        self.selected_node, self.selected_position = None, None
        self._started_prompt = self.prompt.text()
        self.view.start(loaded, ids, then)

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
        self.view.before_back()
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
        self.view.choose(token_id)

    def run_or_stop(self) -> None:
        if self._running:
            self._run_job.cancel()  # the worker checks between tokens
            return
        if self.busy or self.state.loaded is None:
            return
        if self.session is None or self._stale():
            self.start(then=self.run_or_stop)
            return
        n = self.run_n.value()
        try:  # before the job: a run whose history cannot fit is refused in one line with the figure (as the CLI's)
            check_session_memory(self.state.loaded, self.session, n, f"Run N = {n}")
        except MemoryEstimateError as exc:
            self.status.setText(str(exc))
            return
        self.selected_node, self.selected_position = None, None
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
            self._apply_pending_edits()

        def progress(done: int, total: int, _message: str) -> None:
            if self.session is session:
                self.status.setText(self._generating(done, total))
            if not self._refresh_timer.isActive():  # a throttle: restarting it per token would starve it
                self._refresh_timer.start()

        self.status.setText(self._generating(0, n))
        self._running = True
        self._run_job = self.state.run(_run, self.session, n, on_result=ended(self._run_done),
                                       on_error=ended(self._job_failed), on_progress=progress,
                                       on_cancelled=ended(lambda: self.status.setText("Stopped.")),
                                       on_finished=finished, owner=self, parts=self.result_parts)
        self._update_enabled()

    def _generating(self, done: int, total: int) -> str:
        """The status line while Run N works: the token (or mask) under way, of N; Stop ends it."""
        what = "Filling" if self._is_encoder() else "Generating"
        return f"{what} {min(done + 1, total)}/{total}\u2026 (Stop ends it)"

    def _run_done(self, reason) -> None:
        node = self.session.current if isinstance(self.session, GenerationSession) else None
        if reason and node is not None and node.stop:  # name the end token (of a list: which one)
            reason = f"{reason}: {self._token_label(node.token)}"
        self.status.setText(f"Stopped: {reason}." if reason else f"Done. {self._describe()}")

    def _changed(self, _result) -> None:
        """After a step, back, choice or reset: the view and the status line describe the new step."""
        self.refresh()
        if self.session is not None:  # else dropped meanwhile (another model): keep what that said
            self.status.setText(self._describe())

    def _describe(self) -> str:
        """One line about where the session is now (the status line after every action)."""
        return "" if self.session is None else self.view.describe(self.session)

    def _token_label(self, token: int) -> str:
        """A token as the user reads it: quoted (spaces visible) with its id; with no tokenizer, the id."""
        if self.state.loaded is None or self.state.loaded.tokenizer is None:
            return f"id {token}"
        return f"{self._strings([token])[0]!r} ({token})"

    def _tokens_text(self, ids: list[int]) -> str:
        """Several tokens as one quoted string (a space token stays visible); with no tokenizer, the ids
        separated by spaces."""
        if self.state.loaded is None or self.state.loaded.tokenizer is None:
            return " ".join(map(str, ids))
        if self.state.is_seq2seq():  # a target reads as its tokenizer decodes it (a word vocabulary's spaces)
            tok = self.state.loaded.tokenizer
            return repr((getattr(tok, "target", None) or tok).decode(ids))
        return repr("".join(self._strings(ids)))

    def toggle_mask(self) -> None:
        if self.busy:  # restarting would drop the session under a running job
            self.status.setText("wait for the current job to finish (or Stop it) before masking")
            return
        if isinstance(self.view, EncoderFillView):  # the button shows for encoders only
            self.view.toggle_mask()

    def _submit(self, fn, *args, on_result=None, on_error=None, on_dropped=None) -> None:
        """Run a job on the session (one at a time) through AppState.run: its result or error arrives
        only while the model and the edits are those it started with. `on_dropped` runs when it was
        dropped for other edits on the same model (a new model cleared everything already)."""
        delivered = []

        def done(result) -> None:
            delivered.append(True)
            self._job_active = False
            if on_result is not None:
                on_result(result)
            else:
                self.refresh()

        def failed(exc, tb) -> None:
            delivered.append(True)
            self._job_active = False
            (on_error or self._job_failed)(exc, tb)

        def finished() -> None:
            if self._job is job:  # not a follow-up job started by on_result (start -> step)
                self._job_active = False
                self._apply_settings()
                self._apply_pending_edits()
                if not delivered and on_dropped is not None and self.state.is_current(job.key, (MODEL,)):
                    on_dropped()
            self._update_enabled()

        self._job_active = True
        self._job = job = self.state.run(fn, *args, on_result=done, on_error=failed, on_finished=finished,
                                         owner=self, parts=self.result_parts)
        self._update_enabled()

    def _job_failed(self, exc: BaseException, tb: str) -> None:
        self.status.setText(str(exc))
        self.refresh()

    # -- selection and inspection ----------------------------------------------------------
    def _strip_selected(self, index: int) -> None:
        if self.session is not None:
            self.view.strip_selected(index)

    def _clear_lens(self) -> None:
        self.lens_rows = []
        self.lens_table.setRowCount(0)
        self.tabs.setTabText(self.tabs.indexOf(self.lens_table), "Logit lens")

    def _tree_clicked(self, item: QTreeWidgetItem, column: int) -> None:
        node = item.data(0, Qt.ItemDataRole.UserRole)  # encoders' fills carry none: nothing to go to
        if node is None or self.session is None or self.busy:
            return
        self.view.tree_clicked(node)

    # -- rendering -------------------------------------------------------------------------
    def refresh(self) -> None:
        self._update_enabled()
        s = self.session
        if s is None:  # nothing of a previous session or model stays on screen
            self.bars.clear(self.view.EMPTY_BARS)
            self._shown = None
            self.dist_label.setText("")
            self.tree.clear()
            self.beam_table.setRowCount(0)
            self.strip.set_tokens([], [])
            self.cross_view.clear("")
            self._clear_lens()
            self._lens_node = None
            self._compare_with_plain(None, None, None)  # nor its model-as-trained column
            return
        self.view.refresh(s)

    def _show_plain_tokens(self, ids: list[int]) -> None:
        self.strip.set_tokens(self._strings(ids), ids)

    def _processing(self) -> tuple[float, int, float]:
        st = self.settings()
        st = st.validated()
        return st.temperature, st.top_k, st.top_p

    def _show_distribution(self, dist, chosen: int | None, depth: int, ended: bool,
                           context_ids: list[int] | None = None, position: int = -1,
                           source: list[int] | None = None) -> None:
        top = dist.top(TOP_BARS, by="tempered_probs")
        if chosen is not None and chosen not in [t for t, _ in top]:
            top.append((chosen, float(dist.tempered_probs[chosen])))
        tokens = [t for t, _ in top]
        if self.state.loaded is not None and self.state.loaded.tokenizer is None:
            labels = [str(t) for t in tokens]  # ProbBars shows the id once
        else:
            labels = [repr(x) for x in self._strings(tokens)]
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
        self._compare_with_plain(dist, chosen, context_ids, position, source)

    def _compare_with_plain(self, dist, chosen: int | None, context_ids: list[int] | None, position: int = -1,
                            source: list[int] | None = None) -> None:
        """Beside the edited model's bars, the model as trained on the same context at the same
        position (the next token, or an encoder's masked position; its logits from a worker, cached
        per context and position), and the change in the chosen token's log-probability."""
        edited = self.session is not None and getattr(self.session, "interventions", None)
        compare = bool(edited) and context_ids is not None  # not isVisible(): the panel may be hidden
        self.plain_box.setVisible(compare)
        self.edited_title.setVisible(compare)
        if not compare:
            self.plain_label.setText("")
            self._plain_wanted = None
            return
        # (context, position), and an encoder-decoder's source: its target's logits depend on it
        key = (tuple(context_ids), position) + ((tuple(source),) if source is not None else ())
        self._plain_wanted = key
        if key in self._plain_logits:
            self._show_plain(dist, chosen, self._plain_logits[key])
            return
        self.plain_label.setText(PLAIN_COMPUTING)
        if key in self._plain_jobs:
            return  # (its result is shown when it comes: this key is wanted again)
        loaded = self.state.loaded

        def done(logits) -> None:
            self._plain_logits[key] = logits
            if self._plain_wanted == key and self._shown is not None:
                self._show_plain(*self._shown, logits)

        def finished() -> None:
            if self._plain_jobs.get(key) is job:  # (not a job for the same key on a model opened since)
                del self._plain_jobs[key]

        # the model as trained does not depend on the edits: dropped only when another model opens
        job = self.state.run(plain_logits_at, loaded, list(context_ids), position, source, on_result=done,
                             on_error=lambda exc, tb: self.plain_label.setText(f"the model as trained: {exc}"),
                             on_finished=finished, owner=self, parts=(MODEL,))
        self._plain_jobs[key] = job

    def _plain_computing(self) -> bool:
        """The model as trained is being computed for the step on show (not: its label says so)."""
        return self.plain_box.isVisibleTo(self) and self._plain_wanted in self._plain_jobs

    def _show_plain(self, dist, chosen: int | None, logits) -> None:
        import math

        plain = process_logits(logits, *self._processing())
        top = plain.top(TOP_BARS, by="tempered_probs")
        token = chosen if chosen is not None else int(dist.model_probs.argmax())
        if token not in [t for t, _ in top]:
            top.append((token, float(plain.tempered_probs[token])))
        tokens = [t for t, _ in top]
        labels = [str(t) for t in tokens] if self.state.loaded.tokenizer is None else \
            [repr(x) for x in self._strings(tokens)]
        self.plain_bars.set_distribution(tokens, labels, [float(plain.probs[t]) for t in tokens],
                                         [float(plain.model_probs[t]) for t in tokens], token)
        before, after = float(plain.model_probs[token]), float(dist.model_probs[token])
        change = (math.log(after) if after > 0 else -math.inf) - (math.log(before) if before > 0 else -math.inf)
        self.plain_change = change
        self.plain_label.setText(f"{'picked' if chosen is not None else 'top'} {self._token_label(token)}: "
                                 f"log p {change:+.3f} with the edits (p {format_prob(after)} with, "
                                 f"{format_prob(before)} without)")

    # -- workspace (MainWindow saves view_state and gives it back with set_view_state) ----------
    VIEW_TABLE = None  # no views table: the settings are the panel's whole view state

    @property
    def view_state(self) -> GenerationViewState:
        """The prompt and the sampling settings (not the generation tree)."""
        return GenerationViewState(
            prompt=self.prompt.text(), strategy=self.strategy.currentText(),
            temperature=self.temperature.value() / 100.0, top_k=self.top_k.value(),
            top_p=self.top_p.value() / 100.0, beams=self.beams.value(), seed=self.seed.value(),
            run_n=self.run_n.value(), length_penalty=self.length_penalty.value(),
            early_stopping=self._early_stopping_word())

    def set_view_state(self, state: GenerationViewState) -> None:
        """Show a workspace's settings; the session, if any, gets them as if the sliders were moved."""
        if state.prompt:  # "": keep what the panel filled in from the current text
            self.prompt.setText(state.prompt)
        if state.strategy in STRATEGIES:  # a strategy this version lacks keeps the current one
            self.strategy.setCurrentText(state.strategy)
        self.temperature.setValue(round(state.temperature * 100))  # the sliders count hundredths
        self.top_k.setValue(state.top_k)
        self.top_p.setValue(round(state.top_p * 100))
        for spin, value in ((self.beams, state.beams), (self.seed, state.seed), (self.run_n, state.run_n),
                            (self.length_penalty, state.length_penalty)):
            spin.setValue(value)
        if state.early_stopping in EARLY_STOPPING:  # a mode this version lacks keeps the current one
            self.early_stopping.setCurrentText(f"early stop {state.early_stopping}")

    # -- export (ExportBar view protocol; File > Export Current View takes export_widget) ---------
    def _beside_the_bars(self) -> bool:
        """The model as trained (with edits) or a step's cross-attention (an encoder-decoder) is shown beside."""
        return self.plain_box.isVisibleTo(self) or self.cross_view.isVisibleTo(self)

    def export_widget(self) -> QWidget:
        return self.bars_area if self._beside_the_bars() else self.bars.plot

    def svg_item(self):
        return None if self._beside_the_bars() else self.bars.plot.getPlotItem()  # (None: the widgets' SVG)

    def _export_name(self) -> str:
        return "generate" if self.session is None else self.view.export_name(self.session)

    def _plain_on_show(self):
        """The model as trained's distribution shown beside the edited one's bars: None when none is shown,
        False while it is being computed."""
        if not self.plain_box.isVisibleTo(self) or self._shown is None:
            return None
        logits = self._plain_logits.get(self._plain_wanted)
        return False if logits is None else process_logits(logits, *self._processing())

    def csv_table(self):
        """The distribution the bars show, every token of the vocabulary from the most probable down,
        then the generated steps of the current path (the `step` column tells the two apart). With edits,
        what is shown: the edited model's p (p_with_edits) beside the model as trained's (p_without_edits,
        empty while it is computed); an encoder-decoder's step: its cross-attention map on show too, as
        `cross_attention` rows (layer shown, head or "mean", source position and token, weight)."""
        header = ["section", "rank_or_step", "token_id", "token", "p", "p_model", "kept", "picked"]
        plain = self._plain_on_show()
        if plain is not None:  # (names that say which is which: the panel shows both)
            header[4:6] = ["p_with_edits", "p_model_with_edits"]
            header += ["p_without_edits", "p_model_without_edits"]
        cross = self.cross_view.matrix() if self.cross_view.isVisibleTo(self) else None
        cross = cross if cross is not None and cross.size else None
        if cross is not None:
            header += ["cross_layer", "cross_head", "source_position", "source_token", "cross_attention"]
        rows = []
        if self._shown is not None:
            dist, chosen = self._shown
            strings = self._strings(list(range(dist.probs.numel())))
            order = sorted(range(dist.probs.numel()), key=lambda t: -float(dist.tempered_probs[t]))
            for rank, t in enumerate(order, 1):
                row = ["distribution", rank, t, strings[t], f"{float(dist.probs[t]):.6g}",
                       f"{float(dist.model_probs[t]):.6g}", int(bool(dist.kept[t])), int(t == chosen)]
                if plain is not None:
                    row += [f"{float(plain.probs[t]):.6g}", f"{float(plain.model_probs[t]):.6g}"] if plain else ["", ""]
                rows.append(row)
        if self.session is not None:
            rows += self.view.step_rows(self.session)
        if cross is not None:
            layer = self.cross_view.layer.currentText()
            heads = [str(h) for h in range(cross.shape[0] - 1)] + ["mean"]
            first = len(header) - 5
            for head, weights in zip(heads, cross):
                for s, (label, w) in enumerate(zip(self.cross_view.source_labels, weights)):
                    rows.append(["cross_attention"] + [""] * (first - 1) + [layer, head, s, label, f"{float(w):.6g}"])
        return header, [row + [""] * (len(header) - len(row)) for row in rows]

    def export_arrays(self) -> dict:
        out = {}
        if self._shown is not None:
            dist, _ = self._shown
            out.update(probs=dist.probs.numpy(), model_probs=dist.model_probs.numpy(), kept=dist.kept.numpy())
        plain = self._plain_on_show()
        if plain:  # (what is shown beside, as in the CSV)
            out.update(probs_without_edits=plain.probs.numpy(), model_probs_without_edits=plain.model_probs.numpy())
        if self.cross_view.isVisibleTo(self) and self.cross_view.matrix().size:
            out.update(cross_attention=self.cross_view.matrix())  # [heads + mean, source] of the layer shown
        if self.session is not None:
            out.update(self.view.export_arrays(self.session))
        return out

    # -- --screenshot (the script is ui/demo.py's) ---------------------------------------------
    def screenshot_demo(self) -> None:
        from ..demo import generation_demo

        self._demo = generation_demo(self)

    def screenshot_ready(self) -> bool:
        """What is on show is drawn, whatever the panel's state: no job holds the session (a step, a run, the
        edits' recompute), no refresh waits, the model as trained is not being computed beside the edited
        one, and the --screenshot demo, if one was started, has played."""
        demo = getattr(self, "_demo", None)
        return (self._laid_out and not self.busy and not self._refresh_timer.isActive()
                and not self._plain_computing() and (demo is None or demo.done))

    # Built by a tab's click, the panel is shown at the event loop's next turn; its plots are drawn at the turn after
    # its first paint, and that drawing sizes their axes to their labels (pyqtgraph's AxisItem), which lays them out
    # once more at the next turn: ready before that relayout, a screenshot was of an empty page, or of the bars with
    # their axis not as wide as it is drawn (two turns after the first paint: measured, test_layouts_at_1024)
    _laid_out = False

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().paintEvent(event)
        if not self._laid_out:
            QTimer.singleShot(0, self, lambda: QTimer.singleShot(0, self, self._after_first_paint))  # not into a deleted panel

    def _after_first_paint(self) -> None:
        self._laid_out = True
