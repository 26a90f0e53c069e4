"""A bottom axis's label kept inside its plot. pyqtgraph centres it under the axis; under a narrow plot (the feature
histogram of the Graph panel's node pane, ~100 px wide at 1280x800, its axis ~45 px) "activation" ran past the
plot's right edge and lost its last letter. The label moves sideways only as far as the plot's edges need (over
the empty corner under the left axis): under a wide plot it stays centred.

    keep_bottom_label_inside(plot)   # a PlotWidget or PlotItem
"""
from __future__ import annotations

EDGE = 2  # pixels kept between the label and the plot's edge


def keep_bottom_label_inside(plot) -> None:
    item = plot.getPlotItem() if hasattr(plot, "getPlotItem") else plot
    axis = item.getAxis("bottom")

    def place() -> None:
        label = axis.label
        if label is None:  # (an axis being closed)
            return
        width = label.boundingRect().width()
        centred = axis.size().width() / 2 - width / 2  # where pyqtgraph puts it (AxisItem.resizeEvent)
        edges = axis.mapRectFromItem(item, item.boundingRect())  # the plot, in the axis's coordinates
        x = max(edges.left() + EDGE, min(centred, edges.right() - EDGE - width))
        label.setPos(int(x), label.pos().y())

    # after pyqtgraph's own placing (its resizeEvent runs before geometryChanged); the plot's size changes the room
    axis.geometryChanged.connect(place)
    item.geometryChanged.connect(place)
