"""Issue 27: the first look arrives in pieces. A text's trace runs layer by layer in a worker; the
Attention panel's model view paints each layer's row as soon as it is recorded, the status bar shows
"layer k / L" with Cancel, and a new text (or Cancel) stops the old trace, whose result is never shown.

The worker is held after its second layer on an Event (a wrapper around ui.state's trace_input), so
what is on show mid-trace is observed without sleeps; every hold also ends when its job is cancelled."""
from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt

from desktop_app.core.checkpoints import new_model, save_model_folder
from desktop_app.core.config import ModelConfig
from desktop_app.core.tokenizer import train_bpe

from .walkthrough import click_panel_tab, open_window

FIRST = "Alice sat on the bank by her sister."
SECOND = "The rabbit ran down the hole and Alice went after it."
THIRD = "Down, down, down: would the fall never come to an end?"
LAYERS, HEADS = 6, 2


@pytest.fixture(autouse=True)
def pieces_at_once(monkeypatch):
    """Every trace shows its pieces (the app waits PIECES_AFTER_S before it does, so that a quick trace
    does not clear the panels between two results; the held traces here are slow ones)."""
    from desktop_app.ui.state import AppState

    monkeypatch.setattr(AppState, "PIECES_AFTER_S", 0.0)


@pytest.fixture(scope="module")
def six_layers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("progressive") / "six-layers"
    tok = train_bpe([(FIRST + " " + SECOND + " " + THIRD) * 10], vocab_size=120)
    cfg = ModelConfig.gpt2(vocab_size=tok.vocab_size, d_model=16, n_layers=LAYERS, n_heads=HEADS, d_ff=32,
                           context_length=64)
    save_model_folder(new_model(cfg, seed=0), folder, tokenizer=tok)
    return folder


class Hold:
    """Holds the worker tracing `text` after its layer `after` (and once more after the next one) until
    released or cancelled; only the first trace of `text` is held."""

    def __init__(self, monkeypatch, text: str, after: int = 2) -> None:
        import desktop_app.ui.state as state_module

        self.text, self.after = text, after
        self.reached, self.release = threading.Event(), threading.Event()
        self.next_reached, self.next_release = threading.Event(), threading.Event()  # the same, one layer on
        self.layers_seen: list = []  # (job, layers done) as the worker handed them on
        self.job = None  # the job held
        real = state_module.trace_input

        def held(loaded, text, ids, interventions=None, *args, on_layer=None, job=None, **kw):
            def hook(ready):
                self.layers_seen.append((job, ready.done))
                on_layer(ready)
                if text == self.text and ready.done in (self.after, self.after + 1):
                    reached, release = ((self.reached, self.release) if ready.done == self.after else
                                        (self.next_reached, self.next_release))
                    if self.job not in (None, job):
                        return  # the first trace of the text only: a later one (another model's) runs through
                    self.job = job
                    reached.set()
                    while not release.wait(0.02) and not job.cancelled:
                        pass  # a cancel ends the hold: the trace stops at its next layer
            return real(loaded, text, ids, interventions, *args, on_layer=hook, job=job, **kw)

        monkeypatch.setattr(state_module, "trace_input", held)

    def held_layers(self) -> list[int]:
        """The layers the held trace handed on."""
        return [done for job, done in self.layers_seen if job is self.job]


def _type(qtbot, window, text: str) -> None:
    model = click_panel_tab(qtbot, window, "Model")
    model.text_edit.selectAll()
    qtbot.keyClicks(model.text_edit, text)


def _attention(qtbot, window):
    attention = click_panel_tab(qtbot, window, "Attention")
    qtbot.waitUntil(lambda: attention.model_view.filled_layers() == LAYERS, timeout=30_000)
    return attention


def _hold_logits(monkeypatch, first_only: bool = False):
    """The text trace's logits step held until `release` is set (or its job cancelled): (reached, set once one
    is held; release; the jobs held). first_only: a later text's logits are not held."""
    import desktop_app.ui.state as state_module

    reached, release, held_jobs = threading.Event(), threading.Event(), []
    real = state_module._add_logits

    def held(add_logits, drawn, job=None):
        if not (first_only and held_jobs):
            held_jobs.append(job)
            reached.set()
            while not release.wait(0.02) and not job.cancelled:
                pass
        return real(add_logits, drawn, job=job)

    monkeypatch.setattr(state_module, "_add_logits", held)
    return reached, release, held_jobs


def test_a_long_trace_paints_its_first_rows_shows_progress_and_is_cancelled_by_a_click(
        qtbot, six_layers, monkeypatch, isolated_user_files, error_watch):
    window, state = open_window(qtbot, six_layers, text=FIRST, watch=error_watch)
    attention = _attention(qtbot, window)
    first_ids = list(state.token_ids)
    hold = Hold(monkeypatch, SECOND)
    progress = window.trace_progress
    assert not progress.bar.isVisible()
    # the trace's clock: each layer takes 2 s (core.jobs.TimeLeft reads it when the trace starts and at each layer)
    from desktop_app.core.jobs import TimeLeft
    monkeypatch.setattr(TimeLeft, "clock", staticmethod(lambda: 2.0 * progress.bar.value()))

    _type(qtbot, window, SECOND)
    qtbot.waitUntil(hold.reached.is_set, timeout=30_000)
    click_panel_tab(qtbot, window, "Attention")
    # the worker is held after layer 2 of 6: its first two rows are painted, the bar says so
    qtbot.waitUntil(lambda: attention.model_view.filled_layers() == 2, timeout=30_000)
    qtbot.waitUntil(lambda: progress.bar.isVisible() and progress.bar.value() == 2, timeout=10_000)
    assert progress.bar.maximum() == LAYERS and progress.bar.text() == "layer 2 / 6 · about 8 s left"
    assert len(attention.model_view.boxes) == LAYERS * HEADS  # the whole grid, rows 3 to 6 still empty
    assert {l for l, _ in attention.model_view.images} == {0, 1}
    assert state.trace is None and state.token_ids != first_ids  # the new text's tokens, not the old trace
    assert state.token_ids == state.loaded.tokenizer.encode(SECOND)
    assert attention.status.text() == "Tracing the text: layer 2 of 6 ready…"
    assert not state._trace_job.done
    window.grab().save(str(isolated_user_files / "mid-trace.png"))

    qtbot.mouseClick(progress.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)  # the worker ended (cancelled)
    assert not progress.bar.isVisible()
    assert not hold.release.is_set()  # it was the cancel that ended the hold
    assert hold.held_layers() == [1, 2]  # stopped there
    # a clear cancelled state: none of the interrupted trace stays on show
    assert state.trace is None and state.token_ids == []
    assert state.trace_problem == "the trace was cancelled after layer 2 of 6"
    assert attention.model_view.filled_layers() == 0 and len(attention.model_view.boxes) == 0
    assert attention.status.text() == "No text traced for this model: the trace was cancelled after layer 2 of 6"
    model = click_panel_tab(qtbot, window, "Model")
    assert model.message_label.text().startswith("No text traced for this model: the trace was cancelled")
    error_watch.assert_clean()  # no error dialog, no error in the status bar

    hold.release.set()  # the next trace of the text runs through
    hold.next_release.set()
    _type(qtbot, window, THIRD)
    qtbot.waitUntil(lambda: state.trace is not None, timeout=30_000)
    assert state.token_ids == state.loaded.tokenizer.encode(THIRD)
    _attention(qtbot, window)
    error_watch.assert_clean()


def test_a_new_text_cancels_the_old_trace_whose_result_is_never_shown(qtbot, six_layers, monkeypatch,
                                                                       isolated_user_files, error_watch):
    window, state = open_window(qtbot, six_layers, text=FIRST, watch=error_watch)
    attention = _attention(qtbot, window)
    hold = Hold(monkeypatch, SECOND)
    shown: list = []  # every input put on show from now on: (token ids, whether a whole trace)
    state.trace_changed.connect(lambda trace: shown.append((list(state.token_ids), trace is not None)))
    painted: list = []  # every piece of a trace handed to the panels
    state.layers_ready.connect(lambda ready: painted.append((list(ready.enc.ids), ready.done)))

    _type(qtbot, window, SECOND)
    qtbot.waitUntil(hold.reached.is_set, timeout=30_000)
    qtbot.waitUntil(lambda: attention.model_view.filled_layers() == 2, timeout=30_000)
    second_ids = state.loaded.tokenizer.encode(SECOND)
    third_ids = state.loaded.tokenizer.encode(THIRD)
    assert painted == [(second_ids, 1), (second_ids, 2)]

    _type(qtbot, window, THIRD)  # the held trace is cancelled by the new text
    qtbot.waitUntil(lambda: state.trace is not None and state.token_ids == third_ids, timeout=30_000)
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    assert not hold.release.is_set()
    assert hold.held_layers() == [1, 2]
    assert (second_ids, True) not in shown  # the old text's trace never reached the panels whole...
    assert all(ids == third_ids for ids, _ in painted[2:])  # ...nor any more of its layers
    assert shown[-1] == (third_ids, True)
    assert not window.trace_progress.bar.isVisible()
    attention = _attention(qtbot, window)
    assert attention.patterns[0].shape[-1] == len(third_ids)
    error_watch.assert_clean()


def test_a_layer_on_its_way_when_cancel_is_clicked_is_never_painted(qtbot, six_layers, monkeypatch,
                                                                    isolated_user_files, error_watch):
    window, state = open_window(qtbot, six_layers, text=FIRST, watch=error_watch)
    attention = _attention(qtbot, window)
    hold = Hold(monkeypatch, SECOND)
    painted: list = []
    state.layers_ready.connect(lambda ready: painted.append(ready.done))

    _type(qtbot, window, SECOND)
    qtbot.waitUntil(hold.reached.is_set, timeout=30_000)
    qtbot.waitUntil(lambda: attention.model_view.filled_layers() == 2 and window.trace_progress.bar.isVisible(),
                    timeout=30_000)
    hold.release.set()
    # layer 3 is recorded and handed on (its signals wait in the UI thread's queue: no events run here)
    assert hold.next_reached.wait(30)
    qtbot.mouseClick(window.trace_progress.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    assert painted == [1, 2]  # layer 3 arrived after the click: dropped
    assert state.trace_problem == "the trace was cancelled after layer 2 of 6"
    assert attention.model_view.filled_layers() == 0 and not window.trace_progress.bar.isVisible()
    error_watch.assert_clean()


def test_a_quick_trace_goes_from_one_result_to_the_next_without_pieces(qtbot, six_layers, monkeypatch,
                                                                       isolated_user_files, error_watch):
    from desktop_app.ui.state import AppState

    monkeypatch.setattr(AppState, "PIECES_AFTER_S", 3600.0)  # no trace here runs that long
    window, state = open_window(qtbot, six_layers, text=FIRST, watch=error_watch)
    _attention(qtbot, window)
    events: list = []
    state.layers_ready.connect(lambda ready: events.append("piece"))
    state.trace_progress.connect(lambda done, total: events.append(("progress", done, total)))
    state.trace_changed.connect(lambda trace: events.append("whole" if trace is not None else "cleared"))
    _type(qtbot, window, SECOND)
    qtbot.waitUntil(lambda: state.trace is not None and state.token_ids == state.loaded.tokenizer.encode(SECOND),
                    timeout=30_000)
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    assert events[-2:] == [("progress", 0, 0), "whole"]
    # (typing may have traced a prefix first) the bar never shown, the panels never cleared between
    assert "piece" not in events and "cleared" not in events
    assert all(e == ("progress", 0, 0) for e in events if isinstance(e, tuple))
    error_watch.assert_clean()


def test_a_trace_refused_for_memory_offers_its_first_layers_and_a_click_traces_them(
        qtbot, six_layers, monkeypatch, isolated_user_files):
    from desktop_app.app.tracing import estimated_trace_bytes
    from desktop_app.core import devices

    window, state = open_window(qtbot, six_layers, text=FIRST)
    _attention(qtbot, window)
    n = len(state.loaded.tokenizer.encode(SECOND))
    have = (estimated_trace_bytes(state.loaded, n, layers=3) + estimated_trace_bytes(state.loaded, n, layers=4)) // 2
    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": have)
    offer = window.trace_progress.layers_button
    assert not offer.isVisible()

    _type(qtbot, window, SECOND)
    qtbot.waitUntil(offer.isVisible, timeout=30_000)
    assert offer.text() == "Trace the first 3 of 6 layers"
    assert state.trace is None and "the first 3 of 6 layers" in state.trace_problem
    attention = click_panel_tab(qtbot, window, "Attention")
    assert attention.status.text().startswith(f"No text traced for this model: a trace of {n} tokens through 6 layers")
    window.grab().save(str(isolated_user_files / "refused.png"))

    qtbot.mouseClick(offer, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: state.trace is not None, timeout=30_000)
    assert state.trace.n_layers == 3 and state.token_ids == state.loaded.tokenizer.encode(SECOND)
    qtbot.waitUntil(lambda: attention.model_view.filled_layers() == 3, timeout=30_000)
    assert len(attention.model_view.boxes) == 3 * HEADS and not offer.isVisible()
    assert attention.status.text().startswith(f"{n} tokens, 3 layers")


def test_a_screenshot_waits_for_the_whole_trace_not_its_first_pieces(qtbot, six_layers, monkeypatch,
                                                                      isolated_user_files):
    from desktop_app.ui.app import StartupWatcher

    window, state = open_window(qtbot, six_layers, text=FIRST)
    hold = Hold(monkeypatch, SECOND)
    watcher = StartupWatcher(state, expect_model=True)  # what --screenshot waits on
    watcher.model_loaded = True
    _type(qtbot, window, SECOND)
    qtbot.waitUntil(hold.reached.is_set, timeout=30_000)
    attention = click_panel_tab(qtbot, window, "Attention")  # opened mid-trace: paints the layers so far
    qtbot.waitUntil(lambda: attention.model_view.filled_layers() == 2, timeout=30_000)
    assert not watcher.ready  # the text is on show, but only two of its layers
    hold.release.set()
    hold.next_release.set()
    qtbot.waitUntil(lambda: watcher.ready, timeout=30_000)
    assert state.trace is not None and state.trace.n_layers == LAYERS


def test_opening_another_model_cancels_the_trace_and_clears_its_pieces(qtbot, six_layers, model_dirs, monkeypatch,
                                                                        isolated_user_files, error_watch):
    window, state = open_window(qtbot, six_layers, text=FIRST, watch=error_watch)
    attention = _attention(qtbot, window)
    hold = Hold(monkeypatch, SECOND)
    shown: list = []  # (model name, token ids, whole trace?) of every input put on show from now on
    state.trace_changed.connect(lambda trace: shown.append((state.loaded.name, list(state.token_ids),
                                                            trace is not None)))
    _type(qtbot, window, SECOND)
    qtbot.waitUntil(hold.reached.is_set, timeout=30_000)
    attention = click_panel_tab(qtbot, window, "Attention")
    qtbot.waitUntil(lambda: attention.model_view.filled_layers() == 2, timeout=30_000)
    second_ids = state.loaded.tokenizer.encode(SECOND)

    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(model_dirs["demo"])  # the held trace is cancelled: it ends at its next layer
    qtbot.waitUntil(lambda: state.trace is not None and state.loaded.name != "six-layers", timeout=30_000)
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    assert not hold.release.is_set()
    assert hold.held_layers() == [1, 2]
    assert ("six-layers", second_ids, True) not in shown  # the cancelled trace never arrived whole
    demo = state.loaded.config
    assert state.token_ids == state.loaded.tokenizer.encode(SECOND) and shown[-1][2]
    qtbot.waitUntil(lambda: attention.model_view.filled_layers() == demo.n_layers, timeout=30_000)
    assert len(attention.model_view.boxes) == demo.n_layers * demo.n_heads
    assert not window.trace_progress.bar.isVisible()
    error_watch.assert_clean()


def test_the_rows_are_made_in_a_worker_and_kept_when_the_whole_trace_lands(qtbot, six_layers, monkeypatch,
                                                                           isolated_user_files):
    import desktop_app.ui.panels.attention as attention_module

    window, state = open_window(qtbot, six_layers, text=FIRST)
    attention = _attention(qtbot, window)
    made_on: list = []  # the thread each thumbnail was made on
    real = attention_module.thumbnails

    def recording(patterns, *args):
        rows = real(patterns, *args)
        made_on.extend([threading.current_thread() is threading.main_thread()] * len(rows))
        return rows

    monkeypatch.setattr(attention_module, "thumbnails", recording)
    hold = Hold(monkeypatch, SECOND)
    _type(qtbot, window, SECOND)
    qtbot.waitUntil(hold.reached.is_set, timeout=30_000)
    qtbot.waitUntil(lambda: attention.model_view.filled_layers() == 2, timeout=30_000)
    first_rows = list(attention._partial_thumbs)
    hold.release.set()
    hold.next_release.set()
    qtbot.waitUntil(lambda: attention.data is not None and attention.data.aggregated, timeout=30_000)
    assert state.trace.n_layers == LAYERS and attention.model_view.filled_layers() == LAYERS
    assert all(a is b for a, b in zip(attention.data.thumbs[0] + attention.data.thumbs[1],
                                      first_rows[0] + first_rows[1]))  # the same arrays: made once, as it arrived
    assert made_on and not any(made_on)  # never on the UI thread


def test_the_attention_panel_is_painted_before_the_logits_and_the_model_panel_then_shows_a_whole_traces(
        qtbot, six_layers, monkeypatch, isolated_user_files, error_watch):
    """The logits (the unembedding of every position: ~1 s at Qwen2.5-0.5B's 1,024 tokens) are a second step
    of the text's trace, after its blocks: the Attention panel's model view is painted, and a screenshot may
    be taken, while they are still to come (held here); every panel shows the trace only once they are in
    it, the values of a whole forward's trace."""
    import torch

    from desktop_app.app.tracing import trace_input
    from desktop_app.ui.panels.model import token_probabilities
    from desktop_app.ui.app import StartupWatcher, drawn_before_the_logits

    window, state = open_window(qtbot, six_layers, text=FIRST, watch=error_watch)
    attention = _attention(qtbot, window)
    reached, release, _ = _hold_logits(monkeypatch)
    watcher = StartupWatcher(state, expect_model=True, drawn_early=lambda: drawn_before_the_logits(window))
    watcher.model_loaded = True
    _type(qtbot, window, SECOND)
    qtbot.waitUntil(reached.is_set, timeout=30_000)
    attention = click_panel_tab(qtbot, window, "Attention")
    qtbot.waitUntil(lambda: attention.model_view.filled_layers() == LAYERS, timeout=30_000)
    blocks = state.tracing.trace
    assert "logits" not in blocks and f"blocks.{LAYERS - 1}.resid_post" in blocks and "final_norm.out" in blocks
    assert state.trace is None and state.token_ids == state.loaded.tokenizer.encode(SECOND)
    assert attention.drawn_before_the_logits() and attention.screenshot_ready() and watcher.ready
    assert attention.status.text() == f"Tracing the text: all {LAYERS} layers ready, the logits next…"
    assert attention.tokens.canvas.ids == state.token_ids  # its tokens above the grid too
    window.grab().save(str(isolated_user_files / "before-the-logits.png"))
    model = click_panel_tab(qtbot, window, "Model")  # no colours of another trace's logits meanwhile
    assert model.probabilities is None and model.token_strip.canvas.values is None
    assert not drawn_before_the_logits(window)  # (the Model panel draws nothing before the logits)

    release.set()
    qtbot.waitUntil(lambda: state.trace is not None, timeout=30_000)
    qtbot.waitUntil(lambda: model.probabilities is not None, timeout=30_000)
    assert state.trace is blocks and state._trace_job is None and not window.trace_progress.bar.isVisible()
    _, whole = trace_input(state.loaded, SECOND, None)  # one forward, logits included
    assert torch.equal(state.trace["logits"], whole["logits"])
    assert torch.equal(state.trace["final_norm.out"], whole["final_norm.out"])
    expected = token_probabilities(whole["logits"][0], state.token_ids)
    assert list(model.probabilities[1:]) == list(expected[1:])  # (the first token has none: nan)
    error_watch.assert_clean()


def test_a_new_text_while_the_logits_are_computed_is_traced_and_the_old_one_never_shown(
        qtbot, six_layers, monkeypatch, isolated_user_files, error_watch):
    window, state = open_window(qtbot, six_layers, text=FIRST, watch=error_watch)
    _attention(qtbot, window)
    reached, release, held_jobs = _hold_logits(monkeypatch, first_only=True)  # the first text's logits only
    shown: list = []
    state.trace_changed.connect(lambda trace: shown.append((list(state.token_ids), trace is not None)))
    _type(qtbot, window, SECOND)
    qtbot.waitUntil(reached.is_set, timeout=30_000)
    _type(qtbot, window, THIRD)  # cancels the held step: the second text's trace is never shown whole
    third_ids = state.loaded.tokenizer.encode(THIRD)
    qtbot.waitUntil(lambda: state.trace is not None and state.token_ids == third_ids, timeout=30_000)
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    assert held_jobs[0].cancelled and not release.is_set()
    assert (state.loaded.tokenizer.encode(SECOND), True) not in shown and shown[-1] == (third_ids, True)
    assert "logits" in state.trace
    error_watch.assert_clean()


def test_the_logits_wait_until_the_attention_panel_has_made_its_last_row(qtbot, six_layers, monkeypatch,
                                                                        isolated_user_files, error_watch):
    """The logits take every free core: they start once the model view's rows are all made and painted
    (AppState.hold_logits: the panel says so, drawing_ended), not beside the last row's thumbnails; then the
    trace lands as before. (The most they wait is made longer than the test: the panel's word starts them.)"""
    import desktop_app.ui.panels.attention as attention_module
    import desktop_app.ui.state as state_module

    monkeypatch.setattr(state_module.AppState, "LOGITS_WAIT_S", 600.0)

    window, state = open_window(qtbot, six_layers, text=FIRST, watch=error_watch)
    attention = _attention(qtbot, window)
    last_row, release = threading.Event(), threading.Event()
    made, real_thumbnails = [], attention_module.thumbnails

    def thumbnails(patterns, *args):
        made.append(len(patterns))
        if len(made) == LAYERS:  # the new text's last layer: held until released
            last_row.set()
            release.wait(30)
        return real_thumbnails(patterns, *args)

    rows_when_the_logits_started = []
    real_logits = state_module._add_logits

    def add_logits(add_logits, drawn, job=None):
        def counted():
            rows_when_the_logits_started.append(attention.model_view.filled_layers())
            add_logits()
        return real_logits(counted, drawn, job=job)

    monkeypatch.setattr(attention_module, "thumbnails", thumbnails)
    monkeypatch.setattr(state_module, "_add_logits", add_logits)
    _type(qtbot, window, SECOND)
    qtbot.waitUntil(last_row.is_set, timeout=30_000)
    qtbot.waitUntil(lambda: state.tracing is not None and state.tracing.done == LAYERS, timeout=30_000)
    qtbot.wait(100)  # (turns of the event loop for a logits step not held to start in)
    assert rows_when_the_logits_started == [] and state.trace is None
    release.set()
    qtbot.waitUntil(lambda: state.trace is not None, timeout=30_000)
    assert rows_when_the_logits_started == [LAYERS] and "logits" in state.trace
    assert state.token_ids == state.loaded.tokenizer.encode(SECOND)
    error_watch.assert_clean()


def test_the_screenshot_watcher_hears_that_the_rows_are_drawn_before_the_logits(
        qtbot, six_layers, monkeypatch, isolated_user_files, error_watch):
    """--screenshot's StartupWatcher waits for the panel on show drawn from the blocks without asking it on a
    timer: the Attention panel's last row made (AppState.drawing_done) ends its wait while the logits are held."""
    from desktop_app.ui.app import StartupWatcher, drawn_before_the_logits

    window, state = open_window(qtbot, six_layers, text=FIRST, watch=error_watch)
    _attention(qtbot, window)
    _, release, _ = _hold_logits(monkeypatch)
    watcher = StartupWatcher(state, expect_model=True, drawn_early=lambda: drawn_before_the_logits(window))
    watcher.model_loaded = True
    told: list[bool] = []  # whether the watcher was ready each time something told it of a change
    watcher.on_change = lambda: told.append(watcher.ready)  # (what its wait() quits its event loop on)
    _type(qtbot, window, SECOND)
    attention = click_panel_tab(qtbot, window, "Attention")
    try:
        qtbot.waitUntil(lambda: True in told, timeout=20_000)  # no timer asks drawn_early: the panel's word
        assert not watcher.traced and state.trace is None and attention.drawn_before_the_logits()
    finally:
        release.set()
    qtbot.waitUntil(lambda: state.trace is not None and state.token_ids == state.loaded.tokenizer.encode(SECOND),
                    timeout=30_000)
    error_watch.assert_clean()
