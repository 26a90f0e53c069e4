"""Issue 25 §6, the Generate panel as clicked: an ablation keeps the history, the Beams tab shows
where the beams differ, the branch rows stay readable, a double click forces one token, a value
at the right edge stays in view, and the status line counts Run N's tokens."""
from __future__ import annotations

import threading

import pytest
import torch
from PySide6.QtCore import QPoint, Qt

from desktop_app.core.generation import GenerationSession, GenerationSettings, process_logits
from desktop_app.ui.widgets.prob_bars import ProbBars

from .test_generation_panel import _first_step, _idle, _make, panel  # noqa: F401 (a fixture)
from .walkthrough import click_panel_tab, open_window


def _click_step(qtbot, p, depth: int) -> None:
    qtbot.mouseClick(p.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: p.session is not None and p.session.current.depth == depth and not p.busy,
                    timeout=20_000)


def _bar_point(bars, index: int) -> QPoint:
    pos = bars.plot.mapFromScene(bars.bar_scene_pos(index))
    return QPoint(pos.x(), pos.y())


def test_an_ablation_from_the_attention_panel_keeps_the_history_and_shows_the_edited_model(
        qtbot, model_dirs, isolated_user_files, error_watch):
    from .test_ablation_ui import _action, _wait_traced

    w, state = open_window(qtbot, model_dirs["llama"], name="llama", watch=error_watch)
    gen = click_panel_tab(qtbot, w, "Generate")
    for depth in (1, 2, 3):
        _click_step(qtbot, gen, depth)
    before = gen.session
    ids, tokens = before.ids(), before.ids()[len(before.prompt):]
    row = gen.tree.topLevelItem(0).text(0)
    assert row == gen._tokens_text(tokens)

    att = click_panel_tab(qtbot, w, "Attention")  # right-click head 1.2, Ablate > Zero
    qtbot.waitUntil(lambda: (1, 2) in att.model_view.boxes, timeout=20_000)
    att.model_view.customContextMenuRequested.emit(att.model_view.mapFromScene(att.model_view.thumb_scene_center(1, 2)))
    with qtbot.waitSignal(state.trace_changed, timeout=20_000):
        _action(att.last_ablation_menu, "Ablate head 1.2", "Zero").trigger()
    _wait_traced(qtbot, state)

    click_panel_tab(qtbot, w, "Generate")
    qtbot.waitUntil(lambda: gen.session is not before and gen.session is not None and not gen.busy, timeout=20_000)
    s = gen.session
    assert s.interventions and s.ids() == ids and s.current.depth == 3  # the 3 tokens are still there
    assert gen.tree.topLevelItemCount() == 1 and gen.tree.topLevelItem(0).text(0) == row
    assert gen.strip.count() == len(ids)
    assert gen.status.text().startswith("History kept, with the edited model's probabilities.")
    # the bars are the edited model's distribution after those 3 tokens, beside the model as trained
    edited = GenerationSession(state.loaded, ids, GenerationSettings(), interventions=list(state.interventions))
    want = process_logits(edited.root.next_logits)
    plain = process_logits(GenerationSession(state.loaded, ids, GenerationSettings()).root.next_logits)
    assert not torch.allclose(want.model_probs, plain.model_probs, atol=1e-4)  # the edit matters here
    assert gen.bars.token_ids[0] == int(want.probs.argmax())
    for t, p in zip(gen.bars.token_ids, gen.bars.probs):
        assert p == pytest.approx(float(want.probs[t]), abs=1e-5)
    qtbot.waitUntil(lambda: "log p" in gen.plain_label.text(), timeout=20_000)
    assert gen.plain_box.isVisible() and gen.plain_bars.token_ids[0] == int(plain.probs.argmax())
    # each kept token's probability is the edited model's too
    node = s.current
    assert node.model_prob == pytest.approx(
        float(process_logits(s.current.parent.next_logits).model_probs[node.token]), rel=1e-6)
    error_watch.assert_clean()


def test_edits_changed_during_run_n_stop_it_and_keep_what_it_made(qtbot):
    from desktop_app.core.interventions import Intervention

    p = _make(qtbot, context=4096)
    p.prompt.setText("the ")
    p.run_n.setValue(4000)
    qtbot.mouseClick(p.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: p.session is not None and p.session.current.depth >= 3, timeout=20_000)
    p.state.set_interventions([Intervention("blocks.1.attn.head.2")])
    qtbot.waitUntil(lambda: not p.busy and bool(p.session.interventions), timeout=20_000)
    s = p.session
    assert 3 <= s.current.depth < 4000 and p.strip.count() == len(s.ids())
    assert p.status.text().startswith("History kept")


def test_double_clicking_a_bar_forces_exactly_one_token(qtbot, panel):
    """A double click as Qt delivers it: press and release (a click), then the second press as a
    double-click event and its release. The first click forces the token at once (the worker is done
    well within the double-click interval); the double-click event must not force another one."""
    _first_step(qtbot, panel)
    panel.back()
    _idle(qtbot, panel)
    greedy = panel.session.root.children[0].token
    index = next(i for i, t in enumerate(panel.bars.token_ids) if t != greedy)
    target = panel.bars.token_ids[index]
    forced = []
    panel.bars.token_clicked.connect(forced.append)
    view, at = panel.bars.plot.viewport(), _bar_point(panel.bars, index)
    qtbot.mouseClick(view, Qt.MouseButton.LeftButton, pos=at)
    qtbot.waitUntil(lambda: panel.session.current.token == target, timeout=10_000)
    _idle(qtbot, panel)
    qtbot.mouseDClick(view, Qt.MouseButton.LeftButton, pos=at)  # QTest sends the double-click event alone
    qtbot.mouseRelease(view, Qt.MouseButton.LeftButton, pos=at)
    _idle(qtbot, panel)
    assert forced == [target]  # one gesture, one token
    assert panel.session.current.depth == 1 and [c.token for c in panel.session.root.children] == [greedy, target]


def test_the_beams_tab_shows_where_the_beams_differ_and_the_rows_stay_in_view(qtbot):
    p = _make(qtbot, context=64)
    p.resize(900, 600)
    p.prompt.setText("the ")
    p.strategy.setCurrentText("beam")
    p.beams.setValue(4)
    p.run_n.setValue(20)
    qtbot.mouseClick(p.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: p.session is not None and p.session.current.depth == 20 and not p.busy, timeout=30_000)
    s = p.session
    beams = sorted(s.beams, key=lambda b: -b.score)
    texts = [p.beam_table.item(i, 0).text() for i in range(p.beam_table.rowCount())]
    assert len(texts) == 4 and len(set(texts)) == 4  # the four rows differ visibly
    full = [s.ids(b)[len(s.prompt):] for b in beams]
    for i, (text, toks) in enumerate(zip(texts, full)):
        # the part it shares with its nearest beam, counted here token by token
        shared = max(next((k for k in range(20) if toks[k] != other[k]), 20) for other in full if other is not toks)
        assert text.endswith(" | " + p._tokens_text(toks[shared:]))  # where this beam differs
        assert p._tokens_text(toks) in p.beam_table.item(i, 0).toolTip()  # the whole text
        if shared > 3:
            assert text.startswith("\u2026")  # the shared part is cut to its last tokens
    # the branch rows: each label starts inside the tree's view (nested only where a branch leaves another)
    p.tabs.setCurrentWidget(p.beam_table)
    tree = p.tree
    width = tree.viewport().width()
    items, stack = [], [tree.topLevelItem(i) for i in range(tree.topLevelItemCount())]
    while stack:
        it = stack.pop()
        items.append(it)
        stack += [it.child(k) for k in range(it.childCount())]
    assert len(items) > 4  # beam search left pruned branches too
    for it in items:
        tree.scrollToItem(it)
        rect = tree.visualItemRect(it)
        assert rect.left() < width / 3, (it.text(0), rect.left(), width)


@pytest.mark.parametrize("size", [(260, 200), (500, 300), (900, 500)])
def test_a_value_at_the_right_edge_is_fully_in_view(qtbot, size):
    bars = ProbBars()
    qtbot.addWidget(bars)
    bars.resize(*size)
    bars.show()
    qtbot.waitExposed(bars)
    bars.set_distribution([5, 6, 7], ["'a'", "'b'", "'c'"], [0.999, 0.0009, 0.0001], [0.999, 0.0009, 0.0001], 5)
    qtbot.wait(10)
    vb = bars.plot.getPlotItem().getViewBox()
    view = bars.plot.mapFromScene(vb.sceneBoundingRect()).boundingRect()
    for txt in bars._value_texts:
        rect = bars.plot.mapFromScene(txt.textItem.sceneBoundingRect()).boundingRect()
        assert view.contains(rect), (txt.textItem.toPlainText(), rect, view)
        assert bars.plot.viewport().rect().contains(rect)


def test_the_status_line_counts_run_n_and_is_restored_at_the_end(qtbot, panel):
    model = panel.state.loaded.model
    ui = threading.get_ident()
    gate = threading.Event()

    def hold(module, args) -> None:  # only Run N's forwards wait, not the prompt's
        if threading.get_ident() != ui and panel._running:
            gate.wait(10)
    seen = []
    set_text = panel.status.setText
    panel.status.setText = lambda text: (seen.append(text), set_text(text))
    h = model.register_forward_pre_hook(hold)
    try:
        panel.prompt.setText("the ")
        panel.run_n.setValue(5)
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: panel._running, timeout=10_000)
        qtbot.wait(50)
        assert panel.status.text() == "Generating 1/5\u2026 (Stop ends it)"  # was "Ready: a prompt of 4 tokens..."
    finally:
        gate.set()
        h.remove()
    qtbot.waitUntil(lambda: not panel.busy and panel.session.current.depth == 5, timeout=10_000)
    counts = [t for t in seen if t.startswith("Generating")]
    assert [c.split()[1] for c in counts] == [f"{k}/5\u2026" for k in (1, 1, 2, 3, 4, 5, 5)]
    assert panel.status.text().startswith("Done. Step 5:")
