"""The Generate panel's two views: decoder stepping and encoder mask filling.

Both work on the panel's shared widgets (prompt, buttons, sliders, bars, tree, tables, token strip,
status line) and its one session; the panel (generation.GenerationPanel) shows the view that fits the
open model: DecoderStepView for a causal model (an encoder-decoder's target too, with the step's
cross-attention in a CrossAttentionStepView), EncoderFillView for an encoder. What is the same in
both (jobs, settings, the distribution bars, the export protocol) stays in the panel.
"""
from __future__ import annotations

import math

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QComboBox, QLabel, QTableWidgetItem, QTreeWidgetItem, QVBoxLayout, QWidget

from ...core.generation import GenerationError, GenerationSession, MaskedFillSession, process_logits
from ...core.views.generation import branch_rows, common_prefix_length
from ...app.generation import mask_positions
from ...app.tracing import tokenize_and_trace
from ..widgets.heatmap import Heatmap
from ..widgets.made_when_shown import MadeWhenShown
from ..widgets.readable import format_prob


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# -- worker functions (run off the UI thread) ------------------------------------------------


def _start_decoder(loaded, ids, settings, seed, interventions=None):
    return GenerationSession(loaded, ids, settings, seed=seed, interventions=interventions or None)


def _start_encoder(loaded, ids, masked, mask_id, settings, order, seed, interventions=None):
    s = MaskedFillSession(loaded, ids, masked, mask_id, settings, order, seed, interventions=interventions or None)
    s.all_logits()  # the view reads cached logits only
    return s


def _mutate(session, action: str, *args):
    """One session change; for encoders also the logits of the new sequence."""
    result = getattr(session, action)(*args)
    if isinstance(session, MaskedFillSession):
        session.all_logits()
    return result


def _lens(session, node):
    return node, session.logit_lens(node)


def _inspect(session, node):
    """Logit lens of the step that picked `node` and the Trace of the path up to that step."""
    lens = session.logit_lens(node)
    trace, ids = session.step_trace(node.parent)
    return node, lens, trace, ids


MEAN_OF_LAYERS = "all layers (mean)"


class CrossAttentionStepView(QWidget):
    """An encoder-decoder's cross-attention at one step: which source tokens the decoder reads while it
    predicts the next target token. Rows: each head of the chosen decoder layer, then their mean;
    columns: the source tokens; each row sums to 1.

        view.set_step(rows [L, H, S], source_labels, caption)   # GenerationSession.cross_attention
        view.clear(message)
        view.matrix()   # what is on show [H + 1, S]
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        v = QVBoxLayout(self)
        v.setContentsMargins(0, 0, 0, 0)
        self.caption = QLabel("")
        self.caption.setWordWrap(True)
        self.caption.setTextFormat(Qt.TextFormat.PlainText)  # it quotes the token written: <s> is a tag to rich text
        v.addWidget(self.caption)
        self.layer = QComboBox()
        self.layer.setToolTip("The decoder layer whose cross-attention is shown (or the mean over layers)")
        self.layer.currentIndexChanged.connect(lambda _: self._draw())
        v.addWidget(self.layer)
        # (a pyqtgraph plot: made when first shown or drawn, as this view is shown for encoder-decoders only)
        self._heatmap = MadeWhenShown(lambda: Heatmap(row_name="head", col_name="source", value_name="attention",
                                                      annotate_max_cells=120, row_tokens=False))
        self._heatmap.setMinimumWidth(220)
        v.addWidget(self._heatmap, 1)
        self.rows = np.zeros((0, 0, 0), dtype=np.float32)
        self.source_labels: list[str] = []

    def clear(self, message: str) -> None:
        self.rows = np.zeros((0, 0, 0), dtype=np.float32)
        self.source_labels = []
        self.caption.setText(message)
        if self._heatmap.made:  # (one not made yet shows nothing)
            self.heatmap.clear_matrix("")

    heatmap = property(lambda self: self._heatmap.widget())  # (made now if not yet)

    def set_step(self, rows, source_labels: list[str], caption: str) -> None:
        rows = np.asarray(rows, dtype=np.float32)
        self.rows, self.source_labels = rows, list(source_labels)
        layers = [f"decoder layer {l}" for l in range(rows.shape[0])] + [MEAN_OF_LAYERS]
        if [self.layer.itemText(i) for i in range(self.layer.count())] != layers:
            self.layer.blockSignals(True)
            self.layer.clear()
            self.layer.addItems(layers)
            self.layer.setCurrentIndex(rows.shape[0] - 1)  # the last layer, nearest the prediction
            self.layer.blockSignals(False)
        self.caption.setText(caption)
        self._draw()

    def matrix(self) -> np.ndarray:
        """[H + 1, S]: the chosen layer's heads (or each head's mean over layers), then the heads' mean."""
        if not self.rows.size:
            return np.zeros((0, 0), dtype=np.float32)
        i = self.layer.currentIndex()
        heads = self.rows.mean(0) if i < 0 or i >= self.rows.shape[0] else self.rows[i]
        return np.concatenate([heads, heads.mean(0, keepdims=True)])

    def _draw(self) -> None:
        if not self.rows.size:
            return
        m = self.matrix()
        labels = [f"head {h}" for h in range(m.shape[0] - 1)] + ["mean"]
        self.heatmap.set_matrix(m, labels, self.source_labels, levels=(0.0, 1.0),
                                title=f"Cross-attention, {self.layer.currentText()}")


class GenerationView:
    """What one kind of model does with the panel's widgets; `panel` holds them and the session."""

    encoder = False
    EMPTY_BARS = "Step \u2192 (Right arrow) or Run N: the next token's candidates show here"

    def __init__(self, panel) -> None:
        self.panel = panel

    def show(self, loaded) -> None:
        """Show the controls this kind of model uses and the prompt box's hint."""

    def ready_message(self) -> str:
        return ""

    def start(self, loaded, ids: list[int], then) -> None:
        """Submit the job that starts a session from the prompt's ids."""
        raise NotImplementedError

    def before_back(self) -> None:
        """Note what Back leaves (the decoder highlights the branch it came from)."""

    def choose(self, token_id: int) -> None:
        raise NotImplementedError

    def strip_selected(self, index: int) -> None:
        raise NotImplementedError

    def tree_clicked(self, node) -> None:
        """Go to a branch of the tree (the decoder's tree items carry their node)."""

    def refresh(self, session) -> None:
        raise NotImplementedError

    def describe(self, session) -> str:
        raise NotImplementedError

    def export_name(self, session) -> str:
        return "generate"

    def step_rows(self, session) -> list[list]:
        """The CSV rows of the steps taken so far."""
        return []

    def export_arrays(self, session) -> dict:
        return {}


class DecoderStepView(GenerationView):
    """Causal models: step, go back, force a token (a branch), the branches as a tree, beams, and the
    logit lens of a selected step."""

    def show(self, loaded) -> None:
        p = self.panel
        seq2seq = p.state.is_seq2seq()
        p.order.setVisible(False)
        p.mask_button.setVisible(False)
        for w in (p.beams, p.length_penalty, p.early_stopping):
            w.setVisible(True)
        p.prompt_label.setVisible(seq2seq)
        p.cross_view.setVisible(seq2seq)
        p.cross_view.clear("")
        what = "source" if seq2seq else "prompt"
        p.prompt.setPlaceholderText(f"{what}: token ids separated by spaces (this model has no tokenizer)"
                                    if loaded.tokenizer is None else
                                    "source text: the decoder writes its target" if seq2seq else "prompt")

    def ready_message(self) -> str:
        return "press Step (Right arrow) to generate."

    def start(self, loaded, ids, then) -> None:
        p = self.panel
        p._submit(_start_decoder, loaded, ids, p.settings(), p.seed.value(), list(p.state.interventions),
                  on_result=lambda s: p._session_ready(s, then), on_dropped=lambda: p.start(then))

    def before_back(self) -> None:
        p = self.panel
        # repeated Backs keep the deepest node left, so the bars highlight the branch we came from
        left = p.session.current
        if p._trail is None or left not in p._trail.path():
            p._trail = left

    def choose(self, token_id: int) -> None:
        """Force a token after the node whose distribution is shown (a branch if it differs)."""
        p = self.panel
        s = p.session
        base = p.selected_node.parent if p.selected_node is not None else s.current
        if base is not s.current:
            s.goto(base)  # pure navigation, no model work
        p.selected_node = None
        p._submit(_mutate, s, "choose", int(token_id), on_result=p._changed)

    def strip_selected(self, index: int) -> None:
        p = self.panel
        s = p.session
        n_prompt = len(s.prompt)
        path = s.current.path()
        if index < n_prompt:
            p.selected_node = None
            p.refresh()
            if s.record and not p.busy:  # its per-head outputs are products: in a worker
                p._submit(s.step_trace, s.root, on_result=lambda result: self._hand_on(*result))
            return
        p.selected_node = path[index - n_prompt + 1]
        if not p.busy:
            p._clear_lens()
            p._lens_node = p.selected_node  # _inspect brings this step's lens (and its trace)
            p.refresh()
            p._submit(_inspect, s, p.selected_node, on_result=self._inspected)
        else:
            p.refresh()

    def _inspected(self, result) -> None:
        p = self.panel
        node, lens, trace, ids = result
        p._lens_node = node
        self._show_lens(node, lens)
        p.tabs.setCurrentWidget(p.lens_table)
        beside = "; its cross-attention is beside the bars" if p.session.source is not None else ""
        p.status.setText(f"Step {node.depth}: picked {p._token_label(node.token)} with p = "
                         f"{format_prob(node.model_prob)}{beside}; its attention is in the Attention panel.")
        self._hand_on(trace, ids)

    def _hand_on(self, trace, ids) -> None:
        """A step's trace to the inspecting panels: an encoder-decoder's with its source as the input's
        tokens and `ids` ([start] + the target so far) as what its decoder read."""
        p = self.panel
        s = p.session
        if s.source is not None:
            p.state.show_trace(trace, s.source, decoder_ids=ids)
        else:
            p.state.show_trace(trace, ids)

    def _show_lens(self, node, lens) -> None:
        p = self.panel
        p.lens_rows = lens
        p.lens_table.setRowCount(len(lens))
        for i, r in enumerate(lens):
            cells = ["embed" if r.layer < 0 else f"block {r.layer}", p._token_label(r.top_token),
                     format_prob(r.top_prob), format_prob(r.chosen_prob)]
            for j, c in enumerate(cells):
                item = QTableWidgetItem(c)
                item.setToolTip(c)  # (a long token is cut with "…")
                p.lens_table.setItem(i, j, item)
        p.tabs.setTabText(p.tabs.indexOf(p.lens_table), f"Logit lens (step {node.depth})")

    def _follow_lens(self, s: GenerationSession) -> None:
        """The lens table shows the selected step, else the current one: never a step left behind."""
        p = self.panel
        node = p.selected_node if p.selected_node is not None else s.current
        if node is p._lens_node:
            return
        p._clear_lens()
        p._lens_node = None
        if node.parent is None or not s.record or p._running:
            return  # at the prompt there is no step; a run refreshes again when it ends
        p._lens_node = node

        def shown(result) -> None:
            lens_node, lens = result
            if lens_node is p._lens_node and p.session is s:
                self._show_lens(lens_node, lens)

        # Not a session job (no busy flag, actions stay available): it only reads the node's recorded
        # residuals, which never change, and the model's unembedding (AppState.run: dropped for another
        # model or other edits, which replace the session).
        # A failed lens leaves the table empty: the step itself stands and its status line says so.
        p.state.run(_lens, s, node, on_result=shown, on_error=lambda *_: None, owner=p, parts=p.result_parts)

    def tree_clicked(self, node) -> None:
        p = self.panel
        p.selected_node = None
        p.session.goto(node)  # pure navigation; the cache is rebuilt lazily on the next step
        p.refresh()

    def refresh(self, s: GenerationSession) -> None:
        self._refresh(s)
        self._follow_lens(s)

    def _refresh(self, s: GenerationSession) -> None:
        p = self.panel
        ids = s.ids()
        path = s.current.path()
        values = [None] * len(s.prompt) + [n.model_prob for n in path[1:]]
        p.strip.set_tokens(p._strings(ids), ids, values, vmin=0.0, vmax=1.0)
        sel = p.selected_node
        if sel is not None and sel in path:
            p.strip.set_selected(len(s.prompt) + path.index(sel) - 1)
            base, chosen = sel.parent, sel.token
        else:
            p.selected_node = None
            p.strip.set_selected(None)
            base = s.current
            chosen = self._forward_child(base)
        try:
            dist = process_logits(base.next_logits, *p._processing())
        except GenerationError as exc:
            p.dist_label.setText(str(exc))
            return
        p._show_distribution(dist, chosen, base.depth + 1, base is s.current and s.current.stop,
                             context_ids=s.ids(base), source=s.source)
        self._refresh_cross(s, base, chosen)
        self._refresh_tree(s)
        self._refresh_beams(s)

    def _refresh_cross(self, s: GenerationSession, base, chosen) -> None:
        """An encoder-decoder's cross-attention of the step on show: the forward of `base`'s token, the one
        that gave the distribution in the bars, over the session's own source."""
        p = self.panel
        if s.source is None or not s.record:
            return
        writing = f" {p._token_label(chosen)}" if chosen is not None else " the next token"
        p.cross_view.set_step(s.cross_attention(base).numpy(), p.state.token_strings(s.source),
                              f"Step {base.depth + 1}: the source tokens the decoder reads while writing{writing}")

    def _forward_child(self, base):
        """Token to highlight after `base`: the one on the branch Back left, else the newest child."""
        trail = self.panel._trail
        if trail is not None:
            path = trail.path()
            if base in path[:-1]:
                return path[path.index(base) + 1].token
        return base.children[-1].token if base.children else None

    def _refresh_tree(self, s: GenerationSession) -> None:
        """The branches as rows (core.views.generation.branch_rows): a row runs from where it leaves an
        older branch to its end and nests under that branch; the row holding the current token is bold."""
        p = self.panel
        p.tree.clear()
        bold = QFont()
        bold.setBold(True)
        items: list[QTreeWidgetItem] = []
        for row in branch_rows(s.root):
            nodes = [n for n in row.nodes if n.token is not None]
            text = p._tokens_text([n.token for n in nodes]) if nodes else "(prompt)"
            steps = f"{nodes[0].depth}\u2013{row.end.depth}" if nodes else "0"
            item = QTreeWidgetItem([text, steps, f"{row.end.score:.3f}"])
            item.setData(0, Qt.ItemDataRole.UserRole, row.end)
            whole = p._tokens_text(s.ids(row.end)[len(s.prompt):]) if row.end.depth else "(the prompt only)"
            where = "" if row.parent is None else f"; it branches off after step {row.start.depth - 1}"
            item.setToolTip(0, f"{whole}\nsteps {steps}{where}; click to go to its end")
            if s.current in row.nodes:
                item.setFont(0, bold)
            if row.parent is None:
                p.tree.addTopLevelItem(item)
            else:
                items[row.parent].addChild(item)
            items.append(item)
        p.tree.expandAll()

    def _refresh_beams(self, s: GenerationSession) -> None:
        """One row per beam, best first, showing where it differs: what follows the part it shares
        with the nearest other beam, after that part's last few tokens ("…shared | differing");
        the whole text in the tooltip."""
        p = self.panel
        # (an encoder-decoder's hypotheses ended by a stop token are set aside: listed too, "ended")
        beams = sorted(s.beams + s.finished_beams, key=lambda b: -b.score) if s.settings.strategy == "beam" else []
        paths = [s.ids(b)[len(s.prompt):] for b in beams]
        p.beam_table.setRowCount(len(beams))
        for i, (b, toks) in enumerate(zip(beams, paths)):
            common = max((common_prefix_length([toks, other]) for j, other in enumerate(paths) if j != i), default=0)
            cells = [self._beam_label(toks, common), f"{b.score:.3f}", "yes" if b.stop else ""]
            for j, c in enumerate(cells):
                item = QTableWidgetItem(c)
                if j == 0:
                    item.setToolTip(f"{p._tokens_text(toks)}\n(its first {plural(common, 'token')} are another "
                                    "beam's too)" if common else p._tokens_text(toks))
                p.beam_table.setItem(i, j, item)

    BEAM_CONTEXT = 3  # tokens of the shared part kept before the "|"

    def _beam_label(self, toks: list[int], common: int) -> str:
        p = self.panel
        if not common:
            return p._tokens_text(toks) if toks else "(nothing generated)"
        kept = min(common, self.BEAM_CONTEXT)
        shared = ("\u2026" if common > kept else "") + p._tokens_text(toks[common - kept:common])
        return f"{shared} | {p._tokens_text(toks[common:]) if toks[common:] else '(ends here)'}"

    def describe(self, s: GenerationSession) -> str:
        node = s.current
        if node.parent is None:
            what = (f"a source of {plural(len(s.source), 'token')}, the target at the decoder's start token"
                    if s.source is not None else f"a prompt of {plural(len(s.prompt), 'token')}")
            return f"Ready: {what}. Step (Right arrow), Back (Left arrow), click a bar to force a token."
        how = {"greedy": "greedy", "sampled": "sampled", "chosen": "forced", "beam": "beam search"}
        text = (f"Step {node.depth}: {self.panel._token_label(node.token)} ({how.get(node.how, node.how)}), "
                f"model p = {format_prob(node.model_prob)}")
        if node.stop:
            text += "; a stop token ended this branch"
        elif len(s.prompt) + node.depth >= s.model.cfg.context_length:
            text += f"; the context length ({plural(s.model.cfg.context_length, 'token')}) is reached"
        return text + "."

    def export_name(self, s: GenerationSession) -> str:
        node = self.panel.selected_node.parent if self.panel.selected_node is not None else s.current
        return f"generate-step{node.depth + 1}"

    def step_rows(self, s: GenerationSession) -> list[list]:
        path = s.current.path()[1:]
        strings = self.panel._strings([n.token for n in path])
        return [["step", n.depth, n.token, name, f"{n.prob:.6g}", f"{n.model_prob:.6g}", 1, n.how]
                for n, name in zip(path, strings)]

    def export_arrays(self, s: GenerationSession) -> dict:
        import numpy as np

        path = s.current.path()[1:]
        return {"ids": np.array(s.ids()), "step_model_probs": np.array([n.model_prob for n in path])}


class EncoderFillView(GenerationView):
    """Encoder (masked-language) models: fill the [MASK] positions one at a time, in the chosen order;
    the fills so far in the tree; any token can be masked and the text restarted."""

    encoder = True
    EMPTY_BARS = "Step: the candidates for a [MASK] position show here"

    def show(self, loaded) -> None:
        p = self.panel
        p.order.setVisible(True)
        p.mask_button.setVisible(True)
        for w in (p.beams, p.length_penalty, p.early_stopping):  # beam search is a decoder's
            w.setVisible(False)
        p.prompt.setPlaceholderText(
            "text with [MASK] tokens to fill (or select tokens and press Mask)" if loaded.tokenizer else
            "prompt: token ids separated by spaces (this model has no tokenizer)")

    def ready_message(self) -> str:
        return "encoder model - press Step to fill the [MASK] positions."

    def start(self, loaded, ids, then) -> None:
        p = self.panel
        mask_id = loaded.tokenizer.mask_token_id  # why_cannot_generate: a tokenizer with a [MASK]
        masked = mask_positions(loaded, ids, p._extra_masks)
        if not masked:
            p.status.setText("put [MASK] in the text, or select a token and press Mask / unmask")
            p._show_plain_tokens(ids)
            return
        p._submit(_start_encoder, loaded, ids, masked, mask_id, p.settings(), p.order.currentText(),
                  p.seed.value(), list(p.state.interventions), on_result=lambda s: p._session_ready(s, then),
                  on_dropped=lambda: p.start(then))

    def choose(self, token_id: int) -> None:
        p = self.panel
        s = p.session
        pos = self.shown_position()
        if pos is None or pos not in s.remaining:
            p.status.setText("select a masked position (or let the order pick one) to fill it")
            return
        p.selected_position = None
        p._submit(_mutate, s, "choose", int(token_id), pos, on_result=p._changed)

    def toggle_mask(self) -> None:
        p = self.panel
        pos = p.strip.selected_index
        if pos is None:
            p.status.setText("select a token in the strip first")
            return
        p._extra_masks ^= {pos}
        p.session = None
        p.start()

    def strip_selected(self, index: int) -> None:
        p = self.panel
        s = p.session
        p.selected_position = index
        p.refresh()
        if not p.busy:  # the inspecting panels show the sequence as filled so far
            p._submit(tokenize_and_trace, p.state.loaded, "", s.ids(), list(p.state.interventions),
                      on_result=self._show_filled)

    def _show_filled(self, result) -> None:
        p = self.panel
        ids, trace = result
        p.refresh()
        if trace is not None:
            p.state.show_trace(trace, ids)

    def shown_position(self) -> int | None:
        p = self.panel
        s = p.session
        if not isinstance(s, MaskedFillSession):
            return None
        if p.selected_position is not None:
            return p.selected_position
        if s.finished or s.cached_logits() is None:
            return None
        return s.next_position()

    def refresh(self, s: MaskedFillSession) -> None:
        p = self.panel
        p._clear_lens()
        ids = s.ids()
        filled = {st.position: st for st in s.history}
        values = [filled[i].model_prob if i in filled else None for i in range(len(ids))]
        p.strip.set_tokens(p._strings(ids), ids, values, vmin=0.0, vmax=1.0)
        p.strip.set_selected(p.selected_position)
        p.tree.clear()  # the fills so far, also once every position is filled
        for st in s.history:
            p.tree.addTopLevelItem(QTreeWidgetItem([f"position {st.position}: {p._token_label(st.token)}", "",
                                                    f"{math.log(max(st.model_prob, 1e-300)):.3f}"]))
        pos = self.shown_position()
        logits = s.cached_logits()
        if pos is None or logits is None:
            p.bars.clear("every masked position is filled" if s.finished else self.EMPTY_BARS)
            p._shown = None
            p.dist_label.setText("every masked position is filled" if s.finished else "")
            return
        dist = process_logits(logits[pos], *p._processing())
        chosen = filled[pos].token if pos in filled else None
        if pos in filled:  # show the distribution it was filled from
            dist = process_logits(filled[pos].logits, *p._processing())
        p._show_distribution(dist, chosen, len(s.history) + (pos not in filled), False,
                             context_ids=s.context_ids(pos), position=pos)
        p.dist_label.setText(f"position {pos}: " + p.dist_label.text())

    def describe(self, s: MaskedFillSession) -> str:
        total, done = len(s.masked), len(s.history)
        if s.finished:
            return f"Every masked position is filled ({total} of {total}); Back undoes the last fill."
        return (f"{done} of {plural(total, 'masked position')} filled: Step (Right arrow) fills the next, "
                "click a bar to fill it with that token.")

    def step_rows(self, s: MaskedFillSession) -> list[list]:
        strings = self.panel._strings([st.token for st in s.history])
        return [["step", i, st.token, name, "", f"{st.model_prob:.6g}", 1, f"position {st.position}"]
                for i, (st, name) in enumerate(zip(s.history, strings), 1)]
