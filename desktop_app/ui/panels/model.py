"""Model panel: the architecture of the open model, and how a text splits into its tokens."""
from __future__ import annotations

import math

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QCheckBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton,
                               QSizePolicy, QSpinBox, QSplitter, QVBoxLayout, QWidget)

from ...core.families import REGISTRY
from ..state import AppState
from ..widgets.export import ExportBar
from ..widgets.readable import format_prob
from ..widgets.token_strip import TokenStrip, plural
from ..workers import run_job

TYPING_DEBOUNCE_MS = 250


IMAGE_MODEL_TEXT = ("This is a vision transformer (ViT): it reads images, not text. Give it one in the Image "
                    "panel (a held-out digit, Open image…, or drop a file there); its [CLS] + patch tokens "
                    "show here and in Attention and Layers.")


def format_count(n: int) -> str:
    """12,345,678 (12.3 M)."""
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n:,} ({n / div:.1f} {unit})"
    return f"{n:,}"


FAMILY_NAMES = {model_type: family.title for model_type, family in REGISTRY.items()}


def architecture_rows(loaded, device: str) -> list[tuple[str, str]]:
    """(label, value) pairs of the summary; the test compares them with the config."""
    cfg = loaded.config
    kv = cfg.n_kv_heads if cfg.n_kv_heads is not None else cfg.n_heads
    kv_text = f"{kv}" + (" (grouped-query)" if kv != cfg.n_heads else "")
    attention = cfg.attention_kind + (", causal" if cfg.causal else ", bidirectional")
    images = cfg.input_kind == "patches"
    if cfg.is_encoder_decoder:
        layers = [("Encoder layers", f"{cfg.n_layers} (bidirectional self-attention)"),
                  ("Decoder layers", f"{cfg.n_decoder_layers or cfg.n_layers} (causal self-attention + "
                                     "cross-attention to the encoder)")]
        attention = f"{cfg.attention_kind}; encoder-decoder"
    else:
        layers = [("Layers", str(cfg.n_layers))]
    return [
        ("Family", FAMILY_NAMES.get(cfg.family, cfg.family)),
        *layers,
        ("Heads", f"{cfg.n_heads} (head width {cfg.d_head})"),
        ("KV heads", kv_text),
        ("d_model", str(cfg.d_model)),
        ("d_ff", str(cfg.d_ff)),
        ("Vocabulary", f"{cfg.vocab_size:,} classes (reads images)" if images else
         f"{cfg.vocab_size:,}" + ("" if loaded.tokenizer is not None else " (no tokenizer: type ids)")),
        ("Context length", f"{cfg.context_length:,}" + (f" ([CLS] + {cfg.context_length - 1} patches of {cfg.patch_size} x "
                                                          f"{cfg.patch_size} px, {cfg.image_size} x {cfg.image_size} "
                                                          "images)" if images else "")),
        ("Parameters", format_count(loaded.model.num_parameters())),
        ("Attention", attention),
        ("Positions / norm", f"{cfg.positions} / {cfg.norm} ({cfg.norm_placement})"),
        ("dtype", str(loaded.model.dtype).replace("torch.", "")),
        ("Device", str(loaded.model.device) if loaded.model is not None else device),
        ("Path", str(loaded.path) if loaded.path is not None else "(in memory)"),
        *gguf_rows(loaded.gguf),
    ]


def gguf_rows(summary) -> list[tuple[str, str]]:
    """A GGUF file's rows: its type per tensor kind (dequantized into the dtype above) and chat template."""
    if summary is None:
        return []
    kind = f"GGUF {summary.file_type}" if summary.file_type else "GGUF"
    rows = [("File", f"{kind}" + (", dequantized to the dtype above" if summary.dequantized else "")),
            ("Tensor types", "\n".join(summary.quantization_lines()))]
    if summary.chat_template:
        lines = summary.chat_template.strip().splitlines()
        rows.append(("Chat template", "\n".join(lines[:6]) + (f"\n… ({len(lines)} lines)" if len(lines) > 6 else "")))
    return rows


def token_probabilities(logits, ids: list[int]) -> list[float]:
    """p(token_t | tokens before it) from a causal model's logits [T, vocab]; NaN for the first token."""
    import torch

    if len(ids) < 2:
        return [float("nan")] * len(ids)
    # a few rows at a time: the whole [T, vocab] in float32 twice (the copy and its log-softmax) was the
    # first look's peak at the Qwen2.5-0.5B shape (1,024 x 151,936: 1.2 GB held for a moment); row-wise, the
    # same values
    rows = max(1, (32 << 20) // (4 * logits.shape[-1]))
    targets = torch.tensor(ids[1:], device=logits.device)[:, None]
    picked = [torch.log_softmax(logits[start:start + rows].float(), dim=-1).gather(1, targets[start:start + rows])[:, 0]
              for start in range(0, len(ids) - 1, rows)]
    return [float("nan")] + torch.cat(picked).exp().tolist()


class TokensView:
    """What the Model panel's export bar saves: the chips (PNG/SVG) and the per-token table (CSV). An
    encoder-decoder's: the source's chips, and its table of both sequences (the decoder's input with the
    probability of each target token)."""

    def __init__(self, panel: "ModelPanel") -> None:
        self.panel = panel
        self.drawn = panel.tokens_drawn  # (the export bar checks again on it)

    def export_unavailable(self) -> str | None:
        return None if self.panel.state.token_ids else "No tokens to export: open a model and type a text"

    def export_widget(self):
        return self.panel.token_strip.canvas

    def _sequences(self):
        """(name, ids, probabilities) of each sequence shown."""
        state = self.panel.state
        ids = state.token_ids
        if not state.is_seq2seq():
            return [("text", ids, self.panel.probabilities or [float("nan")] * len(ids))]
        dec = state.decoder_ids
        return [("source", ids, [float("nan")] * len(ids)),
                ("decoder input", dec, self.panel.target_probabilities or [float("nan")] * len(dec))]

    def csv_table(self):
        rows = []
        seqs = self._sequences()
        for name, ids, probs in seqs:
            strings = self.panel.state.token_strings(ids)
            rows += [([name] if len(seqs) > 1 else []) + [i, t, s, "" if math.isnan(p) else f"{p:.6g}"]
                     for i, (t, s, p) in enumerate(zip(ids, strings, probs))]
        head = ["position", "id", "token", "p(token | tokens before)"]
        return (["sequence"] + head if len(seqs) > 1 else head), rows

    def export_arrays(self):
        import numpy as np

        out = {}
        seqs = self._sequences()
        for name, ids, probs in seqs:
            pre = "" if len(seqs) == 1 else name.split()[0] + "_"
            out.update({f"{pre}ids": np.array(ids, dtype=np.int64),
                        f"{pre}tokens": np.array(self.panel.state.token_strings(ids)),
                        f"{pre}probability": np.array(probs, dtype=np.float64)})
        return out


def perplexity(probs: list[float]) -> float | None:
    logs = [math.log(p) for p in probs if not math.isnan(p) and p > 0]
    return math.exp(-sum(logs) / len(logs)) if logs else None


def perplexity_text(ppl: float) -> str:
    """47.3, or 4.7e+16 for a huge one (a random model's), never 47006289042225504.0."""
    return f"{ppl:.1f}" if ppl < 1e5 else f"{ppl:.2g}"


class ModelPanel(QWidget):
    tokens_drawn = Signal()  # the chips (or their colours) changed: what the export bar saves
    title = "Model"
    help_text = (
        "<p><b>Architecture</b>: the open model's configuration. A transformer maps token ids "
        "t<sub>1..T</sub> to vectors x<sub>i</sub> = E[t<sub>i</sub>] (+ position), then applies "
        "<i>Layers</i> blocks, each x &larr; x + Attn(Norm(x)); x &larr; x + MLP(Norm(x)) (pre-LN; "
        "BERT normalises after each sum). <i>Heads</i> split d_model into parallel attention heads of width "
        "d_model / heads; <i>KV heads</i> &lt; heads means grouped-query attention (heads share keys and "
        "values). <i>d_ff</i> is the MLP's hidden width; <i>parameters</i> counts tied weights once.</p>"
        "<p><b>Tokens</b>: the text box is split by the model's tokenizer; each chip is one token with its "
        "id below (spaces show as &middot;, newlines as &crarr;). A model folder without tokenizer.json "
        "takes token ids typed as numbers. Every other panel looks at these tokens.</p>"
        "<p><b>Special tokens</b>: as <i>transformers</i> does, and as the model was trained, the tokenizer's "
        "own special tokens are added around the text (its post-processor: [CLS] &hellip; [SEP] for BERT, "
        "&lt;s&gt; &hellip; &lt;/s&gt; for RoBERTa, a BOS token for LLaMA; none for GPT-2); the line under "
        "the text says which. Untick <i>Add the tokenizer's special tokens</i> to trace the text bare.</p>"
        "<p><b>Colour</b> (decoders): the probability the model gave each token after the ones before it, "
        "p(t<sub>i</sub> | t<sub>&lt;i</sub>) = softmax(logits<sub>i-1</sub>)[t<sub>i</sub>] (dark = likely; the "
        "first token has no prediction, grey). Perplexity = exp(&minus;mean log p).</p>"
        "<p><b>Encoder-decoders</b> (T5, BART, Marian): the text is the <i>source</i>, which the encoder reads; "
        "the <i>Target</i> box is what the decoder reads after its start token, [start] + the target's tokens "
        "(Marian's target side has its own tokenizer), and each target chip is coloured by "
        "p(y<sub>i</sub> | y<sub>&lt;i</sub>, source). An empty target: the decoder reads its start token alone.</p>")

    def __init__(self, state: AppState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self._summary_labels: dict[str, QLabel] = {}
        self.probabilities: list[float] | None = None
        self._trace_unseen = False  # a trace arrived while another tab was on show: coloured when shown
        self._colouring = None  # the worker computing the chips' probabilities (token_probabilities)
        self._count_text = ""  # the token count's line, before the colours' line

        self.summary_box = QGroupBox("Architecture")
        self.summary_form = QFormLayout(self.summary_box)
        self.summary_form.setLabelAlignment(Qt.AlignmentFlag.AlignRight)
        self.empty_label = QLabel("No model open. Use File > Open Model Folder… (Ctrl+O) or drop a folder or a "
                                  ".gguf file here.")
        self.empty_label.setWordWrap(True)
        self.summary_form.addRow(self.empty_label)

        self.text_edit = QPlainTextEdit()
        self.text_edit.setPlaceholderText("Type text here; its tokens appear below.")
        self.text_edit.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self._debounce = QTimer(self, singleShot=True, interval=TYPING_DEBOUNCE_MS)
        self._debounce.timeout.connect(self._send_text)
        self.text_edit.textChanged.connect(self._debounce.start)

        self.special_check = QCheckBox("Add the tokenizer's special tokens")
        self.special_check.setToolTip("Put the tokenizer's own special tokens ([CLS] … [SEP], <s> … </s>, BOS) "
                                      "around the text, as transformers does and as the model was trained; "
                                      "untick to trace the text bare. Applies to every panel and is remembered.")
        self.special_check.setChecked(state.special_tokens)
        self.special_check.toggled.connect(self._special_tokens_toggled)
        self.special_label = QLabel("")
        self.special_label.setWordWrap(True)
        self.special_label.setTextFormat(Qt.TextFormat.PlainText)  # <s> (BART, RoBERTa, Llama) is a tag to rich text
        self.special_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.token_strip = TokenStrip()
        self.token_strip.token_selected.connect(self._show_token)
        # An encoder-decoder's target: its box and its chips (the decoder's input), hidden for other models.
        self.target_probabilities: list[float] | None = None
        self.target_label = QLabel("Target (what the decoder reads after its start token):")
        self.target_edit = QPlainTextEdit()
        self.target_edit.setPlaceholderText("Type the target here (e.g. a translation); empty: the start token alone.")
        self.target_edit.setMaximumHeight(70)
        self._target_debounce = QTimer(self, singleShot=True, interval=TYPING_DEBOUNCE_MS)
        self._target_debounce.timeout.connect(self._send_target)
        self.target_edit.textChanged.connect(self._target_debounce.start)
        self.target_strip = TokenStrip()
        self.target_strip.token_selected.connect(self._show_target_token)
        self.target_count = QLabel("")
        self.target_count.setWordWrap(True)
        self.source_title = QLabel("Source tokens (the encoder's input):")
        self.count_label = QLabel("0 tokens")
        self.token_info = QLabel("")
        for label in (self.count_label, self.token_info):  # long lines wrap: the window stays narrow
            label.setWordWrap(True)
        self.message_label = QLabel("")
        self.message_label.setStyleSheet("color: #b00020")
        self.message_label.setWordWrap(True)
        # Shown while the chips are a generation step's tokens, not the text box's (show_trace).
        self.source_label = QLabel("")
        self.source_label.setWordWrap(True)
        self.back_button = QPushButton("Back to the text")
        self.back_button.setToolTip("Show the tokens of the text above again")
        self.back_button.clicked.connect(lambda _checked=False: self.state.back_to_text())
        source_row = QHBoxLayout()
        source_row.addWidget(self.source_label, 1)
        source_row.addWidget(self.back_button)
        self.source_label.setVisible(False)
        self.back_button.setVisible(False)
        # A mixture of experts' routing under the chips: each token's chosen experts at the chosen layer, the chip
        # coloured by the first expert's weight (hidden for dense models)
        self.routing_label = QLabel("Experts chosen at layer")
        self.routing_layer = QSpinBox()
        self.routing_layer.setToolTip("The block whose router's choices the strip below shows")
        self.routing_layer.valueChanged.connect(lambda _v: self._show_routing())
        self.routing_strip = TokenStrip(show_ids=False)
        self.routing_strip.token_selected.connect(self._show_routing_token)
        self.routing_strip.setToolTip("Each token's chosen experts (E3,E5: its top-k), coloured by the first one's "
                                      "weight; click one for the weights")
        routing_row = QHBoxLayout()
        routing_row.addWidget(self.routing_label)
        routing_row.addWidget(self.routing_layer)
        routing_row.addStretch(1)
        self.routing_widgets = (self.routing_label, self.routing_layer, self.routing_strip)
        self.tokens_view = TokensView(self)
        self.export_bar = ExportBar(lambda: self.tokens_view, lambda: "tokens")

        tokens_box = QGroupBox("Text and tokens")
        tv = QVBoxLayout(tokens_box)
        tv.addWidget(self.text_edit, 1)
        row = QHBoxLayout()
        # the two lines share the row's width, the count's the longer (a stretch between them left it ~200 px:
        # two lines at 1280 x 800)
        row.addWidget(self.count_label, 2)
        row.addWidget(self.token_info, 1)
        self.token_info.setVisible(False)  # (until a token is clicked the count has the row: one line at 1024 px)
        row.addWidget(self.export_bar)
        tv.addLayout(row)
        special_row = QHBoxLayout()
        special_row.addWidget(self.special_check)
        special_row.addWidget(self.special_label, 1)
        tv.addLayout(special_row)
        tv.addLayout(source_row)
        tv.addWidget(self.source_title)
        tv.addWidget(self.token_strip, 4)
        tv.addLayout(routing_row)
        tv.addWidget(self.routing_strip, 2)
        self.target_widgets = (self.source_title, self.target_label, self.target_edit, self.target_count,
                               self.target_strip)
        for w in self.target_widgets[1:]:
            tv.addWidget(w, 3 if w is self.target_strip else 0)
        tv.addWidget(self.message_label)
        self._show_target_box(False)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(self.summary_box)
        splitter.addWidget(tokens_box)
        splitter.setStretchFactor(0, 0)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([380, 900])
        layout = QVBoxLayout(self)
        layout.addWidget(splitter)

        state.model_changed.connect(self._on_model)
        state.device_changed.connect(lambda _d: self._on_model(self.state.loaded))
        state.text_changed.connect(self._on_state_text)
        state.target_changed.connect(self._on_state_target)
        state.tokens_changed.connect(self._on_tokens)
        state.trace_changed.connect(self._on_trace)
        state.error.connect(self._on_error)
        # Built after the model may already be loaded (panels are created lazily): render the state now.
        self._show_routing()  # (hidden until a mixture of experts is open)
        self._on_state_text(state.text)
        self._on_state_target(state.target)
        if state.loaded is not None:
            self._on_model(state.loaded)
            self._on_tokens(state.token_ids)
            self._on_trace(state.trace)

    # -- state -> view ---------------------------------------------------------------------
    def _on_model(self, loaded) -> None:
        while self.summary_form.rowCount():
            self.summary_form.removeRow(0)
        self._summary_labels.clear()
        if loaded is None:
            self.empty_label = QLabel("No model open.")
            self.summary_form.addRow(self.empty_label)
            return
        self.summary_box.setTitle(f"Architecture — {loaded.name}")
        for label, value in architecture_rows(loaded, self.state.device):
            v = QLabel(value)
            v.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            v.setWordWrap(label in ("Path", "Chat template"))
            self._summary_labels[label] = v
            self.summary_form.addRow(label, v)
        placeholder = ("Type text here; its tokens appear below." if loaded.tokenizer is not None
                       else f"This model takes token ids ({loaded.tokenizer_missing}): type them, e.g. 1 2 3")
        images = loaded.config.input_kind == "patches"
        if images:
            placeholder = IMAGE_MODEL_TEXT
        self.text_edit.setPlaceholderText(placeholder)
        self.text_edit.setReadOnly(images)  # a ViT never reads the text box (AppState traces its image)
        self.text_edit.setToolTip(IMAGE_MODEL_TEXT if images else "")
        self.special_check.setEnabled(loaded.tokenizer is not None)
        self.special_check.setVisible(not images)
        self.special_label.setVisible(not images)
        self._show_target_box(loaded.config.is_encoder_decoder)
        self.routing_layer.setRange(0, loaded.config.n_layers - 1)
        self._show_routing()
        self._on_state_text(self.state.text)  # empty for a ViT (its placeholder says where images go)

    def _on_state_text(self, text: str) -> None:
        if self._reads_images():
            text = ""  # the state keeps the text for the next text model; it is not this model's input
        if text != self.text_edit.toPlainText():
            self.text_edit.blockSignals(True)
            self.text_edit.setPlainText(text)
            self.text_edit.blockSignals(False)

    def _on_tokens(self, ids: list) -> None:
        self.message_label.setText(self.state.trace_problem and
                                   f"No text traced for this model: {self.state.trace_problem}")
        if self._reads_images():
            self.message_label.setText(self.state.trace_problem and
                                       f"No image traced for this model: {self.state.trace_problem}")
        generated = self.state.trace_source == "generation"
        self.source_label.setText("These tokens are a generation step's (from the Generate panel), not the "
                                  "text above." if generated else "")
        self.source_label.setVisible(generated)
        self.back_button.setVisible(generated)
        strings = self.state.token_strings(ids)
        self.token_strip.set_tokens(strings, ids)
        n = len(ids)
        limit = self.state.loaded.config.context_length if self.state.loaded is not None else None
        text = f"{n} token{'s' if n != 1 else ''}"
        if self._reads_images():
            text = (f"[CLS] + {n - 1} patches of {self.state.image_source or 'the image'}" if n else
                    "No image yet: give one in the Image panel.")
        elif limit is not None and n >= limit:
            text += f" (the context length, {limit}: longer text is cut)"
        self.count_label.setText(text)
        self._count_text = text  # the colours' line is added to it (_on_trace)
        self.special_label.setText(self._specials_line())
        if self.special_check.isChecked() != self.state.special_tokens:  # set elsewhere (the saved choice at start)
            self.special_check.blockSignals(True)
            self.special_check.setChecked(self.state.special_tokens)
            self.special_check.blockSignals(False)
        self._show_token_info("")
        self.probabilities = None
        self.target_probabilities = None
        dec = self.state.decoder_ids
        self.target_strip.set_tokens(self.state.token_strings(dec), dec)
        # a target longer than the decoder's context is cut to it: its notice says so, as the source's count does
        target = getattr(self.state.encoded, "target", None) if not generated else None
        cut = f" ({target.notice})" if getattr(target, "notice", "") else ""
        self.target_count.setText(f"decoder input: the start token + {plural(len(dec) - 1, 'target token')}{cut}"
                                  if dec else "")
        self.tokens_drawn.emit()

    def _show_token_info(self, text: str) -> None:
        """A clicked token's line beside the count: shown only while it says something (empty, it took a third of
        the row and the count wrapped onto a second line at 1024 px)."""
        self.token_info.setText(text)
        self.token_info.setVisible(bool(text))

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._trace_unseen:
            self._on_trace(self.state.trace)

    def _on_trace(self, trace) -> None:
        """Colour the chips by how likely the model found each token (causal models with logits); an
        encoder-decoder's target chips by how likely it found each target token. While another panel's tab
        is on show, when this one is next shown: the first look at 1,024 tokens in the Attention panel
        waited ~1 s for colours of a tab nobody saw (log-softmax over 1,024 x 151,936 logits)."""
        self._trace_unseen = not _on_show_in_its_window(self)
        if self._trace_unseen:
            return
        loaded, ids = self.state.loaded, self.state.token_ids
        self._show_routing()
        if trace is not None and loaded is not None and loaded.config.is_encoder_decoder:
            self._colour_target(trace)
            return
        if trace is None or loaded is None or not loaded.config.causal or "logits" not in trace:
            return
        logits = trace["logits"][0]
        if logits.shape[0] != len(ids):
            return
        # in a worker: at 1,024 tokens of the Qwen2.5-0.5B shape the log-softmax over every position's logits held
        # the UI thread ~1.1 s at the Model tab's click (bench ui); the chips show uncoloured meanwhile
        if self._colouring is not None:
            self._colouring.detach()  # another trace's colours: never shown
        ids = list(ids)
        if self.probabilities is not None:  # the colours of the trace before (a what-if edit, the same tokens)
            self.probabilities = None
            self.token_strip.set_tokens(self.state.token_strings(ids), ids)
            self.count_label.setText(self._count_text)

        def coloured(probabilities: list[float]) -> None:
            if self.state.trace is not trace or self.state.token_ids != ids:
                return  # the chips on show are another text's or another trace's now
            self._colouring = None
            self.probabilities = probabilities
            self.token_strip.set_tokens(self.state.token_strings(ids), ids, probabilities, vmin=0.0, vmax=1.0)
            self.tokens_drawn.emit()
            ppl = perplexity(probabilities)
            if ppl is not None:
                self.count_label.setText(f"{self._count_text} · colour: p(token | tokens before) · "
                                         f"perplexity {perplexity_text(ppl)}")

        self._colouring = run_job(token_probabilities, logits, ids, on_result=coloured, owner=self,
                                  on_error=lambda exc, _tb: self.message_label.setText(f"Token colours failed: {exc}"))

    def _routing(self):
        """The chosen experts [T, k] and their weights [T, k] at the chosen layer, or None (no router recorded,
        or a trace of other tokens than the chips')."""
        trace, layer = self.state.trace, self.routing_layer.value()
        name = f"blocks.{layer}.mlp.experts"
        if trace is None or name not in trace or trace[name].shape[1] != len(self.state.token_ids):
            return None
        return trace[name][0].tolist(), trace[f"blocks.{layer}.mlp.expert_weights"][0].float().tolist()

    def _show_routing(self) -> None:
        loaded = self.state.loaded
        shown = loaded is not None and bool(getattr(loaded.config, "num_experts", 0))
        for w in self.routing_widgets:
            w.setVisible(shown)
        routing = self._routing() if shown else None
        if routing is None:
            self.routing_strip.set_tokens([], [])
            return
        ids, weights = routing
        strings = self.state.token_strings(self.state.token_ids)
        self.routing_strip.set_tokens([f"{s}\u2192" + ",".join(f"E{e}" for e in chosen) for s, chosen in zip(strings, ids)],
                                      self.state.token_ids, [w[0] for w in weights], vmin=0.0, vmax=1.0)

    def _show_routing_token(self, index: int) -> None:
        routing = self._routing()
        if routing is not None and 0 <= index < len(routing[0]):
            ids, weights = routing
            chosen = ", ".join(f"E{e} ({format_prob(w)})" for e, w in zip(ids[index], weights[index]))
            self._show_token_info(f"token #{index} at layer {self.routing_layer.value()}: experts {chosen}")

    def _colour_target(self, trace) -> None:
        """The decoder's input chips coloured by p(target token i | the ones before it, the source): logits
        row i predicts target token i (app.tracing's convention), so the start token has no colour."""
        dec = self.state.decoder_ids
        if "logits" not in trace or trace["logits"].shape[1] != len(dec):
            return
        self.target_probabilities = token_probabilities(trace["logits"][0], dec)
        self.target_strip.set_tokens(self.state.token_strings(dec), dec, self.target_probabilities, vmin=0.0, vmax=1.0)
        ppl = perplexity(self.target_probabilities)
        if ppl is not None:
            self.target_count.setText(f"{self.target_count.text()} · colour: p(target token | tokens before, source) · "
                                      f"perplexity {perplexity_text(ppl)}")

    def _show_target_box(self, shown: bool) -> None:
        for w in self.target_widgets:
            w.setVisible(shown)

    def _on_state_target(self, text: str) -> None:
        if text != self.target_edit.toPlainText():
            self.target_edit.blockSignals(True)
            self.target_edit.setPlainText(text)
            self.target_edit.blockSignals(False)

    def _send_target(self) -> None:
        self.state.set_target(self.target_edit.toPlainText())

    def _show_target_token(self, index: int) -> None:
        dec = self.state.decoder_ids
        if 0 <= index < len(dec):
            text = f"decoder position {index}: id {dec[index]}, {self.state.token_strings([dec[index]])[0]!r}"
            probs = self.target_probabilities
            if probs is not None and 0 < index < len(probs):
                text += f", p = {format_prob(probs[index])}"
            self._show_token_info(text)

    def _specials_line(self) -> str:
        """Which special tokens the tokenizer added to the text shown, and what added them."""
        state, loaded = self.state, self.state.loaded
        if loaded is None or loaded.tokenizer is None or state.trace_source != "text" or state.encoded is None:
            return ""
        if not state.special_tokens:
            return "Special tokens: off (the text as typed)"
        enc = state.encoded
        if not enc.specials:
            return "Special tokens added: none (this tokenizer adds none)"
        return f"Special tokens added: {enc.specials_text()} — {enc.specials_source}"

    def _reads_images(self) -> bool:
        return self.state.loaded is not None and self.state.loaded.config.input_kind == "patches"

    def _on_error(self, message: str) -> None:
        if message != self.state.trace_problem:  # that one _on_tokens already said, with what it means
            self.message_label.setText(message)

    def _show_token(self, index: int) -> None:
        ids = self.state.token_ids
        if 0 <= index < len(ids):
            s = self.state.token_strings([ids[index]])[0]
            text = f"token #{index}: id {ids[index]}, {s!r}"
            if self.probabilities is not None and index < len(self.probabilities) and index > 0:
                text += f", p = {format_prob(self.probabilities[index])}"
            self._show_token_info(text)

    # -- view -> state ---------------------------------------------------------------------
    def _special_tokens_toggled(self, on: bool) -> None:
        from ..settings import set_special_tokens_on

        set_special_tokens_on(on)  # remembered: applied at the next start (MainWindow.apply_preferences)
        self.state.set_special_tokens(on)

    def _send_text(self) -> None:
        text = self.text_edit.toPlainText()
        if text != self.state.text:
            self.state.set_text(text)

    def summary_value(self, label: str) -> str:
        """The text shown for one summary row (tests, screenshots)."""
        return self._summary_labels[label].text()


def _on_show_in_its_window(widget) -> bool:
    """Whether `widget` shows when its top-level window does: no widget between them is hidden (a tab
    widget hides the pages not on show). Asked of the widget's own ancestors, not of the main window."""
    while widget is not None and not widget.isWindow():
        if widget.isHidden():
            return False
        widget = widget.parentWidget()
    return True

