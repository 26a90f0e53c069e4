"""The Generate panel never runs the model on the UI thread: every module's forward a click causes is made in a
worker, also when the view refreshes while a run ends (a node whose forward waited for its first read would
be made by whichever thread read it first: the panel's runs make every node at once)."""
from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt

from desktop_app.core import jobs
from tiny_models import tiny_model
from .walkthrough import show_generation_panel

TEXT = "the cat sat on the mat and the dog sat on the log. "


@pytest.fixture
def panel(qtbot):
    return show_generation_panel(qtbot, tiny_model(TEXT, init_std=0.3))


@pytest.fixture
def forward_threads(panel):
    """The thread of every module's forward the model makes (the model itself, each block, each product)."""
    threads: list[int] = []
    hooks = [m.register_forward_pre_hook(lambda module, args: threads.append(threading.get_ident()) and None)
             for m in panel.state.loaded.model.modules()]
    yield threads
    for h in hooks:
        h.remove()


def _idle(qtbot, p) -> None:
    qtbot.waitUntil(lambda: not p.busy and not p._running, timeout=10_000)


def test_run_n_makes_every_forward_in_the_worker_also_when_the_view_refreshes_as_it_ends(
        qtbot, panel, forward_threads, monkeypatch):
    """The worker is held after its run's last progress report until the view has refreshed (the 40 ms
    throttle fired on the UI thread): that refresh reads the last node's distribution, which a run that left its
    last forward for the first read (GenerationSession.run(lazy_last=True)) would have made right there."""
    refreshed = threading.Event()
    panel._refresh_timer.timeout.connect(refreshed.set)  # after the panel's own refresh (connected first)
    real_progress = jobs.JobControl.progress

    def held_at_the_end(self, done: int, total: int, message: str = "") -> None:
        real_progress(self, done, total, message)
        if done == total and threading.current_thread() is not threading.main_thread():
            refreshed.clear()
            assert refreshed.wait(10), "the view did not refresh while the run was ending"
    monkeypatch.setattr(jobs.JobControl, "progress", held_at_the_end)
    panel.prompt.setText("the ")
    panel.run_n.setValue(5)
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.session is not None and panel.session.current.depth == 5, timeout=10_000)
    _idle(qtbot, panel)
    ui = threading.get_ident()
    assert forward_threads and ui not in forward_threads
    # and every node the view may read is there already: reading them all on this thread runs nothing
    made = len(forward_threads)
    panel.refresh()
    for node in panel.session.current.path():
        assert node.next_logits is not None and node.record
    assert len(forward_threads) == made
    assert panel.bars.chosen is None and len(panel.bars.token_ids) > 0  # the last step's distribution is on show


def test_selecting_a_prompt_token_hands_on_its_trace_from_a_worker(qtbot, panel, forward_threads):
    """The prompt's trace rebuilds each head's output (products of the model's weights): in a worker."""
    panel.prompt.setText("the ")
    qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.session is not None and panel.session.current.depth == 1, timeout=10_000)
    _idle(qtbot, panel)
    forward_threads.clear()
    with qtbot.waitSignal(panel.state.trace_changed, timeout=10_000) as handed:
        qtbot.mouseClick(panel.strip.canvas, Qt.MouseButton.LeftButton, pos=panel.strip.chip_center(1))
    assert handed.args[0].pattern(0).shape[-1] == len(panel.session.prompt)
    assert panel.state.token_ids == panel.session.prompt
    assert forward_threads and threading.get_ident() not in forward_threads


def test_a_strategy_picked_lays_the_weights_out_in_the_next_steps_worker(qtbot, panel, monkeypatch):
    """Beam search's steps and one-row steps want the weights laid out differently (a bfloat16 model: a
    prepacked copy of every weight, a second or so at 0.5B); picking another strategy hands the settings on
    from the UI thread, and the next step's worker lays them out."""
    model = panel.state.loaded.model
    real, packed = model.pack_for_decoding, []

    def recording(prepack: bool = True) -> None:
        packed.append((threading.get_ident(), prepack))
        real(prepack=prepack)
    monkeypatch.setattr(model, "pack_for_decoding", recording)
    panel.prompt.setText("the ")
    panel.strategy.setCurrentText("beam")
    qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.session is not None and panel.session.current.depth == 1, timeout=10_000)
    _idle(qtbot, panel)
    panel.strategy.setCurrentText("greedy")
    assert panel.session.settings.strategy == "greedy"  # handed on at once: the session is idle
    qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.session.current.depth == 2, timeout=10_000)
    _idle(qtbot, panel)
    assert [p for _, p in packed] == [False, True]  # the beam session's layout, then the one-row steps'
    assert threading.get_ident() not in [t for t, _ in packed]
