"""The views of the Attention and Layers panels as data (no Qt).

Each panel module here declares:
- a view state dataclass: every choice its controls hold (view, layer, head, statistic, depth, selected
  token). It is the single source of truth: the panel's controls write it, the tabs, export names and
  invalidation read it, the `render` command builds one from its arguments, a workspace saves it.
- a VIEWS table of `View`s: name, title, the controls it reads, `compute(data, state)` returning a plain
  result, and the export-name template. The Qt panel draws each result (a `HeatmapResult` by the one
  generic heatmap renderer; other kinds by a renderer the panel registers under the view's `widget`).

Adding a heatmap view is one `View(...)` line in the table plus its compute function (and a test).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class View:
    name: str  # stable id: tab, `render --view`, export names, workspace files
    title: str  # tab title
    controls: tuple[str, ...]  # view-state fields it reads (their controls are enabled on its tab)
    compute: Callable[[Any, Any], Any]  # (panel data, view state) -> plain result, or None: not ready yet
    export_name: str = "{view}"  # str.format over the view state's fields (and the panel's extras)
    widget: str = "heatmap"  # what draws it: "heatmap" = the generic heatmap renderer, else the panel's own
    axes: tuple[str, str, str] = ("query", "key", "weight")  # heatmap: row, column and value names
    heatmap_options: dict = field(default_factory=dict)  # heatmap: colormap, annotate_max_cells, row_tokens...
    rows: str = ""  # heatmap rows are "queries" or "tokens" (the selected token highlights one), else none
    keep_zoom: bool = False  # heatmap: new values of the same shape are uploaded in place (zoom kept)


@dataclass
class HeatmapResult:
    """A matrix to draw, with everything a heatmap needs to draw it."""
    values: np.ndarray
    row_labels: list[str]
    col_labels: list[str]
    mask: np.ndarray | None = None  # True where a cell exists
    levels: tuple[float, float] | None = None  # colour range (None: the values' range)
    title: str = ""
    value_name: str | None = None  # overrides the view's value axis name (e.g. the statistic shown)


def view_names(views: tuple[View, ...]) -> tuple[str, ...]:
    return tuple(v.name for v in views)


def find_view(views: tuple[View, ...], name: str) -> View:
    for v in views:
        if v.name == name:
            return v
    raise KeyError(f"no view named {name!r} (views: {', '.join(view_names(views))})")


def views_using(views: tuple[View, ...], control: str) -> tuple[str, ...]:
    """Names of the views a change of `control` invalidates."""
    return tuple(v.name for v in views if control in v.controls)


def export_name(views: tuple[View, ...], state, **extra) -> str:
    values = {f.name: getattr(state, f.name) for f in fields(state)}
    return find_view(views, state.view).export_name.format(**values, **extra)


def state_to_dict(state) -> dict:
    """Plain JSON-able dict of a view state (workspace files)."""
    return {f.name: getattr(state, f.name) for f in fields(state)}


def state_from_dict(cls, data, views: tuple[View, ...] | None = None):
    """A view state from a workspace dict: unknown keys (a newer app) are ignored, missing or ill-typed
    ones (an older app, a hand edit) keep their defaults, so any file opens."""
    state = cls()
    if not isinstance(data, dict):
        return state
    for f in fields(cls):
        if f.name not in data:
            continue
        value, default = data[f.name], getattr(state, f.name)
        if f.type in ("int | None", "Optional[int]"):  # an optional index: a token, a head
            ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
        elif isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        elif isinstance(default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            value = float(value) if ok else value
        elif isinstance(default, str):
            ok = isinstance(value, str)
        else:
            ok = False
        if f.name == "view" and ok and views is not None:
            ok = value in view_names(views)
        if ok:
            setattr(state, f.name, value)
    return state
