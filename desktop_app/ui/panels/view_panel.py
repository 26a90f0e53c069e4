"""The skeleton shared by the panels whose views are declared as data (core.views: Attention, Layers).

A `ViewTablePanel` subclass names its VIEWS table and view-state class; this class builds one widget
per view (a generic Heatmap for heatmap views, the panel's own widget otherwise), the tab widget and
export bar, lays them out under the panel's controls, follows the app's trace, runs the panel's worker
job for a trace (dropping the result of an older one), and keeps the selected token in every view.
Each panel keeps what is its own: its controls, its data, how its other views are drawn and cleared.
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtWidgets import QHBoxLayout, QTabWidget, QVBoxLayout, QWidget

from ...core.views import HeatmapResult, View, export_name, view_names
from ..widgets.after_first_paint import AfterFirstPaint
from ..widgets.elided_label import ElidedLabel
from ..widgets.export import ExportBar
from ..widgets.heatmap import Heatmap
from ..widgets.made_when_shown import MadeWhenShown
from ..widgets.token_strip import TokenStrip


class ViewTablePanel(QWidget):
    VIEW_TABLE: tuple[View, ...] = ()  # the views as data (a core.views module's VIEWS)
    VIEW_STATE: type = type(None)  # that module's view-state dataclass
    VIEWS: tuple[str, ...] = ()  # view names, in tab order (from VIEW_TABLE)
    VIEW_TITLES: tuple[str, ...] = ()  # tab titles (from VIEW_TABLE)
    START_AFTER_FIRST_PAINT = False  # a trace's worker asked for before the panel's first paint starts after it

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.VIEWS = view_names(cls.VIEW_TABLE)
        cls.VIEW_TITLES = tuple(v.title for v in cls.VIEW_TABLE)

    def __init__(self, state, view_state, waiting_text: str, parent=None) -> None:
        super().__init__(parent)
        self.state = state
        self.view_state = view_state if view_state is not None else self.VIEW_STATE()  # what the controls hold
        self.trace = None
        self.data = None
        self._generation = 0  # counts traces: a worker's result for an older trace is dropped
        # views whose numbers changed while hidden: drawn when shown (_refresh); at 1,024 tokens of the
        # Qwen2.5-0.5B shape drawing every view at a result held the UI thread ~1.2 s (bench ui)
        self._stale: set[str] = set()
        self._job = None
        self._after_paint = AfterFirstPaint(self)  # a worker asked for before the first paint: _run_trace_job
        self._relabel = False  # keep_zoom heatmaps need new labels / mask (a new trace)
        # one line beside the controls: cut with "…" (whole text in the tooltip), never widening the window
        self.status = ElidedLabel(waiting_text)
        self.tokens = TokenStrip(show_ids=False)
        self.tokens.setMaximumHeight(90)

    def _build_views(self, own: dict[str, QWidget | Callable[[], QWidget]]) -> None:
        """The tabs, the export bar, and the widget of the view on show (`own`: the panel's widget, or what
        makes it, for each non-heatmap kind). Each other view's widget is made when its tab is first shown or
        it is asked for (self.widgets[name]; widgets.made_when_shown): a pyqtgraph plot is ~10-25 ms to make,
        and at the Qwen2.5-0.5B shape making every view held the Layers panel's first show 278-525 ms (bench ui)."""
        self._own = own
        self._cleared: str | None = None  # what the views say while there is no trace (_clear)
        pages = {name: MadeWhenShown(lambda name=name: self._make_view(name)) for name in self.VIEWS}
        self.widgets = _ViewWidgets(pages)  # view name -> the widget that draws it, once made
        self.tabs = QTabWidget()
        for name, title in zip(self.VIEWS, self.VIEW_TITLES):
            self.tabs.addTab(pages[name], title)
        self.tabs.setCurrentIndex(self.VIEWS.index(self.view_state.view))
        self.tabs.currentChanged.connect(lambda i: self.widgets[self.VIEWS[i]])  # (first: the panel's own follow)
        self.export_bar = ExportBar(self.current_view, self._export_name)
        self.tabs.currentChanged.connect(lambda _: self.export_bar.refresh())  # another tab: another view

    def _make_view(self, name: str) -> QWidget:
        v = self.VIEW_TABLE[self.VIEWS.index(name)]
        if v.widget == "heatmap":
            w = Heatmap(row_name=v.axes[0], col_name=v.axes[1], value_name=v.axes[2], **v.heatmap_options)
            if v.rows:
                w.cell_clicked.connect(lambda row, _col, v=v: self._on_row_clicked(v, row))
            if self._cleared is not None:
                w.clear_matrix(self._cleared)
        else:
            w = self._own[v.widget]
            w = w if isinstance(w, QWidget) else w()
        if hasattr(self, "export_bar"):  # (the view made first is the bar's own current_view())
            self.export_bar.follow(w)
        self._view_made(name, w)
        return w

    def _view_made(self, name: str, widget: QWidget) -> None:
        """Connect what the panel needs of a view's widget, when made."""

    def _lay_out(self, controls: QHBoxLayout) -> None:
        """The panel's controls, then the status and export bar on their row; the tokens; the tabs."""
        controls.addWidget(self.status, 1)
        controls.addWidget(self.export_bar)
        lay = QVBoxLayout(self)
        lay.addLayout(controls)
        lay.addWidget(self.tokens)
        lay.addWidget(self.tabs, 1)

    def _follow_trace(self) -> None:
        """Show the app's trace from now on (and the one it already has): the end of a panel's __init__."""
        self.state.trace_changed.connect(self._on_trace_changed)
        if getattr(self.state, "trace", None) is not None:
            self._on_trace_changed(self.state.trace)
        elif self._cleared is None:  # nothing yet: the heatmaps say what to do, as the status line does
            self._clear_heatmaps(self.status.text())

    def heatmap_views(self) -> list[View]:
        return [v for v in self.VIEW_TABLE if v.widget == "heatmap"]

    def _clear_heatmaps(self, message: str) -> None:
        """Every heatmap made so far says `message` instead of numbers, and one made later will too."""
        self._cleared = message
        for v in self.heatmap_views():
            if v.name in self.widgets:
                self.widgets[v.name].clear_matrix(message)

    # -- view state ------------------------------------------------------------------------
    def set_view_state(self, view_state) -> None:
        """Show these choices (a workspace, the render command): tab, the panel's controls, then the selection."""
        self.view_state = self.VIEW_STATE(**vars(view_state))
        self.tabs.blockSignals(True)  # the panel shows the whole state below, not one tab change at a time
        self.tabs.setCurrentIndex(self.VIEWS.index(self.view_state.view))
        self.tabs.blockSignals(False)
        self.widgets[self.view_state.view]  # (made: the tab's signal was blocked)  # noqa: B018
        self._show_view_state()
        self.select_token(self.view_state.selected_token)

    def _show_view_state(self) -> None:
        """Clamp the new view state to the trace shown and show it in the panel's controls and views."""
        raise NotImplementedError

    # -- views -----------------------------------------------------------------------------
    def views(self) -> list:
        """Every view's widget (each made now if not yet)."""
        return [self.widgets[name] for name in self.VIEWS]

    def current_view(self):
        return self.widgets[self.VIEWS[self.tabs.currentIndex()]]

    def show_view(self, name: str) -> None:
        self.tabs.setCurrentIndex(self.VIEWS.index(name))

    def _refresh(self) -> None:
        """Draw the view on show if its numbers changed while it was hidden (_draw_stale)."""
        name = self.view_state.view
        if name in self._stale and self.data is not None:
            self._stale.discard(name)
            self._draw_stale(name)

    def _draw_stale(self, name: str) -> None:
        raise NotImplementedError

    def _export_name(self) -> str:
        return export_name(self.VIEW_TABLE, self.view_state, **self._export_name_extras())

    def _export_name_extras(self) -> dict[str, str]:
        """Names an export-name template may use beyond the view state's fields."""
        return {}

    def _render_heatmap(self, view: View, r: HeatmapResult) -> None:
        """The one renderer of every heatmap view's result."""
        hm = self.widgets[view.name]
        if r.value_name is not None:
            hm.set_axis_names(view.axes[0], view.axes[1], r.value_name)
        relabel = view.keep_zoom and self._relabel
        if view.keep_zoom:
            self._relabel = False
        if not view.keep_zoom or relabel or hm.values.shape != r.values.shape:
            hm.set_matrix(r.values, r.row_labels, r.col_labels, mask=r.mask, levels=r.levels, title=r.title)
        else:
            hm.set_values(r.values, r.levels)  # the fast path: one texture upload
            hm.set_title(r.title)
        if view.rows:  # (a view made after the selection is given it here)
            hm.set_selected_row(self._row_of_selection(view))

    # -- data ------------------------------------------------------------------------------
    def _on_trace_changed(self, trace) -> None:
        self.set_trace(trace, list(getattr(self.state, "token_ids", []) or []))

    def _new_trace(self, trace) -> int:
        """Take this trace as the one shown; returns its number (a worker's result must carry it back)."""
        self.trace = trace
        self._generation += 1
        self._cleared = None
        return self._generation

    def _is_current(self, generation: int) -> bool:
        return generation == self._generation

    # A panel built by a click on its tab starts its trace's worker at once, and at the Qwen2.5-0.5B shape the
    # worker's numpy and torch work (the layer analysis: float64 copies of the residual stream, cosines on both
    # cores) took the cores from the panel's first paint: the Layers tab's first show was 1.2-1.9x slower with the
    # worker running than without (the UI thread's own CPU time the same; bench ui). So a job asked for before the
    # panel's first paint starts just after it, or at the next turn of the event loop when no paint is coming
    # (widgets.after_first_paint). (Layers only: the Attention panel is built by the first look, before its trace,
    # and follows its own jobs' ends.)
    def _run_trace_job(self, work: Callable, on_result: Callable, failure: str, sync: bool,
                       on_progress: Callable[[int, int, str], None] | None = None,
                       on_partial: Callable | None = None) -> None:
        """work(job) -> result, then on_result(result): here (sync, the CLI) or in a worker, which replaces
        the previous trace's job (its progress to on_progress, the pieces it hands before its result to
        on_partial: workers.run_job). A worker's error goes to the status line as 'FAILURE failed: ...'."""
        if sync:
            on_result(work())
            return
        self._cancel_job()  # its result would be dropped anyway
        if self.START_AFTER_FIRST_PAINT and not self._after_paint.painted:  # (a panel built by a tab's click: below)
            self._after_paint.call(lambda: self._start_trace_job(work, on_result, failure, on_progress, on_partial))
            return
        self._start_trace_job(work, on_result, failure, on_progress, on_partial)

    def _start_trace_job(self, work: Callable, on_result: Callable, failure: str,
                         on_progress: Callable[[int, int, str], None] | None,
                         on_partial: Callable | None) -> None:
        from ..workers import run_job

        mine: list = []  # this job, once started: only its own delivery marks the panel's work done

        def ended() -> bool:
            if mine and self._job is mine[0]:
                self._job = None
                self._job_changed()
                return True
            return False

        def delivered(result) -> None:
            ended()
            on_result(result)

        def failed(exc, tb) -> None:
            ended()
            self.status.setText(f"{failure} failed: {exc}")

        def cancelled() -> None:  # (a newer trace's cancel of an older job is not this panel's news)
            if ended():
                self._job_cancelled()

        self._job = run_job(work, on_result=delivered, on_error=failed, on_progress=on_progress, on_partial=on_partial,
                            on_cancelled=cancelled)
        mine.append(self._job)
        self._job_changed()

    def _job_changed(self) -> None:
        """The panel's worker started or ended (a panel with a Cancel button enables it here)."""

    def _job_cancelled(self) -> None:
        """The current trace's worker was cancelled by the person (not replaced by a newer trace's)."""

    def screenshot_ready(self) -> bool:
        """--screenshot waits for the worker's numbers: a heatmap still 'computing…' is no picture."""
        return self._job is None and not self._after_paint.pending

    def _cancel_job(self) -> None:
        if self._job is not None and not self._job.done:
            self._job.cancel()
        had = self._job is not None
        self._job = None  # nothing more of it will be shown
        self._after_paint.cancel()  # (one not started yet never starts)
        if had:
            self._job_changed()

    def _clear(self, message: str) -> None:
        """No trace to show: nothing of a previous text or model stays on show."""
        self._cancel_job()
        self.data = None
        self.view_state.selected_token = None  # the other choices are kept for the next trace
        self.tokens.set_tokens([], [])
        self._clear_heatmaps(message)
        self._clear_own(message)
        self.status.setText(message)

    def _clear_own(self, message: str) -> None:
        """Clear the panel's own views and controls."""
        raise NotImplementedError

    # -- selection -------------------------------------------------------------------------
    @property
    def selected_token(self) -> int | None:
        return self.view_state.selected_token

    def select_token(self, index: int | None) -> None:
        """Highlight token `index` (position in the sequence) in every view."""
        self.view_state.selected_token = index
        self.tokens.set_selected(index)
        self._apply_selection()

    def _apply_selection(self) -> None:
        for v in self.heatmap_views():
            if v.rows and v.name in self.widgets:  # (one made later is drawn, then given the selection)
                self.widgets[v.name].set_selected_row(self._row_of_selection(v))
        self._select_in_own_views()

    def _row_of_selection(self, view: View) -> int | None:
        """The row of a heatmap view that shows the selected token (rows of tokens: its position)."""
        return self.selected_token

    def _token_of_row(self, view: View, row: int) -> int:
        """The token a heatmap view's row shows (the inverse of _row_of_selection)."""
        return row

    def _on_row_clicked(self, view: View, row: int) -> None:
        self.select_token(self._token_of_row(view, row))

    def _select_in_own_views(self) -> None:
        """Show the selected token in the panel's own views."""
        raise NotImplementedError


class _ViewWidgets:
    """View name -> its widget, made when asked for (`in` and iterating see only the ones made, and make none)."""

    def __init__(self, pages: dict[str, MadeWhenShown]) -> None:
        self._pages = pages

    def __getitem__(self, name: str) -> QWidget:
        return self._pages[name].widget()

    def __contains__(self, name: str) -> bool:
        return self._pages[name].made

    def __iter__(self):
        """The names of the views made so far."""
        return (name for name, page in self._pages.items() if page.made)
