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


def test_chips_are_measured_again_for_new_tokens_and_a_new_font_not_for_a_new_width_nor_the_same_tokens(qtbot):
    """The chips' sizes are kept between layouts (the scroll area asks at many widths) but follow the
    tokens and the font: each layout equals one measured afresh."""
    strip = TokenStrip()
    qtbot.addWidget(strip)
    strip.resize(300, 200)
    strip.show()
    c = strip.canvas

    def fresh_widths():
        from PySide6.QtGui import QFontMetrics
        fm, fm_id = QFontMetrics(c.font()), QFontMetrics(c._id_font)
        return [c._chip_size(i, fm, fm_id).width() for i in range(len(c.strings))]

    strip.set_tokens(["a", "b", "c"], [1, 2, 3])
    sizes = c._sizes
    strip.resize(250, 200)
    c.heightForWidth(120)
    assert c._sizes is sizes  # a new width: no new measure
    strip.set_tokens(["a", "b", "c"], [1, 2, 3])  # the same tokens again (new lists): no new measure either
    assert c._sizes is sizes
    strip.set_tokens(["a much longer token", "b", "c"], [1, 2, 3])  # same count, other text
    assert [c.chip_rect(i).width() for i in range(3)] == fresh_widths()
    assert c.chip_rect(0).width() > c.chip_rect(1).width()
    font = c.font()
    font.setPointSizeF(font.pointSizeF() * 2)
    c.setFont(font)
    c.relayout()
    assert [c.chip_rect(i).width() for i in range(3)] == fresh_widths()


def test_the_chips_are_laid_out_once_per_change_of_tokens_or_width(qtbot, monkeypatch):
    """The scroll area and every paint ask for the layout: each (tokens, width) is wrapped once, and the
    rectangles are those a fresh layout at that width gives."""
    strip = TokenStrip()
    qtbot.addWidget(strip)
    strip.resize(300, 200)
    strip.show()
    c = strip.canvas
    wraps = []
    wrap = c._wrap
    monkeypatch.setattr(c, "_wrap", lambda width: wraps.append(width) or wrap(width))
    strip.set_tokens([f"tok{i}" for i in range(200)], list(range(200)))
    strip.grab()  # a paint
    for _ in range(5):
        c.sizeHint(), c.heightForWidth(c.width()), c.heightForWidth(150), strip.chip_center(7)
        strip.grab()
    assert sorted(wraps) == sorted({c.width(), 150})
    strip.set_tokens([f"tok{i}" for i in range(200)], list(range(200)))  # the same tokens again: no layout
    strip.grab()
    assert len(wraps) == 2
    strip.set_tokens([f"other{i}" for i in range(200)], list(range(200)))
    strip.grab()
    c.heightForWidth(c.width())
    assert len(wraps) == 3
    strip.resize(220, 200)  # a new width: laid out again, once
    qtbot.waitUntil(lambda: c.width() < 220)
    strip.grab(), c.sizeHint(), strip.grab()
    assert len(wraps) == 4 and wraps[-1] == c.width()
    corners, height = wrap(c.width())
    assert [(r.x(), r.y()) for r in (c.chip_rect(i) for i in range(200))] == corners
    assert c.minimumHeight() == height + 2 and c.heightForWidth(c.width()) == height + 2


def test_a_hidden_strip_lays_its_chips_out_when_shown(qtbot, monkeypatch):
    """A panel not on show (the Model panel during a first look on the Attention panel) is given its
    tokens: they are measured and laid out once it is shown, as tall as a strip shown first."""
    shown = TokenStrip()
    qtbot.addWidget(shown)
    shown.resize(200, 300)
    shown.show()
    tokens = [f"tok{i}" for i in range(100)], list(range(100))
    shown.set_tokens(*tokens)
    strip = TokenStrip()
    qtbot.addWidget(strip)
    strip.resize(200, 300)
    c = strip.canvas
    wraps = []
    wrap = c._wrap
    monkeypatch.setattr(c, "_wrap", lambda width: wraps.append(width) or wrap(width))
    strip.set_tokens(*tokens)
    assert wraps == [] and c._sizes == []  # not even measured
    strip.show()
    qtbot.waitUntil(lambda: c.width() == shown.canvas.width())
    strip.grab()
    assert wraps[-1] == c.width() and len(wraps) <= 2  # (at the width it is shown at, then the scroll area's)
    assert c.minimumHeight() == shown.canvas.minimumHeight() > 100
    assert strip.chip_center(99) == shown.chip_center(99)
