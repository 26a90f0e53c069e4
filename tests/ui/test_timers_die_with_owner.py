"""A timer started for a widget (or item) does not call into it once it is deleted: no call, no error
(RuntimeError: Internal C++ object already deleted, for a user a crash risk)."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import shiboken6

from desktop_app.ui import workers
from desktop_app.ui.state import AppState
from desktop_app.ui.widgets.edge_layer import EdgeLayer
from tiny_models import tiny_model


def test_an_edge_layer_deleted_before_its_settle_timer_fires_does_not_render(qtbot, monkeypatch):
    """EdgeLayer renders its image SETTLE_MS after its segments change: an item deleted meanwhile (its
    plot cleared) is not rendered; its timer was parentless and called _render on the deleted item."""
    calls = []
    monkeypatch.setattr(EdgeLayer, "_render", lambda self: calls.append(shiboken6.isValid(self)))
    layer = EdgeLayer()
    layer.set_buckets([])  # starts the settle timer
    assert layer._timer.isActive()
    shiboken6.delete(layer)
    qtbot.wait(EdgeLayer.SETTLE_MS + 150)
    assert calls == []


def test_the_logits_fallback_sets_nothing_once_the_trace_has_landed(qtbot, monkeypatch):
    """Why state.py's 2 s logits fallback, `QTimer.singleShot(ms, drawn.set)`, needs no context object: its
    callable is a method of a plain threading.Event, which PySide holds weakly, so once the trace has landed
    (the job and the state let go of the event) it sets nothing; it touches no Qt object. Tying it to the
    state instead could leave a worker waiting on an event no timer would set. (Passes before and after
    this branch: it guards that choice, e.g. against a lambda that would hold the event.)"""
    import desktop_app.ui.state as state_module

    sets = []  # (whether the trace had landed) at each set of a logits job's `drawn`

    class Drawn(threading.Event):
        def set(self):
            sets.append(state.trace is not None)
            super().set()

    monkeypatch.setattr(state_module, "threading", SimpleNamespace(Event=Drawn))
    monkeypatch.setattr(AppState, "LOGITS_WAIT_S", 1.0)
    state = AppState()
    state.loaded = tiny_model("the cat sat on the mat. ", "gpt2")
    state.set_text("the cat sat")
    qtbot.waitUntil(lambda: state.trace is not None, timeout=30_000)
    assert sets[:1] == [False]  # no holder drawing: the logits started a turn later
    qtbot.waitUntil(lambda: not workers.active_jobs(), timeout=10_000)
    qtbot.wait(round(AppState.LOGITS_WAIT_S * 1000) + 300)  # the fallback's time, and more
    assert True not in sets  # nothing set once the trace had landed
