"""What if panel: which heads wrote the next token (direct logit attribution), which
activations carry the answer (activation patching), and what adding a direction does (steering).

(a) Direct logit attribution of one token's logit at one position of the current text (default:
the last position and the model's top next token): one bar per head, per MLP, the embedding and
the biases; they add up to the logit. The current text's ablations (AppState.interventions) apply.
(b) Activation patching: a clean and a corrupted text of the same length in tokens, an answer
token (and optionally a wrong one); one corrupted forward per patched activation, in a worker with
progress and Cancel; two heatmaps of the recovered fraction (residual stream layer x position,
heads layer x head).
(c) Steering: the mean residual stream after a layer on one text minus that on another, scaled by a
slider, added after that layer at every position (core.interventions.steer); Apply puts it among
AppState.interventions (replacing an earlier steer), so the strip lists it and the Generate panel
compares the steered model with the model as trained.
Model work runs in workers (ui.workers.run_job), never on the UI thread.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QLineEdit, QPushButton, QSlider, QSpinBox,
                               QSplitter, QTabWidget, QVBoxLayout, QWidget)

from ...app.edits import ALREADY
from ...app.whatif import (EXPERT, HEAD, ablation, ablation_choices, forced_routing, attribute_ids, attribution_problem, is_seq2seq,
                           patch_ids, patching_problem, refuse, steering_edit, steering_problem, text_ids)
from ...core.views.whatif import TABS as WHATIF_TABS, WhatIfViewState
from ..state import EDITS, MODEL, ResultView
from ..widgets.attribution_bars import AttributionBars, Bars
from ..widgets.export import ExportBar
from ..widgets.heatmap import Heatmap
from ..widgets.job_progress import JobProgressBar
from ..widgets.made_when_shown import MadeWhenShown
from . import CANCEL_KEY, key_buttons


# -- core work, run in workers -----------------------------------------------------------------


def token_id_of(loaded, text: str, what: str) -> int:
    """One token id from what the user typed: '#123' (an id), or a text that is exactly one token
    (a model without a tokenizer takes ids only; an encoder-decoder's answer is a target token, cut by
    its target tokenizer when it has one, Marian's). ValueError with one line otherwise."""
    typed, text = text, text.strip()
    vocab = loaded.config.vocab_size
    if not text:
        raise ValueError(f"the {what} token is empty: type a token or #id")
    if text.startswith("#") or loaded.tokenizer is None:
        try:
            tid = int(text.lstrip("#"))
        except ValueError:
            raise ValueError(f"{what} token {text!r}: this model has no tokenizer, give a token id") from None
        if not 0 <= tid < vocab:
            raise ValueError(f"{what} token id {tid} is outside the vocabulary (0..{vocab - 1})")
        return tid
    tok = (loaded.tokenizer.target or loaded.tokenizer) if is_seq2seq(loaded) else loaded.tokenizer
    ids = tok.encode(typed)  # as typed: a leading space is part of many BPE tokens
    if len(ids) != 1:
        ids = tok.encode(text)
    if len(ids) != 1:
        raise ValueError(f"{what} token {text!r} is {len(ids)} tokens {tok.token_strings(ids)}: "
                         "give one token, or #id")
    return int(ids[0])


def attribute(loaded, ids: list[int], position: int, token_text: str, interventions: list, decoder_ids=None,
              job=None):
    """(Attribution, token id) for the token typed (empty: the edited model's top next token there); an
    encoder-decoder's at a position of its decoder input `decoder_ids` (app.whatif.attribute_ids)."""
    refuse(attribution_problem(loaded.config))
    token = token_id_of(loaded, token_text, "attributed") if token_text.strip() else None
    return attribute_ids(loaded, ids, position, token, interventions, decoder_ids, job=job)


def patch(loaded, clean: str, corrupted: str, answer: str, wrong: str, interventions=(), job=None, decoder_ids=None):
    """(Patching, clean ids) on the edited model: `interventions` (AppState's ablations) apply in
    the clean, corrupted and patched runs alike, as in every other panel. An encoder-decoder's clean and
    corrupted texts are two sources, its decoder reading `decoder_ids` (the Model panel's target) in each."""
    refuse(patching_problem(loaded.config))
    clean_ids, corrupted_ids = text_ids(loaded, clean, "clean"), text_ids(loaded, corrupted, "corrupted")
    answer_id = token_id_of(loaded, answer, "answer")
    wrong_id = token_id_of(loaded, wrong, "wrong") if wrong.strip() else None
    return patch_ids(loaded, clean_ids, corrupted_ids, answer_id, wrong_id, list(interventions), job,
                     decoder_ids), clean_ids


SCALE_STEPS = 2  # the scale slider moves in steps of 1 / SCALE_STEPS
SCALE_MAX = 10


# -- the attribution bar chart ----------------------------------------------------------------


def component_bars(attribution) -> Bars:
    """One bar per component of the logit (embedding, each head, each layer's MLP and biases)."""
    labels = [_component_label(c, l, h) for c, l, h, _ in attribution.rows()]
    rows = [[s, c, l, h, f"{v:.6g}"] for s, (c, l, h, v) in zip(labels, attribution.rows())]
    rows.append(["sum", "sum", -1, -1, f"{attribution.sum:.6g}"])
    rows.append(["logit", "logit", -1, -1, f"{attribution.logit:.6g}"])
    arrays = {"labels": np.array(labels), "contributions": attribution.contributions,
              "logit": np.array(attribution.logit)}
    # the named bars (embed, each MLP and bias, norm bias...) are always labelled, the many numbered heads and
    # experts thinned around them (as the Features chart's bias and error): at 1024 px 'norm bias' went unnamed;
    # a layer's are left out together (every k-th layer's named) where 24 layers' would not fit
    named = [(i, l) for i, (c, l, _, _) in enumerate(attribution.rows()) if c not in NUMBERED_COMPONENTS]
    return Bars(labels, [float(v) for v in attribution.contributions], arrays,
                ["label", "component", "layer", "head", "contribution"], rows,
                always_labelled=tuple(i for i, _ in named), always_groups=tuple(l for _, l in named))


NUMBERED_COMPONENTS = ("head", "cross_head", "expert")  # L2H3, L2xH3, L2E5: one of many a layer


def attribution_title(attribution, token_label: str, where: str) -> str:
    """`where`: what the position is ("position", an encoder-decoder's "decoder position")."""
    return (f"token {token_label} at {where} {attribution.position}: sum {attribution.sum:.4g}, "
            f"logit {attribution.logit:.4g}")


def attribution_chart() -> AttributionBars:
    return AttributionBars(component_bars, "no attribution yet: Attribute")


def _component_label(component: str, layer: int, head: int) -> str:
    """L2H3: a (self-attention) head; L2xH3: an encoder-decoder's cross-attention head; L2E5: a mixture's
    expert 5."""
    return {"embed": "embed", "head": f"L{layer}H{head}", "attn_bias": f"L{layer} bias", "mlp": f"L{layer} MLP",
            "expert": f"L{layer}E{head}", "shared_expert": f"L{layer} shared",
            "cross_head": f"L{layer}xH{head}", "cross_bias": f"L{layer} x-bias", "logits_bias": "logits bias",
            "final_norm_bias": "norm bias"}.get(component) or (
        f"L{layer} edit {component.removeprefix('edit_')}" if component.startswith("edit_") else component)


# -- the panel ---------------------------------------------------------------------------------


class WhatIfPanel(QWidget, ResultView):
    title = "What if"
    # (key, what): the buttons' keys (each works while its tab is on show), listed in Help
    shortcuts = (("Ctrl+Return", "Attribute"), (CANCEL_KEY, "Cancel the attribution"), ("Ctrl+Return", "Run the patching"),
                 (CANCEL_KEY, "Cancel the patching"), ("Ctrl+Return", "Apply the steer"),
                 (CANCEL_KEY, "Cancel the steering vector"), ("Ctrl+Return", "Ablate"))
    help_text = (
        "<b>What am I looking at?</b> <b>Direct logit attribution</b>: the logit of token t at position p is "
        "a sum over what each component wrote into the residual stream, read through the final norm "
        "(linearised at p) and the unembedding: logit<sub>t</sub> = &Sigma;<sub>c</sub> W<sub>U</sub>[t]&middot;"
        "norm(c). One bar per head (W<sub>O,h</sub> z<sub>h</sub>), per MLP, the embedding and the biases; "
        "the bars add up to the logit. Ablations set in the Attention panel or the Ablate tab apply. "
        "<i>Encoder-decoders</i> (T5-style, pre-norm): the decoder's logit at a position of its input "
        "([start] + the Model panel's target), over the decoder's embedding, its self-attention heads "
        "(L<i>l</i>H<i>h</i>), its cross-attention heads (L<i>l</i>xH<i>h</i>, which read the encoder's "
        "output) and its MLPs.<br>"
        "<b>Activation patching</b>: run the corrupted text, copy one activation from the clean run, and "
        "measure how much of the answer comes back: (m<sub>patched</sub> &minus; m<sub>corrupted</sub>) / "
        "(m<sub>clean</sub> &minus; m<sub>corrupted</sub>), m = logit[answer] (&minus; logit[wrong]) at the last "
        "position; 1 = fully restored. Rows: the residual stream at each layer and position, and each "
        "head's output (all positions). <i>Encoder-decoders</i>: the clean and corrupted texts are two "
        "sources (the decoder reads the Model panel's target in every run); rows: the encoder's residual "
        "stream at each source position, and every head of the three kinds (enc: encoder self-attention, "
        "dec: decoder self-attention, cross: cross-attention).<br>"
        "<b>Ablate</b>: zero one head (of an encoder-decoder: encoder self-, decoder self- or "
        "cross-attention), a layer's attention or an MLP; the strip at the top lists it and every panel "
        "shows the edited model.<br>"
        "<b>Steer</b>: v = mean<sub>positions</sub> resid<sub>L</sub>(towards) &minus; "
        "mean<sub>positions</sub> resid<sub>L</sub>(away from), the residual stream after layer L on two texts; "
        "Apply adds scale &times; v to the residual stream after layer L at every position, the generated ones "
        "too. The strip at the top lists the steer (x removes it); the Generate panel shows the next-token "
        "distribution with and without it.")

    def __init__(self, state, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self._dla_job = None
        self._own_tips: dict = {}  # the controls' tooltips while they are enabled
        self._dla_follows = False  # an attribution was asked for: it follows the inputs, shown or not
        self._patch_job = None
        self.patching = None  # the last core.interventions.Patching shown
        # what the bars / maps on show were computed for (position, token typed) / (the four texts typed), and
        # their result line: typing other inputs marks them out of date (_typed_changed)
        self._dla_for = self._patch_for = None
        self._dla_asked = self._patch_asked = None  # (those of the job running)
        self._dla_line = self._patch_line = ""

        # (a) direct logit attribution
        self.position_spin = QSpinBox()
        self.position_spin.setRange(-1, 100_000)
        self.position_spin.setValue(-1)
        self.position_spin.setSpecialValueText("last")  # -1: the text's last position
        self.token_edit = QLineEdit()
        self.token_edit.setPlaceholderText("top next token (or a token, or #id)")
        self.attribute_button = QPushButton("Attribute")
        # Cancel, as the patching's (Esc while its tab is on show): an attribution of a 124M model took 3 s at 64
        # tokens, 18 s at 1,024 (2 busy cores); a cancel lands after the block the forward is in
        self.dla_cancel_button = QPushButton("Cancel")
        self.dla_cancel_button.setEnabled(False)
        self.dla_status = QLabel(self.DLA_HINT)
        self.dla_status.setWordWrap(True)  # (the edits in force, an out-of-date line: not cut at 1024 pixels)
        self.dla_chart = attribution_chart()
        self.dla_export = ExportBar(lambda: self.dla_chart, lambda: "whatif-attribution")
        dla = QWidget()
        row = QHBoxLayout()
        for w in (QLabel("Position"), self.position_spin, QLabel("Token"), self.token_edit, self.attribute_button,
                  self.dla_cancel_button):
            row.addWidget(w)
        row.addWidget(self.dla_export)
        lay = QVBoxLayout(dla)
        lay.addLayout(row)
        lay.addWidget(self.dla_status)
        lay.addWidget(self.dla_chart, 1)

        # (b) activation patching
        self.clean_edit, self.corrupted_edit = QLineEdit(), QLineEdit()
        self.clean_edit.setPlaceholderText("clean text")
        self.corrupted_edit.setPlaceholderText("corrupted text (same number of tokens)")
        self.answer_edit, self.wrong_edit = QLineEdit(), QLineEdit()
        self.answer_edit.setPlaceholderText("answer token or #id")
        self.wrong_edit.setPlaceholderText("wrong token (optional)")
        self.run_button, self.cancel_button = QPushButton("Run"), QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.progress = JobProgressBar()
        self.progress.setVisible(False)
        self.patch_status = QLabel(self.PATCH_HINT)
        self.patch_status.setWordWrap(True)
        patching = QWidget()
        texts = QHBoxLayout()
        for w in (QLabel("Clean"), self.clean_edit, QLabel("Corrupted"), self.corrupted_edit):
            texts.addWidget(w, 1 if isinstance(w, QLineEdit) else 0)
        answers = QHBoxLayout()
        for w in (QLabel("Answer"), self.answer_edit, QLabel("Wrong"), self.wrong_edit, self.run_button,
                  self.cancel_button, self.progress):
            answers.addWidget(w)
        # the maps made when the tab is first shown (a heatmap is a pyqtgraph plot, ~25-50 ms to make): the
        # panel's first show is the attribution's tab
        self.patching_maps = MadeWhenShown(self._make_patching_maps)
        lay = QVBoxLayout(patching)
        lay.addLayout(texts)
        lay.addLayout(answers)
        lay.addWidget(self.patch_status)
        lay.addWidget(self.patching_maps, 1)

        # (c) steering
        self.towards_edit, self.away_edit = QLineEdit(), QLineEdit()
        self.towards_edit.setPlaceholderText("text to steer towards, e.g. Love")
        self.away_edit.setPlaceholderText("text to steer away from, e.g. Hate")
        self.steer_layer_spin = QSpinBox()
        self.steer_layer_spin.setRange(0, 999)  # narrowed to the model's layers when one opens
        self.steer_layer_spin.setToolTip("v is read from, and added to, the residual stream after this layer")
        self._steer_layer: int | None = None  # as in WhatIfViewState: None = the model's middle layer
        self.scale_slider = QSlider(Qt.Orientation.Horizontal)
        self.scale_slider.setRange(-SCALE_MAX * SCALE_STEPS, SCALE_MAX * SCALE_STEPS)
        self.scale_slider.setSingleStep(1)
        self.scale_slider.setPageStep(SCALE_STEPS)
        self.scale_slider.setTickPosition(QSlider.TickPosition.TicksBelow)
        self.scale_slider.setTickInterval(SCALE_STEPS * 5)
        self.scale_slider.setMinimumWidth(200)
        self.scale_label = QLabel()
        self.scale_label.setMinimumWidth(45)
        self.apply_steer_button = QPushButton("Apply")
        self.apply_steer_button.setToolTip("Add scale x v after the layer: every panel shows the steered model")
        self.steer_cancel_button = QPushButton("Cancel")  # (the vector's two forwards: 1-11 s on a 124M model)
        self.steer_cancel_button.setEnabled(False)
        self.steer_status = QLabel(self.STEER_HINT)
        self.steer_status.setWordWrap(True)
        steering = QWidget()
        texts = QHBoxLayout()
        for w in (QLabel("Towards"), self.towards_edit, QLabel("Away from"), self.away_edit):
            texts.addWidget(w, 1 if isinstance(w, QLineEdit) else 0)
        knobs = QHBoxLayout()
        for w in (QLabel("Layer"), self.steer_layer_spin, QLabel("Scale"), QLabel(f"-{SCALE_MAX}"),
                  self.scale_slider, QLabel(f"+{SCALE_MAX}"), self.scale_label, self.apply_steer_button,
                  self.steer_cancel_button):
            knobs.addWidget(w, 1 if w is self.scale_slider else 0)
        how = QLabel("v = mean residual stream after the layer on the first text &minus; the same on the second "
                     "(the texts may differ in length). Apply adds scale &times; v there at every position, the "
                     "generated ones too, beside any ablations; a new Apply replaces the steer. A negative scale "
                     "steers the other way. Compare |scale &times; v| with the residual stream's own size (the "
                     "Layers panel) to judge how strong a push it is.")
        how.setWordWrap(True)
        how.setTextFormat(Qt.TextFormat.RichText)  # no tags, so AutoText would show the entities raw
        how.setStyleSheet("color: palette(placeholder-text);")
        lay = QVBoxLayout(steering)
        lay.addLayout(texts)
        lay.addLayout(knobs)
        lay.addWidget(self.steer_status)
        lay.addWidget(how)
        lay.addStretch(1)
        self._steer_job = None
        self.set_scale(4.0)

        # (d) ablation: zero one head (of any of an encoder-decoder's three kinds), a layer's attention, an MLP or
        # a mixture's expert
        self.ablate_kind = QComboBox()
        self.ablate_layer, self.ablate_head = QSpinBox(), QSpinBox()
        self.ablate_button = QPushButton("Ablate")
        self.ablate_button.setToolTip("Zero it: listed in the strip above, every panel shows the edited model")
        self.ablate_status = QLabel(self.ABLATE_HINT)
        self.ablate_status.setWordWrap(True)
        ablating = QWidget()
        knobs = QHBoxLayout()
        self.ablate_head_label = QLabel("Head")  # "Expert" when the kind is a mixture's expert
        for w in (QLabel("Zero"), self.ablate_kind, QLabel("Layer"), self.ablate_layer, self.ablate_head_label,
                  self.ablate_head, self.ablate_button):
            knobs.addWidget(w)
        knobs.addStretch(1)
        # a mixture of experts: force one token's routing at one layer (shown for a mixture only)
        self.route_layer, self.route_position = QSpinBox(), QSpinBox()
        self.route_experts = QLineEdit()
        self.route_experts.setPlaceholderText("e.g. 0,1")
        self.route_button = QPushButton("Route")
        self.route_button.setToolTip("Send the token to these experts (weighted by the router's probabilities of "
                                     "them): every panel and Generate show the edited model")
        self.route_row = QWidget()
        routes = QHBoxLayout(self.route_row)
        routes.setContentsMargins(0, 0, 0, 0)
        for w in (QLabel("Force routing: layer"), self.route_layer, QLabel("token"), self.route_position,
                  QLabel("to experts"), self.route_experts, self.route_button):
            routes.addWidget(w, 1 if w is self.route_experts else 0)
        self.route_row.setVisible(False)
        lay = QVBoxLayout(ablating)
        lay.addLayout(knobs)
        lay.addWidget(self.route_row)
        lay.addWidget(self.ablate_status)
        lay.addStretch(1)
        self.route_button.clicked.connect(self.apply_routing)
        self.route_experts.returnPressed.connect(self.apply_routing)
        self.ablate_kind.currentIndexChanged.connect(self._ablate_kind_chosen)
        self.ablate_button.clicked.connect(self.apply_ablation)

        self.tabs = QTabWidget()
        self.tabs.addTab(dla, "Direct logit attribution")
        self.tabs.addTab(patching, "Activation patching")
        self.tabs.addTab(steering, "Steer")
        self.tabs.addTab(ablating, "Ablate")
        # File > Export Current View: the chart, or the residual-stream map (the heads map has its own bar)
        self.export_bar = ExportBar(self.current_view, self._export_name, self,
                                    views=(self.dla_chart,))  # (and the residual-stream map, once made)
        self.export_bar.hide()
        outer = QVBoxLayout(self)
        outer.addWidget(self.tabs)

        self.attribute_button.clicked.connect(self.attribute)
        self.token_edit.returnPressed.connect(self.attribute)
        self.run_button.clicked.connect(self.run_patching)
        self.cancel_button.clicked.connect(self.cancel_patching)
        key_buttons(self.shortcuts, (self.attribute_button, self.dla_cancel_button, self.run_button,
                                     self.cancel_button, self.apply_steer_button, self.steer_cancel_button,
                                     self.ablate_button))
        self.dla_cancel_button.clicked.connect(lambda: self._cancel(self._dla_job))
        self.steer_cancel_button.clicked.connect(lambda: self._cancel(self._steer_job))
        self.scale_slider.valueChanged.connect(self._show_scale)
        self.steer_layer_spin.valueChanged.connect(self._steer_layer_chosen)
        self.apply_steer_button.clicked.connect(self.apply_steer)
        for edit in (self.towards_edit, self.away_edit):
            edit.returnPressed.connect(self.apply_steer)
        self.token_edit.textEdited.connect(self._typed_changed)
        self.position_spin.valueChanged.connect(self._typed_changed)
        for edit in (self.clean_edit, self.corrupted_edit, self.answer_edit, self.wrong_edit):
            edit.textEdited.connect(self._typed_changed)
        self.watch_inputs(state)  # every result shown here belongs to the current model, text and edits
        state.trace_changed.connect(self._on_trace)
        state.model_changed.connect(self._on_model)
        state.interventions_changed.connect(self._forget_applied)
        if getattr(state, "loaded", None) is not None:
            self._on_model(state.loaded)

    STALE_DLA = ("Out of date: the bars are for {what}; Attribute (Ctrl+Return) for the position and token "
                 "typed.")
    STALE_PATCH = ("Out of date: the maps are for clean {0!r}, corrupted {1!r}, answer {2!r}; Run (Ctrl+Return) "
                   "for the texts typed.")

    def _dla_typed(self) -> tuple:
        return self.position_spin.value(), self.token_edit.text().strip()

    def _patch_typed(self) -> tuple:
        return tuple(e.text() for e in (self.clean_edit, self.corrupted_edit, self.answer_edit, self.wrong_edit))

    def _typed_changed(self, *_args) -> None:
        """A result on show whose inputs were typed over says so (its result line again if they are typed back)."""
        if self.dla_chart.attribution is not None and self._dla_for is not None and not self._dla_running():
            a = self.dla_chart.attribution
            what = f"token {self.state.token_strings([a.token_id])[0]!r} (#{a.token_id}) at position {a.position}"
            self.dla_status.setText(self._dla_line if self._dla_typed() == self._dla_for
                                    else self.STALE_DLA.format(what=what))
        if self.patching is not None and self._patch_for is not None:
            self.patch_status.setText(self._patch_line if self._patch_typed() == self._patch_for
                                      else self.STALE_PATCH.format(*(t if len(t) <= 40 else f"{t[:39]}…"
                                                                      for t in self._patch_for)))

    def _forget_applied(self, *_args) -> None:
        """An "Applied ..." line is about an edit in force: gone with it (Clear all, its x, another model)."""
        labels = {iv.label for iv in self.state.interventions}
        for status in (self.ablate_status, self.steer_status):
            text = status.text()
            if text.startswith("Applied ") and not any(text.startswith(f"Applied {label}:") for label in labels):
                status.setText("")

    def showEvent(self, event) -> None:
        super().showEvent(event)
        # a first look shows the default attribution (the top next token at the last position: one
        # forward in a worker), not empty axes
        if self.dla_chart.attribution is None and not self._dla_running():
            self._attribute_if_possible()

    def current_view(self):
        return self.dla_chart if self.tabs.currentIndex() == 0 else self.resid_map

    def _make_patching_maps(self) -> QSplitter:
        """The residual-stream and heads maps of activation patching, each with its export bar."""
        self._resid_map = Heatmap(colormap="CET-D1", row_name="layer", col_name="position", value_name="recovered",
                                  row_tokens=False, annotate_max_cells=200)
        self._heads_map = Heatmap(colormap="CET-D1", row_name="layer", col_name="head", value_name="recovered",
                                  row_tokens=False, col_tokens=False, annotate_max_cells=200)
        self._resid_export = ExportBar(lambda: self._resid_map, lambda: "whatif-patching-resid")
        self._heads_export = ExportBar(lambda: self._heads_map, lambda: "whatif-patching-heads")
        self.export_bar.follow(self._resid_map)
        maps = QSplitter()
        for hm, bar, name in ((self._resid_map, self._resid_export, "Residual stream (layer x position)"),
                              (self._heads_map, self._heads_export, "Heads (layer x head)")):
            box = QWidget()
            v = QVBoxLayout(box)
            head = QHBoxLayout()
            head.addWidget(QLabel(name), 1)
            head.addWidget(bar)
            v.addLayout(head)
            v.addWidget(hm, 1)
            maps.addWidget(box)
        return maps

    def _patching_part(self, name: str):
        self.patching_maps.widget()  # (the maps made now if not yet)
        return getattr(self, name)

    # activation patching's maps and their export bars (made when first asked for, or shown)
    resid_map = property(lambda self: self._patching_part("_resid_map"))
    heads_map = property(lambda self: self._patching_part("_heads_map"))
    resid_export = property(lambda self: self._patching_part("_resid_export"))
    heads_export = property(lambda self: self._patching_part("_heads_export"))

    def _export_name(self) -> str:
        return "whatif-attribution" if self.tabs.currentIndex() == 0 else "whatif-patching-resid"

    # -- workspace (MainWindow saves view_state and gives it back with set_view_state) ----------
    VIEW_TABLE = None  # no views table: the inputs are the panel's whole view state

    @property
    def view_state(self) -> WhatIfViewState:
        """The typed inputs and the tab (not the bars or maps: Attribute / Run computes them again)."""
        position = self.position_spin.value()
        return WhatIfViewState(
            tab=WHATIF_TABS[self.tabs.currentIndex()], position=None if position < 0 else position,
            token=self.token_edit.text(), clean=self.clean_edit.text(), corrupted=self.corrupted_edit.text(),
            answer=self.answer_edit.text(), wrong=self.wrong_edit.text(), steer_towards=self.towards_edit.text(),
            steer_away=self.away_edit.text(), steer_scale=self.scale,
            # the layer shown once a model is open (even if never touched); before that, what was restored
            steer_layer=self.steer_layer_spin.value() if self.state.loaded is not None else self._steer_layer)

    def set_view_state(self, state: WhatIfViewState) -> None:
        self.position_spin.setValue(-1 if state.position is None else state.position)  # -1 shows "last"
        for edit, text in ((self.token_edit, state.token), (self.corrupted_edit, state.corrupted),
                           (self.answer_edit, state.answer), (self.wrong_edit, state.wrong),
                           (self.towards_edit, state.steer_towards), (self.away_edit, state.steer_away)):
            edit.setText(text)
        if state.clean:  # "": keep the current text the panel started from
            self.clean_edit.setText(state.clean)
        self.set_scale(state.steer_scale)
        self._steer_layer = state.steer_layer
        self._show_steer_layer()
        if state.tab in WHATIF_TABS:
            self.tabs.setCurrentIndex(WHATIF_TABS.index(state.tab))

    # -- (a) --------------------------------------------------------------------------------
    DLA_HINT = "Choose a position and a token (empty: the model's top next token), then Attribute."
    PATCH_HINT = "Type a clean and a corrupted text and the answer token; then Run."
    STEER_HINT = "Type a text to steer towards and one to steer away from, choose a layer and a scale, then Apply."
    ABLATE_HINT = "Choose a head, a layer's attention or an MLP, then Ablate."

    def clear_results(self, changed: frozenset) -> None:
        """AppState.inputs_changed: what was computed for another model, text or edits goes (the
        attribution follows the new trace in _on_trace; patching and steering wait for Run / Apply)."""
        for job in (self._dla_job, self._patch_job, self._steer_job):
            if job is not None and not job.done:
                job.cancel()  # AppState.run would drop its result anyway
        self.dla_chart.clear_chart("")
        loaded = self.state.loaded
        cfg = loaded.config if loaded is not None else None

        def line(hint: str, problem: str) -> str:  # a model the tool is not for: why, not how to use it
            return f"{problem[0].upper()}{problem[1:]}." if problem else hint

        self.dla_status.setText(line(self.DLA_HINT, attribution_problem(cfg) if cfg is not None else ""))
        if changed & {MODEL, EDITS}:  # patching reads its own texts, with the model and its edits
            if self.patching_maps.made:  # (maps not made yet show nothing)
                self.resid_map.clear_matrix("")
                self.heads_map.clear_matrix("")
            self.patching = None
            self.patch_status.setText(line(self.PATCH_HINT, patching_problem(cfg) if cfg is not None else ""))
        if MODEL in changed:  # a steering vector is one model's residual stream
            self.steer_status.setText(line(self.STEER_HINT, steering_problem(cfg) if cfg is not None else ""))

    def _on_model(self, loaded) -> None:
        cfg = loaded.config if loaded is not None else None
        dla_problem = attribution_problem(cfg) if cfg is not None else ""
        patch_problem = patching_problem(cfg) if cfg is not None else ""
        steer_problem = steering_problem(cfg) if cfg is not None else ""
        for widgets, problem in (((self.attribute_button, self.token_edit, self.position_spin), dla_problem),
                                 ((self.run_button, self.clean_edit, self.corrupted_edit, self.answer_edit,
                                   self.wrong_edit), patch_problem),
                                 ((self.apply_steer_button, self.towards_edit, self.away_edit),
                                  steer_problem)):
            for w in widgets:  # disabled, saying why (a tooltip shows on a disabled widget too)
                own = self._own_tips.setdefault(w, w.toolTip())
                w.setEnabled(not problem)
                w.setToolTip(f"Not for this model: {problem}" if problem else own)
        self._show_steer_layer()
        self._fill_ablate_kinds(cfg)
        self._forget_applied()
        self._fill_routing(cfg)
        for label, problem in ((self.dla_status, dla_problem), (self.patch_status, patch_problem),
                               (self.steer_status, steer_problem)):
            if problem:
                label.setText(f"{problem[0].upper()}{problem[1:]}.")
        if cfg is not None and cfg.input_kind == "patches":
            return
        if loaded is not None and not self.clean_edit.text() and self.state.text:
            self.clean_edit.setText(self.state.text)  # a starting point: the text being inspected

    def _dla_running(self) -> bool:
        return self._dla_job is not None and not self._dla_job.done

    def _attribute_if_possible(self) -> None:
        """The default attribution, when this model can have one and there is a text to read."""
        loaded = self.state.loaded
        if loaded is not None and self.state.token_ids and not attribution_problem(loaded.config):
            self.attribute()

    def _on_trace(self, _trace) -> None:
        loaded = self.state.loaded
        self._fill_routing(loaded.config if loaded is not None else None)  # the token box within the new text
        # a new input (text, ids, ablations): its attribution follows while the panel is in use
        if self.isVisible() or self._dla_follows:
            self._attribute_if_possible()

    def screenshot_demo(self) -> None:
        """--screenshot: the default attribution, as a first look shows it."""
        if self.dla_chart.attribution is None:
            self.attribute()

    def screenshot_ready(self) -> bool:
        """What is on show is drawn, whatever the panel's state: no attribution or patching job runs, and the
        attribution's line says its result (or its failure, or why the model cannot be attributed), not that
        it is computing."""
        running = any(job is not None and not job.done for job in (self._dla_job, self._patch_job))
        return not running and not self.dla_status.text().endswith("\u2026")

    def attribute(self) -> None:
        loaded = self.state.loaded
        if loaded is None:
            self.dla_status.setText("Open a model first.")
            return
        problem = attribution_problem(loaded.config)
        if problem:
            self.dla_chart.clear_chart("")
            self.dla_status.setText(f"Cannot attribute: {problem}")
            return
        self._dla_follows = True  # from now on the bars follow the text, the model and the edits
        ids = list(self.state.token_ids)
        position = self.position_spin.value()
        if self._dla_running():
            self._dla_job.cancel()
        self.dla_status.setText(f"Attributing… ({CANCEL_KEY} cancels)")
        self._dla_asked = self._dla_typed()
        # the tokens shown (the text's, or a generation step's) with the current model and edits; an
        # encoder-decoder's decoder reads [start] + the Model panel's target
        decoder = list(self.state.decoder_ids) or None if is_seq2seq(loaded) else None
        self._dla_job = job = self.state.run(
            attribute, loaded, ids, position, self.token_edit.text(), list(self.state.interventions), decoder,
            on_result=self._show_attribution, on_error=self._dla_failed, owner=self,
            on_cancelled=lambda: self._cancelled(job, self._dla_job, self.dla_status, "Attribution cancelled."),
            on_finished=lambda: self.dla_cancel_button.setEnabled(self._dla_running()))
        self.dla_cancel_button.setEnabled(True)

    def _show_attribution(self, result) -> None:
        attribution, token = result
        label = repr(self.state.token_strings([token])[0]) if self.state.loaded is not None else str(token)
        seq2seq = self.state.loaded is not None and is_seq2seq(self.state.loaded)
        self.dla_chart.set_attribution(attribution, attribution_title(attribution, f"{label} (#{token})",
                                                                      "decoder position" if seq2seq else "position"))
        # (not "ablated": a feature's clamp or a steer is among the edits too)
        edits = f"; edits: {', '.join(iv.label for iv in self.state.interventions)}" \
            if self.state.interventions else ""
        top = np.argsort(-np.abs(attribution.contributions))[:3]
        biggest = ", ".join(f"{self.dla_chart.labels[i]} {attribution.contributions[i]:+.3g}" for i in top)
        self._dla_for = self._dla_asked
        self._dla_line = f"logit {attribution.logit:.4g} = sum {attribution.sum:.4g}; largest: {biggest}" + edits
        self.dla_status.setText(self._dla_line)
        self._typed_changed()  # (typed over while it was computed)

    def _dla_failed(self, exc: BaseException, tb: str) -> None:
        self.dla_chart.clear_chart("")
        self.dla_status.setText(f"Cannot attribute: {exc}")

    @staticmethod
    def _cancel(job) -> None:
        """Cancel (Esc) of the attribution, the patching or the steering vector: the job stops at its next check."""
        if job is not None:
            job.cancel()

    @staticmethod
    def _cancelled(job, current, status: QLabel, line: str) -> None:
        if job is current:  # (not one replaced by a newer Attribute / Apply, which says its own line)
            status.setText(line)

    # -- (b) --------------------------------------------------------------------------------
    def run_patching(self) -> None:
        loaded = self.state.loaded
        if loaded is None:
            self.patch_status.setText("Open a model first.")
            return
        if self._patch_job is not None and not self._patch_job.done:
            return
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress.begin()
        self.progress.setVisible(True)
        self.patch_status.setText("Patching…")
        self._patch_ablations = list(self.state.interventions)  # what the result was computed under
        self._patch_asked = self._patch_typed()
        self._patch_job = self.state.run(patch, loaded, self.clean_edit.text(), self.corrupted_edit.text(),
                                  self.answer_edit.text(), self.wrong_edit.text(), self._patch_ablations,
                                  decoder_ids=list(self.state.decoder_ids) or None if is_seq2seq(loaded) else None,
                                  on_result=self._show_patching,
                                  on_error=self._patch_failed, on_progress=self._patch_progress,
                                  on_cancelled=self._patch_cancelled, on_finished=self._patch_finished,
                                  parts=(MODEL, EDITS))

    def cancel_patching(self) -> None:
        self._cancel(self._patch_job)

    def _patch_progress(self, done: int, total: int, _message: str) -> None:
        left = self.progress.show_progress(done, total)
        self.patch_status.setText(f"Patching: {done}/{total} forwards" + (f", {left}" if left else ""))

    def _patch_finished(self) -> None:
        self.run_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.progress.setVisible(False)

    def _patch_cancelled(self) -> None:
        self.patch_status.setText("Patching cancelled.")

    def _patch_failed(self, exc: BaseException, tb: str) -> None:
        self.patch_status.setText(f"Cannot patch: {exc}")

    def _show_patching(self, result) -> None:
        res, clean_ids = result
        self.patching = res
        span = max(1.0, float(np.nanmax(np.abs(np.concatenate([res.resid.ravel(), res.heads.ravel()])))))
        levels = (-span, span)  # 0 (white) = nothing recovered; symmetric so the sign reads at a glance
        rows = ["embed"] + [f"layer {l}" for l in range(len(res.resid_rows) - 1)]
        head_rows = getattr(res, "head_rows", None)  # an encoder-decoder's: "enc L0", "dec L0", "cross L0" ...
        stream = "the encoder's residual stream" if head_rows else "residual stream"
        tokens = [f"{i}:{s}" for i, s in enumerate(self.state.token_strings(clean_ids))]
        self.resid_map.set_matrix(res.resid, rows, tokens, levels=levels, title=f"recovered ({stream})")
        L, H = res.heads.shape
        row_names = head_rows or [f"layer {l}" for l in range(L)]
        self.heads_map.set_matrix(res.heads, row_names, [f"head {h}" for h in range(H)],
                                  levels=levels, title="recovered (head outputs)")
        l, h = np.unravel_index(int(np.argmax(res.heads)), res.heads.shape)
        where = head_rows[l] if head_rows else f"layer {l}"
        ablations = getattr(self, "_patch_ablations", [])
        edits = f"; edits: {', '.join(iv.label for iv in ablations)}" if ablations else ""
        self._patch_for = self._patch_asked
        self._patch_line = (f"clean {res.clean_metric:.4g}, corrupted {res.corrupted_metric:.4g}; "
                            f"largest head recovery: {where} head {h} ({res.heads[l, h]:.2f}){edits}")
        self.patch_status.setText(self._patch_line)
        self._typed_changed()  # (typed over while it ran)

    # -- (d) --------------------------------------------------------------------------------
    def _fill_ablate_kinds(self, cfg) -> None:
        """The model's kinds of ablation (app.whatif.ablation_choices) in the list."""
        self.ablate_kind.blockSignals(True)
        self.ablate_kind.clear()
        for label, prefix, what, layers in ablation_choices(cfg) if cfg is not None else []:
            self.ablate_kind.addItem(label, (prefix, what, layers))
        self.ablate_kind.blockSignals(False)
        self.ablate_button.setEnabled(cfg is not None)
        self._ablate_kind_chosen()

    def _fill_routing(self, cfg) -> None:
        """The forced-routing row: shown for a mixture of experts, its boxes within the model's layers and
        the text's tokens."""
        moe = cfg is not None and bool(getattr(cfg, "num_experts", 0))
        self.route_row.setVisible(moe)
        if moe:
            self.route_layer.setRange(0, cfg.n_layers - 1)
            self.route_position.setRange(0, max(len(self.state.token_ids), 1) - 1)

    def apply_routing(self) -> None:
        loaded = self.state.loaded
        if loaded is None:
            self.ablate_status.setText("Open a model first.")
            return
        position = self.route_position.value()
        if position >= len(self.state.token_ids):
            self.ablate_status.setText(f"Cannot route: the text has {len(self.state.token_ids)} tokens")
            return
        try:
            iv = forced_routing(loaded.config, self.route_layer.value(), position, self.route_experts.text())
        except ValueError as exc:
            self.ablate_status.setText(f"Cannot route: {exc}")
            return
        # a new routing of the same token at the same layer replaces the old one (app/edits.py's rule)
        if self.state.edits.add(iv) == ALREADY:
            self.ablate_status.setText(f"{iv.label} is already applied.")
            return
        self.ablate_status.setText(f"Applied {iv.label}: every panel and Generate show the edited model; remove it "
                                   "with its x in the strip above.")

    def _ablate_kind_chosen(self, *_) -> None:
        """The layer box within the chosen stack's layers; the head box only for a head."""
        data = self.ablate_kind.currentData()
        loaded = self.state.loaded
        if data is None or loaded is None:
            return
        _, what, layers = data
        self.ablate_layer.setRange(0, layers - 1)
        experts = what == EXPERT  # the head box counts a mixture's experts
        self.ablate_head.setRange(0, (loaded.config.num_experts if experts else loaded.config.n_heads) - 1)
        self.ablate_head.setEnabled(what in (HEAD, EXPERT))
        self.ablate_head_label.setText("Expert" if experts else "Head")

    def apply_ablation(self) -> None:
        loaded = self.state.loaded
        data = self.ablate_kind.currentData()
        if loaded is None or data is None:
            self.ablate_status.setText("Open a model first.")
            return
        prefix, what, _ = data
        try:
            iv = ablation(loaded.config, prefix, what, self.ablate_layer.value(), self.ablate_head.value())
        except ValueError as exc:
            self.ablate_status.setText(f"Cannot ablate: {exc}")
            return
        if self.state.edits.add(iv) == ALREADY:  # another kind of ablation of the same target replaces it
            self.ablate_status.setText(f"{iv.label} is already applied.")
            return
        self.ablate_status.setText(f"Applied {iv.label}: every panel shows the edited model; remove it with its x "
                                   "in the strip above.")

    # -- (c) --------------------------------------------------------------------------------
    @property
    def scale(self) -> float:
        return self.scale_slider.value() / SCALE_STEPS

    def set_scale(self, scale: float) -> None:
        self.scale_slider.setValue(round(scale * SCALE_STEPS))  # clamped to the slider's range
        self._show_scale()

    def _show_scale(self, *_) -> None:
        self.scale_label.setText(f"x{self.scale:.1f}")

    def _steer_layer_chosen(self, value: int) -> None:
        self._steer_layer = value

    def _show_steer_layer(self) -> None:
        """The layer box within the open model's layers, at the chosen layer (default: the middle one)."""
        loaded = self.state.loaded
        if loaded is None:
            return
        n = loaded.config.n_layers
        self.steer_layer_spin.blockSignals(True)  # not a choice of the user's: keep _steer_layer as it was
        self.steer_layer_spin.setRange(0, n - 1)
        self.steer_layer_spin.setValue(n // 2 if self._steer_layer is None else min(self._steer_layer, n - 1))
        self.steer_layer_spin.blockSignals(False)

    def apply_steer(self) -> None:
        loaded = self.state.loaded
        if loaded is None:
            self.steer_status.setText("Open a model first.")
            return
        if self._steer_job is not None and not self._steer_job.done:
            self._steer_job.cancel()
        layer, scale = self.steer_layer_spin.value(), self.scale
        self.steer_status.setText(f"Computing the steering vector… ({CANCEL_KEY} cancels)")
        # another model opened meanwhile (its residual stream differs): AppState.run drops the vector
        self._steer_job = job = self.state.run(
            steering_edit, loaded, self.towards_edit.text(), self.away_edit.text(), layer, scale,
            on_result=lambda result: self._steer_ready(*result), on_error=self._steer_failed, parts=(MODEL,), owner=self,
            on_cancelled=lambda: self._cancelled(job, self._steer_job, self.steer_status,
                                                 "Steering vector cancelled: nothing applied."),
            on_finished=lambda: self.steer_cancel_button.setEnabled(
                self._steer_job is not None and not self._steer_job.done))
        self.steer_cancel_button.setEnabled(True)

    def _steer_ready(self, iv, norm: float) -> None:
        self.state.edits.add(iv)  # replaces the steer applied before: one steer at a time (app/edits.py)
        self.steer_status.setText(f"Applied {iv.label}: |v| = {norm:.3g}, |scale x v| = {float(iv.value.norm()):.3g}. "
                                  "Every panel shows the steered model; the Generate panel compares it with the "
                                  "model as trained. Remove it with its x in the strip above.")

    def _steer_failed(self, exc: BaseException, tb: str) -> None:
        self.steer_status.setText(f"Cannot steer: {exc}")
