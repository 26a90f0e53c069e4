"""Frames per second of the Dynamics panel playing particles (issue 18: 2,000 particles in d = 3 at
30 frames per second or more on a 2-core CPU).

    python -m desktop_app bench dynamics [--n 2000] [--d 3] [--attention softmax] [--integrator euler]
                                         [--seconds 5] [--record-every 10] [--twin] [--threads 0]

Two numbers, one step per frame, in the panel's float32, on the sphere with Q = K = V = I:
  simulation_fps  steps per second of core.dynamics.Simulation.advance alone (what the worker does)
  panel_fps       frames per second actually drawn by the DynamicsPanel playing offscreen (its timer
                  asks the worker for the next frame whenever none is in flight; the worker steps and
                  measures, the UI thread draws the 3-D view and the curves) over --seconds of play.
and, for a shared machine, cpu_ms_per_frame (process CPU time, worker and UI together, per frame
drawn) and the 1-minute load average.
Curves are measured every --record-every steps, clusters among the panel's CLUSTER_SAMPLE particles
(the count costs O(n^2)); the W2 twin run, which doubles the work, is off unless --twin (as in the
panel). Threads: as the app sets them (ui.app.leave_a_core_for_the_ui: all cores but one, so 1 on a
2-core machine, where two spinning torch threads against other processes made each step several
times slower, measured) unless --threads.
"""
from __future__ import annotations

import argparse
import os
import time
from ..commands.args import OneLineParser, float_in, int_in, positive_int


def main(argv: list[str]) -> dict:
    ap = OneLineParser(prog="bench dynamics")
    ap.add_argument("--n", type=int_in(2, 10**6), default=2000)
    ap.add_argument("--d", type=int_in(1, 4096), default=3)
    ap.add_argument("--attention", choices=("softmax", "l2", "sinkhorn"), default="softmax")
    ap.add_argument("--integrator", choices=("euler", "rk4"), default="euler")
    ap.add_argument("--seconds", type=float_in(0, 3600, lo_open=True), default=5.0)
    ap.add_argument("--record-every", type=positive_int, default=10, help="as the panel's default")
    ap.add_argument("--twin", action="store_true", help="also run the twin for the W2 curve")
    ap.add_argument("--threads", type=int_in(0, 1024), default=0, help="torch threads (0: as the app, all cores but one)")
    args = ap.parse_args(argv)
    if "QT_QPA_PLATFORM" not in os.environ and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    import torch

    from ..core import dynamics as dy

    from ..ui.panels.dynamics import CLUSTER_SAMPLE

    if args.threads:
        torch.set_num_threads(args.threads)
    else:
        from ..ui.app import leave_a_core_for_the_ui

        leave_a_core_for_the_ui()
    cfg = dy.DynamicsConfig(attention=args.attention, d=args.d, n=args.n, sphere=True, integrator=args.integrator,
                            dt=0.02, perturbation=1e-3 if args.twin else 0.0, cluster_sample=CLUSTER_SAMPLE,
                            dtype=torch.float32)

    sim = dy.Simulation(cfg)
    sim.advance(2, record_every=10**9)  # warm-up
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < args.seconds / 2:
        sim.advance(1, record_every=args.record_every)
        steps += 1
    simulation_fps = steps / (time.perf_counter() - t0)

    from PySide6.QtWidgets import QApplication

    from ..ui.panels.dynamics import DynamicsPanel
    from ..ui.state import AppState

    app = QApplication.instance() or QApplication([])
    panel = DynamicsPanel(AppState())
    panel.resize(1400, 850)
    panel.show()
    panel.n.setValue(args.n)
    panel.d.setValue(args.d)
    panel.attention.setCurrentText(args.attention)
    panel.integrator.setCurrentText(args.integrator)
    panel.dt.setValue(0.02)
    panel.twin.setChecked(args.twin)
    panel.record_every.setValue(args.record_every)
    panel.steps_per_frame.setValue(1)
    panel.timer.setInterval(1)  # measure what the machine can do, not the panel's 33 ms timer
    panel.reset()
    deadline = time.perf_counter() + 60
    while panel.sim is None and time.perf_counter() < deadline:
        app.processEvents()
        time.sleep(0.002)
    panel.play_button.setChecked(True)
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()  # the application's own event loop, not a busy processEvents loop that would hog a core
    QTimer.singleShot(int(args.seconds / 2 * 1000), loop.quit)
    start_frames, t0, cpu0 = len(panel._frames), time.perf_counter(), time.process_time()
    loop.exec()
    frames = len(panel._frames) - start_frames
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    panel.play_button.setChecked(False)
    while panel.is_running():
        app.processEvents()
    panel_fps = frames / elapsed
    panel.close()
    return {"name": "dynamics", "n": args.n, "d": args.d, "attention": args.attention, "integrator": args.integrator,
            "twin": args.twin, "record_every": args.record_every, "torch_threads": torch.get_num_threads(),
            "simulation_fps": round(simulation_fps, 1), "panel_fps": round(panel_fps, 1), "target_fps": 30,
            # CPU seconds (all threads: worker and UI) per frame drawn: what a frame costs whatever the load
            "cpu_ms_per_frame": round(1000 * cpu / max(frames, 1), 1), "load_average": round(os.getloadavg()[0], 2),
            "meets_target": panel_fps >= 30}
