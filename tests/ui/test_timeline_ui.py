"""Issue 30, the GUI: a training run with kept checkpoints opens with a step slider under the menu bar;
moving it (keys on the slider, a click on its loss curve, Play) puts every panel on the model at that step,
the same text traced again; a click on the Train panel's loss curve opens the nearest kept step. A run
without kept steps, or any other model: no bar."""
from __future__ import annotations

import pytest
import torch
from PySide6.QtCore import QPointF, Qt

from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.training import TrainConfig, train
from desktop_app.core.training.timeline import step_folder

from .walkthrough import choose_item, click_panel_tab, type_into

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

MODEL = {"n_layers": 1, "n_heads": 2, "d_model": 16, "d_ff": 32}


def _train(out, keep_every: int) -> None:
    train(TrainConfig(task="induction", task_options={"length": 6, "symbols": 6}, model=dict(MODEL), lr=1e-2,
                      schedule="constant", warmup_steps=0, batch_size=8, eval_every=100, checkpoint_every=100,
                      log_every=1, keep_every=keep_every, steps=12), out)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny GPT-2 trained 12 steps on the induction task, kept at 0, 4, 8 (and its checkpoint at 12)."""
    out = tmp_path_factory.mktemp("timeline") / "run"
    _train(out, keep_every=4)
    return out


def _same_weights(loaded, folder) -> bool:
    ours, kept = loaded.model.state_dict(), load_model_folder(folder).model.state_dict()
    return ours.keys() == kept.keys() and all(torch.equal(ours[k], kept[k]) for k in ours)


def _window(qtbot, state):
    from desktop_app.ui.main_window import MainWindow

    window = MainWindow(state)
    qtbot.addWidget(window)
    window.show()
    return window


def _probabilities_of(folder, text):
    """What the Model panel shows for `text` on the model in `folder`, computed here without the app."""
    from desktop_app.app.tracing import trace_input
    from desktop_app.ui.panels.model import token_probabilities

    loaded = load_model_folder(folder)
    enc, trace = trace_input(loaded, text, None)
    return token_probabilities(trace["logits"][0], enc.ids)


def _open_run(qtbot, state, window, run):
    with qtbot.waitSignal(state.model_changed, timeout=60_000):
        state.open_model(run)
    qtbot.waitUntil(lambda: window.timeline_bar.isVisible(), timeout=30_000)
    qtbot.waitUntil(lambda: state.trace is not None, timeout=30_000)


def test_the_slider_puts_every_panel_on_the_model_at_that_step(qtbot, run, isolated_user_files):
    from desktop_app.ui.state import AppState

    state = AppState()
    window = _window(qtbot, state)
    bar = window.timeline_bar
    _open_run(qtbot, state, window, run)
    assert bar.steps == [0, 4, 8, 12] and bar.slider.value() == 3  # the run's own checkpoint, the last step
    assert "step 12 of 12" in bar.step_label.text()
    text, ids = state.text, list(state.token_ids)  # a sample of the induction task (set at the first open)
    model_panel = window.panel("Model")

    bar.slider.setFocus()
    for key, step in ((Qt.Key.Key_Home, 0), (Qt.Key.Key_Right, 4), (Qt.Key.Key_End, 12), (Qt.Key.Key_Left, 8)):
        before = state.key.model
        qtbot.keyClick(bar.slider, key)
        folder = step_folder(run, step)
        qtbot.waitUntil(lambda: state.loaded.path == folder and state.key.model > before, timeout=60_000)
        assert _same_weights(state.loaded, folder)  # exactly the weights kept at that step
        assert state.text == text and state.token_ids == ids  # the same text, traced again
        qtbot.waitUntil(lambda: model_panel.probabilities == pytest.approx(_probabilities_of(folder, text), abs=1e-6, nan_ok=True),
                        timeout=30_000)
        qtbot.waitUntil(lambda: bar.shown_step == step and f"step {step} of 12" in bar.step_label.text(),
                        timeout=30_000)
    # the steps are not all the same model (else the panels' check above could not fail)
    assert _probabilities_of(step_folder(run, 0), text) != pytest.approx(_probabilities_of(run, text), abs=1e-6, nan_ok=True)

    # back to a step opened before: from the cache, the same objects, no load
    cached = state.step_cache.get((str(step_folder(run, 4)), state.device, state.dtype))
    assert cached is not None
    qtbot.keyClick(bar.slider, Qt.Key.Key_Left)
    qtbot.waitUntil(lambda: state.loaded is cached, timeout=10_000)

    # steps asked for faster than they load: the last one asked wins, none arriving late replaces it
    state.step_cache.clear()
    qtbot.keyClick(bar.slider, Qt.Key.Key_Home)
    qtbot.keyClick(bar.slider, Qt.Key.Key_Right)
    qtbot.keyClick(bar.slider, Qt.Key.Key_Right)
    qtbot.waitUntil(lambda: state.loading is None and state.loaded.path == step_folder(run, 8), timeout=60_000)
    qtbot.waitUntil(lambda: bar.shown_step == 8 and state.trace is not None, timeout=30_000)
    assert state.loaded.path == step_folder(run, 8) and bar.slider.value() == 2
    assert _same_weights(state.loaded, step_folder(run, 8))


def test_a_click_on_the_bars_loss_curve_and_play(qtbot, run, isolated_user_files):
    from desktop_app.ui.state import AppState

    state = AppState()
    window = _window(qtbot, state)
    bar = window.timeline_bar
    _open_run(qtbot, state, window, run)
    x, y = bar.loss_curve.getData()
    assert len(x) == 12 and len(bar.kept_marks.data) == 4  # the loss at every logged step, the kept ones marked
    vb = bar.plot.getPlotItem().vb
    # a person clicks the curve they see: wait for it to be painted (pyqtgraph fits the view to the data when it
    # paints; mapped before that, the click lands off the curve and nothing opens)
    qtbot.waitUntil(lambda: vb.viewRange()[0][0] <= 0 and vb.viewRange()[0][1] >= 12, timeout=30_000)
    pos = bar.plot.mapFromScene(vb.mapViewToScene(QPointF(3.6, float(y[3]))))
    qtbot.mouseClick(bar.plot.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    qtbot.waitUntil(lambda: state.loaded.path == step_folder(run, 4) and bar.shown_step == 4, timeout=60_000)
    assert bar.slider.value() == 1

    qtbot.mouseClick(bar.play_button, Qt.MouseButton.LeftButton)
    seen = []
    qtbot.waitUntil(lambda: seen.append(bar.shown_step) or not bar.play_button.isChecked(), timeout=60_000)
    assert bar.shown_step == 12 and 8 in seen and state.loaded.path == step_folder(run, 12)
    assert bar.play_button.text() == "Play"


def test_no_bar_for_a_run_without_kept_steps_nor_for_other_models(qtbot, tmp_path, run, isolated_user_files):
    from desktop_app.ui.state import AppState

    plain = tmp_path / "plain"
    _train(plain, keep_every=0)
    state = AppState()
    window = _window(qtbot, state)
    _open_run(qtbot, state, window, run)
    with qtbot.waitSignal(state.model_changed, timeout=60_000):
        state.open_model(plain)
    qtbot.waitUntil(lambda: not window.timeline_bar.isVisible(), timeout=30_000)
    qtbot.waitUntil(lambda: state.trace is not None and state.loaded.path == plain, timeout=30_000)
    assert not window.timeline_bar.isVisible()


def test_a_click_on_the_train_panels_loss_curve_opens_the_nearest_kept_step(qtbot, tmp_path, run,
                                                                            isolated_user_files):
    from desktop_app.ui.state import AppState

    state = AppState()
    window = _window(qtbot, state)
    window.show_panel("Train")
    panel = window.panel("Train")
    panel.run.out_dir = run  # the run this panel trained (as its Start sets it)
    panel.loss_plot.setXRange(0, 12, padding=0)
    panel.loss_plot.setYRange(0, 2, padding=0)
    vb = panel.loss_plot.getPlotItem().vb
    pos = panel.loss_plot.mapFromScene(vb.mapViewToScene(QPointF(7.0, 1.0)))
    qtbot.mouseClick(panel.loss_plot.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    qtbot.waitUntil(lambda: state.loaded is not None and state.loaded.path == step_folder(run, 8), timeout=60_000)
    assert _same_weights(state.loaded, step_folder(run, 8))
    assert "step 8" in panel.status_label.text()
    qtbot.waitUntil(lambda: window.timeline_bar.isVisible() and window.timeline_bar.shown_step == 8, timeout=30_000)


def test_across_training_plots_each_heads_metrics_against_step_and_exports_them(qtbot, run, tmp_path, monkeypatch,
                                                                                 isolated_user_files):
    import csv

    from PySide6.QtWidgets import QFileDialog, QToolButton

    from desktop_app.app.timeline import scrub
    from desktop_app.ui.state import AppState

    state = AppState()
    window = _window(qtbot, state)
    _open_run(qtbot, state, window, run)
    qtbot.mouseClick(window.timeline_bar.across_button, Qt.MouseButton.LeftButton)
    across = window.timeline_bar.across
    qtbot.addWidget(across)
    qtbot.waitUntil(lambda: across.results is not None, timeout=60_000)
    expected = scrub(run, "induction")
    curves = across.plots["induction"].getPlotItem().listDataItems()
    assert len(curves) == 2  # one layer, two heads
    for head, curve in enumerate(curves):
        xs, ys = curve.getData()
        assert list(xs) == [0, 4, 8, 12]
        assert ys == pytest.approx(expected.values[:, 0, head])

    target = tmp_path / "across.csv"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(target), "")))
    button = next(b for b in across.export_bar.findChildren(QToolButton) if b.text() == "Data")
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    rows = list(csv.reader(target.read_text().splitlines()))
    assert rows[0] == ["metric", "step", "layer", "head", "value"]
    assert len(rows) - 1 == 4 * 4 * 2 + 4  # head metrics x steps x heads, and the weight norms shown: steps x layer
    assert [r[1:4] for r in rows[1:] if r[0] == "weight-norm"] == [[s, "0", "-1"] for s in ("0", "4", "8", "12")]
    induction = [r for r in rows[1:] if r[0] == "induction" and r[1] == "8" and r[3] == "1"]
    assert float(induction[0][4]) == pytest.approx(float(expected.values[2, 0, 1]))


def _across(qtbot, run):
    from desktop_app.ui.state import AppState

    state = AppState()
    window = _window(qtbot, state)
    _open_run(qtbot, state, window, run)
    return _across_of(qtbot, window)


def _across_of(qtbot, window):
    """The Across-training window, opened by a click on the bar's button, once it has measured the head
    metrics and the default per-layer metric (weight norms)."""
    qtbot.mouseClick(window.timeline_bar.across_button, Qt.MouseButton.LeftButton)
    across = window.timeline_bar.across
    qtbot.addWidget(across)
    qtbot.waitUntil(lambda: across.results is not None and "weight-norm" in across.layer_results, timeout=60_000)
    return across


def _export(qtbot, monkeypatch, across, button_text, target):
    from PySide6.QtWidgets import QFileDialog

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(target), "")))
    qtbot.waitUntil(lambda: across.export_bar.buttons[button_text].isEnabled(), timeout=60_000)
    qtbot.mouseClick(across.export_bar.buttons[button_text], Qt.MouseButton.LeftButton)
    assert target.is_file()


@pytest.mark.parametrize("entry, metric", [("Lipschitz constant", "lipschitz"), ("Logit lens: probability", "logit-lens"),
                                           ("Gradient norms", "grad-norm")])
def test_across_training_plots_the_per_layer_metric_chosen_and_exports_it(qtbot, run, tmp_path, monkeypatch,
                                                                          isolated_user_files, entry, metric):
    """The Per layer box, chosen by typing into it: its metric measured in a worker, a line per layer of
    exactly what scrub gives; the export (CSV, PNG, SVG) holds it beside the head metrics."""
    import csv

    from desktop_app.app.timeline import scrub

    across = _across(qtbot, run)
    weight_norms = across.layer_plot.getPlotItem().listDataItems()
    assert len(weight_norms) == 1 and list(weight_norms[0].getData()[0]) == [0, 4, 8, 12]  # the default
    across.layer_metric.setFocus()
    qtbot.keyClicks(across.layer_metric, entry)
    assert across.layer_metric.currentText() == entry
    qtbot.waitUntil(lambda: metric in across.layer_results, timeout=60_000)
    expected = scrub(run, metric)
    curves = across.layer_plot.getPlotItem().listDataItems()
    assert len(curves) == 1  # one layer
    xs, ys = curves[0].getData()
    assert list(xs) == expected.steps and ys == pytest.approx(expected.values[:, 0, 0])
    assert "measuring" not in across.layer_plot.getPlotItem().titleLabel.text

    target = tmp_path / "across.csv"
    _export(qtbot, monkeypatch, across, "Data", target)
    rows = list(csv.reader(target.read_text().splitlines()))
    mine = [r for r in rows[1:] if r[0] == metric]
    assert [(int(r[1]), int(r[2]), int(r[3])) for r in mine] == [(s, 0, -1) for s in expected.steps]
    assert [float(r[4]) for r in mine] == pytest.approx(expected.values[:, 0, 0])
    assert {r[0] for r in rows[1:]} == {"induction", "prev-token", "entropy", "distance", metric}
    _export(qtbot, monkeypatch, across, "PNG", tmp_path / "across.png")
    _export(qtbot, monkeypatch, across, "SVG", tmp_path / "across.svg")
    svg = (tmp_path / "across.svg").read_text()
    assert across.layer_plot.getPlotItem().titleLabel.text.split(" (")[0].split(":")[0] in svg


@pytest.mark.slow  # about 15 s: a training process of its own
def test_a_click_on_the_loss_curve_while_the_run_trains_opens_a_step_it_kept(qtbot, tmp_path, monkeypatch,
                                                                           isolated_user_files):
    """A real run from the Train panel (its own process, keep every 20 steps): clicked while it trains."""
    from desktop_app.ui.state import AppState

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the run's process: one thread for a tiny model
    state = AppState()
    window = _window(qtbot, state)
    window.show_panel("Train")
    panel = window.panel("Train")
    panel.task.setCurrentText("sort")
    panel.length.setValue(5)
    panel.layers.setValue(1)
    panel.heads.setValue(2)
    panel.d_model.setValue(16)
    panel.d_ff.setValue(32)
    panel.context.setValue(16)
    panel.steps.setValue(100_000)
    panel.eval_every.setValue(1000)
    panel.checkpoint_every.setValue(100_000)
    qtbot.waitUntil(panel.keep_every.isVisible, timeout=10_000)
    type_into(qtbot, panel.keep_every, "20")  # the form's own Keep every field (issue 41: it had none)
    panel.out_edit.setText(str(tmp_path / "runs"))
    qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: sum(bool(e.get("kept")) for e in panel.events if e["event"] == "checkpoint") >= 2,
                    timeout=90_000)
    qtbot.waitUntil(lambda: panel.train_curve.getData()[0] is not None and panel.train_curve.getData()[0][-1] > 24,
                    timeout=60_000)
    assert panel.running
    run = panel.out_dir
    vb = panel.loss_plot.getPlotItem().vb
    (x0, x1), (y0, y1) = vb.viewRange()
    assert x0 < 18 < x1
    pos = panel.loss_plot.mapFromScene(vb.mapViewToScene(QPointF(18.0, (y0 + y1) / 2)))
    qtbot.mouseClick(panel.loss_plot.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    kept = run / "checkpoints" / "step-000020"
    qtbot.waitUntil(lambda: state.loaded is not None and state.loaded.path == kept, timeout=60_000)
    assert panel.running  # it was clicked while the run trained
    assert _same_weights(state.loaded, kept)
    qtbot.waitUntil(lambda: window.timeline_bar.isVisible() and window.timeline_bar.shown_step == 20, timeout=30_000)
    qtbot.mouseClick(panel.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.running, timeout=60_000)


def test_across_training_measures_a_cached_models_step_revisions(qtbot, tmp_path, monkeypatch, isolated_user_files):
    """A model opened from the Hugging Face cache whose revisions are training steps: Across training measures
    each step's snapshot (the head metrics and the per-layer metric)."""
    from desktop_app.core.hf_cache import step_snapshot
    from desktop_app.ui.state import AppState
    from fake_hf_cache import add_step_revisions, point_at

    cache = tmp_path / "hf-cache"
    point_at(monkeypatch, cache, tmp_path / "home")
    repo = add_step_revisions(cache, tmp_path)  # steps 0, 512, 1000
    state = AppState()
    window = _window(qtbot, state)
    with qtbot.waitSignal(state.model_changed, timeout=60_000):
        state.open_model(step_snapshot(repo, 1000))
    qtbot.waitUntil(lambda: window.timeline_bar.isVisible(), timeout=30_000)
    across = _across_of(qtbot, window)
    assert not across.status.text().startswith("Could not")
    for plot, curves in ((across.plots["induction"], 2), (across.layer_plot, 1)):  # 1 layer, 2 heads
        assert [list(c.getData()[0]) for c in plot.getPlotItem().listDataItems()] == [[0, 512, 1000]] * curves


def test_across_training_closed_while_it_measures_measures_again_when_reopened(qtbot, run, monkeypatch,
                                                                                isolated_user_files):
    """Closing the window stops its workers; a click on Across training… again shows the same window, which
    must measure again rather than say 'Measuring…' for ever. The first window's workers here wait until
    they are stopped, so the close always comes first."""
    from desktop_app.ui.state import AppState
    from desktop_app.ui.widgets import across_training

    real, started = across_training.scrub_metrics, []

    def held_until_stopped(run_dir, metrics, job=None):
        started.append(metrics)
        if len(started) <= 2:  # the first window's two workers: the head metrics, the weight norms
            job._cancel.wait(timeout=60)
            job.check()
        return real(run_dir, metrics, job=job)

    monkeypatch.setattr(across_training, "scrub_metrics", held_until_stopped)
    state = AppState()
    window = _window(qtbot, state)
    _open_run(qtbot, state, window, run)
    bar = window.timeline_bar
    qtbot.mouseClick(bar.across_button, Qt.MouseButton.LeftButton)
    across = bar.across
    qtbot.addWidget(across)
    qtbot.waitUntil(lambda: len(started) == 2, timeout=30_000)
    across.close()
    qtbot.mouseClick(bar.across_button, Qt.MouseButton.LeftButton)
    assert bar.across is across and across.isVisible()
    qtbot.waitUntil(lambda: across.results is not None and "weight-norm" in across.layer_results, timeout=60_000)
    assert len(across.plots["induction"].getPlotItem().listDataItems()) == 2  # drawn once: one layer, two heads
    assert len(across.layer_plot.getPlotItem().listDataItems()) == 1
    assert "kept steps" in across.status.text()


def test_the_train_panels_keep_fields_are_what_the_run_is_given(qtbot, isolated_user_files):
    """Issue 41: Keep every / Keep spacing / Keep at most are fields of the Train panel's form, typed and chosen
    there, and the run's settings carry them (and a workspace's form brings them back)."""
    from desktop_app.ui.state import AppState

    state = AppState()
    window = _window(qtbot, state)
    panel = click_panel_tab(qtbot, window, "Train")
    qtbot.waitUntil(panel.isVisible, timeout=10_000)
    assert panel.keep_every.isVisible() and panel.keep_spacing.isVisible() and panel.keep_max_gb.isVisible()
    type_into(qtbot, panel.keep_every, "50")
    choose_item(qtbot, panel.keep_spacing, "log")
    type_into(qtbot, panel.keep_max_gb, "0.25")
    cfg = panel.form.config()
    assert (cfg.keep_every, cfg.keep_spacing, cfg.keep_max_gb) == (50, "log", 0.25)
    panel.form.set_config(type(cfg)(**{**cfg.__dict__, "keep_every": 7, "keep_spacing": "linear"}))
    assert (panel.keep_every.value(), panel.keep_spacing.currentText()) == (7, "linear")


def test_now_using_a_run_is_forgotten_when_another_model_opens(qtbot, run, isolated_user_files):
    """Issue 41: the Train panel kept "Now using RUN in every panel" after another model was opened."""
    from desktop_app.ui.state import AppState

    state = AppState()
    window = _window(qtbot, state)
    panel = click_panel_tab(qtbot, window, "Train")
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(run)
    panel.status_label.setText(f"Now using {run} in every panel.")  # what Use in every panel says
    other = step_folder(run, 4)
    with qtbot.waitSignal(state.model_changed, timeout=30_000):
        window.open_model(other)
    assert panel.status_label.text() == ""


def test_steps_visited_are_one_recent_entry_and_escape_closes_across_training(qtbot, run, isolated_user_files):
    """Issue 41: every timeline step visited was added to Recent; the Across-training window opened taller
    than a 1000-px screen and Escape did not close it."""
    from desktop_app.ui import settings as app_settings
    from desktop_app.ui.state import AppState

    state = AppState()
    window = _window(qtbot, state)
    _open_run(qtbot, state, window, run)
    for step in (4, 8):
        with qtbot.waitSignal(state.model_changed, timeout=60_000):
            state.open_model(step_folder(run, step))
    assert [str(p) for p in app_settings.recent_models()].count(str(run)) == 1
    assert not any("step-0000" in str(p) for p in app_settings.recent_models())
    across = _across_of(qtbot, window)
    screen = across.screen().availableGeometry().height()
    assert across.frameGeometry().height() <= max(screen, 460)
    across.activateWindow()
    across.setFocus()
    qtbot.keyClick(across, Qt.Key.Key_Escape)
    assert not across.isVisible()
