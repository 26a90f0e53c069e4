"""DynamicsPanel with pytest-qt, offscreen: the real buttons build, step, play and pause the particles
(computed in a worker), dragging rotates the 3-D view, the model's per-layer curves are the core's,
bad matrices are one line naming the file, and the exports write the numbers shown."""
from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from PySide6.QtCore import QPoint, Qt

from desktop_app.core import dynamics as dy
from desktop_app.core.checkpoints import LoadedModel, new_model
from desktop_app.core.config import ModelConfig
from desktop_app.core.tokenizer import char_tokenizer
from desktop_app.ui.panels.dynamics import DynamicsPanel
from desktop_app.ui.state import AppState

TEXT = "the queen of hearts made some tarts"


@pytest.fixture
def state():
    tok = char_tokenizer(TEXT)
    cfg = ModelConfig.gpt2(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32, context_length=64)
    s = AppState()
    s.loaded = LoadedModel(new_model(cfg, seed=0).eval(), cfg, tok, None, "test")
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
