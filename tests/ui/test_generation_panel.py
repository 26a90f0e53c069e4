"""GenerationPanel with pytest-qt: Step / Back (buttons and arrow keys), forcing a token by clicking
its bar, sliders reshaping the bars without running the model, Run / Stop, inspection, beams,
and the encoder (masked fill) mode."""
from __future__ import annotations

import pytest
import torch
from PySide6.QtCore import QPoint, Qt

from desktop_app.core.checkpoints import LoadedModel, new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.generation import process_logits
from desktop_app.core.tokenizer import char_tokenizer
from desktop_app.ui.panels.generation import GenerationPanel
from desktop_app.ui.state import AppState

TEXT = "the cat sat on the mat and the dog sat on the log. "


def _loaded(family="gpt2", context=64):
    specials = ["[MASK]"] if family == "bert" else []
    tok = char_tokenizer(TEXT, specials=specials)
    cfg = getattr(ModelConfig, family)(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                                       context_length=context, init_std=0.3)
    return LoadedModel(new_model(cfg, seed=0).eval(), cfg, tok, None, "test")


@pytest.fixture
def panel(qtbot):
    return _make(qtbot)


def _make(qtbot, family="gpt2", context=64):
    state = AppState()
    loaded = _loaded(family, context)
    state.loaded = loaded
    p = GenerationPanel(state)
    qtbot.addWidget(p)
    p.resize(1000, 700)
    p.show()
    state.model_changed.emit(loaded)
    return p


def _idle(qtbot, p):
    qtbot.waitUntil(lambda: not p.busy, timeout=10_000)
    qtbot.wait(10)


def _logits_after(p, ids):
    with torch.no_grad():
        return p.state.loaded.model(torch.tensor([ids])).logits[0, -1]


def test_step_and_back_with_buttons_and_arrow_keys(qtbot, panel):
    tok = panel.state.loaded.tokenizer
    panel.prompt.setText("the c")
    prompt = tok.encode("the c")
    qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.session is not None and panel.session.current.depth == 1, timeout=10_000)
    _idle(qtbot, panel)
    assert panel.session.ids()[-1] == int(_logits_after(panel, prompt).argmax())  # greedy
    assert panel.strip.count() == len(prompt) + 1
    panel.bars.setFocus()
    qtbot.keyClick(panel.bars, Qt.Key.Key_Right)
    qtbot.waitUntil(lambda: panel.session.current.depth == 2, timeout=10_000)
    _idle(qtbot, panel)
    qtbot.keyClick(panel.bars, Qt.Key.Key_Left)
    qtbot.waitUntil(lambda: panel.session.current.depth == 1, timeout=10_000)
    _idle(qtbot, panel)
    assert panel.strip.count() == len(prompt) + 1
    # after Back, the bars show the distribution again with the token that was taken highlighted
    assert panel.bars.chosen == panel.session.current.children[0].token


def test_clicking_a_bar_forces_that_token_and_starts_a_branch(qtbot, panel):
    panel.prompt.setText("the ")
    panel.step()
    qtbot.waitUntil(lambda: panel.session is not None and panel.session.current.depth == 1, timeout=10_000)
    _idle(qtbot, panel)
    panel.back()
    _idle(qtbot, panel)
    greedy = panel.session.root.children[0].token
    target_index = next(i for i, t in enumerate(panel.bars.token_ids) if t != greedy)
    target = panel.bars.token_ids[target_index]
    view = panel.bars.plot.viewport()
    pos = panel.bars.plot.mapFromScene(panel.bars.bar_scene_pos(target_index))
    qtbot.mouseClick(view, Qt.MouseButton.LeftButton, pos=QPoint(pos.x(), pos.y()))
    qtbot.waitUntil(lambda: panel.session.current.depth == 1 and panel.session.current.token == target,
                    timeout=10_000)
    _idle(qtbot, panel)
    root = panel.session.root
    assert [c.token for c in root.children] == [greedy, target]
    assert panel.tree.topLevelItem(0).childCount() == 2  # the fork shows as two branches
    # clicking the first branch in the tree goes back to it
    first = panel.tree.topLevelItem(0).child(0)
    panel._tree_clicked(first, 0)
    assert panel.session.current.token == greedy


def test_sliders_reshape_the_bars_without_running_the_model(qtbot, panel):
    panel.prompt.setText("the ")
    panel.step()
    qtbot.waitUntil(lambda: panel.session is not None and panel.session.current.depth == 1, timeout=10_000)
    _idle(qtbot, panel)
    calls = []
    hook = panel.state.loaded.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        panel.temperature.setValue(250)
        panel.top_k.setValue(3)
        assert not panel.busy and not calls
        logits = panel.session.current.next_logits
        want = process_logits(logits, 2.5, 3, 1.0)
        for t, p in zip(panel.bars.token_ids, panel.bars.probs):
            assert p == pytest.approx(float(want.probs[t]), abs=1e-9)
        assert sum(p > 0 for p in panel.bars.probs) == 3
        panel.top_k.setValue(0)
        panel.top_p.setValue(50)
        want = process_logits(logits, 2.5, 0, 0.5)
        assert sum(p > 0 for p in panel.bars.probs) == int(want.kept.sum())
    finally:
        hook.remove()


def test_run_then_stop(qtbot):
    p = _make(qtbot, context=4096)
    p.prompt.setText("the ")
    p.run_n.setValue(4000)
    qtbot.mouseClick(p.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: p.session is not None and p.session.current.depth >= 3, timeout=20_000)
    assert p.run_button.text() == "Stop"
    qtbot.mouseClick(p.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not p.busy, timeout=2_000)  # the worker checks between tokens
    depth = p.session.current.depth
    assert 3 <= depth < 4000 and p.status.text() == "Stopped."
    qtbot.wait(100)
    assert p.session.current.depth == depth  # nothing runs after Stop
    assert p.run_button.text() == "Run N"
    # the strip is refreshed to the final text
    assert p.strip.count() == len(p.session.ids())


def test_selecting_a_generated_token_shows_logit_lens_and_hands_attention(qtbot, panel):
    panel.prompt.setText("the ")
    panel.run_n.setValue(4)
    panel.run_or_stop()
    qtbot.waitUntil(lambda: panel.session is not None and panel.session.current.depth == 4, timeout=10_000)
    _idle(qtbot, panel)
    n_prompt = len(panel.session.prompt)
    with qtbot.waitSignal(panel.state.trace_changed, timeout=10_000) as sig:
        qtbot.mouseClick(panel.strip.canvas, Qt.MouseButton.LeftButton, pos=panel.strip.chip_center(n_prompt + 1))
    trace = sig.args[0]
    node = panel.session.current.path()[2]
    assert panel.selected_node is node
    assert panel.state.token_ids == panel.session.ids(node.parent)
    assert trace.pattern(0).shape[-1] == len(panel.state.token_ids)
    assert panel.lens_table.rowCount() == panel.state.loaded.config.n_layers + 1
    assert panel.bars.chosen == node.token  # the distribution it was picked from
    assert panel.lens_rows[-1].chosen_prob == pytest.approx(node.model_prob, rel=1e-4)


def test_beam_search_shows_the_beams(qtbot, panel):
    panel.prompt.setText("the ")
    panel.strategy.setCurrentText("beam")
    panel.beams.setValue(3)
    panel.step()
    qtbot.waitUntil(lambda: panel.session is not None and panel.session.current.depth == 1, timeout=10_000)
    _idle(qtbot, panel)
    panel.step()
    qtbot.waitUntil(lambda: panel.session.current.depth == 2, timeout=10_000)
    _idle(qtbot, panel)
    assert panel.beam_table.rowCount() == 3
    scores = [float(panel.beam_table.item(i, 1).text()) for i in range(3)]
    assert scores == sorted(scores, reverse=True)


def test_encoder_mode_fills_masks(qtbot):
    p = _make(qtbot, family="bert")
    assert p.order.isVisible() and not p.beams.isVisible()
    p.prompt.setText("the c[MASK]t s[MASK]t")
    p.step()
    qtbot.waitUntil(lambda: p.session is not None and len(p.session.history) == 1, timeout=10_000)
    _idle(qtbot, p)
    p.run_or_stop()
    qtbot.waitUntil(lambda: p.session.finished and not p.busy, timeout=10_000)
    mask = p.state.loaded.tokenizer.mask_token_id
    assert mask not in p.session.ids()
    p.back()
    _idle(qtbot, p)
    assert len(p.session.remaining) == 1 and p.bars.token_ids  # the distribution of the last mask
    target = p.bars.token_ids[-1]
    p.choose(target)
    qtbot.waitUntil(lambda: p.session.finished, timeout=10_000)
    assert p.session.history[-1].token == target


def test_editing_the_prompt_starts_a_new_tree_on_the_next_step(qtbot, panel):
    tok = panel.state.loaded.tokenizer
    panel.prompt.setText("the ")
    panel.step()
    qtbot.waitUntil(lambda: panel.session is not None and panel.session.current.depth == 1, timeout=10_000)
    _idle(qtbot, panel)
    first = panel.session
    panel.prompt.setText("a dog ")
    panel.step()
    qtbot.waitUntil(lambda: panel.session is not first and panel.session.current.depth == 1, timeout=10_000)
    assert panel.session.prompt == tok.encode("a dog ")
