"""How numbers and text read on screen, in one style everywhere: a probability's format, and the text colour
that reads on a coloured cell or chip."""
from __future__ import annotations

import math

from PySide6.QtGui import QColor


def format_prob(p: float | None, decimals: int = 3) -> str:
    """A probability with a fixed number of decimals (so a column lines up); one too small to show that way in
    scientific notation ("2.1e-05", never "0.000"); a rounding error below 0 is 0 (never "-8.5e-05");
    None and NaN as ""."""
    if p is None:
        return ""
    p = float(p)
    if math.isnan(p):
        return ""
    p = max(p, 0.0) + 0.0  # + 0.0: no "-0.000" either
    if p != 0 and p < 0.5 * 10 ** -decimals:
        return f"{p:.1e}"
    return f"{p:.{decimals}f}"


def _relative_luminance(colour: QColor) -> float:
    """WCAG 2's relative luminance of an sRGB colour (0 black .. 1 white)."""
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    return 0.2126 * linear(colour.redF()) + 0.7152 * linear(colour.greenF()) + 0.0722 * linear(colour.blueF())


def contrast_ratio(a: QColor, b: QColor) -> float:
    """WCAG 2's contrast ratio of two colours (1 .. 21; 4.5 is its minimum for text)."""
    hi, lo = sorted((_relative_luminance(a), _relative_luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def text_colour_on(background: QColor, dark: QColor | None = None, light: QColor | None = None) -> QColor:
    """Black or white text, whichever contrasts more with `background` (WCAG's contrast ratio): black on a
    light blue or a pale yellow, white on a saturated blue (either reads at a contrast of 4.5 at least)."""
    dark = QColor(0, 0, 0) if dark is None else dark
    light = QColor(255, 255, 255) if light is None else light
    return light if contrast_ratio(light, background) > contrast_ratio(dark, background) else dark


def quiet_text_colour_on(background: QColor, quiet: QColor) -> QColor:
    """`quiet` (a grey for secondary text) where it still reads on `background` (contrast 4.5), else the
    text colour that reads best: a token's id under it, grey on a pale chip, black or white on a blue one."""
    return quiet if contrast_ratio(quiet, background) >= 4.5 else text_colour_on(background)
