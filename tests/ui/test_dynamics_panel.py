"""DynamicsPanel with pytest-qt, offscreen: the real buttons build, step, play and pause the particles
(computed in a worker), dragging rotates the 3-D view, the model's per-layer curves are the core's,
bad matrices are one line naming the file, and the exports write the numbers shown."""
from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from PySide6.QtCore import QPoint, QRect, Qt

from desktop_app.core import dynamics as dy
from desktop_app.ui.panels.dynamics import DynamicsPanel
from desktop_app.ui.state import AppState
from tiny_models import tiny_model

TEXT = "the queen of hearts made some tarts"


@pytest.fixture
def state():
    s = AppState()
    s.loaded = tiny_model(TEXT, d_model=16, n_heads=2, d_ff=32)
    return s


@pytest.fixture
def panel(qtbot, state):
    p = DynamicsPanel(state)
    qtbot.addWidget(p)
    p._on_model_changed(state.loaded)
    p.resize(1200, 800)
    p.show()
    return p


def click(qtbot, button):
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def reset(qtbot, panel):
    click(qtbot, panel.reset_button)
    qtbot.waitUntil(lambda: panel.sim is not None, timeout=10000)


def test_a_first_look_shows_the_starting_particles(qtbot, panel):
    """Opening the panel draws the default particles (no empty axes until Reset), and the time plots
    share one axis, so W2's (empty while the twin run is off) spans the run too."""
    qtbot.waitUntil(lambda: panel.sim is not None, timeout=10000)
    n = panel.n.value()
    assert panel.sim.config.n == n and panel.sim.twin is None
    assert len(panel.scatter.getData()[0]) + len(panel.back.getData()[0]) == n
    click(qtbot, panel.step_button)
    qtbot.waitUntil(lambda: len(panel._frames) > 1, timeout=10000)
    assert panel.p_w2.viewRange()[0] == panel.p_clusters.viewRange()[0]


def test_reset_step_play_pause_cluster_on_the_sphere(qtbot, panel, tmp_path):
    panel.n.setValue(40)
    panel.steps_per_frame.setValue(10)
    panel.record_every.setValue(10)
    reset(qtbot, panel)
    assert panel.sim.config.sphere and panel.sim.config.n == 40 and panel.sim.config.d == 3
    start = panel.screen_xy.copy()
    assert start.shape == (40, 2)
    assert len(panel.scatter.getData()[0]) + len(panel.back.getData()[0]) == 40  # near and far halves
    click(qtbot, panel.step_button)
    qtbot.waitUntil(lambda: len(panel._frames) == 2, timeout=10000)
    assert panel._frames[-1].t == pytest.approx(1.0)
    assert not np.allclose(panel.screen_xy, start)  # the particles moved on screen
    click(qtbot, panel.play_button)
    assert panel.play_button.text() == "Pause"
    qtbot.waitUntil(lambda: panel._frames[-1].t >= 30, timeout=60000)
    click(qtbot, panel.play_button)
    assert panel.play_button.text() == "Play" and not panel.timer.isActive()
    qtbot.waitUntil(lambda: not panel.is_running(), timeout=10000)
    frames = len(panel._frames)
    qtbot.wait(150)
    assert len(panel._frames) == frames  # paused: no more frames
    last = panel._records[-1]
    assert last.clusters == 1 and last.mean_cosine > 0.999  # Geshkovski et al.: one cluster on the sphere
    assert "1 cluster(s)" in panel.status.text()
    # the time slider shows an earlier frame
    panel.slider.setValue(0)
    assert panel.time_label.text() == "t = 0"
    np.testing.assert_allclose(panel.screen_xy, start)
    # curves as CSV: the records shown
    out = tmp_path / "curves.csv"
    panel.export(out)
    with open(out, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(dy.CSV_COLUMNS)
    assert len(rows) - 1 == len(panel._records) and int(rows[-1][1]) == 1
    arrays = tmp_path / "frames.npz"
    panel.export(arrays)
    saved = np.load(arrays)
    assert saved["frames"].shape == (len(panel._frames), 40, 3)
    np.testing.assert_allclose(saved["frame_t"], [f.t for f in panel._frames])
    np.testing.assert_allclose(saved["positions"], panel._frames[0].shown)  # the slider's frame
    png = tmp_path / "frame.png"
    panel.export(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_drag_rotates_the_3d_view(qtbot, panel):
    panel.n.setValue(30)
    reset(qtbot, panel)
    before = panel.screen_xy.copy()
    yaw = panel._yaw
    vp = panel.particles.viewport()
    qtbot.mousePress(vp, Qt.MouseButton.LeftButton, pos=QPoint(100, 100))
    qtbot.mouseMove(vp, QPoint(160, 100))
    qtbot.mouseRelease(vp, Qt.MouseButton.LeftButton, pos=QPoint(160, 100))
    assert panel._yaw == pytest.approx(yaw + 0.6)
    after = panel.screen_xy
    assert not np.allclose(before, after)
    # an orthographic view of a rotation: on the unit sphere, every screen point stays in the unit disc
    assert np.hypot(after[:, 0], after[:, 1]).max() <= 1 + 1e-6


def test_model_curves_and_tokens_of_the_text(qtbot, panel, state):
    ids = [i % state.loaded.config.vocab_size for i in range(20)]
    _, trace = state.loaded.model.run_with_trace(torch.tensor(ids)[None])
    state.trace = trace
    state.trace_changed.emit(trace)
    qtbot.waitUntil(lambda: panel._layer_curves is not None, timeout=10000)
    expected = dy.layer_curves(trace, 0.05)
    x, y = panel.c_model_cos.getData()
    np.testing.assert_allclose(y, expected.mean_cosine)
    np.testing.assert_allclose(panel.c_model_clusters.getData()[1], expected.clusters)
    # start from the tokens after layer 0's attention, driven by a head of the model
    panel.init.setCurrentIndex(panel.init.findData("tokens"))
    panel.token_layer.setValue(1)
    panel.qkv.setCurrentIndex(panel.qkv.findData("model"))
    panel.attention.setCurrentText("l2")
    panel.sphere.setChecked(False)
    reset(qtbot, panel)
    assert panel.sim.config.n == len(ids) and panel.sim.config.d == 16
    assert panel.sim.head.name == "layer 0 head 0"
    np.testing.assert_allclose(panel._frames[0].shown, dy.trace_tokens(trace, "blocks.0.resid_mid"), rtol=1e-6, atol=1e-6)


def test_bad_matrices_file_is_one_line_naming_it(qtbot, panel, tmp_path):
    bad = tmp_path / "broken.npz"
    bad.write_bytes(b"not an archive")
    panel.set_matrices(str(bad))
    click(qtbot, panel.reset_button)
    qtbot.waitUntil(lambda: panel.status.text().startswith("Failed"), timeout=10000)
    text = panel.status.text()
    assert str(bad) in text and "not a NumPy .npz archive" in text and "\n" not in text
    assert panel.sim is None


def test_benchmark_plays_the_panel_and_reports_frames_per_second(qtbot):
    from desktop_app.benchmarks import dynamics as bench

    out = bench.main(["--n", "200", "--seconds", "1"])
    assert out["name"] == "dynamics" and out["n"] == 200 and out["target_fps"] == 30
    assert out["simulation_fps"] > 1 and out["panel_fps"] > 1  # frames really were computed and drawn
    assert out["meets_target"] == (out["panel_fps"] >= 30)


def test_the_simulation_runs_off_the_ui_thread(qtbot, panel):
    import threading

    panel.n.setValue(20)
    panel.d.setValue(2)
    panel.sphere.setChecked(False)
    reset(qtbot, panel)
    threads = []
    advance = panel.sim.advance

    def recording_advance(*args, **kwargs):
        threads.append(threading.current_thread())
        return advance(*args, **kwargs)

    panel.sim.advance = recording_advance
    click(qtbot, panel.step_button)
    qtbot.waitUntil(lambda: len(panel._frames) == 2, timeout=10000)
    assert threads and all(t is not threading.main_thread() for t in threads)
    assert panel.screen_xy.shape == (20, 2)  # d = 2 is drawn directly
    np.testing.assert_allclose(panel.screen_xy, panel._frames[-1].shown)


def test_full_covariance_for_the_gaussian_start_and_bad_input_is_one_line(qtbot, panel):
    panel.init.setCurrentIndex(panel.init.findData("gaussian"))
    panel.sphere.setChecked(False)
    panel.n.setValue(3000)
    assert panel.covariance.isEnabled() and not panel.twin.isChecked()  # the twin run is off by default
    panel.covariance.setText("2 0.8 0; 0.8 1 0; 0 0 0.5")
    reset(qtbot, panel)
    np.testing.assert_allclose(np.cov(panel.sim.x0.double().numpy().T), [[2, 0.8, 0], [0.8, 1, 0], [0, 0, 0.5]],
                               atol=0.12)
    assert panel.p_clusters.titleLabel.text.startswith("clusters (among 500")  # n > 500: a fixed subset
    shown = panel.sim
    panel.covariance.setText("1 2 0; 2 1 0; 0 0 1")
    click(qtbot, panel.reset_button)
    assert "positive semi-definite" in panel.status.text() and "\n" not in panel.status.text()
    assert panel.sim is shown and not panel.is_running()  # nothing rebuilt: the particles shown stay


def test_d_box_follows_a_model_head_and_the_tokens(qtbot, panel, state):
    assert panel.d.value() == 3
    panel.qkv.setCurrentIndex(panel.qkv.findData("model"))
    assert panel.d.value() == 16 and not panel.d.isEnabled()  # the test model's d_model
    panel.qkv.setCurrentIndex(panel.qkv.findData("identity"))
    panel.d.setValue(3)
    ids = list(range(12))
    _, trace = state.loaded.model.run_with_trace(torch.tensor(ids)[None])
    state.trace = trace
    state.trace_changed.emit(trace)
    panel.init.setCurrentIndex(panel.init.findData("tokens"))
    assert panel.d.value() == 16
    panel.sphere.setChecked(False)
    reset(qtbot, panel)
    assert panel.sim.config.d == 16 == panel.d.value()


def test_twin_switched_on_draws_the_w2_curve(qtbot, panel):
    panel.n.setValue(30)
    click(qtbot, panel.twin)
    assert panel.twin.isChecked()
    panel.record_every.setValue(1)
    reset(qtbot, panel)
    click(qtbot, panel.step_button)
    qtbot.waitUntil(lambda: len(panel._frames) == 2, timeout=10000)
    t, w2 = panel.c_w2.getData()
    assert len(w2) == 2 and np.all(w2 > 0)


def test_png_sequence_export_writes_every_frame_and_refuses_a_foreign_folder(qtbot, panel, tmp_path):
    panel.n.setValue(30)
    panel.steps_per_frame.setValue(2)
    reset(qtbot, panel)
    for k in range(2):
        click(qtbot, panel.step_button)
        qtbot.waitUntil(lambda: len(panel._frames) == k + 2, timeout=10000)
    folder = tmp_path / "frames"
    panel.export_png_sequence(folder)
    qtbot.waitUntil(lambda: panel.status.text().startswith("Wrote"), timeout=20000)
    pngs = sorted(p.name for p in folder.glob("*.png"))
    assert pngs == ["frame_0000.png", "frame_0001.png", "frame_0002.png"]
    assert all((folder / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in pngs)
    with open(folder / "frames.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["frame", "t"] and [float(r[1]) for r in rows[1:]] == pytest.approx([f.t for f in panel._frames])
    panel.export_png_sequence(folder)  # the app's own folder: replaced
    qtbot.waitUntil(lambda: panel.status.text().startswith("Wrote"), timeout=20000)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    panel.export_png_sequence(foreign)
    text = panel.status.text()
    assert text.startswith("PNG frames not written") and "did not write" in text and "\n" not in text
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


def _rgb(image) -> np.ndarray:
    from PySide6.QtGui import QImage

    image = image.convertToFormat(QImage.Format.Format_RGB32)
    a = np.frombuffer(image.constBits(), np.uint8, image.sizeInBytes())
    return a.reshape(image.height(), image.bytesPerLine() // 4, 4)[:, :image.width(), :3].copy()


def test_after_pause_the_3d_view_shows_the_current_particles_and_no_stale_dots(qtbot, panel):
    """Issue 25: after Pause the 3-D view showed about 30 dots the particles had left (the curves said one
    cluster). The points' items hold the current positions, and what the window shows (its backing store,
    painted incrementally as the particles moved) is what a fresh paint of the view draws: the points'
    bounding rect now holds their round pen, so the view repaints where the outermost dots were."""
    from PySide6.QtWidgets import QApplication

    panel.n.setValue(200)
    panel.steps_per_frame.setValue(5)
    panel.dt.setValue(0.5)
    reset(qtbot, panel)
    assert panel.view3d.isChecked() and panel.sim.config.d == 3
    click(qtbot, panel.play_button)
    qtbot.waitUntil(lambda: panel._frames[-1].t >= 40, timeout=120_000)  # many frames drawn while collapsing
    click(qtbot, panel.play_button)  # Pause
    qtbot.waitUntil(lambda: not panel.is_running(), timeout=30_000)
    qtbot.wait(200)  # the last frame's repaint reaches the window
    assert panel._records[-1].clusters == 1
    # the items hold the current positions: the last frame, the simulation's state, split near / far
    frame = panel.current_frame()
    assert frame is panel._frames[-1] and np.allclose(frame.shown, panel.sim.shown().numpy())
    xy, depth = panel._screen(frame.shown, with_depth=True)
    np.testing.assert_allclose(np.column_stack(panel.scatter.getData()), xy[depth >= 0])
    np.testing.assert_allclose(np.column_stack(panel.back.getData()), xy[depth < 0])
    # and the window shows them, nothing else
    view = panel.particles.viewport()
    top_left = view.mapTo(panel, view.rect().topLeft())
    rows = slice(top_left.y(), top_left.y() + view.height())
    cols = slice(top_left.x(), top_left.x() + view.width())
    on_screen = _rgb(QApplication.primaryScreen().grabWindow(panel.winId()).toImage())[rows, cols]
    fresh = _rgb(panel.grab().toImage())[rows, cols]
    stale = np.argwhere(np.any(on_screen != fresh, axis=2))
    assert len(stale) == 0, f"{len(stale)} stale pixels, e.g. at {stale[:5].tolist()}"


@pytest.mark.parametrize("size", [(1024, 700), (1280, 800)])
def test_the_panel_fits_small_windows(qtbot, model_dirs, isolated_user_files, size, tmp_path):
    """Issue 25: at 1024 x 700 the curves were cut at the window's right edge, and at 1280 x 800 the form
    still needed a horizontal scroll bar. The form scrolls only up and down, is as wide as its rows, and
    the particle view and every curve lie inside the window."""
    from .walkthrough import click_panel_tab, open_window

    window, state = open_window(qtbot, model_dirs["demo"], name="demo")
    panel = click_panel_tab(qtbot, window, "Dynamics")
    window.resize(*size)
    qtbot.waitUntil(lambda: window.size().toTuple() == size and panel.sim is not None, timeout=30_000)
    qtbot.wait(100)  # the layouts settle
    window.grab().save(str(tmp_path / f"dynamics_{size[0]}x{size[1]}.png"))
    scroll = panel.form_scroll
    assert not scroll.horizontalScrollBar().isVisible()
    assert scroll.widget().width() >= scroll.widget().minimumSizeHint().width()  # no row cut on the right
    def in_window(w):
        return QRect(w.mapTo(window, QPoint(0, 0)), w.size())

    shown = in_window(window.centralWidget())  # below the menu, above the status bar
    for widget in (scroll, panel.particles, panel.curves, panel.export_bar):
        rect = in_window(widget)
        assert shown.contains(rect), (widget, rect, shown)
        parent = widget.parentWidget()
        while parent is not window:  # no parent clips it either
            assert in_window(parent).contains(rect), (widget, rect, parent, in_window(parent))
            parent = parent.parentWidget()
    view = panel.curves.viewport().rect()
    for plot in (panel.p_clusters, panel.p_cosine, panel.p_radius, panel.p_w2, panel.p_model_cos,
                 panel.p_model_clusters):  # inside the curves' view, not cut at its edge
        rect = panel.curves.mapFromScene(plot.sceneBoundingRect()).boundingRect()
        assert view.contains(rect), (plot.titleLabel.text, rect, view)


def test_empty_plots_show_a_hint_not_axes_until_there_is_data(qtbot, panel):
    """Issue 25: before Play the time plots showed axes around nothing (one record draws no curve)."""
    qtbot.waitUntil(lambda: panel.sim is not None, timeout=10000)  # the first look: the starting particles
    assert len(panel._records) == 1
    for plot in (panel.p_clusters, panel.p_cosine, panel.p_radius):
        hint = panel.hints[plot]
        assert hint.item.isVisible() and "Press Play" in hint.item.toPlainText()
        assert not plot.getAxis("left").isVisible() and not plot.getAxis("bottom").isVisible()
    assert "Twin run off" in panel.hints[panel.p_w2].item.toPlainText()  # twin off: W2 never has data
    assert not panel.p_radius.legend.isVisible()
    panel.record_every.setValue(1)  # the next step records
    click(qtbot, panel.step_button)
    qtbot.waitUntil(lambda: len(panel._records) >= 2, timeout=10000)
    for plot in (panel.p_clusters, panel.p_cosine, panel.p_radius):
        assert not panel.hints[plot].item.isVisible()
        assert plot.getAxis("left").isVisible() and plot.getAxis("bottom").isVisible()
    assert panel.p_radius.legend.isVisible() and panel.hints[panel.p_w2].item.isVisible()


def test_the_export_bar_waits_for_the_particles(qtbot, state, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QToolButton

    from desktop_app.ui.widgets import export

    p = DynamicsPanel(state)
    qtbot.addWidget(p)
    buttons = p.export_bar.findChildren(QToolButton)
    assert all(not b.isEnabled() and "Reset builds the particles" in b.toolTip() for b in buttons)
    p.show()  # the first look builds the starting particles
    qtbot.waitUntil(lambda: p.sim is not None, timeout=10000)
    assert all(b.isEnabled() for b in buttons)  # the panel's `drawn`, which its bar follows
    monkeypatch.setattr(export, "ask_save_path", lambda *a, **k: str(tmp_path / "curves.csv"))
    qtbot.mouseClick(p.export_bar.buttons["Data"], Qt.MouseButton.LeftButton)
    with open(tmp_path / "curves.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == list(dy.CSV_COLUMNS) and len(rows) - 1 == len(p._records) >= 1


def _right_click(qtbot, view, plot):
    """A person's right-click in the middle of `plot` (a PlotItem in the GraphicsView `view`)."""
    vb = plot.getViewBox()
    pos = view.mapFromScene(vb.mapToScene(vb.boundingRect().center()))
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.RightButton, pos=pos)


def test_a_plots_right_click_menu_is_made_at_the_first_right_click_and_does_what_it_did(qtbot, panel):
    """pyqtgraph makes each plot's menu with the plot (~5-8 ms each, seven plots at the panel's first show):
    here it is made at the first right-click, the same menu, and its View All still fits the data."""
    qtbot.waitUntil(lambda: panel.sim is not None, timeout=10000)
    plots = [panel.p_clusters, panel.p_cosine, panel.p_radius, panel.p_w2, panel.p_model_cos,
             panel.p_model_clusters, panel.particles.getPlotItem()]
    assert all(p.getViewBox().menu is None for p in plots)  # (before: seven menus made with the panel)
    if panel.view3d.isChecked():
        click(qtbot, panel.view3d)  # (in 3-D a drag rotates: the view takes the mouse)
    particles = panel.particles.getPlotItem()
    particles.getViewBox().setRange(xRange=(100, 101), yRange=(100, 101), padding=0)  # away from the particles
    _right_click(qtbot, panel.particles, particles)
    menu = particles.getViewBox().menu
    qtbot.waitUntil(menu.isVisible, timeout=5000)
    titles = [a.text() for a in menu.actions()]
    assert titles[0] == "View All" and "Plot Options" in titles and "Mouse Mode" in titles
    menu.actions()[0].trigger()
    menu.close()
    (x0, x1), (y0, y1) = particles.getViewBox().viewRange()
    x, y = panel.scatter.getData()
    assert x0 <= x.min() and x.max() <= x1 and y0 <= y.min() and y.max() <= y1  # View All: the particles again
    assert all(p.getViewBox().menu is None for p in plots[:-1])  # the others still wait for theirs


def test_a_right_click_on_the_3d_view_gives_its_menu_and_reset_rotation_undoes_a_drag(qtbot, panel):
    """In 3-D the view took every mouse release (a left drag rotates it), so a right-click showed no menu: it gives
    the plot's menu as in 2-D (View All, Export...), with Reset rotation, which undoes a drag's rotation."""
    qtbot.waitUntil(lambda: panel.sim is not None, timeout=10000)
    assert panel.view3d.isChecked() and panel.sim.config.d >= 3
    view = panel.particles.viewport()
    before = panel.screen_xy.copy()
    centre = view.rect().center()
    qtbot.mousePress(view, Qt.MouseButton.LeftButton, pos=centre)  # a left drag rotates
    qtbot.mouseMove(view, centre + QPoint(60, 25))
    qtbot.mouseRelease(view, Qt.MouseButton.LeftButton, pos=centre + QPoint(60, 25))
    assert not np.allclose(panel.screen_xy, before)
    particles = panel.particles.getPlotItem()
    _right_click(qtbot, panel.particles, particles)
    menu = particles.getViewBox().menu
    assert menu is not None  # (before: no menu, the release never reached the plot)
    qtbot.waitUntil(menu.isVisible, timeout=5000)
    titles = [a.text() for a in menu.actions() if a.isVisible()]
    assert titles[0] == "View All" and "Export..." in titles and "Reset rotation" in titles
    next(a for a in menu.actions() if a.text() == "Reset rotation").trigger()
    menu.close()
    np.testing.assert_allclose(panel.screen_xy, before)


def test_a_flat_curve_gets_a_y_range_around_its_value_not_the_last_runs_span(qtbot, panel):
    """look16: after a run whose clusters fell from 40 to a few, a run with constant clusters (here dt 0.001:
    the particles barely move) drew its flat line in the old run's span (the README's dynamics_model.png:
    51 clusters on -50..150): pyqtgraph keeps the view's span for zero-span data."""
    def run(dt: float, steps: int) -> list[int]:
        """Reset with this dt, then Step clicked `steps` times: each frame's cluster count."""
        panel.dt.setValue(dt)
        reset(qtbot, panel)
        for k in range(steps):
            click(qtbot, panel.step_button)
            qtbot.waitUntil(lambda: len(panel._frames) == k + 2 and not panel.is_running(), timeout=10000)
        qtbot.wait(50)  # (the view's range is updated when drawn)
        return [r.clusters for r in panel._records]

    panel.n.setValue(40)
    panel.steps_per_frame.setValue(10)
    panel.record_every.setValue(10)
    counts = run(1.0, 4)
    assert max(counts) - min(counts) >= 10  # the first run's span is wide
    counts = set(run(0.001, 3))
    assert len(counts) == 1  # flat
    value = counts.pop()
    lo, hi = panel.p_clusters.viewRange()[1]
    assert lo <= value <= hi and hi - lo <= 2, (value, lo, hi)
    # a curve that varies again: auto range follows it
    counts = run(1.0, 4)
    lo, hi = panel.p_clusters.viewRange()[1]
    assert lo <= min(counts) and max(counts) <= hi and hi - lo <= 2 * (max(counts) - min(counts)), (counts, lo, hi)
