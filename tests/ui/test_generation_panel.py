"""GenerationPanel with pytest-qt: Step / Back (buttons and arrow keys), forcing a token by clicking
its bar, sliders reshaping the bars without running the model, Run / Stop, inspection, beams,
and the encoder (masked fill) mode."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest
import torch
from PySide6.QtCore import QPoint, Qt

from desktop_app.core.checkpoints import load_model_folder, new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.generation import GenerationSettings, generate, process_logits
from desktop_app.paths import demo_model_dir
from desktop_app.core.tokenizer import char_tokenizer
from tiny_models import tiny_model, tiny_model_on
from .walkthrough import show_generation_panel

TEXT = "the cat sat on the mat and the dog sat on the log. "


def _loaded(family="gpt2", context=64):
    specials = ["[MASK]"] if family == "bert" else []
    return tiny_model(TEXT, family, specials=specials, context_length=context, init_std=0.3)


@pytest.fixture
def panel(qtbot):
    return _make(qtbot)


def _make(qtbot, family="gpt2", context=64, loaded=None):
    return show_generation_panel(qtbot, loaded or _loaded(family, context))


def _idle(qtbot, p):
    qtbot.waitUntil(lambda: not p.busy, timeout=10_000)
    qtbot.wait(10)


def _first_step(qtbot, panel) -> None:
    """Prompt "the ", one Step, and wait until the panel is idle at depth 1."""
    panel.prompt.setText("the ")
    panel.step()
    qtbot.waitUntil(lambda: panel.session is not None and panel.session.current.depth == 1, timeout=10_000)
    _idle(qtbot, panel)


@contextmanager
def _held(model):
    """Hold every forward of a worker thread until the gate opens: the panel is really busy."""
    gate = threading.Event()
    ui = threading.get_ident()

    def hold(module, args) -> None:  # returns None: a pre-hook's return value would replace the args
        if threading.get_ident() != ui:
            gate.wait(10)
    h = model.register_forward_pre_hook(hold)
    try:
        yield gate
    finally:
        gate.set()
        h.remove()


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
    _first_step(qtbot, panel)
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
    # the fork shows as two rows: the first branch, and under it the forced one that leaves it
    first = panel.tree.topLevelItem(0)
    assert panel.tree.topLevelItemCount() == 1 and first.childCount() == 1
    assert first.child(0).font(0).bold() and not first.font(0).bold()  # the current token's row
    # clicking the first branch in the tree goes back to it
    panel._tree_clicked(first, 0)
    assert panel.session.current.token == greedy


def test_sliders_reshape_the_bars_without_running_the_model(qtbot, panel):
    _first_step(qtbot, panel)
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
    _idle(qtbot, p)  # the job's end handlers run before the panel is deleted
    assert p.session.history[-1].token == target


def test_encoder_mode_hands_the_filled_sequence_to_the_inspectors(qtbot):
    """Selecting a position of a masked fill shows the sequence as filled so far in the Attention and
    Layers panels (the state's trace): the same attention as a traced forward of those ids."""
    p = _make(qtbot, family="bert")
    p.prompt.setText("the c[MASK]t s[MASK]t")
    p.step()
    qtbot.waitUntil(lambda: p.session is not None and len(p.session.history) == 1, timeout=10_000)
    _idle(qtbot, p)
    filled = p.session.history[0].position
    with qtbot.waitSignal(p.state.trace_changed, timeout=10_000) as sig:
        p.strip.token_selected.emit(filled)
    trace = sig.args[0]
    ids = p.session.ids()
    assert p.state.token_ids == ids and p.state.loaded.tokenizer.mask_token_id in ids  # one mask left
    _, ref = p.state.loaded.model.run_with_trace(torch.tensor([ids]))
    assert torch.allclose(trace["blocks.0.attn.pattern"], ref["blocks.0.attn.pattern"], atol=1e-6)
    assert p.selected_position == filled
    _idle(qtbot, p)


def test_editing_the_prompt_starts_a_new_tree_on_the_next_step(qtbot, panel):
    tok = panel.state.loaded.tokenizer
    _first_step(qtbot, panel)
    first = panel.session
    panel.prompt.setText("a dog ")
    panel.step()
    qtbot.waitUntil(lambda: panel.session is not first and panel.session.current.depth == 1, timeout=10_000)
    assert panel.session.prompt == tok.encode("a dog ")


def test_tokens_faster_than_the_refresh_interval_still_refresh_the_view(qtbot, panel):
    _first_step(qtbot, panel)
    fired = []
    panel._refresh_timer.timeout.connect(lambda: fired.append(1))
    panel.run_n.setValue(3)
    with _held(panel.state.loaded.model):
        panel.run_or_stop()
        assert panel._running
        for i in range(30):  # what the worker sends per token, every 10 ms (faster than the 40 ms refresh)
            panel._run_job.signals.progress.emit(i, 30, "")
            qtbot.wait(10)
        assert len(fired) >= 3  # a timer restarted per token would not fire until the run ends
    qtbot.waitUntil(lambda: panel.session.current.depth == 4, timeout=10_000)
    _idle(qtbot, panel)


def test_stop_ends_a_run_on_the_demo_model_within_one_step(qtbot):
    p = _make(qtbot, loaded=load_model_folder(demo_model_dir()))
    p.prompt.setText("the ")
    p.run_n.setValue(200)
    p.run_or_stop()
    qtbot.waitUntil(lambda: p.session is not None and p.session.current.depth >= 3, timeout=20_000)
    t0 = time.perf_counter()
    qtbot.mouseClick(p.run_button, Qt.MouseButton.LeftButton)
    at_stop = p.session.current.depth
    qtbot.waitUntil(lambda: not p.busy, timeout=5_000)
    elapsed = time.perf_counter() - t0
    assert p.status.text() == "Stopped." and at_stop < 200
    assert p.session.current.depth - at_stop <= 1  # at most the step already in flight finishes
    assert elapsed < 1.0  # the issue asks for 200 ms; generous for a loaded test machine


def test_settings_changed_while_busy_reach_the_session_for_the_next_step(qtbot, panel):
    _first_step(qtbot, panel)
    with _held(panel.state.loaded.model) as gate:
        panel.step()
        assert panel.busy
        panel.strategy.setCurrentText("sample")
        panel.temperature.setValue(200)
        assert panel.session.settings.strategy == "greedy"  # not changed under the running job
        gate.set()
        qtbot.waitUntil(lambda: panel.session.current.depth == 2, timeout=10_000)
        _idle(qtbot, panel)
    assert panel.session.settings.strategy == "sample" and panel.session.settings.temperature == 2.0
    panel.step()
    qtbot.waitUntil(lambda: panel.session.current.depth == 3, timeout=10_000)
    _idle(qtbot, panel)
    assert panel.session.current.how == "sampled"


def test_reset_uses_the_seed_in_the_box(qtbot, panel):
    panel.prompt.setText("the ")
    panel.strategy.setCurrentText("sample")
    panel.temperature.setValue(300)
    panel.run_n.setValue(12)

    def run() -> list[int]:
        panel.run_or_stop()
        qtbot.waitUntil(lambda: panel.session is not None and panel.session.current.depth == 12, timeout=10_000)
        _idle(qtbot, panel)
        return panel.session.ids()

    first = run()
    panel.seed.setValue(5)
    panel.reset()
    _idle(qtbot, panel)
    assert panel.session.current.depth == 0
    s = panel.session
    want, _ = generate(panel.state.loaded, s.prompt, 12, GenerationSettings("sample", 3.0), seed=5,
                       stop_tokens=list(s.stop_tokens))
    assert run() == want and want != first  # 12 draws at T=3: equal only by negligible chance
    panel.seed.setValue(0)
    panel.reset()
    _idle(qtbot, panel)
    assert run() == first  # the same seed reproduces the same sample


def test_back_highlights_the_branch_it_came_from(qtbot, panel):
    _first_step(qtbot, panel)
    greedy = panel.session.current
    panel.back()
    _idle(qtbot, panel)
    other = next(t for t in panel.bars.token_ids if t != greedy.token)
    panel.choose(other)
    qtbot.waitUntil(lambda: panel.session.current.token == other, timeout=10_000)
    _idle(qtbot, panel)
    panel._tree_clicked(panel.tree.topLevelItem(0), 0)  # back onto the first branch
    assert panel.session.current is greedy
    panel.back()
    _idle(qtbot, panel)
    assert [c.token for c in panel.session.root.children] == [greedy.token, other]
    assert panel.bars.chosen == greedy.token  # not the newest child
    for depth in (1, 2):  # two steps down the greedy branch, then two Backs
        panel.step()
        qtbot.waitUntil(lambda: panel.session.current.depth == depth, timeout=10_000)
        _idle(qtbot, panel)
    panel.back()
    _idle(qtbot, panel)
    panel.back()
    _idle(qtbot, panel)
    assert panel.session.current is panel.session.root and panel.bars.chosen == greedy.token


def test_mask_toggle_is_refused_while_a_job_runs(qtbot):
    p = _make(qtbot, family="bert")
    p.prompt.setText("the c[MASK]t s[MASK]t")
    p.step()
    qtbot.waitUntil(lambda: p.session is not None and len(p.session.history) == 1, timeout=10_000)
    _idle(qtbot, p)
    session = p.session
    with _held(p.state.loaded.model) as gate:
        p.step()
        assert p.busy
        p.strip.set_selected(0)
        p.toggle_mask()
        assert p.session is session and not p._extra_masks and "wait" in p.status.text()
        gate.set()
        qtbot.waitUntil(lambda: p.session is not None and len(p.session.history) == 2, timeout=10_000)
        _idle(qtbot, p)
    assert p.session is session and session.finished  # the running step's result was kept


def test_screenshot_demo_leaves_a_branch_and_the_forced_tokens_lens(qtbot):
    """The --screenshot hook plays Step x6, Back x2, a forced runner-up, Step x3, then inspects the
    forced token: the tree has a fork and the lens rows describe that token's step."""
    p = _make(qtbot, loaded=load_model_folder(demo_model_dir()))
    p.screenshot_demo()
    qtbot.waitUntil(p.screenshot_ready, timeout=30_000)
    s = p.session
    forks = [n for n in _nodes(s.root) if len(n.children) > 1]
    assert len(forks) == 1 and forks[0].depth == 4
    first, forced = forks[0].children
    assert forced.token != first.token and s.current in _nodes(forced) and s.current.depth == forced.depth + 3
    assert p.selected_node is forced
    assert p.lens_table.rowCount() == p.state.loaded.config.n_layers + 1  # embed + each block
    assert p.bars.chosen == forced.token


def _nodes(node):
    yield node
    for c in node.children:
        yield from _nodes(c)


# -- issue 13: clicked regressions ---------------------------------------------------------------


def _click(qtbot, widget, pos=None) -> None:
    assert widget.isEnabled(), widget
    if pos is None:
        qtbot.mouseClick(widget, Qt.MouseButton.LeftButton)
    else:
        qtbot.mouseClick(widget, Qt.MouseButton.LeftButton, pos=pos)


def _click_step(qtbot, p, depth: int) -> None:
    _click(qtbot, p.step_button)
    qtbot.waitUntil(lambda: p.session is not None and p.session.current.depth == depth, timeout=10_000)
    _idle(qtbot, p)


def test_first_click_on_start_starts_with_the_prompt_filled_in(qtbot):
    """Was: TypeError: 'bool' object is not callable (`clicked` sent `checked` into start(then=...));
    the demo model starts with a prompt already there, and Step after it succeeds."""
    p = _make(qtbot, loaded=load_model_folder(demo_model_dir()))
    assert p.prompt.text()
    _click(qtbot, p.start_button)
    qtbot.waitUntil(lambda: p.session is not None, timeout=10_000)
    _idle(qtbot, p)
    assert p.session.prompt == p.state.loaded.tokenizer.encode(p.prompt.text())
    assert p.status.text().startswith("Ready: a prompt of")
    _click_step(qtbot, p, 1)
    # Return in the prompt box starts too (returnPressed -> start())
    p.prompt.setText(p.prompt.text() + " and")
    first = p.session
    qtbot.keyClick(p.prompt, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: p.session is not first, timeout=10_000)
    _idle(qtbot, p)


def test_prompt_filled_in_follows_the_model_unless_the_user_typed_one(qtbot):
    p = _make(qtbot)
    auto = p.prompt.text()
    assert auto
    notok = tiny_model_on(None, vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32, context_length=32,
                          name="ids")
    p.state.loaded = notok
    p.state.model_changed.emit(notok)
    assert [int(t) for t in p.prompt.text().split()]  # a few ids, not text it cannot read
    _click_step(qtbot, p, 1)
    p.prompt.setText("7 8 9")
    p.state.model_changed.emit(notok)
    assert p.prompt.text() == "7 8 9"


def test_status_lens_and_strip_follow_the_current_step(qtbot):
    p = _make(qtbot, context=12)
    p.prompt.setText("the ")
    _click_step(qtbot, p, 1)
    n_prompt = len(p.session.prompt)
    with qtbot.waitSignal(p.state.trace_changed, timeout=10_000):  # inspect step 1
        qtbot.mouseClick(p.strip.canvas, Qt.MouseButton.LeftButton, pos=p.strip.chip_center(n_prompt))
    _idle(qtbot, p)
    assert p.status.text().startswith("Step 1:")
    _click_step(qtbot, p, 2)
    node = p.session.current
    assert p.status.text().startswith("Step 2:")  # was: "Step 1: picked ..." kept
    qtbot.waitUntil(lambda: bool(p.lens_rows) and p.tabs.tabText(0) == "Logit lens (step 2)", timeout=10_000)
    assert p.lens_rows[-1].chosen_prob == pytest.approx(node.model_prob, rel=1e-4)
    assert p.strip.count() == n_prompt + 2
    _click(qtbot, p.back_button)
    qtbot.waitUntil(lambda: p.session.current.depth == 1, timeout=10_000)
    _idle(qtbot, p)
    assert p.status.text().startswith("Step 1:")
    qtbot.waitUntil(lambda: p.tabs.tabText(0) == "Logit lens (step 1)", timeout=10_000)
    # run to the end of the context, then Reset: the status says where the session is now
    p.run_n.setValue(50)
    _click(qtbot, p.run_button)
    qtbot.waitUntil(lambda: not p.busy and p.session.current.depth == 12 - n_prompt, timeout=10_000)
    assert "context length" in p.status.text()
    _click(qtbot, p.reset_button)
    qtbot.waitUntil(lambda: p.session.current.depth == 0, timeout=10_000)
    _idle(qtbot, p)
    assert p.status.text().startswith("Ready") and "context" not in p.status.text()  # was: "context length reached"
    assert p.strip.count() == n_prompt and p.lens_table.rowCount() == 0
    # another model: nothing of this session stays on screen
    other = _loaded(context=12)
    p.state.loaded = other
    p.state.model_changed.emit(other)
    assert p.strip.count() == 0 and p.lens_table.rowCount() == 0 and p.tree.topLevelItemCount() == 0


def test_arrow_keys_keep_stepping_after_clicking_step_or_back(qtbot, panel):
    """Was: the clicked button, disabled while the step ran, handed the focus to "N = 20", which
    took the arrow keys."""
    panel.prompt.setText("the ")
    _click_step(qtbot, panel, 1)
    assert not panel.run_n.hasFocus()
    qtbot.keyClick(panel, Qt.Key.Key_Right)
    qtbot.waitUntil(lambda: panel.session.current.depth == 2, timeout=10_000)
    _idle(qtbot, panel)
    _click(qtbot, panel.back_button)
    qtbot.waitUntil(lambda: panel.session.current.depth == 1, timeout=10_000)
    _idle(qtbot, panel)
    assert not panel.run_n.hasFocus()
    qtbot.keyClick(panel, Qt.Key.Key_Left)
    qtbot.waitUntil(lambda: panel.session.current.depth == 0, timeout=10_000)
    _idle(qtbot, panel)
    assert panel.run_n.value() == 20


def test_tiny_probabilities_and_token_labels_are_readable(qtbot, panel):
    from desktop_app.ui.widgets.readable import format_prob

    assert format_prob(2.3e-5) == "2.3e-05" and format_prob(0.5) == "0.500" and format_prob(0.0) == "0.000"
    panel.prompt.setText("t")
    _click(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: panel.session is not None, timeout=10_000)
    _idle(qtbot, panel)
    assert panel.status.text().startswith("Ready: a prompt of 1 token.")  # not "1 tokens"
    # a very low temperature leaves most candidates with tiny probabilities: never "0.000"
    panel.temperature.setValue(5)
    texts = [t.textItem.toPlainText() for t in panel.bars._value_texts]
    assert texts and "0.000" not in texts and "0.000" not in panel.dist_label.text()
    panel.temperature.setValue(100)
    # force the space token by clicking its bar: the branch table shows it quoted, not blank
    space = panel.state.loaded.tokenizer.encode(" ")[0]
    index = panel.bars.token_ids.index(space)
    pos = panel.bars.plot.mapFromScene(panel.bars.bar_scene_pos(index))
    _click(qtbot, panel.bars.plot.viewport(), QPoint(pos.x(), pos.y()))
    qtbot.waitUntil(lambda: panel.session.current.token == space, timeout=10_000)
    _idle(qtbot, panel)
    assert panel.tree.topLevelItem(0).text(0) == "' '"  # one branch: one item
    assert "' ' (" in panel.status.text()


def test_no_tokenizer_branch_labels_separate_the_ids(qtbot):
    p = _make(qtbot, loaded=tiny_model_on(None, vocab_size=300, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                                          context_length=32, name="ids"))
    p.prompt.setText("12 7")
    _click_step(qtbot, p, 1)
    _click_step(qtbot, p, 2)
    ids = p.session.ids()[2:]
    assert p.tree.topLevelItem(0).text(0) == f"{ids[0]} {ids[1]}"  # was: run together
    assert p.status.text().startswith(f"Step 2: id {ids[1]} ")


def _encoder(tmp_path, lm_head=True, tokenizer=True):
    from desktop_app.core.checkpoints import save_model_folder

    tok = char_tokenizer(TEXT, specials=["[MASK]"])
    cfg = ModelConfig.bert(vocab_size=tok.vocab_size, d_model=32, n_layers=2, n_heads=4, d_ff=64,
                           context_length=64, lm_head=lm_head)
    folder = tmp_path / f"bert-{lm_head}-{tokenizer}"
    save_model_folder(new_model(cfg, seed=0), folder, tokenizer=tok if tokenizer else None)
    return load_model_folder(folder)


@pytest.mark.parametrize("lm_head,tokenizer,says", [
    (False, True, "no masked-language-model head"),
    (True, False, "no tokenizer"),
])
def test_an_encoder_that_cannot_fill_says_why_at_once_and_disables_generate(qtbot, tmp_path, lm_head,
                                                                            tokenizer, says):
    p = _make(qtbot, loaded=_encoder(tmp_path, lm_head, tokenizer))
    assert says in p.status.text() and "tokenizer has no [MASK]" not in p.status.text()
    for w in (p.start_button, p.step_button, p.run_button, p.back_button, p.reset_button, p.temperature):
        assert not w.isEnabled()
    qtbot.keyClick(p, Qt.Key.Key_Right)  # the shortcut does nothing either
    qtbot.wait(50)
    assert p.session is None and says in p.status.text()
    # a model that can generate enables everything again
    p.state.loaded = _loaded("bert")
    p.state.model_changed.emit(p.state.loaded)
    assert p.step_button.isEnabled() and p.temperature.isEnabled()


def test_a_session_started_on_the_previous_model_is_dropped(qtbot, panel):
    """A Start still running when another model opens must not bring the old model's tokens back."""
    panel.prompt.setText("the ")
    old = panel.state.loaded
    with _held(old.model) as gate:
        _click(qtbot, panel.start_button)
        assert panel.busy
        other = _loaded(context=32)
        panel.state.loaded = other
        panel.state.model_changed.emit(other)
        gate.set()
        _idle(qtbot, panel)
    assert panel.session is None and panel.strip.count() == 0
    assert panel.status.text().startswith("test: press Step")  # what the new model's opening said
    _click(qtbot, panel.step_button)  # the new model generates
    qtbot.waitUntil(lambda: panel.session is not None and panel.session.current.depth == 1, timeout=10_000)
    _idle(qtbot, panel)
    assert panel.session.model is other.model


def test_opening_another_model_during_run_n_keeps_the_new_models_status(qtbot, panel):
    _first_step(qtbot, panel)
    with _held(panel.state.loaded.model) as gate:
        _click(qtbot, panel.run_button)
        assert panel._running
        other = _loaded(context=32)
        panel.state.loaded = other
        panel.state.model_changed.emit(other)
        gate.set()
        _idle(qtbot, panel)
    assert panel.session is None and panel.strip.count() == 0
    assert panel.status.text().startswith("test: press Step")  # was: "Stopped." of the old run
    assert panel.run_button.text() == "Run N"


# -- issue 15: one panel, two views ------------------------------------------------------------------

def test_the_panel_shows_the_view_that_fits_the_model_and_switches_with_it(qtbot):
    from desktop_app.core.generation import GenerationSession, MaskedFillSession
    from desktop_app.ui.panels.generation_views import DecoderStepView, EncoderFillView

    p = _make(qtbot, family="bert")
    assert isinstance(p.view, EncoderFillView) and p.view.panel is p
    assert p.mask_button.isVisible() and p.order.isVisible() and not p.beams.isVisible()
    p.prompt.setText("the c[MASK]t")
    _click(qtbot, p.step_button)
    qtbot.waitUntil(lambda: p.session is not None and len(p.session.history) == 1, timeout=10_000)
    _idle(qtbot, p)
    assert isinstance(p.session, MaskedFillSession) and "Every masked position is filled" in p.status.text()

    decoder = _loaded("gpt2")
    p.state.loaded = decoder
    p.state.model_changed.emit(decoder)  # the same panel, now a decoder: the stepping view, same widgets
    assert isinstance(p.view, DecoderStepView) and p.session is None
    assert not p.mask_button.isVisible() and not p.order.isVisible() and p.beams.isVisible()
    p.prompt.setText("the ")
    _click_step(qtbot, p, 1)
    assert isinstance(p.session, GenerationSession) and p.status.text().startswith("Step 1:")
    assert p.tree.topLevelItemCount() == 1 and p.bars.token_ids  # the decoder's tree in the shared tree widget


def test_the_screenshot_script_lives_in_the_demo_module(qtbot):
    """The panel keeps only the --screenshot hooks; ui/demo.py has the script (here an encoder's: two fills)."""
    from desktop_app.ui import demo
    from desktop_app.ui.panels import generation

    assert "ScriptedDemo" not in open(generation.__file__, encoding="utf-8").read()
    p = _make(qtbot, family="bert")
    p.prompt.setText("the c[MASK]t s[MASK]t o[MASK] the mat")
    p.screenshot_demo()
    assert isinstance(p._demo, demo.ScriptedDemo)
    qtbot.waitUntil(p.screenshot_ready, timeout=30_000)
    assert len(p.session.history) == 2 and len(p.session.remaining) == 1


def test_a_prompt_outside_the_vocabulary_or_context_is_one_line_and_starts_nothing(qtbot):
    """The prompt is read as every text box is (core.inputs): ids beyond the vocabulary and a prompt
    longer than the context are refused in the status line, not handed to the model."""
    p = _make(qtbot)
    notok = tiny_model_on(None, vocab_size=50, d_model=16, n_layers=1, n_heads=2, d_ff=32, context_length=8,
                          name="ids")
    p.state.loaded = notok
    p.state.model_changed.emit(notok)
    for typed, said in (("7 80 9", "80"), (" ".join(["1"] * 9), "context")):
        p.prompt.setFocus()
        qtbot.keyClick(p.prompt, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
        qtbot.keyClicks(p.prompt, typed)
        qtbot.mouseClick(p.start_button, Qt.MouseButton.LeftButton)
        assert said in p.status.text() and p.session is None, p.status.text()


def test_beam_options_typed_and_picked_reach_the_search_and_the_workspace(qtbot, panel):
    """The length penalty and early stopping (the CLI's --length-penalty, --early-stopping) as a person sets
    them: typed and picked before Step, then changed between steps; the session searches with them."""
    from .walkthrough import choose_item, type_into

    panel.prompt.setText("the ")
    choose_item(qtbot, panel.strategy, "beam")
    type_into(qtbot, panel.length_penalty, "2.5")
    choose_item(qtbot, panel.early_stopping, "early stop never")
    _click_step(qtbot, panel, 1)
    assert (panel.session.settings.length_penalty, panel.session.settings.early_stopping) == (2.5, "never")
    choose_item(qtbot, panel.early_stopping, "early stop true")
    type_into(qtbot, panel.length_penalty, "-0.5")
    _click_step(qtbot, panel, 2)
    assert (panel.session.settings.length_penalty, panel.session.settings.early_stopping) == (-0.5, True)
    saved = panel.view_state
    assert (saved.length_penalty, saved.early_stopping) == (-0.5, "true")
    type_into(qtbot, panel.length_penalty, "99")  # the box keeps the range the CLI declares (app.generation)
    assert -10 <= panel.length_penalty.value() <= 10 and panel.length_penalty.maximum() == 10
    panel.set_view_state(saved)
    assert panel.length_penalty.value() == -0.5 and panel.early_stopping.currentText() == "early stop true"


def test_screenshot_ready_says_whether_what_is_on_show_is_drawn_without_a_demo(qtbot, panel):
    """screenshot_ready read only the --screenshot demo's progress (an error on a panel where none ran, which bench
    ui worked around): idle, it is ready (once painted and laid out); a Step clicked and held in the worker, not; the
    step drawn, ready."""
    qtbot.waitUntil(panel.screenshot_ready, timeout=5_000)
    panel.prompt.setText("the ")
    with _held(panel.state.loaded.model) as gate:
        qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: panel.busy, timeout=5_000)
        assert not panel.screenshot_ready()
        gate.set()
        qtbot.waitUntil(panel.screenshot_ready, timeout=10_000)
    assert panel.session.current.depth == 1 and panel.bars.token_ids  # the step's bars are drawn


def test_the_plots_not_on_show_are_made_when_first_shown(qtbot, panel):
    """The panel made three pyqtgraph plots at its first show, two of them hidden: the model as trained's bars
    (shown with what-if edits) and an encoder-decoder's cross-attention map. Only the bars on show are made; the
    plain model's when the edits bring them on screen, drawn."""
    import pyqtgraph as pg

    from desktop_app.core.interventions import Intervention

    assert panel.findChildren(pg.GraphicsView) == [panel.bars.plot]  # (before: three)
    panel.state.set_interventions([Intervention("blocks.0.attn.head.1")])
    panel.prompt.setText("the ")
    qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "log p" in panel.plain_label.text(), timeout=20_000)
    assert panel.plain_box.isVisible() and panel.plain_bars.isVisible() and panel.plain_bars.width() > 100
    assert len(panel.plain_bars.token_ids) == len(panel.bars.token_ids)  # drawn
    assert len(panel.findChildren(pg.GraphicsView)) == 2


def test_run_n_that_cannot_fit_is_refused_before_it_starts_with_the_figure(qtbot, monkeypatch):
    """Run N on a large model with many tokens started without a memory check (the CLI's generate refused it):
    the panel now asks app.generation's check first and refuses in one line with the figure; a run that fits
    runs."""
    from desktop_app.app import generation as app_generation
    from desktop_app.core import devices

    p = _make(qtbot, context=4096)
    _first_step(qtbot, p)
    s, loaded = p.session, p.state.loaded

    def need(n):
        return sum(app_generation.generation_bytes(loaded.config, loaded.model.dtype, len(s.ids()), n, 1,
                                                   record=True).values())
    assert s.record and need(4000) > 2 * need(3)
    monkeypatch.setattr(devices, "available_memory", lambda device: (need(4000) + need(3)) / 2)
    p.run_n.setValue(4000)
    qtbot.mouseClick(p.run_button, Qt.MouseButton.LeftButton)
    assert not p.busy and p.run_button.text() == "Run N"
    assert p.status.text() == (f"Run N = 4000 needs about {devices.human_bytes(need(4000))} for the generated "
                               f"tokens' distributions, records and KV cache; this machine has "
                               f"{devices.human_bytes((need(4000) + need(3)) / 2)} available")
    qtbot.wait(50)
    assert p.session is s and s.current.depth == 1  # nothing ran
    p.run_n.setValue(3)
    qtbot.mouseClick(p.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: p.session.current.depth == 4, timeout=10_000)
    _idle(qtbot, p)


def test_a_session_start_that_cannot_fit_the_weights_copy_is_refused_before_it_starts(qtbot, monkeypatch):
    """A session's start lays a float32 model's weights out for one-token steps (a copy of most of them), and the
    panel's only check (Run N's) came after it, with the copy already made. Step (and Run N) on a fresh prompt now
    check the prompt's records and that copy first (app.generation.check_start_memory) and refuse in one line."""
    from desktop_app.app import generation as app_generation
    from desktop_app.core import devices
    from desktop_app.core.model import decoding_copy_bytes

    p = _make(qtbot)
    loaded = p.state.loaded
    p.prompt.setText("the ")
    prompt = len(p._prompt_ids())
    history = sum(app_generation.generation_bytes(loaded.config, loaded.model.dtype, prompt, 0, 1,
                                                  record=True).values())
    copy = decoding_copy_bytes(loaded.model)
    assert copy > 0
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": history + copy - 1)
    qtbot.mouseClick(p.step_button, Qt.MouseButton.LeftButton)
    assert not p.busy and p.session is None
    assert p.status.text() == (f"Starting from this prompt needs about {devices.human_bytes(history + copy)} for the "
                               f"generated tokens' distributions, records and KV cache, and the weights laid out for "
                               f"one-token steps; this machine has {devices.human_bytes(history + copy - 1)} available")
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": history + copy)
    qtbot.mouseClick(p.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: p.session is not None and p.session.current.depth == 1, timeout=10_000)
    _idle(qtbot, p)
    assert decoding_copy_bytes(loaded.model) == 0  # made by the start


def test_a_beam_search_start_is_not_refused_for_the_prepacked_copy_it_never_makes(qtbot, monkeypatch):
    """A bfloat16 session's start makes the prepacked copy for one-row steps, and the start's check counts it; a
    beam search over 3 beams makes none (GenerationSession._pack_for), but the panel's check counted it all the
    same (it was not told the strategy): a beam start near the limit was refused though it fits. With the
    strategy and width picked in the panel, at history + copy - 1 bytes a greedy start is refused, a beam one
    starts, and no copy is made."""
    from desktop_app.app import generation as app_generation
    from desktop_app.core import devices
    from desktop_app.core.model import _one_row_products_here, decoding_copy_bytes

    from .walkthrough import choose_item, type_into

    if not _one_row_products_here(torch.bfloat16):
        pytest.skip("this CPU or torch build has no prepacked bfloat16 product")
    loaded = _loaded()
    loaded.model.to(torch.bfloat16)
    p = _make(qtbot, loaded=loaded)
    type_into(qtbot, p.prompt, TEXT[:60])  # long enough that history + copy leaves the copy its quarter to spare
    prompt = len(p._prompt_ids())
    history = sum(app_generation.generation_bytes(loaded.config, torch.bfloat16, prompt, 0, 1, record=True).values())
    copy = decoding_copy_bytes(loaded.model)
    assert copy > 0 and decoding_copy_bytes(loaded.model, prepack=False) == 0  # bfloat16: the prepacked copy only
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": history + copy - 1)
    assert decoding_copy_bytes(loaded.model) == copy  # still made (a quarter to spare) at this memory, so counted
    assert p.strategy.currentText() == "greedy"
    qtbot.mouseClick(p.step_button, Qt.MouseButton.LeftButton)
    assert not p.busy and p.session is None
    assert p.status.text().startswith(f"Starting from this prompt needs about {devices.human_bytes(history + copy)} ")
    choose_item(qtbot, p.strategy, "beam")
    type_into(qtbot, p.beams, "3")
    assert p.beams.value() == 3
    qtbot.mouseClick(p.step_button, Qt.MouseButton.LeftButton)
    assert p.busy, p.status.text()  # started (was: refused, the copy counted)
    qtbot.waitUntil(lambda: p.session is not None and p.session.current.depth == 1, timeout=10_000)
    _idle(qtbot, p)
    assert p.session.settings.strategy == "beam" and p.session.settings.beams == 3
    assert decoding_copy_bytes(loaded.model) == copy  # the beam session made no copy
