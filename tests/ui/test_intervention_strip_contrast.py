"""Issue 41: the what-if strip's chips are pale yellow; under a dark desktop palette their text was white
(white on pale yellow, unreadable). The strip writes dark text whatever the palette."""
from __future__ import annotations

from PySide6.QtWidgets import QApplication

from desktop_app.core.interventions import parse_ablations
from desktop_app.ui.settings import dark_palette
from desktop_app.ui.state import AppState
from desktop_app.ui.widgets.intervention_strip import InterventionStrip


def test_the_strips_text_is_dark_on_its_pale_yellow_under_a_dark_palette(qtbot, tmp_path):
    app = QApplication.instance()
    before = app.palette()
    app.setPalette(dark_palette())
    try:
        state = AppState()
        strip = InterventionStrip(state)
        qtbot.addWidget(strip)
        strip.show_interventions(parse_ablations("0.1"))
        strip.show()
        qtbot.waitExposed(strip)
        strip.grab().save(str(tmp_path.parent / "edges2_strip.png"))
        label = strip.chips[0].findChildren(type(strip.title))[0]
        image = label.grab().toImage()
        darkest = min(image.pixelColor(x, y).lightness() for x in range(image.width()) for y in range(image.height()))
        assert darkest < 90, darkest  # its letters: dark on the pale chip
    finally:
        app.setPalette(before)

