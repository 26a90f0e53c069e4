"""Issue 41: one probability format everywhere (never "-8.5e-05"), and text that reads on its cell (the logit
lens' white text on light blue): the colour is chosen from the cell's luminance by one helper."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor

from desktop_app.ui.widgets import prob_bars, token_strip
from desktop_app.ui.widgets.readable import format_prob, text_colour_on

from .test_layers_panel import _panel


def _contrast(a: QColor, b: QColor) -> float:
    """WCAG 2's contrast ratio (1 .. 21), written out from the standard."""
    def lum(c: QColor) -> float:
        ch = [x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4 for x in (c.redF(), c.greenF(), c.blueF())]
        return 0.2126 * ch[0] + 0.7152 * ch[1] + 0.0722 * ch[2]
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_one_probability_format_without_a_minus_sign():
    assert getattr(token_strip, "format_prob", format_prob) is format_prob is prob_bars.format_prob  # one, not two
    assert format_prob(-8.5e-05) == "0.000" and format_prob(-0.0) == "0.000"  # a rounding error is 0
    assert format_prob(8.5e-05) == "8.5e-05" and format_prob(0.25) == "0.250" and format_prob(1.0) == "1.000"
    assert format_prob(3e-4, 2) == "3.0e-04" and format_prob(None) == "" and format_prob(float("nan")) == ""


def test_pale_backgrounds_get_dark_text_and_saturated_ones_white():
    for pale in ("#fff4d6", "#ffe3a0", "#ffff99", "#c6dbef", "#f7fbff"):  # pale yellows and light blues
        assert text_colour_on(QColor(pale)).lightness() < 60, pale
    for deep in ("#08306b", "#2171b5", "#000000"):
        assert text_colour_on(QColor(deep)).lightness() > 200, deep


def test_every_logit_lens_cell_reads_at_a_contrast_of_at_least_4_5(qtbot, tmp_path):
    panel, _, ids = _panel(qtbot)
    qtbot.mouseClick(panel.tabs.tabBar(), Qt.MouseButton.LeftButton,
                     pos=panel.tabs.tabBar().tabRect(next(i for i in range(panel.tabs.count())
                                                          if "lens" in panel.tabs.tabText(i).lower())).center())
    lens = panel.lens_view.lens
    n = len(ids)
    probs = np.linspace(0.0, 1.0, 3 * n).reshape(3, n)  # every shade of the ramp, 0.6-0.8 included
    lens.set_data(lens.tokens, lens.next_tokens, lens.strings, lens.ids, probs)
    worst = min(_contrast(lens.data(lens.index(r, c), Qt.ItemDataRole.ForegroundRole),
                          lens.data(lens.index(r, c), Qt.ItemDataRole.BackgroundRole))
                for r in range(lens.rowCount()) for c in range(1, lens.columnCount()))
    assert worst >= 4.5, worst  # white on p = 0.61's light blue was 2.5
    panel.lens_view.grab().save(str(tmp_path / "lens.png"))


def test_every_token_chips_id_reads_on_its_chip():
    """The id under a token on the Model panel's probability colours: grey 110 on a mid blue was at 1.1."""
    for t in np.linspace(0.0, 1.0, 101):
        chip = token_strip.value_colour(float(t), 0.0, 1.0)
        assert _contrast(token_strip.id_colour_on(chip), chip) >= 4.5, (t, chip.name())
    assert token_strip.id_colour_on(QColor("#ffffff")) == QColor(110, 110, 110)  # the quiet grey where it reads
