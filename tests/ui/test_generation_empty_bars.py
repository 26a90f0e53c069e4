"""look15: before any step the Generate panel's bars plot showed bare axes (0.0002...0.0012 under no bars), which
read as a distribution of tiny probabilities. It is an empty plot (widgets.empty_plot) whose title says what to do,
until a Step draws bars; Reset of the session's model (a new model) empties it again."""
from __future__ import annotations

from PySide6.QtCore import Qt

from tiny_models import tiny_model
from .walkthrough import show_generation_panel

TEXT = "the cat sat on the mat and the dog sat on the log. "


def _axes_shown(plot_item) -> bool:
    return plot_item.getAxis("left").isVisible() or plot_item.getAxis("bottom").isVisible()


def test_the_bars_plot_says_what_to_do_before_a_step_and_draws_axes_after(qtbot, tmp_path):
    loaded = tiny_model(TEXT, "gpt2", context_length=64, init_std=0.3)
    panel = show_generation_panel(qtbot, loaded)
    item = panel.bars.plot.getPlotItem()
    qtbot.waitExposed(panel)
    panel.grab().save(str(tmp_path / "before.png"))
    assert not _axes_shown(item)
    title = item.titleLabel.text
    assert item.titleLabel.isVisible() and "Step" in title and "Run N" in title, title

    panel.prompt.setText("the ")
    qtbot.mouseClick(panel.step_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.session is not None and panel.session.current.depth == 1, timeout=10_000)
    qtbot.waitUntil(lambda: not panel.busy, timeout=10_000)
    assert panel.bars.token_ids and _axes_shown(item)
    assert not item.titleLabel.isVisible()  # (bars: no title over them)

    state = panel.state  # another model: its session goes, the plot is empty and says what to do again
    other = tiny_model(TEXT, "gpt2", context_length=64, init_std=0.3)
    state.loaded = other
    state.model_changed.emit(other)
    qtbot.waitUntil(lambda: panel.session is None, timeout=10_000)
    assert not _axes_shown(item) and item.titleLabel.text == title
