"""Tables as the README's screenshots show them, at 1280x800 (shots5): the feature dashboard's Promotes /
Suppresses tables show every column of their filled rows without a scroll bar and, like its top-contexts
table, end on a whole row (look16: they cut their last row), its histogram's title fits, and the Graph
panel's Intervene table gives the token what the numbers leave ('p after' took most of the width)."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtWidgets import QFileDialog

from .test_features_panel import _click_row, _dictionary, _lens_shown, _open_from_menu
from .test_layouts_at_1024 import _columns_hold_their_cells
from .walkthrough import click_panel_tab, click_tab, graph_with_its_top_feature_clicked, open_window

MARGINS = 6  # (a cell's text is drawn 3 px in from either side)


def _widest(table, c: int) -> int:
    """The width column c needs: its title's or its widest cell's text."""
    title = table.horizontalHeader().fontMetrics().horizontalAdvance(table.horizontalHeaderItem(c).text())
    cells = [table.fontMetrics().horizontalAdvance(table.item(r, c).text()) for r in range(table.rowCount())]
    return max([title, *cells]) + MARGINS


def _ends_on_a_whole_row(table) -> bool:
    """The viewport's last pixel row is a row's last: no row cut in half at the bottom (or every row shown)."""
    h = table.viewport().height()
    last = table.rowAt(h - 1)
    if last < 0:  # below the last row: all shown
        return True
    return table.rowViewportPosition(last) + table.rowHeight(last) == h


def test_the_feature_dashboards_filled_tables_show_every_column_and_whole_rows(qtbot, model_dirs,
                                                                               isolated_user_files, tmp_path,
                                                                               monkeypatch):
    from desktop_app.paths import demo_text_path

    text_file = tmp_path / "alice.txt"
    text_file.write_text(Path(demo_text_path()).read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    w, state = open_window(qtbot, model_dirs["demo"], text="Alice was beginning to get very tired of sitting")
    w.resize(1280, 800)
    _open_from_menu(qtbot, w, state, monkeypatch, _dictionary(tmp_path / "sae"))
    panel = click_panel_tab(qtbot, w, "Features")
    _lens_shown(qtbot, panel)
    _click_row(qtbot, panel.features_table, 0)
    click_tab(qtbot, panel.tabs, "Dashboard")
    dash = panel.dashboard
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(text_file), "")))
    qtbot.mouseClick(dash.file_button, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(dash.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dash.contexts is not None and dash.run_button.isEnabled(), timeout=60_000)
    qtbot.wait(50)  # (laid out)
    for table in (dash.promoted_table, dash.suppressed_table):
        assert table.rowCount() > 0
        _columns_hold_their_cells(table)
        assert not table.horizontalScrollBar().isVisible()
    contexts = dash.contexts_table
    assert contexts.rowCount() > 10  # (more than fit: the last one shown was cut in half)
    assert contexts.verticalScrollBar().isVisible()
    assert _ends_on_a_whole_row(contexts), (contexts.viewport().height(), contexts.rowHeight(0))
    assert "fires on" in dash.fires_label.text()
    assert label_text_fits(dash.fires_label), (dash.fires_label.text(), dash.fires_label.size())
    for table in (dash.promoted_table, dash.suppressed_table):  # (the last row shown was cut)
        assert table.rowCount() * table.rowHeight(0) > table.viewport().height()  # more rows than fit
        assert _ends_on_a_whole_row(table), (table.viewport().height(), table.rowHeight(0))
    w.resize(1280, 700)  # and again after the window is resized
    qtbot.wait(50)
    assert _ends_on_a_whole_row(contexts), (contexts.viewport().height(), contexts.rowHeight(0))
    for table in (dash.promoted_table, dash.suppressed_table):
        assert _ends_on_a_whole_row(table), (table.viewport().height(), table.rowHeight(0))


def label_text_fits(label) -> bool:
    """A word-wrapped label's text, laid out at its width, fits inside it (no word wider, no line below it)."""
    from PySide6.QtCore import QRect

    rect = label.contentsRect()
    need = label.fontMetrics().boundingRect(QRect(0, 0, rect.width(), 10_000), int(Qt.TextFlag.TextWordWrap),
                                            label.text())
    return need.width() <= rect.width() and need.height() <= rect.height()


def test_the_graph_intervene_tables_numbers_are_as_wide_as_they_are_and_the_token_the_rest(
        qtbot, model_dirs, isolated_user_files, tmp_path, monkeypatch):
    w, state = open_window(qtbot, model_dirs["demo"], text="The cat sat on the mat because it was")
    w.resize(1280, 800)
    panel, top = graph_with_its_top_feature_clicked(qtbot, w, tmp_path, monkeypatch)
    qtbot.waitUntil(lambda: panel.selected == top, timeout=3000)
    qtbot.mouseClick(panel.pin_button, Qt.MouseButton.LeftButton)
    click_tab(qtbot, panel.side, "Intervene")
    qtbot.mouseClick(panel.run_edit_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.edit_result is not None, timeout=20_000)
    qtbot.wait(50)  # (laid out)
    table = panel.logits_table
    assert table.rowCount() > 0
    _columns_hold_their_cells(table)
    for c in range(1, table.columnCount()):  # each number's column as wide as what it holds
        assert table.columnWidth(c) <= _widest(table, c) + 2 * MARGINS, (c, table.columnWidth(c), _widest(table, c))
    numbers = sum(table.columnWidth(c) for c in range(1, table.columnCount()))
    assert abs(table.columnWidth(0) - (table.viewport().width() - numbers)) <= 1  # the token the rest
    assert not table.horizontalScrollBar().isVisible()


def test_the_graph_nodes_dashboard_shows_the_token_column_its_histograms_title_and_whole_rows(
        qtbot, model_dirs, isolated_user_files, tmp_path, monkeypatch):
    """look16: in the Graph panel's node pane (about 430 px wide at 1280x800) the top contexts' 'before' column,
    as wide as its text, pushed the token column past the right edge; the histogram's title was cut after
    "fires on 1,11"; Promotes / Suppresses cut their last row; the hover line widened the window past 1280; the
    histogram's x label lost its last letter ("activatio")."""
    from desktop_app.paths import demo_text_path

    text_file = tmp_path / "alice.txt"
    text_file.write_text(Path(demo_text_path()).read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    w, state = open_window(qtbot, model_dirs["demo"], name="demo")
    w.resize(1280, 800)
    panel, top = graph_with_its_top_feature_clicked(qtbot, w, tmp_path, monkeypatch)
    dash = panel.dashboard
    qtbot.waitUntil(lambda: dash.promoted_table.rowCount() > 0, timeout=20_000)
    # the hover line of the node under the mouse (~750 px) made the window ~1,300 px wide, past the 1280 asked
    d, view = panel.full_layout, panel.plot.getPlotItem().vb
    qtbot.mouseMove(panel.plot.viewport(), QPoint(1, 1))
    qtbot.wait(100)  # (pyqtgraph's scene drops mouse moves closer than its rate limit)
    qtbot.mouseMove(panel.plot.viewport(), panel.plot.mapFromScene(view.mapViewToScene(QPointF(d.x[top], d.y[top]))))
    qtbot.waitUntil(lambda: "cumulative influence" in panel.hover.text(), timeout=3000)  # (that node's, or one on it)
    qtbot.wait(50)
    assert w.width() == 1280 and w.minimumSizeHint().width() <= 1024, (w.width(), w.minimumSizeHint())
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(text_file), "")))
    qtbot.mouseClick(dash.file_button, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(dash.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dash.contexts is not None and dash.run_button.isEnabled(), timeout=60_000)
    qtbot.wait(50)  # (laid out)
    contexts = dash.contexts_table
    assert contexts.viewport().width() < 500  # the narrow pane this is about
    assert contexts.rowCount() > 0
    # rank, activation and token whole and inside the viewport; before and after share the rest (cut, not hidden)
    for c in (0, 1, 3):
        widest = max(contexts.fontMetrics().horizontalAdvance(contexts.item(r, c).text())
                     for r in range(contexts.rowCount()))
        assert contexts.columnWidth(c) >= widest + MARGINS, (c, contexts.columnWidth(c), widest)
    last = contexts.columnCount() - 1
    assert contexts.columnViewportPosition(last) + contexts.columnWidth(last) <= contexts.viewport().width()
    assert not contexts.horizontalScrollBar().isVisible()
    assert min(contexts.columnWidth(2), contexts.columnWidth(4)) >= 60  # the contexts still readable
    assert "fires on" in dash.fires_label.text()
    assert label_text_fits(dash.fires_label), (dash.fires_label.text(), dash.fires_label.size())
    # the histogram's x label whole: centred under its ~45 px axis, "activation" ran past the plot's right edge
    axis = dash.histogram.getPlotItem().getAxis("bottom")
    shown = axis.label.mapRectToScene(axis.label.boundingRect())  # (the scene is the plot widget, pixel for pixel)
    assert axis.labelText == "activation" and axis.label.isVisible()
    assert 0 <= shown.left() and shown.right() <= dash.histogram.viewport().width(), (shown, dash.histogram.width())
    for table in (contexts, dash.promoted_table, dash.suppressed_table):
        assert table.rowCount() * table.rowHeight(0) > table.viewport().height()  # more rows than fit
        assert _ends_on_a_whole_row(table), (table.viewport().height(), table.rowHeight(0))


def test_the_features_lens_table_gives_each_column_its_width_and_lines_up_its_numbers(
        qtbot, model_dirs, isolated_user_files, tmp_path, monkeypatch):
    """The Features lens at 1280x800: its last column (|error|) stretched over ~360 px, its numbers at the left
    edge and its title ~170 px to their right; L0, var. expl. and |error| were left-aligned."""
    from .test_features_panel import TEXT

    w, state = open_window(qtbot, model_dirs["demo"], text=TEXT)
    w.resize(1280, 800)
    _open_from_menu(qtbot, w, state, monkeypatch, _dictionary(tmp_path / "sae-l2"))
    panel = w.slot("Features").panel
    _lens_shown(qtbot, panel)
    _click_row(qtbot, panel.features_table, 1)  # (a feature clicked: the text coloured by it)
    qtbot.waitUntil(lambda: panel.dashboard.promoted_table.rowCount() > 0, timeout=20_000)
    qtbot.wait(50)  # (laid out)
    table = panel.tokens_table
    header = [table.horizontalHeaderItem(c).text() for c in range(table.columnCount())]
    assert header[-3:] == ["L0", "var. expl.", "|error|"]
    for c in range(table.columnCount()):
        assert table.columnWidth(c) <= _widest(table, c) + MARGINS, (header[c], table.columnWidth(c), _widest(table, c))
    assert table.viewport().width() > sum(table.columnWidth(c) for c in range(table.columnCount()))  # (room left)
    right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
    for c in (0, len(header) - 3, len(header) - 2, len(header) - 1):
        assert all(Qt.AlignmentFlag(table.item(r, c).textAlignment()) == right for r in range(table.rowCount())), header[c]
