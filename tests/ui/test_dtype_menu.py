"""Issue 27: the compute dtype is shown in the status bar and changed from Device > Compute dtype (the
open model is opened again in it); auto keeps a float32 checkpoint in float32."""
from __future__ import annotations

import torch

from tiny_models import save_tiny_model


def test_the_device_menu_changes_the_compute_dtype_and_the_status_bar_shows_it(qtbot, tmp_path):
    from desktop_app.ui.main_window import MainWindow
    from desktop_app.ui.state import AppState

    save_tiny_model(tmp_path / "m", "abcdefgh ", d_model=16, n_heads=2, d_ff=32, context_length=32)
    state = AppState()
    state.text = "abc"
    window = MainWindow(state)
    qtbot.addWidget(window)
    window.show()
    with qtbot.waitSignal(state.model_changed, timeout=60_000):
        state.open_model(tmp_path / "m")
    assert window.dtype_actions["auto"].isChecked()
    assert window.dtype_label.text() == "float32" and "checkpoint" in window.dtype_label.toolTip()

    with qtbot.waitSignal(state.model_changed, timeout=60_000):
        window.dtype_actions["bfloat16"].trigger()  # the menu item, as a click on it does
    assert state.loaded.model.dtype == torch.bfloat16 and state.dtype == "bfloat16"
    assert window.dtype_label.text() == "bfloat16" and window.dtype_actions["bfloat16"].isChecked()
    qtbot.waitUntil(lambda: state.trace is not None and state.trace.pattern(0).dtype == torch.bfloat16,
                    timeout=60_000)

    with qtbot.waitSignal(state.model_changed, timeout=60_000):
        window.dtype_actions["auto"].trigger()
    assert state.loaded.model.dtype == torch.float32 and state.dtype is None
    assert window.dtype_label.text() == "float32"
