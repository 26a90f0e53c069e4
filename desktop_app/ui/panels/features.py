"""Features panel: sparse dictionaries (SAEs, transcoders) attached to the model, read on the current text.

- Dictionaries: File > Open Sparse Features..., the Open button, or a dictionary folder dropped on the
  window (AppState.open_dictionary; one per hook; Detach removes one and its feature edits).
- Lens: each token's top active features (id, activation) at each attached hook, with the token's
  L0, fraction of variance explained and reconstruction error; click a token (chip or row) for its
  features, click a feature to colour the text by its activation; right-click a feature to zero,
  clamp, scale or add it (a what-if edit: the strip lists it, every panel shows the edited model).
- Dashboard: the clicked feature's top-activating contexts over a text file (a worker with progress
  and Cancel, cached on disk: app.features.cached_dashboard), its activation histogram there, and the
  tokens its decoder direction promotes and suppresses through the unembedding.
- Attribution: the direct contribution of each active feature (and the bias, skip and error terms)
  to the edited model's top next-token logit at the last position.
Every computation runs in a worker through AppState.run on app.features; a result for a model, text,
edits or dictionaries no longer shown is never delivered.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QFileDialog, QHBoxLayout, QInputDialog, QLabel, QListWidget, QMenu,
                               QPushButton, QSplitter, QTabWidget, QVBoxLayout, QWidget)

from ...app.features import (attribute_next_token, cached_dashboard, decoder_tokens, feature_edit_from,
                             lens_on)
from .. import settings as app_settings
from ..state import DICTIONARIES, EDITS, FEATURE_PARTS, INPUT, MODEL, ResultView
from ..widgets.export import ExportBar
from ..widgets.form_fields import keyed_combo
from ..widgets.job_progress import JobProgressBar
from ..widgets.token_strip import TokenStrip
from . import CANCEL_KEY, key_buttons
from .features_views import FeatureDashboard, feature_attribution_chart, fill_table, read_only_table, visible

TABS = ("Lens", "Dashboard", "Attribution")
EDIT_HOWS = (("zero", "Zero feature {k}"), ("clamp", "Clamp feature {k} to…"), ("scale", "Scale feature {k} by…"),
             ("add", "Add feature {k}'s direction (steer)…"))


LENS_SIDES = [("Source (encoder hooks)", "encoder"), ("Target (decoder hooks)", "decoder")]


def _under_its_label(label: QLabel, widget: QWidget) -> QWidget:
    """`label` above `widget`, which takes the height left: one pane of a splitter."""
    pane = QWidget()
    layout = QVBoxLayout(pane)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(label)
    layout.addWidget(widget, 1)
    return pane


def choose_dictionary_folder(parent: QWidget) -> str | None:
    """Ask for a dictionary folder (SAELens: cfg.json + sae_weights.safetensors; Gemma Scope: params.npz)."""
    from pathlib import Path

    path = QFileDialog.getExistingDirectory(
        parent, "Open sparse features (a folder with cfg.json + sae_weights.safetensors, or params.npz)",
        app_settings.last_folder())
    if not path:
        return None
    app_settings.set_last_folder(Path(path).parent)
    return path


def dictionary_label(a) -> str:
    d = a.dictionary
    where = d.hook if not d.is_transcoder else f"{d.hook} -> {d.hook_out}"
    return f"{d.name}  ·  {where}  ·  {d.architecture} {d.d_in}x{d.d_sae}"


def _edits_feature(iv, dictionary, feature: int) -> bool:
    edit = getattr(iv, "features", None)
    return edit is not None and edit.attached.dictionary is dictionary and any(op.feature == feature for op in edit.ops)


class FeaturesPanel(QWidget, ResultView):
    drawn = Signal()  # what its exports would write changed (its ExportBar follows this)
    title = "Features"
    shortcuts = (("Ctrl+Return", "Run the dashboard"), ("Ctrl+Return", "Attribute"),
                 (CANCEL_KEY, "Cancel the dashboard"), (CANCEL_KEY, "Cancel the lens"))  # (key, what): the buttons' keys, in Help
    result_parts = FEATURE_PARTS
    TOP_PER_TOKEN = 5  # features per token and hook in the lens table
    TOP_FEATURES = 10  # features per hook listed for the selected token
    COLOUR_HINT = "Click a feature to colour the text by its activation; right-click it to edit it."
    help_text = (
        "<b>What am I looking at?</b> A sparse dictionary reads an activation x of the model (the residual "
        "stream, an MLP's or attention's output) and writes it as a sparse sum of learned directions: "
        "a = act(W<sub>enc</sub><sup>T</sup>(x &minus; b<sub>dec</sub>) + b<sub>enc</sub>) (ReLU, JumpReLU or "
        "TopK), x&#770; = W<sub>dec</sub><sup>T</sup>a + b<sub>dec</sub>. <b>Lens</b>: each token's most active "
        "features a<sub>i</sub> at each attached hook; L0 = the number of active features; variance explained "
        "= 1 &minus; |x &minus; x&#770;|&sup2; / |x &minus; mean(x)|&sup2;; error = |x &minus; x&#770;|. Click a "
        "feature to colour the text by a<sub>i</sub>; right-click it to zero, clamp, scale or add it: the "
        "activation becomes x + W<sub>dec</sub><sup>T</sup>(a' &minus; a) (reconstruction with the edited "
        "features plus the error term), listed in the strip at the top and applied in every panel. "
        "<b>Dashboard</b>: the feature's top-activating contexts over a text file, its activation histogram, "
        "and W<sub>U</sub>&middot;W<sub>dec</sub>[i]: the tokens its direction promotes and suppresses. "
        "<b>Attribution</b>: the top next token's logit, read through the final norm (linearised) and the "
        "unembedding, split into each active feature's a<sub>i</sub>W<sub>dec</sub>[i], the bias, the skip "
        "and the error term; they add up to the hook's direct contribution.<br>"
        "<b>Encoder-decoders</b> (T5, BART, Marian): a dictionary names its stack with the app's own names, "
        "encoder.blocks.L.resid_post (the source) or decoder.blocks.L.resid_post (the decoder's input: [start] + "
        "the Model panel's target); TransformerLens' names (blocks.L.hook_resid_post) cannot say which stack. "
        "<i>Lens on</i> shows the source's or the target's dictionaries. A dictionary trains on an encoder hook "
        "(a text file read as sources); the top contexts read a text file as sources too; the decoder's hooks "
        "have decoder directions (Dashboard); the logit attribution is for one-stack models.")

    def __init__(self, state, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.lens: list[tuple] | None = None  # [(Attached, FeatureActivations, [TokenFeatures])] shown
        self.lens_ids: list[int] = []
        self.token: int | None = None  # the selected position
        self.feature: tuple | None = None  # (Attached, feature id) clicked
        self._feature_rows: list[tuple] = []  # the features table's rows: (Attached, feature id)
        self._stale = True  # the lens is not computed for the current inputs
        self._lens_job = self._attr_job = self._decoder_job = None
        self._lens_cancelled_here = None  # the lens job whose Cancel was clicked (Esc)
        self.last_feature_menu: QMenu | None = None
        self._failure = ""  # why the last dictionary was not attached (said until one is)

        # the dictionaries attached
        self.dict_list = QListWidget()
        self.dict_list.setMaximumHeight(52)
        self.open_button = QPushButton("Open dictionary…")
        self.open_button.setToolTip("Attach a sparse dictionary folder (SAELens: cfg.json + sae_weights.safetensors; "
                                    "Gemma Scope: params.npz): also File > Open Sparse Features… or drop the folder")
        self.detach_button = QPushButton("Detach")
        self.detach_button.setToolTip("Detach the selected dictionary (its feature edits go too)")
        self.status = QLabel("")
        self.status.setWordWrap(True)
        # an encoder-decoder's: which sequence the lens reads (hidden for other models)
        self.side = keyed_combo(LENS_SIDES, "An encoder-decoder's dictionaries read one stack: the encoder's "
                                "(encoder.blocks.L.*, the source's tokens) or the decoder's (decoder.blocks.L.*, "
                                "[start] + the Model panel's target); the lens shows those of the sequence chosen")
        self.side_label = QLabel("Lens on")
        # the lens's forward, with progress and Cancel (shown while it runs) as the other long jobs: at Qwen2.5-0.5B's
        # shape the lens of 1,024 tokens is a forward of the model up to the dictionaries' last layer
        self.lens_progress = JobProgressBar()
        self.lens_cancel_button = QPushButton("Cancel")
        self.lens_cancel_button.setToolTip("Stop reading the features (the lens)")
        for w in (self.lens_progress, self.lens_cancel_button):
            w.setVisible(False)
        self.tabs = QTabWidget()
        top = QHBoxLayout()
        buttons = QVBoxLayout()
        buttons.addWidget(self.open_button)
        buttons.addWidget(self.detach_button)
        top.addWidget(self.dict_list, 1)
        top.addLayout(buttons)

        # Lens
        self.strip = TokenStrip()
        self.colour_label = QLabel(self.COLOUR_HINT)
        self.tokens_table = read_only_table()
        # each column as wide as it is: stretched, the last one (|error|) put its numbers ~200 px from its title
        self.tokens_table.horizontalHeader().setStretchLastSection(False)
        self.features_table = read_only_table()
        self.features_table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.features_table.setToolTip("Click a feature to colour the text by it; right-click to edit it")
        self.token_label = QLabel("")
        tables = QSplitter(Qt.Orientation.Horizontal)
        tables.addWidget(self.tokens_table)
        tables.addWidget(_under_its_label(self.token_label, self.features_table))
        tables.setSizes([600, 300])
        lens = QSplitter(Qt.Orientation.Vertical)
        lens.addWidget(_under_its_label(self.colour_label, self.strip))
        lens.addWidget(tables)
        lens.setSizes([90, 450])
        self.lens_tab = lens

        # Dashboard
        self.dashboard = FeatureDashboard()

        # Attribution
        self.attr_combo = QComboBox()
        self.attribute_button = QPushButton("Attribute")
        self.attr_status = QLabel("")
        self.attr_status.setWordWrap(True)
        self.attr_chart = feature_attribution_chart()
        attr = QWidget()
        av = QVBoxLayout(attr)
        row = QHBoxLayout()
        row.addWidget(QLabel("Dictionary"))
        row.addWidget(self.attr_combo, 1)
        row.addWidget(self.attribute_button)
        av.addLayout(row)
        av.addWidget(self.attr_status)
        av.addWidget(self.attr_chart, 1)

        for w, name in ((lens, "Lens"), (self.dashboard, "Dashboard"), (attr, "Attribution")):
            self.tabs.addTab(w, name)
        self.export_bar = ExportBar(self.current_view, self._export_name,
                                    views=(self, self.dashboard, self.attr_chart))
        self.tabs.currentChanged.connect(lambda _: self.export_bar.refresh())  # another tab: another view
        lay = QVBoxLayout(self)
        lay.addLayout(top)
        head = QHBoxLayout()
        head.addWidget(self.side_label)
        head.addWidget(self.side)
        head.addWidget(self.status, 1)
        head.addWidget(self.lens_progress)
        head.addWidget(self.lens_cancel_button)
        head.addWidget(self.export_bar)
        lay.addLayout(head)
        lay.addWidget(self.tabs, 1)

        self.open_button.clicked.connect(self.open_dictionary)
        self.detach_button.clicked.connect(self.detach_selected)
        self.strip.token_selected.connect(self.select_token)
        self.tokens_table.cellClicked.connect(lambda r, _c: self.select_token(r))
        self.features_table.cellClicked.connect(self._feature_clicked)
        self.features_table.customContextMenuRequested.connect(self._feature_menu)
        self.dashboard.run_button.clicked.connect(self.run_dashboard)
        self.attribute_button.clicked.connect(self.attribute)
        # (the dashboard's Run and Attribute share a key: only the tab on show takes it)
        key_buttons(self.shortcuts, (self.dashboard.run_button, self.attribute_button, self.dashboard.cancel_button,
                                     self.lens_cancel_button))
        self.lens_cancel_button.clicked.connect(self.cancel_lens)
        self.side.currentIndexChanged.connect(self._side_chosen)
        state.model_changed.connect(lambda _loaded: self._show_side_choice())
        self._show_side_choice()
        self.tabs.currentChanged.connect(self._tab_changed)
        self.watch_inputs(state)
        state.dictionaries_changed.connect(self._on_dictionaries)
        state.dictionary_failed.connect(self._dictionary_failed)
        state.trace_changed.connect(self._on_trace)
        self._on_dictionaries(list(state.dictionaries))

    # -- what is current -----------------------------------------------------------------------
    def current_view(self):
        return (self, self.dashboard, self.attr_chart)[max(0, self.tabs.currentIndex())]

    def _export_name(self) -> str:
        return "features-" + TABS[max(0, self.tabs.currentIndex())].lower()

    def _attached_now(self, attached):
        """The state's Attached for the same dictionary (a new model re-attaches them), or None."""
        if attached is None:
            return None
        return next((a for a in self.state.dictionaries if a.dictionary is attached.dictionary), None)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._stale:
            self.refresh()

    def clear_results(self, changed: frozenset) -> None:
        """AppState.inputs_changed: the lens and attribution go (they follow the new inputs while the
        panel is in use); the dashboard's contexts go when the model, edits or dictionaries change."""
        for job in (self._lens_job, self._attr_job):
            if job is not None and not job.done:
                job.cancel()
        self._stale = True
        self.lens, self._feature_rows = None, []
        fill_table(self.tokens_table, [], [])
        fill_table(self.features_table, [], [])
        self.strip.set_tokens([], [])
        self.token_label.setText("")
        self.attr_chart.clear_chart()
        self.attr_status.setText("")
        if changed & {MODEL, EDITS, DICTIONARIES}:
            self.dashboard.cancel()
            self.dashboard.clear_contexts()
        if changed & {MODEL, DICTIONARIES}:
            if self._decoder_job is not None and not self._decoder_job.done:
                self._decoder_job.cancel()
            if self.feature is not None:
                a = self._attached_now(self.feature[0])
                self.feature = (a, self.feature[1]) if a is not None else None
            if self.feature is None:
                self.dashboard.clear()
                self.colour_label.setText(self.COLOUR_HINT)
        self.drawn.emit()

    def _show_side_choice(self) -> None:
        for w in (self.side_label, self.side):
            w.setVisible(self.state.is_seq2seq())

    def _side_chosen(self, *_) -> None:
        self.clear_results(frozenset({INPUT}))
        if self.isVisible():
            self.refresh()

    def _lens_input(self) -> tuple[list, list[int]]:
        """(the dictionaries the lens shows, the token ids of its rows): every dictionary on the text, or
        an encoder-decoder's dictionaries of the stack chosen on its source or its decoder's input."""
        state = self.state
        if not self.state.is_seq2seq():
            return list(state.dictionaries), list(state.token_ids)
        side = self.side.currentData()
        return ([a for a in state.dictionaries if a.read.stack == side],
                list(state.token_ids if side == "encoder" else state.decoder_ids))

    def _on_trace(self, _trace) -> None:
        if self.isVisible():
            self.refresh()

    def _dictionary_failed(self, message: str) -> None:
        self._failure = f"Cannot attach: {message}"
        self.status.setText(self._failure)

    def _on_dictionaries(self, dictionaries: list) -> None:
        if dictionaries:
            self._failure = ""
        self.dict_list.clear()
        for a in dictionaries:
            self.dict_list.addItem(dictionary_label(a))
            self.dict_list.item(self.dict_list.count() - 1).setToolTip(a.dictionary.path or a.dictionary.name)
        if dictionaries:
            self.dict_list.setCurrentRow(len(dictionaries) - 1)
            stack = dictionaries[-1].read.stack  # an encoder-decoder's: the lens shows the last one attached
            if stack is not None and self.side.findData(stack) >= 0:
                self.side.blockSignals(True)
                self.side.setCurrentIndex(self.side.findData(stack))
                self.side.blockSignals(False)
        self.detach_button.setEnabled(bool(dictionaries))
        self.attr_combo.clear()
        self.attr_combo.addItems([a.dictionary.name for a in dictionaries])
        if self.feature is not None and self.isVisible():
            self._show_decoder_tokens()
        if self.isVisible():
            self.refresh()

    # -- the lens ------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Compute the lens (and the attribution, when shown) for the current text and dictionaries."""
        state = self.state
        if state.loaded is None:
            self.status.setText("Open a model, then attach a sparse dictionary.")
            return
        if not state.dictionaries:
            self.status.setText(self._failure or "Attach a sparse dictionary: File > Open Sparse Features…, "
                                "Open dictionary…, or drop its folder on the window.")
            return
        if state.takes_images() or not state.token_ids:
            self.status.setText(state.no_trace_message())
            return
        dictionaries, ids = self._lens_input()
        if not dictionaries:  # an encoder-decoder's dictionaries all read the other stack
            other = self.side.itemText(1 - self.side.currentIndex())
            self.status.setText(f"No dictionary attached reads the {self.side.currentText().split(' (')[0].lower()}: "
                                f"choose Lens on: {other}.")
            return
        self._stale = False
        if self._lens_job is not None and not self._lens_job.done:
            self._lens_job.cancel()
        decoder_ids = list(state.decoder_ids) if self.state.is_seq2seq() else None
        self.status.setText(f"Reading the features… ({CANCEL_KEY} cancels)")
        self.lens_progress.begin()
        self._lens_job = job = state.run(
            lens_on, state.loaded, list(state.token_ids), dictionaries, list(state.interventions), self.TOP_FEATURES,
            decoder_ids, on_result=lambda r: self._show_lens(dictionaries, ids, r), on_error=self._lens_failed,
            on_progress=lambda done, total, message: self._lens_progress(job, done, total, message),
            on_cancelled=lambda: self._lens_cancelled(job), on_finished=self._lens_running_shown,
            parts=FEATURE_PARTS, owner=self)
        self._lens_running_shown()
        if self.tabs.currentIndex() == TABS.index("Attribution"):
            self.attribute()

    def _lens_running(self) -> bool:
        return self._lens_job is not None and not self._lens_job.done

    def _lens_running_shown(self) -> None:
        """Progress and Cancel on show while a lens job runs (a finished one's: gone, unless a newer one runs)."""
        running = self._lens_running()
        for w in (self.lens_progress, self.lens_cancel_button):
            w.setVisible(running)
        self.lens_cancel_button.setEnabled(running)

    def _lens_progress(self, job, done: int, total: int, message: str) -> None:
        if job is self._lens_job:
            self.lens_progress.show_progress(done, total)  # (the bar says the time left)
            self.status.setText(f"Reading the features: {message} ({CANCEL_KEY} cancels)")

    def cancel_lens(self) -> None:
        """Cancel (Esc) of the lens: its forward stops after the block it is in."""
        if self._lens_running():
            self._lens_cancelled_here = self._lens_job
            self._lens_job.cancel()

    def _lens_cancelled(self, job) -> None:
        # (said for the Cancel clicked, not for a lens the new inputs replaced: the new one says its own line)
        if job is self._lens_job and job is self._lens_cancelled_here:
            self._stale = True  # read again when the panel is shown again
            self.status.setText("Cancelled: the features are read again when the text changes or the panel is "
                                "shown again.")

    def _lens_failed(self, exc: BaseException, tb: str) -> None:
        self.status.setText(f"Cannot read the features: {exc}")

    def _show_lens(self, dictionaries: list, ids: list[int], result) -> None:
        self.lens = [(a, run, tokens) for a, (run, tokens) in zip(dictionaries, result)]
        self.lens_ids = ids
        strings = self.state.token_strings(ids)
        header = ["#", "token"]
        for a, _run, _tokens in self.lens:
            name = a.dictionary.hook
            header += [f"{name}: top features", "L0", "var. expl.", "|error|"]
        rows = []
        for t, s in enumerate(strings):
            row = [t, visible(s)]
            for _a, _run, tokens in self.lens:
                tf = tokens[t]
                row += [", ".join(f"{k}:{v:.3g}" for k, v in tf.top[:self.TOP_PER_TOKEN]), tf.l0,
                        f"{tf.variance_explained:.3f}", f"{tf.error_norm:.3g}"]
            rows.append(row)
        numbers = (0,) + tuple(c for g in range(len(self.lens)) for c in (3 + 4 * g, 4 + 4 * g, 5 + 4 * g))
        fill_table(self.tokens_table, header, rows, align_right=numbers)  # (L0, var. expl., |error| line up)
        self.tokens_table.resizeColumnsToContents()
        self.status.setText("; ".join(f"{a.dictionary.name}: mean L0 {run.mean_l0:.1f}, variance explained "
                                      f"{run.variance_explained:.3f}" for a, run, _t in self.lens))
        if self.token is None or self.token >= len(ids):
            self.token = len(ids) - 1
        self.select_token(self.token)
        self._tab_changed(self.tabs.currentIndex())  # (its tab clicked while the lens was computed: attribute now)
        self.drawn.emit()

    def _colour_values(self):
        """(values, vmax) of the clicked feature over the text, or (None, None)."""
        if self.feature is None or self.lens is None:
            return None, None
        a, k = self.feature
        run = next((run for b, run, _t in self.lens if b.dictionary is a.dictionary), None)
        if run is None:
            return None, None
        values = run.acts[:, k].tolist()
        return values, max(max(values), 1e-6)

    def select_token(self, position: int) -> None:
        if self.lens is None or not 0 <= position < len(self.lens_ids):
            return
        self.token = position
        values, vmax = self._colour_values()
        self.strip.set_tokens(self.state.token_strings(self.lens_ids), self.lens_ids, values, vmin=0.0, vmax=vmax)
        self.strip.set_selected(position)
        self.tokens_table.selectRow(position)
        s = self.state.token_strings([self.lens_ids[position]])[0]
        self.token_label.setText(f"<b>Token {position}</b> {visible(s)!r}: its top features")
        self._feature_rows, rows = [], []
        for a, run, tokens in self.lens:
            for k, v in tokens[position].top[:self.TOP_FEATURES]:
                self._feature_rows.append((a, k))
                rows.append([a.dictionary.hook, k, f"{v:.4g}"])
        fill_table(self.features_table, ["hook", "feature", "activation"], rows, align_right=(1, 2))
        self.features_table.resizeColumnsToContents()
        self._mark_feature_row()

    def _mark_feature_row(self) -> None:
        if self.feature is None:
            return
        for r, (a, k) in enumerate(self._feature_rows):
            if a.dictionary is self.feature[0].dictionary and k == self.feature[1]:
                self.features_table.selectRow(r)
                return
        self.features_table.clearSelection()

    def _feature_clicked(self, row: int, _column: int) -> None:
        if 0 <= row < len(self._feature_rows):
            self.choose_feature(*self._feature_rows[row])

    def choose_feature(self, attached, feature: int) -> None:
        """Colour the text by this feature and make it the dashboard's."""
        same = self.feature is not None and self.feature[0].dictionary is attached.dictionary \
            and self.feature[1] == feature
        self.feature = (attached, int(feature))
        values, vmax = self._colour_values()
        if values is not None:
            self.strip.set_tokens(self.state.token_strings(self.lens_ids), self.lens_ids, values, vmin=0.0, vmax=vmax)
            self.strip.set_selected(self.token)
            self.colour_label.setText(f"Coloured by feature {feature} at {attached.dictionary.hook} "
                                      f"(0 to {vmax:.3g}); active on {sum(v > 0 for v in values)} of {len(values)} tokens.")
        if not same:
            self.dashboard.cancel()
            self.dashboard.clear_contexts()
            self.dashboard.header.setText(f"<b>Feature {feature}</b> of {attached.dictionary.name} "
                                          f"at {attached.dictionary.hook}")
            self._show_decoder_tokens()

    def _show_decoder_tokens(self) -> None:
        a, k = self.feature
        if self._decoder_job is not None and not self._decoder_job.done:
            self._decoder_job.cancel()
        self.dashboard.show_decoder_tokens([], [])
        self._decoder_job = self.state.run(
            decoder_tokens, self.state.loaded, a, k, 10, on_result=lambda r: self.dashboard.show_decoder_tokens(*r),
            on_error=lambda exc, tb: self.dashboard.show_decoder_tokens([], [], str(exc)),
            parts=(MODEL, DICTIONARIES), owner=self)

    # -- dictionaries --------------------------------------------------------------------------
    def open_dictionary(self) -> None:
        path = choose_dictionary_folder(self)
        if path:
            self.status.setText(f"Opening {path}…")
            self.state.open_dictionary(path)

    def detach_selected(self) -> None:
        row = self.dict_list.currentRow()
        if 0 <= row < len(self.state.dictionaries):
            self.state.remove_dictionary(self.state.dictionaries[row])

    # -- feature edits -------------------------------------------------------------------------
    def _feature_menu(self, pos) -> None:
        row = self.features_table.indexAt(pos).row()
        if not 0 <= row < len(self._feature_rows):
            return
        a, k = self._feature_rows[row]
        menu = QMenu(self)
        for how, text in EDIT_HOWS:
            menu.addAction(text.format(k=k)).triggered.connect(lambda _=False, h=how: self.edit_feature(a, k, h))
        if any(_edits_feature(iv, a.dictionary, k) for iv in self.state.interventions):
            menu.addSeparator()
            menu.addAction(f"Remove feature {k}'s edit").triggered.connect(lambda: self.remove_edit(a, k))
        self.last_feature_menu = menu  # kept: tests and screenshots reach it
        menu.popup(self.features_table.viewport().mapToGlobal(pos))

    def _default_value(self, attached, feature: int, how: str) -> float:
        """What the value box starts at: the feature's largest activation on the text (clamp, add), x2 (scale)."""
        run = next((run for b, run, _t in self.lens or [] if b.dictionary is attached.dictionary), None)
        top = float(run.acts[:, feature].max()) if run is not None else 1.0
        return 2.0 if how == "scale" else max(top, 1.0)

    def edit_feature(self, attached, feature: int, how: str, value: float | None = None) -> None:
        """Apply a feature edit through AppState's what-if edits (by their rule, app/edits.py: it replaces an
        edit of the same feature)."""
        if value is None and how != "zero":
            label = {"clamp": f"Set feature {feature}'s activation to:", "scale": f"Multiply feature {feature}'s "
                     "activation by:", "add": f"Add to feature {feature}'s activation (steers along its direction):"}[how]
            value, ok = QInputDialog.getDouble(self, f"{how.capitalize()} feature {feature}", label,
                                               self._default_value(attached, feature, how), -1e6, 1e6, 3)
            if not ok:
                return
        try:
            iv = feature_edit_from(attached, feature, how, 0.0 if value is None else value)
        except ValueError as exc:
            self.status.setText(f"Cannot edit feature {feature}: {exc}")
            return
        self.state.edits.add(iv)

    def remove_edit(self, attached, feature: int) -> None:
        self.state.edits.remove_if(lambda iv: _edits_feature(iv, attached.dictionary, feature))

    # -- dashboard -----------------------------------------------------------------------------
    def run_dashboard(self) -> None:
        if self.feature is None:
            self.dashboard.status.setText("Click a feature in the lens first.")
            return
        a, k = self.feature
        self.dashboard.run_contexts(
            self.state, f"feature {k}", cached_dashboard, self.state.loaded, a, self.dashboard.text_file, k,
            interventions=list(self.state.interventions), ids=list(self.state.token_ids),
            parts=(MODEL, EDITS, DICTIONARIES), owner=self)

    # -- attribution ---------------------------------------------------------------------------
    def _tab_changed(self, index: int) -> None:
        running = self._attr_job is not None and not self._attr_job.done
        if TABS[index] == "Attribution" and self.attr_chart.attribution is None and self.lens is not None \
                and not running:
            self.attribute()

    def attribute(self) -> None:
        state = self.state
        row = self.attr_combo.currentIndex()
        if state.loaded is None or not 0 <= row < len(state.dictionaries) or not state.token_ids:
            self.attr_status.setText("Attach a dictionary and type a text first.")
            return
        if self._attr_job is not None and not self._attr_job.done:
            self._attr_job.cancel()
        a = state.dictionaries[row]
        self.attr_status.setText("Attributing…")
        self._attr_job = state.run(attribute_next_token, state.loaded, list(state.token_ids), a,
                                   list(state.interventions), on_result=lambda r: self._show_attribution(a, *r),
                                   on_error=lambda exc, tb: self.attr_status.setText(f"Cannot attribute: {exc}"),
                                   parts=FEATURE_PARTS, owner=self)

    def _show_attribution(self, attached, fa, token: int) -> None:
        label = f"{self.state.token_strings([token])[0]!r} (#{token})"
        self.attr_chart.set_attribution(fa, f"{label} at position {fa.position}: {attached.dictionary.hook} "
                                             f"adds {fa.direct:.4g} directly")
        biggest = ", ".join(f"f{int(f)} {c:+.3g}" for f, c in zip(fa.features[:3], fa.contributions[:3]))
        # (the chart's title names the token, the position and the hook's direct contribution: one line at 1024 px)
        self.attr_status.setText(f"The {len(fa.features)} active features, bias, skip and error sum to {fa.total:.4g} "
                                 f"(direct contribution {fa.direct:.4g}); largest: {biggest or 'none'}")

    # -- export (ExportBar's view protocol for the Lens tab) ------------------------------------
    def export_widget(self):
        return self.lens_tab

    def export_unavailable(self) -> str | None:
        return None if self.lens is not None else "no features yet: attach a dictionary and type a text"

    def export_arrays(self):
        import numpy as np

        if self.lens is None:
            return {}
        out = {"ids": np.array(self.lens_ids)}
        for i, (_a, run, _t) in enumerate(self.lens):
            out[f"acts_{i}"] = run.acts.cpu().numpy()
            out[f"l0_{i}"] = run.l0.cpu().numpy()
            out[f"variance_explained_{i}"] = run.token_variance_explained.cpu().numpy()
        return out

    def csv_table(self):
        if self.lens is None:
            return None
        rows = []
        for a, _run, tokens in self.lens:
            for tf in tokens:
                for k, v in tf.top:
                    rows.append([a.dictionary.hook, tf.position, self.lens_ids[tf.position], k, f"{v:.6g}", tf.l0,
                                 f"{tf.variance_explained:.6g}", f"{tf.error_norm:.6g}"])
        return ["hook", "position", "token_id", "feature", "activation", "l0", "variance_explained", "error_norm"], rows
