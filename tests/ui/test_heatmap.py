"""Heatmap widget: one image item, thinned token labels, hover text, masks, row highlight, CSV."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPoint, QPointF, Qt

from desktop_app.ui.widgets.heatmap import Heatmap, LabelAxis


def _heatmap(qtbot, n=6, mask=True):
    hm = Heatmap(row_name="query", col_name="key", value_name="weight")
    qtbot.addWidget(hm)
    hm.resize(600, 500)
    hm.show()
    values = np.arange(n * n, dtype=np.float32).reshape(n, n) / (n * n)
    labels = [f"t{i}" for i in range(n)]
    hm.set_matrix(values, labels, labels, mask=np.tril(np.ones((n, n), bool)) if mask else None)
    return hm, values


def test_an_arbitrary_mask_is_an_image_overlay(qtbot):
    hm, values = _heatmap(qtbot, n=5, mask=False)
    mask = np.ones((5, 5), bool)
    mask[2, 0] = mask[0, 3] = False  # not a prefix per row
    hm.set_matrix(values, mask=mask)
    assert hm.mask_image.isVisible() and not hm.mask_polygon.isVisible()
    assert tuple(hm.mask_image.image[2, 0]) == (150, 150, 150, 255) and hm.mask_image.image[2, 1, 3] == 0


def test_one_image_item_holds_every_cell(qtbot):
    hm, values = _heatmap(qtbot, n=300)
    np.testing.assert_array_equal(hm.image.image, values)
    images = [i for i in hm.plot.items if i.__class__.__name__ == "ImageItem"]
    assert len(images) == 2  # the values and the static mask overlay, whatever the size
    assert hm.image.boundingRect().width() == 300


def test_labels_are_thinned_to_fit_and_follow_zoom():
    ax = LabelAxis("left")
    ax.set_labels([f"tok{i}" for i in range(1024)])
    (step, ticks), = ax.tickValues(0, 1024, 500)
    assert len(ticks) * ax._label_pixels() <= 500 + step * ax._label_pixels()
    assert step > 1 and ticks[0] == 0.5
    assert ax.tickStrings(ticks[:2], 1, step) == ["tok0", f"tok{int(step)}"]
    (step_zoomed, ticks_zoomed), = ax.tickValues(100, 110, 500)  # zoomed in: every label
    assert step_zoomed == 1 and ticks_zoomed[0] == 100.5 and len(ticks_zoomed) == 11


def test_describe_cell_and_mask(qtbot):
    hm, values = _heatmap(qtbot)
    assert hm.describe_cell(4, 1) == f"query 4 't4' \u2192 key 1 't1'\nweight: {values[4, 1]:.4g}"
    assert hm.describe_cell(1, 4).endswith("weight: masked")
    poly = hm.mask_polygon.polygon()  # a causal mask is a staircase polygon
    assert hm.mask_polygon.isVisible() and not hm.mask_image.isVisible()
    assert poly.containsPoint(QPointF(4.5, 1.5), Qt.FillRule.OddEvenFill)
    assert not poly.containsPoint(QPointF(1.5, 4.5), Qt.FillRule.OddEvenFill)
    assert not poly.containsPoint(QPointF(3.5, 3.5), Qt.FillRule.OddEvenFill)
    header, rows = hm.csv_table()
    assert header == ["query \\ key", "t0", "t1", "t2", "t3", "t4", "t5"]
    assert rows[1][0] == "t1" and rows[1][3] == "" and abs(float(rows[1][1]) - values[1, 0]) < 1e-6


def test_set_values_keeps_labels_and_levels_reach_the_colour_bar(qtbot):
    hm, values = _heatmap(qtbot)
    hm.set_values(values[::-1].copy(), levels=(0.0, 2.0))
    assert hm.row_labels[0] == "t0" and hm.levels == (0.0, 2.0)
    assert tuple(hm.colorbar.levels()) == (0.0, 2.0)
    np.testing.assert_array_equal(hm.image.image, values[::-1])


def test_cell_mapping_round_trip_and_row_highlight(qtbot):
    hm, _ = _heatmap(qtbot, n=50, mask=False)
    for r, c in ((0, 0), (10, 37), (49, 49)):
        assert hm.cell_at(hm.cell_scene_pos(r, c)) == (r, c)
    assert hm.cell_at(hm.mapToScene(QPoint(1, 1))) is None
    hm.set_selected_row(12)
    assert hm.row_box.isVisible() and hm.row_box.rect().top() == 12 and hm.row_box.rect().width() == 50
    hm.set_selected_row(None)
    assert not hm.row_box.isVisible()


def test_annotations_only_for_small_matrices(qtbot):
    hm = Heatmap(annotate_max_cells=20)
    qtbot.addWidget(hm)
    hm.set_matrix(np.eye(4))
    assert [a.text() for a in hm.annotations[:2]] == ["1", "0"]
    hm.set_matrix(np.eye(5))
    assert hm.annotations == []


def test_annotations_follow_each_new_matrix_reusing_their_items(qtbot):
    hm = Heatmap(annotate_max_cells=20)
    qtbot.addWidget(hm)
    hm.set_matrix(np.array([[1.0, 2.0], [3.0, 4.0]]))
    first = list(hm.annotations)
    hm.set_matrix(np.array([[5.0, 6.0, 7.0]]))
    assert [a.text() for a in hm.annotations] == ["5", "6", "7"]
    assert [(a.pos().x(), a.pos().y()) for a in hm.annotations] == [(0.5, 0.5), (1.5, 0.5), (2.5, 0.5)]
    assert hm.annotations == first[:3] and first[3].scene() is None  # the items reused, the one left over gone
    hm.set_matrix(np.array([[0.25, 0.5], [0.75, 1.0]]), mask=np.array([[True, False], [True, True]]))
    assert [a.text() for a in hm.annotations] == ["0.25", "0.75", "1.00"]  # none on the masked cell
    assert all(a.scene() is hm.plot.scene() for a in hm.annotations)
    hm.set_matrix(np.eye(5))
    assert hm.annotations == [] and all(a.scene() is None for a in first)


def test_each_number_is_drawn_centred_in_its_cell_in_screen_pixels(qtbot):
    """The cells' numbers are plain text items in screen pixels (pyqtgraph's TextItem took ~1 ms each: 0.3-0.5 s
    for the head statistics' 336 at Qwen2.5-0.5B); each is centred on its cell, and the grab shows it there."""
    from PySide6.QtCore import QPointF

    hm = Heatmap(annotate_max_cells=20, colorbar=False)
    qtbot.addWidget(hm)
    hm.resize(400, 300)
    hm.show()
    qtbot.waitExposed(hm)
    hm.set_matrix(np.array([[0.0, 10.0], [20.0, 30.0]]), levels=(0.0, 30.0))
    qtbot.wait(50)
    view = hm.viewport()
    for t, (r, c) in zip(hm.annotations, [(0, 0), (0, 1), (1, 0), (1, 1)]):
        drawn = t.deviceTransform(hm.viewportTransform()).mapRect(t.boundingRect())
        cell = hm.mapFromScene(hm.vb.mapViewToScene(QPointF(c + 0.5, r + 0.5)))
        assert abs(drawn.center().x() - cell.x()) <= 1 and abs(drawn.center().y() - cell.y()) <= 1
        assert drawn.width() < view.width() / 4  # screen pixels, not one cell's width of the view
    image = hm.grab().toImage()
    box = hm.annotations[0].deviceTransform(hm.viewportTransform()).mapRect(hm.annotations[0].boundingRect())
    # the first cell (the colour map's darkest) has white text: some white pixel inside the number's box
    white = [image.pixelColor(x, y).lightness() for x in range(int(box.left()), int(box.right()))
             for y in range(int(box.top()), int(box.bottom()))]
    assert max(white) > 230
