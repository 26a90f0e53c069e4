"""A target longer than the decoder's context, typed in the Model panel: the decoder reads its first
tokens (context - 1 after the start token, </s> kept at the end) and the line under the Target box says
so, as the source's count says its text is cut; before, it said "the start token + 11 target tokens" as if
the whole target had been read."""
from __future__ import annotations

from PySide6.QtCore import Qt

from translate_models import save_translate_model

from .walkthrough import click_panel_tab, open_window

CONTEXT = 12


def test_a_target_cut_to_the_decoders_context_is_said_under_the_target(qtbot, tmp_path, isolated_user_files,
                                                                       error_watch):
    folder = tmp_path / "marian"
    save_translate_model(folder, d_model=16, n_layers=1, n_decoder_layers=1, n_heads=2, d_ff=32, context_length=CONTEXT)
    w, state = open_window(qtbot, folder, text="the black dog runs", watch=error_watch)
    panel = click_panel_tab(qtbot, w, "Model")
    target = " ".join(["le chien noir court"] * 5)  # 20 words: longer than 11
    qtbot.mouseClick(panel.target_edit.viewport(), Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(state.trace_changed, timeout=30_000):
        qtbot.keyClicks(panel.target_edit, target)
    qtbot.waitUntil(lambda: state._trace_job is None and state.target == target, timeout=30_000)
    assert len(state.decoder_ids) == CONTEXT
    line = panel.target_count.text()
    assert f"the start token + {CONTEXT - 1} target tokens" in line and "only the first" in line, line

    short = "le chien"  # fits: nothing said
    qtbot.keyClick(panel.target_edit, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    with qtbot.waitSignal(state.trace_changed, timeout=30_000):
        qtbot.keyClicks(panel.target_edit, short)
    qtbot.waitUntil(lambda: state._trace_job is None and state.target == short, timeout=30_000)
    assert "only the first" not in panel.target_count.text()
    error_watch.assert_clean()
    w.close()
