"""The What if panel's attribution chart names its token in the title as the tokenizer writes it: a token
that looks like markup (<|endoftext|>, T5's <pad>, BART's <s> and </s>) is shown, not swallowed by
the title's rich text (it read "token '' (#0)" before, and <s> struck the rest of the title through)."""
from __future__ import annotations

from PySide6.QtCore import Qt

from .walkthrough import click_panel_tab, open_window, type_into


def test_a_special_token_is_named_in_the_attribution_title(qtbot, model_dirs, isolated_user_files, error_watch):
    w, state = open_window(qtbot, model_dirs["demo"], text="Alice and the rabbit hole.", watch=error_watch)
    special = state.token_strings([0])[0]
    assert special.startswith("<") and special.endswith(">")  # the demo tokenizer's <|endoftext|>
    panel = click_panel_tab(qtbot, w, "What if")
    type_into(qtbot, panel.token_edit, "#0")
    qtbot.mouseClick(panel.attribute_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.dla_chart.attribution is not None and panel.dla_chart.attribution.token_id == 0
                    and (panel._dla_job is None or panel._dla_job.done), timeout=30_000)
    shown = panel.dla_chart.plot_item.titleLabel.item.toPlainText()
    assert shown.startswith(f"token {special!r} (#0) at position ") and "logit" in shown, shown
    error_watch.assert_clean()
    w.close()
