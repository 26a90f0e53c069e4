"""TokenStrip: chips laid out, coloured by value, clicking emits the chip's index."""
from PySide6.QtCore import Qt

from desktop_app.ui.widgets.token_strip import TokenStrip, value_colour


def test_set_tokens_and_click_selects(qtbot):
    strip = TokenStrip()
    qtbot.addWidget(strip)
    strip.resize(300, 120)
    strip.show()
    strip.set_tokens(["Hello", " world", "\n", "!"], [15, 995, 198, 0], values=[0.9, 0.1, 0.5, None])
    assert strip.count() == 4
    with qtbot.waitSignal(strip.token_selected) as sig:
        qtbot.mouseClick(strip.canvas, Qt.MouseButton.LeftButton, pos=strip.chip_center(2))
    assert sig.args == [2]
    assert strip.selected_index == 2
    # programmatic selection does not emit
    with qtbot.assertNotEmitted(strip.token_selected):
        strip.set_selected(0)
    assert strip.selected_index == 0


def test_wraps_to_width_and_rejects_mismatched_lengths(qtbot):
    strip = TokenStrip()
    qtbot.addWidget(strip)
    strip.resize(200, 200)
    strip.show()
    strip.set_tokens([f"tok{i}" for i in range(50)], list(range(50)))
    ys = {strip.chip_center(i).y() for i in range(50)}
    assert len(ys) > 1  # wrapped onto several lines
    import pytest
    with pytest.raises(ValueError):
        strip.set_tokens(["a", "b"], [1])


def test_value_colour_monotone():
    lo, mid, hi = (value_colour(v, 0.0, 1.0).lightness() for v in (0.0, 0.5, 1.0))
    assert lo > mid > hi
    assert value_colour(float("nan"), 0, 1).name() == "#e1e1e1"
