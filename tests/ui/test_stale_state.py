"""Issue 13, defects 1 and 4: what the panels show always belongs to the open model and agrees with
the Model panel's text box (driven by clicks and typing, as a person would)."""
from __future__ import annotations

from PySide6.QtCore import Qt

from .walkthrough import TEXTS, open_window


def _wait_traced(qtbot, state):
    qtbot.waitUntil(lambda: state._trace_job is None or state._trace_job.done, timeout=30_000)


def _show_tab(qtbot, window, title):
    bar = window.tabs.tabBar()
    index = next(i for i in range(window.tabs.count()) if window.tabs.tabText(i) == title)
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(index).center())
    return window.slot(title).panel


def test_opening_a_model_that_cannot_trace_the_text_clears_the_old_models_views(qtbot, model_dirs,
                                                                                 isolated_user_files):
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    attention = _show_tab(qtbot, window, "Attention")
    layers = _show_tab(qtbot, window, "Layers")
    qtbot.waitUntil(lambda: len(attention.model_view.boxes) > 0, timeout=30_000)
    demo_grid = len(attention.model_view.boxes)
    assert demo_grid == state.loaded.config.n_layers * state.loaded.config.n_heads
    qtbot.waitUntil(lambda: layers.result is not None, timeout=30_000)

    # 'notok' has no tokenizer: the demo's English text is not a list of ids for it
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(model_dirs["notok"])
    _wait_traced(qtbot, state)
    qtbot.waitUntil(lambda: state.trace is None and state.trace_problem != "", timeout=10_000)
    assert state.token_ids == []
    assert "token ids" in state.trace_problem

    # never the old model's 6 x 12 grid (2 x 4 would be the new model's, none is right: no trace)
    assert len(attention.model_view.boxes) in (0, 2 * 4)
    assert attention.patterns == [] and attention.tokens.count() == 0
    assert attention.layer_spin.maximum() == 0 and attention.head_spin.maximum() == 0
    assert attention.status.text().startswith("No text traced for this model:")
    assert layers.result is None and layers.tokens.count() == 0 and layers.lens_view.lens.rowCount() == 0
    assert layers.status.text().startswith("No text traced for this model:")
    model = _show_tab(qtbot, window, "Model")
    assert model.token_strip.count() == 0
    assert model.message_label.text().startswith("No text traced for this model:")

    # typing ids the new model can read brings its own trace: 2 layers x 4 heads
    _show_tab(qtbot, window, "Model")
    model.text_edit.selectAll()
    qtbot.keyClicks(model.text_edit, TEXTS["notok"])
    qtbot.waitUntil(lambda: state.trace is not None, timeout=30_000)
    _wait_traced(qtbot, state)
    attention = _show_tab(qtbot, window, "Attention")
    qtbot.waitUntil(lambda: len(attention.model_view.boxes) == 2 * 4, timeout=30_000)
    assert model.message_label.text() == ""


def test_chips_from_a_generation_step_are_marked_and_the_button_brings_back_the_texts(qtbot, model_dirs,
                                                                                     isolated_user_files):
    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    model = window.panel("Model")
    # a job is marked done before its result reaches the UI thread: wait for the tokens themselves
    qtbot.waitUntil(lambda: state.trace is not None and len(state.token_ids) > 0, timeout=30_000)
    text_ids = list(state.token_ids)
    assert model.token_strip.count() == len(text_ids)
    assert not model.back_button.isVisible()

    # what the Generate panel does when a generated token is inspected: a longer sequence's trace
    import torch

    loaded = state.loaded
    generated = text_ids + loaded.tokenizer.encode(" and then")
    _, trace = loaded.model.run_with_trace(torch.tensor([generated]))
    state.show_trace(trace, generated)
    assert model.token_strip.count() == len(generated)
    assert model.text_edit.toPlainText() == TEXTS["demo"]  # the text box keeps the user's text...
    assert model.back_button.isVisible()  # ...and the panel says the chips are not its tokens
    assert "generation step" in model.source_label.text()

    qtbot.mouseClick(model.back_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: state.token_ids == text_ids and state.trace_source == "text", timeout=30_000)
    qtbot.waitUntil(lambda: model.token_strip.count() == len(text_ids), timeout=10_000)
    assert not model.back_button.isVisible() and not model.source_label.isVisible()


# -- issue 25 §4: no panel shows a result computed for another model or text ----------------------


def _open_from_recent(qtbot, window, state, folder):
    """File > Open Recent > folder, as a person picks it (the menu fills itself when shown)."""
    import os

    window.recent_menu.aboutToShow.emit()
    action = next(a for a in window.recent_menu.actions() if a.text() == os.path.abspath(str(folder)))
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        action.trigger()
    _wait_traced(qtbot, state)


def _top_token(loaded, ids):
    import torch

    with torch.no_grad():
        return int(loaded.model(torch.tensor([ids])).logits[0, -1].argmax())


def test_opening_another_model_never_leaves_the_old_attribution_on_show(qtbot, model_dirs, isolated_user_files):
    """What if > Direct logit attribution computed on one model; another model opened from the Recent
    menu: the old summary, bars and labels go, and what comes is the new model's (its tokens)."""
    window, state = open_window(qtbot, model_dirs["demo"], text="Alice and the rabbit hole.")
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(model_dirs["llama"])
    _wait_traced(qtbot, state)
    panel = _show_tab(qtbot, window, "What if")
    qtbot.mouseClick(panel.attribute_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.dla_chart.attribution is not None and (panel._dla_job is None or panel._dla_job.done), timeout=30_000)
    llama = state.loaded
    assert panel.dla_chart.attribution.head_table.shape == (llama.config.n_layers, llama.config.n_heads)
    old_summary = panel.dla_status.text()
    assert old_summary.startswith("logit")

    seen, cleared = [], []  # what the chart shows once the model changed; the status line at that moment
    state.model_changed.connect(lambda _: cleared.append((panel.dla_status.text(), panel.dla_chart.attribution)))
    real_set = panel.dla_chart.set_attribution
    panel.dla_chart.set_attribution = lambda a, label: (cleared and seen.append((a, label)), real_set(a, label))
    _open_from_recent(qtbot, window, state, model_dirs["demo"])
    demo = state.loaded
    assert demo is not llama
    # the moment the model changed, nothing of the old attribution was left...
    assert cleared[0][0] != old_summary and cleared[0][1] is None
    # ...and what comes is recomputed for the new one
    qtbot.waitUntil(lambda: panel.dla_chart.attribution is not None and (panel._dla_job is None or panel._dla_job.done)
                    and panel.dla_chart.attribution.head_table.shape[0] == demo.config.n_layers, timeout=30_000)
    assert panel.dla_status.text() != old_summary and panel.dla_status.text().startswith("logit")
    assert seen and all(a.head_table.shape == (demo.config.n_layers, demo.config.n_heads) for a, _ in seen)
    attribution, label = seen[-1]
    assert attribution.head_table.shape == (demo.config.n_layers, demo.config.n_heads)
    top = _top_token(demo, state.token_ids)
    assert attribution.token_id == top
    assert label.startswith(f"token {demo.tokenizer.token_strings([top])[0]!r}")  # the new model's token, its title
    assert repr(demo.tokenizer.token_strings([top])[0]) in panel.dla_chart.plot_item.titleLabel.text


def test_a_late_attribution_for_the_old_model_is_dropped(qtbot, model_dirs, isolated_user_files, monkeypatch):
    """An attribution still running when another model opens: its result, when it comes, is not shown."""
    import threading

    import desktop_app.ui.panels.whatif as whatif

    window, state = open_window(qtbot, model_dirs["llama"], text="Alice and the rabbit hole.")
    real, gate, started, ended = whatif.attribute, threading.Event(), [], []

    def held(loaded, *args):  # the old model's attribution waits until the new model is open
        started.append(loaded)
        if loaded is not state.loaded or not gate.is_set():
            gate.wait(60)
        try:
            return real(loaded, *args)
        finally:
            ended.append(loaded)

    monkeypatch.setattr(whatif, "attribute", held)
    try:
        panel = _show_tab(qtbot, window, "What if")
        qtbot.mouseClick(panel.attribute_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: len(started) >= 1, timeout=30_000)
        llama = started[0]
        shown = []
        real_set = panel.dla_chart.set_attribution
        panel.dla_chart.set_attribution = lambda a, label: (shown.append(a), real_set(a, label))
        with qtbot.waitSignal(state.model_changed, timeout=30_000):
            window.open_model(model_dirs["demo"])
        _wait_traced(qtbot, state)
        assert state.loaded is not llama
        assert not panel.dla_status.text().startswith("logit")  # nothing shown yet for the new model
    finally:
        gate.set()
    # every job has ended and its result has been handed over (or dropped): the demo's bars only
    demo = state.loaded
    qtbot.waitUntil(lambda: len(ended) == len(started) and panel.dla_chart.attribution is not None
                    and (panel._dla_job is None or panel._dla_job.done), timeout=30_000)
    qtbot.waitUntil(lambda: panel.dla_chart.attribution.head_table.shape == (demo.config.n_layers,
                                                                               demo.config.n_heads), timeout=30_000)
    assert llama in ended  # the old model's job did finish...
    assert all(a.head_table.shape == (demo.config.n_layers, demo.config.n_heads) for a in shown)  # ...unseen
    assert panel.dla_chart.attribution.token_id == _top_token(demo, state.token_ids)


# -- issue 25 §4, the remaining panels: Generate, Image, Dynamics ---------------------------------


def _gated(module, name, monkeypatch):
    """Replace module.name by a version that waits for the returned event while it runs for a model no
    longer current (the old model's job, still in its worker when the new model arrives)."""
    import threading

    real, gate, started, ended = getattr(module, name), threading.Event(), [], []

    def held(*args, **kwargs):
        started.append(args)
        gate.wait(60)
        try:
            return real(*args, **kwargs)
        finally:
            ended.append(args)

    monkeypatch.setattr(module, name, held)
    return gate, started, ended


def test_a_generation_step_inspected_on_the_old_model_never_reaches_the_new_one(qtbot, model_dirs, isolated_user_files,
                                                                                monkeypatch):
    """Generate: Step, then a click on the generated token (its logit lens and its trace for every
    panel); another model opens from the Recent menu while that is computed: the old model's lens
    and trace never show, and the session is cleared."""
    import desktop_app.ui.panels.generation_views as views

    window, state = open_window(qtbot, model_dirs["demo"], text="Alice and the rabbit hole.")
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(model_dirs["llama"])
    _wait_traced(qtbot, state)
    gen = _show_tab(qtbot, window, "Generate")
    qtbot.mouseClick(gen.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: gen.session is not None and gen.session.current.depth == 1 and not gen.busy,
                    timeout=30_000)
    llama, n_prompt = state.loaded, len(gen.session.prompt)
    gate, started, ended = _gated(views, "_inspect", monkeypatch)
    shown = []  # every trace handed to the panels once the model changed
    try:
        canvas = gen.strip.canvas
        qtbot.mouseClick(canvas, Qt.MouseButton.LeftButton, pos=gen.strip.chip_center(n_prompt))  # the token
        qtbot.waitUntil(lambda: len(started) == 1, timeout=30_000)
        state.model_changed.connect(lambda _: state.trace_changed.connect(
            lambda trace: shown.append((state.trace_source, trace))))
        _open_from_recent(qtbot, window, state, model_dirs["demo"])
        assert state.loaded is not llama
        assert gen.session is None and gen.tree.topLevelItemCount() == 0 and gen.strip.count() == 0
    finally:
        gate.set()
    qtbot.waitUntil(lambda: len(ended) == 1 and not gen.busy, timeout=30_000)
    _wait_traced(qtbot, state)
    qtbot.wait(50)  # nothing queued on the UI thread may still bring it
    assert all(source != "generation" for source, _ in shown)  # the old step's trace never reached the panels
    assert state.trace_source == "text" and state.trace is not None
    assert state.trace["logits"].shape[-1] == state.loaded.config.vocab_size
    assert gen.session is None and gen.lens_table.rowCount() == 0
    assert "step" not in gen.tabs.tabText(gen.tabs.indexOf(gen.lens_table))
    assert not gen.status.text().startswith("Step 1:")


def test_a_generation_started_before_the_edits_changed_starts_again_with_them(qtbot, monkeypatch):
    """Generate: Step starts a session; the what-if edits change while its prompt runs: the session
    that lands is the edited model's (started again), never one made with the previous edits."""
    import desktop_app.ui.panels.generation_views as views
    from desktop_app.core.interventions import Intervention

    from .test_generation_panel import _make

    p = _make(qtbot)
    p.prompt.setText("the ")
    gate, started, ended = _gated(views, "_start_decoder", monkeypatch)
    try:
        qtbot.mouseClick(p.step_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: len(started) == 1, timeout=30_000)
        p.state.set_interventions([Intervention("blocks.1.attn.head.2")])
    finally:
        gate.set()
    qtbot.waitUntil(lambda: p.session is not None and p.session.current.depth == 1 and not p.busy, timeout=30_000)
    assert len(started) == 2  # started again for the new edits...
    assert [iv.target for iv in p.session.interventions] == ["blocks.1.attn.head.2"]  # ...and made with them


def _vit_dir(tmp_path):
    import pytest

    digit_vit = pytest.importorskip("digit_vit")
    digit_vit.skip_without_digits()
    return digit_vit.save_digit_vit(tmp_path / "vit")


def test_an_image_read_for_the_old_vit_never_shows_on_the_new_model(qtbot, model_dirs, isolated_user_files,
                                                                       tmp_path, monkeypatch):
    """Image: Open image… on a ViT (a file it cannot decode); another model opens from the Recent menu
    while the file is read: neither that ViT's image, prediction nor its error shows on the new model."""
    import desktop_app.ui.panels.image as image
    from PySide6.QtWidgets import QFileDialog

    vit = _vit_dir(tmp_path)
    window, state = open_window(qtbot, model_dirs["demo"], text="Alice and the rabbit hole.")
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(vit)
    _wait_traced(qtbot, state)
    panel = _show_tab(qtbot, window, "Image")
    qtbot.waitUntil(lambda: panel.result is not None, timeout=30_000)
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not a png at all")
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(bad), "")))
    gate, started, ended = _gated(image, "file_pixels", monkeypatch)
    try:
        qtbot.mouseClick(panel.open_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: len(started) == 1, timeout=30_000)
        vit_model = state.loaded
        _open_from_recent(qtbot, window, state, model_dirs["demo"])
        assert state.loaded is not vit_model and not state.takes_images()
    finally:
        gate.set()
    qtbot.waitUntil(lambda: len(ended) == 1, timeout=30_000)
    qtbot.wait(50)  # nothing queued on the UI thread may still bring it
    assert str(bad) not in panel.message.text()  # the old ViT's error never lands on the new model
    assert panel.message.text().startswith("The Image view is for vision transformers")
    assert panel.result is None and panel.canvas.rgb is None and panel.prediction.text() == ""


def test_the_image_panel_shows_the_edited_vit(qtbot, isolated_user_files, tmp_path):
    """Image: an ablation (the what-if edits) analyses the shown digit again, with the edit applied;
    removing it brings back the model as trained."""
    import torch

    from desktop_app.core.interventions import Intervention, resolve

    window, state = open_window(qtbot, _vit_dir(tmp_path))
    panel = _show_tab(qtbot, window, "Image")
    qtbot.waitUntil(lambda: panel.result is not None, timeout=30_000)
    plain, pixels = panel.result["probs"], panel.pixels
    edits = [Intervention("blocks.1.mlp.out"), Intervention("blocks.0.mlp.out")]
    state.set_interventions(edits)
    qtbot.waitUntil(lambda: panel.result is not None and not np_equal(panel.result["probs"], plain), timeout=30_000)
    x = torch.from_numpy(pixels)[None]
    loaded = state.loaded
    with torch.no_grad():
        out, _ = loaded.model.run_with_trace(x, names=("logits",), interventions=resolve(loaded.model, x, edits))
    want = torch.softmax(out.logits[0].float(), -1).numpy()
    assert abs(panel.result["probs"] - want).max() < 1e-5
    state.set_interventions([])
    qtbot.waitUntil(lambda: np_equal(panel.result["probs"], plain), timeout=30_000)


def np_equal(a, b) -> bool:
    import numpy as np

    return a is not None and b is not None and np.allclose(a, b, atol=1e-6)


def _tokens_d(state) -> int:
    """The width of the tokens in the trace on show."""
    from desktop_app.core import dynamics as dy

    return dy.trace_tokens(state.trace, dy.layer_names(state.trace)[0]).shape[-1]


def _n_points(curve) -> int:
    """How many points a pyqtgraph curve draws (its getData is None, None when it has none)."""
    x = curve.getData()[0]
    return 0 if x is None else len(x)


def _wait_own_trace(qtbot, state):
    """Until the state's trace is the current model's (a trace job is marked done before its result
    reaches the UI thread): its tokens have the model's width."""
    def own() -> bool:
        return state.trace is not None and _tokens_d(state) == state.loaded.config.d_model

    qtbot.waitUntil(own, timeout=30_000)


def test_particles_built_from_the_old_models_tokens_never_show_on_the_new_one(qtbot, model_dirs, isolated_user_files,
                                                                              monkeypatch):
    """Dynamics: tokens of the current text driven by a head of the model, Reset clicked; another model
    opens from the Recent menu while the particles are built: they never show, and particles already
    playing from a model go when another opens. Reset then builds them from the new model."""
    import desktop_app.ui.panels.dynamics as dynamics

    window, state = open_window(qtbot, model_dirs["demo"], text="Alice and the rabbit hole.")
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(model_dirs["llama"])
    _wait_own_trace(qtbot, state)
    panel = _show_tab(qtbot, window, "Dynamics")
    panel.init.setCurrentIndex(panel.init.findData("tokens"))
    panel.qkv.setCurrentIndex(panel.qkv.findData("model"))
    llama = state.loaded
    gate, started, ended = _gated(dynamics, "build_simulation", monkeypatch)
    built = []
    real_built = panel._on_built
    monkeypatch.setattr(panel, "_on_built", lambda result: (built.append(result[0]), real_built(result)))
    try:
        qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: len(started) == 1, timeout=30_000)
        _open_from_recent(qtbot, window, state, model_dirs["demo"])
        assert state.loaded is not llama
    finally:
        gate.set()
    qtbot.waitUntil(lambda: len(ended) == 1, timeout=30_000)
    _wait_own_trace(qtbot, state)
    qtbot.wait(50)  # nothing queued on the UI thread may still bring it
    assert built == [] and panel.sim is None and not panel.is_running()  # the old model's particles never came
    assert len(panel.scatter.getData()[0]) == 0
    assert "changed" in panel.status.text()
    # nor did the panel build any by itself meanwhile (its first look, held until its first paint, ran after
    # the new model came: the new model's head with the old trace's tokens, "V is 128x128 but ... dimension 32")
    assert len(started) == len(ended) == 1

    # particles built from this model and playing: another model clears them
    demo_d = state.loaded.config.d_model
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.sim is not None and not panel.is_running(), timeout=30_000)
    assert panel.sim.config.d == demo_d
    qtbot.mouseClick(panel.play_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(panel._frames) >= 3, timeout=30_000)
    _open_from_recent(qtbot, window, state, model_dirs["llama"])
    _wait_own_trace(qtbot, state)
    qtbot.wait(100)
    assert panel.sim is None and panel._frames == [] and not panel.play_button.isChecked()
    assert len(panel.scatter.getData()[0]) == 0 and len(panel.back.getData()[0]) == 0  # no dot of it stays
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.sim is not None and not panel.is_running(), timeout=30_000)
    assert panel.sim.config.d == state.loaded.config.d_model != demo_d


def test_particles_cleared_by_a_model_that_came_before_the_panels_first_paint_stay_cleared(
        qtbot, model_dirs, isolated_user_files, monkeypatch):
    """Dynamics shown for the first time, Reset clicked, and another model arrives before the panel's first
    paint: the first look (starting particles, held until that paint) builds nothing, since Reset was pressed:
    it built the new model's head with the old trace's tokens ("V is 128x128 but the particles live in
    dimension 32"), a race with the first paint that made the test above fail about half the time."""
    import desktop_app.ui.panels.dynamics as dynamics

    window, state = open_window(qtbot, model_dirs["demo"], text="Alice and the rabbit hole.")
    demo = state.loaded
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(model_dirs["llama"])
    _wait_own_trace(qtbot, state)
    gate, started, ended = _gated(dynamics, "build_simulation", monkeypatch)
    gate.set()  # (only counted here)
    panel = _show_tab(qtbot, window, "Dynamics")
    panel.init.setCurrentIndex(panel.init.findData("tokens"))
    panel.qkv.setCurrentIndex(panel.qkv.findData("model"))
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    assert panel._after_paint.pending  # the order this is about: no paint yet, the first look still held
    state.set_model(demo)  # what a model opened meanwhile does on arrival (its load's end, on the UI thread)
    qtbot.waitUntil(lambda: not panel._after_paint.pending, timeout=30_000)
    _wait_own_trace(qtbot, state)
    qtbot.waitUntil(lambda: len(ended) == len(started), timeout=30_000)
    qtbot.wait(50)  # what the workers sent has reached the UI thread
    builds = len(started)
    assert builds == 1  # the click's build only (dropped with the old model)
    assert panel.sim is None and not panel.is_running() and len(panel.scatter.getData()[0]) == 0
    assert "changed" in panel.status.text()


def test_a_reset_from_the_tokens_waits_for_the_new_models_trace(qtbot, model_dirs, isolated_user_files, monkeypatch):
    """Dynamics, tokens of the current text driven by a head of the model: another model opens and Reset is
    clicked before that model's trace arrives. The particles are built once it arrives, from the new model's
    tokens and head: never its head with the old trace's tokens ("Failed: layer 0 head 0: V is 128x128 but the
    particles live in dimension 32", a message that stayed after the new trace came)."""
    import desktop_app.ui.panels.dynamics as dynamics
    import desktop_app.ui.state as state_module

    window, state = open_window(qtbot, model_dirs["demo"], text="Alice and the rabbit hole.")
    _wait_own_trace(qtbot, state)
    demo_d = state.loaded.config.d_model
    panel = _show_tab(qtbot, window, "Dynamics")
    qtbot.waitUntil(lambda: not panel._after_paint.pending and not panel.is_running(), timeout=30_000)
    qtbot.waitUntil(lambda: panel._layer_curves is not None, timeout=30_000)
    assert _n_points(panel.c_model_cos) == state.loaded.config.n_layers + 1  # the demo's, layer by layer
    panel.init.setCurrentIndex(panel.init.findData("tokens"))
    panel.qkv.setCurrentIndex(panel.qkv.findData("model"))
    build_gate, builds, built = _gated(dynamics, "build_simulation", monkeypatch)
    build_gate.set()  # (only counted here)
    trace_gate, traces, _ = _gated(state_module, "_trace_in_pieces", monkeypatch)
    try:
        with qtbot.waitSignal(state.model_changed, timeout=30_000):
            window.open_model(model_dirs["llama"])
        qtbot.waitUntil(lambda: len(traces) == 1, timeout=30_000)  # the new model's trace, held
        assert _tokens_d(state) == demo_d  # the old model's trace is still the one on show...
        # ...but not its curves: they were the old model's (drawn under the new one until its trace came)
        assert panel._layer_curves is None and _n_points(panel.c_model_cos) == 0
        assert panel.curves.hints[panel.p_model_cos].text == "Measuring the model's tokens…"
        qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
        qtbot.wait(50)
        assert builds == [] and panel.sim is None  # nothing built from the old trace...
        assert panel.status.text().startswith("Tracing the text")  # ...it says what it waits for
    finally:
        trace_gate.set()
    llama_d = state.loaded.config.d_model
    assert llama_d != demo_d
    _wait_own_trace(qtbot, state)
    qtbot.waitUntil(lambda: panel.sim is not None or panel.status.text().startswith("Failed"), timeout=30_000)
    qtbot.waitUntil(lambda: not panel.is_running(), timeout=30_000)
    assert not panel.status.text().startswith("Failed"), panel.status.text()
    assert panel.sim.config.d == llama_d  # the new model's tokens...
    assert panel.sim.head.name == "layer 0 head 0" and len(builds) == 1  # ...and head, built once
    assert panel.sim.config.n == len(state.token_ids)
    assert panel.status.text().startswith("layer 0 head 0;")
    qtbot.waitUntil(lambda: panel._layer_curves is not None, timeout=30_000)  # the new model's curves
    assert _n_points(panel.c_model_cos) == state.loaded.config.n_layers + 1


def test_a_failure_of_the_old_models_particles_goes_when_another_model_opens(qtbot, model_dirs, isolated_user_files,
                                                                            tmp_path):
    """Dynamics: the text's tokens driven by a file's head of another width fail to build (one line, in the
    status); another model opens: that failure was the old model's tokens', and goes once the new trace is
    in (the status said it on until the next Reset)."""
    import numpy as np

    window, state = open_window(qtbot, model_dirs["demo"], text="Alice and the rabbit hole.")
    _wait_own_trace(qtbot, state)
    panel = _show_tab(qtbot, window, "Dynamics")
    qtbot.waitUntil(lambda: not panel._after_paint.pending and not panel.is_running(), timeout=30_000)
    head = tmp_path / "head5.npz"
    np.savez(head, Q=np.eye(5), K=np.eye(5), V=np.eye(5))
    panel.init.setCurrentIndex(panel.init.findData("tokens"))
    panel.set_matrices(str(head))
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.is_running(), timeout=30_000)
    failure = panel.status.text()
    assert failure.startswith("Failed:") and "dimension" in failure and panel.sim is None

    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(model_dirs["llama"])
    _wait_own_trace(qtbot, state)
    qtbot.wait(50)  # what the trace's arrival does has reached the panel
    assert not panel.status.text().startswith("Failed"), panel.status.text()
    assert "model changed" in panel.status.text() and "Reset" in panel.status.text()


def test_a_reset_waiting_for_a_trace_that_fails_says_why(qtbot, model_dirs, isolated_user_files, monkeypatch):
    """Dynamics from the tokens, Reset clicked while a model that cannot read the text ('notok': no tokenizer)
    is tracing it: no particles are built, and the status says why there are no tokens."""
    import desktop_app.ui.panels.dynamics as dynamics
    import desktop_app.ui.state as state_module

    window, state = open_window(qtbot, model_dirs["demo"], text="Alice and the rabbit hole.")
    _wait_own_trace(qtbot, state)
    panel = _show_tab(qtbot, window, "Dynamics")
    qtbot.waitUntil(lambda: not panel._after_paint.pending and not panel.is_running(), timeout=30_000)
    panel.init.setCurrentIndex(panel.init.findData("tokens"))
    build_gate, builds, _ = _gated(dynamics, "build_simulation", monkeypatch)
    build_gate.set()  # (only counted here)
    trace_gate, traces, _ = _gated(state_module, "_trace_in_pieces", monkeypatch)
    try:
        with qtbot.waitSignal(state.model_changed, timeout=30_000):
            window.open_model(model_dirs["notok"])
        qtbot.waitUntil(lambda: len(traces) == 1, timeout=30_000)
        qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
        assert panel.status.text().startswith("Tracing the text")
    finally:
        trace_gate.set()
    _wait_traced(qtbot, state)
    qtbot.waitUntil(lambda: state.trace is None and state.trace_problem != "", timeout=10_000)
    qtbot.wait(50)
    assert builds == [] and panel.sim is None and not panel.is_running()
    assert panel.status.text() == state.no_trace_message()
    assert panel.status.text().startswith("No text traced for this model:") and "token ids" in panel.status.text()


def test_a_reset_waiting_for_a_trace_cancelled_before_it_showed_stops_waiting_and_reset_traces_again(
        qtbot, model_dirs, isolated_user_files, monkeypatch):
    """Dynamics from the tokens, Reset clicked while another model's trace runs; that trace is cancelled (the
    status bar's Cancel) before any of it showed: no trace_changed comes, and the panel said "Tracing the
    text…" until the next Reset (refused then). The wait ends at once, in one line saying what to press; that
    Reset traces the text again and builds the particles from the new model's tokens."""
    import threading

    import desktop_app.ui.panels.dynamics as dynamics
    import desktop_app.ui.state as state_module

    window, state = open_window(qtbot, model_dirs["demo"], text="Alice and the rabbit hole.")
    _wait_own_trace(qtbot, state)
    panel = _show_tab(qtbot, window, "Dynamics")
    qtbot.waitUntil(lambda: not panel._after_paint.pending and not panel.is_running(), timeout=30_000)
    panel.init.setCurrentIndex(panel.init.findData("tokens"))
    build_gate, builds, _ = _gated(dynamics, "build_simulation", monkeypatch)
    build_gate.set()  # (only counted here)
    real, gate, traces = state_module._trace_in_pieces, threading.Event(), []

    def held(loaded, *args, job=None, partial=None, **kwargs):
        """The trace, held before its first layer with its progress (and the Cancel beside it) on show."""
        traces.append(loaded)
        job.progress(0, loaded.config.n_layers)
        job.wait(gate)  # (a cancel ends the wait: Cancelled)
        return real(loaded, *args, job=job, partial=partial, **kwargs)

    monkeypatch.setattr(state_module, "_trace_in_pieces", held)
    monkeypatch.setattr(state, "PIECES_AFTER_S", 0.0)  # its progress on show at once
    cancel = window.trace_progress.cancel_button
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(model_dirs["llama"])
    qtbot.waitUntil(cancel.isVisible, timeout=30_000)
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    assert panel.status.text().startswith("Tracing the text") and builds == []
    qtbot.mouseClick(cancel, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    qtbot.wait(50)  # what the cancel's end does has reached the panel
    assert not cancel.isVisible() and not state.trace_is_current()  # nothing of the new model's trace came
    assert builds == [] and panel.sim is None and not panel.is_running()
    assert panel.status.text() == ("The text's trace was cancelled before it arrived: no tokens to build the "
                                   "particles from. Press Reset to trace the text again.")

    gate.set()  # the next trace runs through
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    assert panel.status.text().startswith("Tracing the text")
    qtbot.waitUntil(lambda: len(traces) == 2, timeout=30_000)  # the text traced again
    _wait_own_trace(qtbot, state)
    qtbot.waitUntil(lambda: panel.sim is not None and not panel.is_running(), timeout=30_000)
    assert len(builds) == 1 and panel.sim.config.d == state.loaded.config.d_model  # the new model's tokens
    assert panel.sim.config.n == len(state.token_ids)


def test_a_reset_from_the_tokens_after_the_edits_changed_builds_from_the_edited_trace(
        qtbot, model_dirs, isolated_user_files, monkeypatch):
    """Dynamics from the tokens after a layer's tokens: a what-if edit made and Reset clicked before the text is
    traced again with it: the particles are built once that trace arrives, from its (edited) tokens, and stay
    (built at once from the unedited trace, they were cleared by the edited trace's arrival: 'The text changed')."""
    import desktop_app.ui.panels.dynamics as dynamics
    import desktop_app.ui.state as state_module
    from desktop_app.core import dynamics as dy
    from desktop_app.core.interventions import Intervention

    window, state = open_window(qtbot, model_dirs["demo"], text="Alice and the rabbit hole.")
    _wait_own_trace(qtbot, state)
    panel = _show_tab(qtbot, window, "Dynamics")
    qtbot.waitUntil(lambda: not panel._after_paint.pending and not panel.is_running(), timeout=30_000)
    panel.init.setCurrentIndex(panel.init.findData("tokens"))
    panel.token_layer.setValue(2)  # after layer 1's attention: the edit below changes them
    panel.sphere.setChecked(False)
    unedited = dy.trace_tokens(state.trace, dy.layer_names(state.trace)[2])
    build_gate, builds, _ = _gated(dynamics, "build_simulation", monkeypatch)
    build_gate.set()  # (only counted here)
    trace_gate, traces, _ = _gated(state_module, "_trace_in_pieces", monkeypatch)
    try:
        state.set_interventions([Intervention("blocks.1.attn.head.0")])  # as the What if panel's Apply does
        qtbot.waitUntil(lambda: len(traces) == 1, timeout=30_000)
        qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
        assert panel.status.text().startswith("Tracing the text") and builds == []
    finally:
        trace_gate.set()
    _wait_traced(qtbot, state)
    qtbot.waitUntil(lambda: panel.sim is not None and not panel.is_running(), timeout=30_000)
    qtbot.wait(50)
    edited = dy.trace_tokens(state.trace, dy.layer_names(state.trace)[2])
    assert abs(edited - unedited).max() > 1e-3  # (the edit does change these tokens)
    assert len(builds) == 1 and panel.sim is not None
    assert abs(panel._frames[0].shown - edited).max() < 1e-5  # the edited trace's tokens
    assert panel.status.text().startswith(f"{panel.sim.head.name}; n = {len(state.token_ids)}")  # not 'changed'


def _held_after_the_first_layer(state, monkeypatch):
    """Every text trace held after its first layer (on show at once) until `gate` is set or it is cancelled:
    (gate, reached: set once one is held, the models traced)."""
    import threading

    import desktop_app.ui.state as state_module

    real, gate, reached, traces = state_module.trace_input, threading.Event(), threading.Event(), []

    def held(loaded, *args, on_layer=None, job=None, **kwargs):
        traces.append(loaded)

        def hook(ready):
            on_layer(ready)
            if ready.done == 1:
                reached.set()
                job.wait(gate)  # (a cancel ends the wait: the trace stops at its next layer)
        return real(loaded, *args, on_layer=hook, job=job, **kwargs)

    monkeypatch.setattr(state_module, "trace_input", held)
    monkeypatch.setattr(state, "PIECES_AFTER_S", 0.0)  # its layers on show at once
    return gate, reached, traces


def test_a_reset_waiting_for_a_trace_cancelled_after_its_first_layers_showed_traces_the_text_again(
        qtbot, model_dirs, isolated_user_files, monkeypatch):
    """Dynamics from the tokens, Reset clicked while another model's trace runs; that trace is cancelled (the
    status bar's Cancel) after its first layer showed: the panel said "No text traced for this model: the trace
    was cancelled after layer 1 of 2", and the next Reset refused with the same line. It says to press Reset;
    Reset traces the text again (one line while it waits) and builds from the new model's tokens."""
    import desktop_app.ui.panels.dynamics as dynamics

    window, state = open_window(qtbot, model_dirs["demo"], text="Alice and the rabbit hole.")
    _wait_own_trace(qtbot, state)
    panel = _show_tab(qtbot, window, "Dynamics")
    qtbot.waitUntil(lambda: not panel._after_paint.pending and not panel.is_running(), timeout=30_000)
    panel.init.setCurrentIndex(panel.init.findData("tokens"))
    build_gate, builds, _ = _gated(dynamics, "build_simulation", monkeypatch)
    build_gate.set()  # (only counted here)
    gate, reached, traces = _held_after_the_first_layer(state, monkeypatch)
    cancel = window.trace_progress.cancel_button
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(model_dirs["llama"])
    qtbot.waitUntil(lambda: reached.is_set() and state.tracing is not None and cancel.isVisible(), timeout=30_000)
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    assert panel.status.text() == "Tracing the text: layer 1 of 2 ready…" and builds == []
    qtbot.mouseClick(cancel, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: state._trace_job is None, timeout=30_000)
    qtbot.waitUntil(lambda: state.trace_problem != "", timeout=30_000)  # what the cancel's end does has come
    assert state.trace is None and state.trace_problem == "the trace was cancelled after layer 1 of 2"
    assert builds == [] and panel.sim is None and not panel.is_running()
    assert panel.status.text() == ("No text traced for this model: the trace was cancelled after layer 1 of 2. "
                                   "Press Reset to trace the text again.")
    for plot in (panel.p_model_cos, panel.p_model_clusters):  # (not "Open a model and type a text")
        assert panel.hints[plot].item.toPlainText() == "The text's trace was cancelled: no tokens to measure"
    assert panel.hints[panel.p_w2].item.isVisible()  # the run still drawn has no twin: it says so, no empty axes
    assert "Twin run off" in panel.hints[panel.p_w2].item.toPlainText()

    gate.set()  # the next trace runs through
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    assert panel.status.text().startswith("Tracing the text")  # one line while it waits
    assert "cancelled" not in panel.hints[panel.p_model_cos].item.toPlainText()
    qtbot.waitUntil(lambda: len(traces) == 2, timeout=30_000)  # the text traced again
    _wait_own_trace(qtbot, state)
    qtbot.waitUntil(lambda: panel.sim is not None and not panel.is_running(), timeout=30_000)
    assert len(builds) == 1 and panel.sim.config.d == state.loaded.config.d_model  # the new model's tokens
    assert panel.sim.config.n == len(state.token_ids)


def test_reset_traces_the_text_again_after_its_trace_was_cancelled_after_its_first_layers(
        qtbot, model_dirs, isolated_user_files, monkeypatch):
    """Dynamics from the tokens, no Reset waiting: a new text's trace is cancelled after its first layer showed.
    Reset refused ("No text traced for this model: the trace was cancelled after layer 1 of 4"); it traces the
    text again and builds from its tokens."""
    import desktop_app.ui.panels.dynamics as dynamics

    window, state = open_window(qtbot, model_dirs["demo"], text="Alice and the rabbit hole.")
    _wait_own_trace(qtbot, state)
    panel = _show_tab(qtbot, window, "Dynamics")
    qtbot.waitUntil(lambda: not panel._after_paint.pending and not panel.is_running(), timeout=30_000)
    panel.init.setCurrentIndex(panel.init.findData("tokens"))
    build_gate, builds, _ = _gated(dynamics, "build_simulation", monkeypatch)
    build_gate.set()  # (only counted here)
    gate, reached, traces = _held_after_the_first_layer(state, monkeypatch)
    text = "Alice was beginning to get very tired of sitting by her sister on the bank."
    state.set_text(text)
    qtbot.waitUntil(lambda: reached.is_set() and state.tracing is not None, timeout=30_000)
    qtbot.mouseClick(window.trace_progress.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: state._trace_job is None and state.trace_problem != "", timeout=30_000)
    assert state.trace is None and state.trace_problem.startswith("the trace was cancelled after layer 1 of")

    gate.set()  # the next trace runs through
    qtbot.mouseClick(panel.reset_button, Qt.MouseButton.LeftButton)
    assert panel.status.text().startswith("Tracing the text") and builds == []
    qtbot.waitUntil(lambda: len(traces) == 2, timeout=30_000)  # the text traced again
    qtbot.waitUntil(lambda: panel.sim is not None and not panel.is_running(), timeout=30_000)
    assert state.text == text and panel.sim.config.n == len(state.token_ids) == len(state.loaded.tokenizer.encode(text))
    assert len(builds) == 1
