"""The main window: one tab per panel, menus, status bar, drag and drop of model folders.

Panels are imported and built lazily (the current tab at once, the others when first shown), so
the window appears fast; a panel whose import or construction fails shows the error in its tab
and the rest keep working. All model work goes through AppState (workers), never this thread.
"""
from __future__ import annotations

import importlib
import logging
import os
import traceback
from pathlib import Path

from PySide6.QtCore import QByteArray, QMimeData, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import (QApplication, QFileDialog, QLabel, QMainWindow, QMessageBox, QPlainTextEdit,
                               QProgressBar, QTabWidget, QVBoxLayout, QWidget)

from . import settings as app_settings
from .panels import PANELS
from .state import AppState
from .workspace import Workspace, WorkspaceError, load_workspace, save_workspace

log = logging.getLogger("desktop_app")


def model_folder_of(path: str | Path) -> str | None:
    """What a path opens as a model: a folder itself, a GGUF file itself, or the folder of a model file
    in it (config.json, model.safetensors... as a file manager hands over with 'Open with' or a drop);
    None for anything else."""
    from ..core.formats import is_gguf

    path = Path(path)
    if path.is_dir() or (path.is_file() and is_gguf(path)):
        return str(path)
    if path.is_file() and path.suffix in (".json", ".safetensors"):
        return str(path.parent)
    return None


GGUF_FILTER = "GGUF files (*.gguf);;All files (*)"  # an Ollama blob has no suffix: All files opens it


def model_folder_from_mime(mime: QMimeData) -> str | None:
    """The model folder a drag carries: a dropped folder, or the folder of a dropped file in it."""
    if not mime.hasUrls():
        return None
    for url in mime.urls():
        if url.isLocalFile() and (folder := model_folder_of(url.toLocalFile())) is not None:
            return folder
    return None


def capture_view_state(panel) -> dict | None:
    """A panel's view state as a plain dict (panels declaring their views in core.views have one)."""
    from ..core.views import state_to_dict

    return state_to_dict(panel.view_state) if hasattr(panel, "set_view_state") else None


def apply_view_state(panel, data: dict) -> None:
    """Restore a panel's choices from a workspace dict; unknown or bad keys are ignored."""
    from ..core.views import state_from_dict

    if hasattr(panel, "set_view_state"):  # a panel whose state is no plain view state reads it its own way
        read = getattr(panel, "view_state_from_dict", None)
        panel.set_view_state(read(data) if read else state_from_dict(type(panel.view_state), data, panel.VIEW_TABLE))
        if hasattr(panel, "show_the_models_views"):  # a view saved on another model (a mixture's Routing) gives way
            panel.show_the_models_views()


class PanelSlot(QWidget):
    """The page of one tab: holds its panel once built, or the error that prevented it."""

    def __init__(self, title: str, module: str, class_name: str) -> None:
        super().__init__()
        self.title, self.module, self.class_name = title, module, class_name
        self.panel: QWidget | None = None
        self.error: str | None = None
        self.pending_view_state: dict | None = None  # from a workspace, applied when the panel is built
        self.layout_ = QVBoxLayout(self)
        self.layout_.setContentsMargins(0, 0, 0, 0)

    @property
    def built(self) -> bool:
        return self.panel is not None or self.error is not None

    def build(self, state: AppState) -> None:
        if self.built:
            return
        try:
            cls = getattr(importlib.import_module(self.module), self.class_name)
            self.panel = cls(state)
        except Exception:  # one broken panel must not take the window down
            self.error = traceback.format_exc()
            log.error("panel %s failed to load\n%s", self.title, self.error)
            label = QLabel(f"<b>The {self.title} panel could not be loaded.</b> The other panels still work. "
                           "Details (also in the log file):")
            label.setWordWrap(True)
            details = QPlainTextEdit(self.error)
            details.setReadOnly(True)
            self.layout_.addWidget(label)
            self.layout_.addWidget(details, 1)
            return
        self.layout_.addWidget(self.panel)
        if self.pending_view_state is not None:
            apply_view_state(self.panel, self.pending_view_state)
            self.pending_view_state = None
        if app_settings.palette_is_dark():  # plots built after the theme was applied (pyqtgraph's own colours)
            app_settings.restyle_plots(self.panel)


class MainWindow(QMainWindow):
    panel_built = Signal(str)  # title
    interactive = True  # False for --screenshot and benchmarks: report to the status bar, never block in a dialog

    def __init__(self, state: AppState, parent: QWidget | None = None, panels: list | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.setWindowTitle("Transformer Explorer")
        self.setAcceptDrops(True)
        self.resize(1280, 800)

        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.slots: list[PanelSlot] = []
        for title, module, class_name in (PANELS if panels is None else panels):
            slot = PanelSlot(title, module, class_name)
            self.slots.append(slot)
            self.tabs.addTab(slot, title)
        self.tabs.currentChanged.connect(self._on_tab_changed)
        from .widgets.intervention_strip import InterventionStrip
        self.intervention_strip = InterventionStrip(state)  # the active what-if edits, over every panel
        from .widgets.timeline_bar import TimelineBar
        self.timeline_bar = TimelineBar(state)  # a training run's kept steps (shown only for such a run)
        central = QWidget()
        column = QVBoxLayout(central)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(0)
        column.addWidget(self.timeline_bar)
        column.addWidget(self.intervention_strip)
        column.addWidget(self.tabs, 1)
        self.setCentralWidget(central)

        self._build_status_bar()
        self._build_menus()

        state.model_changed.connect(self._on_model_changed)
        state.model_load_failed.connect(self._on_model_load_failed)
        state.device_changed.connect(self._on_device_changed)
        state.device_failed.connect(self._on_device_failed)
        state.busy_changed.connect(self._on_busy)
        state.error.connect(self._show_in_status_bar)
        self._notices_now: list[str] = []  # notices of the event being handled (a model's opening says them too)
        state.notice.connect(self._on_notice)
        state.dictionary_failed.connect(self._on_dictionary_failed)
        state.panel_wanted.connect(self._show_wanted_panel)
        self._on_device_changed(state.device)
        self._show_the_models_panels()
        if self.slots:
            self.slots[0].build(state)

    # -- panels ----------------------------------------------------------------------------
    def slot(self, title: str) -> PanelSlot:
        for s in self.slots:
            if s.title.lower() == title.lower() or s.module.rsplit(".", 1)[-1] == title.lower():
                return s
        raise KeyError(f"no panel named {title!r} (panels: {', '.join(s.title for s in self.slots)})")

    def panel(self, title: str) -> QWidget | None:
        s = self.slot(title)
        s.build(self.state)
        return s.panel

    def show_panel(self, title: str) -> None:
        """Show a panel's tab; one that does not apply to the open model (a text model's Image panel: its tab is
        hidden) is not shown, the reason said, and the tab on show stays (the Model panel's if it was hidden). Asked
        before any model is open (--panel, the last session's panel), it is decided when the model arrives (unless a
        tab is clicked meanwhile)."""
        s = self.slot(title)
        self._panel_awaited = self.panel_refused = None
        if not self._applies(s):
            if self.state.loaded is None:  # the model on its way may take it (a ViT's Image panel): built now, to
                self._panel_awaited = s.title  # take the model and the workspace's choices as it comes
                s.build(self.state)
                return
            self.panel_refused = (f"the {s.title} panel is for {self.PANELS_FOR[s.title][1]}; "
                                  f"{self.state.loaded.name} is not one")
            if not self.tabs.isTabVisible(self.tabs.currentIndex()):
                self.tabs.setCurrentIndex(0)
            self._on_notice(f"{self.panel_refused[0].upper()}{self.panel_refused[1:]}: the "
                            f"{self.tabs.tabText(self.tabs.currentIndex())} panel is on show.")
            return
        self.tabs.setCurrentWidget(s)
        s.build(self.state)

    def current_slot(self) -> PanelSlot | None:
        w = self.tabs.currentWidget()
        return w if isinstance(w, PanelSlot) else None

    # panels that apply to some models only: shown only for them (as the Layers panel's Routing for a mixture)
    # (title: (whether it applies, what it applies to)): the Image panel: a model that takes images (a ViT)
    PANELS_FOR = {"Image": (AppState.takes_images, "models that take images (vision transformers)")}
    _panel_awaited: str | None = None  # a panel asked for before any model was open (show_panel)
    panel_refused: str | None = None  # why the last panel asked for was not shown (--panel on a text model)

    def _show_the_models_panels(self) -> None:
        """Show each panel's tab if it applies to the open model: a text model's Image tab was shown with its
        controls disabled. A tab hidden while on show gives way to the Model panel's."""
        awaited = self._panel_awaited
        for s in self.slots:
            applies = self.PANELS_FOR.get(s.title)
            if applies is None:
                continue
            index = self.tabs.indexOf(s)
            shown = self._applies(s)
            if not shown and self.tabs.currentIndex() == index:
                self.tabs.setCurrentIndex(0)
            self.tabs.setTabVisible(index, shown)
        self._key_the_panels_on_show()
        if awaited is not None and self.state.loaded is not None:  # the model asked for has come
            self.show_panel(awaited)  # shown, or why not said with the model's 'Opened' line

    def _applies(self, slot: PanelSlot) -> bool:
        applies = self.PANELS_FOR.get(slot.title)
        return applies is None or bool(applies[0](self.state))

    def _key_the_panels_on_show(self) -> None:
        """Ctrl+1..9, then Ctrl+0, show the tabs in the order a person sees them on the bar (a hidden tab has no
        key, nor a line in the View menu): the fifth tab on show is Ctrl+5 whichever panels are hidden."""
        if not hasattr(self, "panel_actions"):
            return  # (menus not built yet: they key themselves)
        place = 0
        for s, a in zip(self.slots, self.panel_actions):
            shown = self.tabs.isTabVisible(self.tabs.indexOf(s))
            a.setVisible(shown)
            a.setShortcut(QKeySequence(f"Ctrl+{(place + 1) % 10}") if shown and place < 10 else QKeySequence())
            place += shown

    def _on_tab_changed(self, index: int) -> None:
        self._panel_awaited = None  # (a tab chosen meanwhile wins over a panel asked for before the model)
        w = self.tabs.widget(index)
        if isinstance(w, PanelSlot) and not w.built:
            QApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
            try:
                w.build(self.state)
            finally:
                QApplication.restoreOverrideCursor()
            self.panel_built.emit(w.title)

    # -- menus -----------------------------------------------------------------------------
    def _action(self, text: str, slot, shortcut=None, tip: str = "") -> QAction:
        a = QAction(text, self)
        if shortcut is not None:
            a.setShortcut(QKeySequence(shortcut))
        if tip:
            a.setStatusTip(tip)
        a.triggered.connect(slot)
        self.addAction(a)  # shortcuts work even when the menu bar is hidden
        return a

    def _build_menus(self) -> None:
        mb = self.menuBar()
        f = mb.addMenu("&File")
        self.open_action = self._action("&Open Model Folder…", self.open_model_dialog, QKeySequence.StandardKey.Open,
                                        "Open a model folder (config.json + model.safetensors [+ tokenizer.json])")
        f.addAction(self.open_action)
        self.open_gguf_action = self._action("Open &GGUF File…", self.open_gguf_dialog,
                                             tip="Open a .gguf file (llama.cpp, Ollama, LM Studio): quantized weights "
                                                 "are dequantized as each tensor is read")
        f.addAction(self.open_gguf_action)
        self.recent_menu = f.addMenu("Open &Recent")
        self.recent_menu.aboutToShow.connect(self._fill_recent_menu)
        self.demo_action = self._action("Open &Demo Model", self.open_demo_model)
        f.addAction(self.demo_action)
        self.hf_cache_action = self._action("Open from &Hugging Face Cache…", self.open_hf_cache_dialog,
                                            tip="Open a model already in the local Hugging Face cache (no download)")
        f.addAction(self.hf_cache_action)
        self.local_stores_action = self._action(
            "Open from &Local Model Stores…", self.open_local_stores_dialog,
            tip="Open a GGUF model Ollama or LM Studio keeps on this machine (no download)")
        f.addAction(self.local_stores_action)
        self.open_features_action = self._action(
            "Open Sparse &Features…", self.open_features_dialog,
            tip="Attach a sparse dictionary (SAE or transcoder) folder to the open model: SAELens' cfg.json + "
                "sae_weights.safetensors, or Gemma Scope's params.npz")
        f.addAction(self.open_features_action)
        self.open_graph_action = self._action(
            "Open Attribution &Graph…", self.open_graph_dialog,
            tip="Draw an attribution graph JSON (python -m desktop_app graph, circuit-tracer or Neuronpedia)")
        f.addAction(self.open_graph_action)
        f.addSeparator()
        self.open_workspace_action = self._action("Open &Workspace…", self.open_workspace_dialog, "Ctrl+Shift+O")
        self.save_workspace_action = self._action("&Save Workspace…", self.save_workspace_dialog, QKeySequence.StandardKey.Save)
        f.addAction(self.open_workspace_action)
        f.addAction(self.save_workspace_action)
        f.addSeparator()
        self.export_action = self._action("&Export Current View…", self.export_current_view, "Ctrl+E",
                                          "Save what the current panel shows")
        f.addAction(self.export_action)
        f.addSeparator()
        self.preferences_action = self._action("&Preferences…", self.open_preferences, QKeySequence.StandardKey.Preferences)
        if self.preferences_action.shortcut().isEmpty():
            self.preferences_action.setShortcut(QKeySequence("Ctrl+,"))
        f.addAction(self.preferences_action)
        f.addSeparator()
        self.quit_action = self._action("&Quit", self.close, QKeySequence.StandardKey.Quit)
        if self.quit_action.shortcut().isEmpty():
            self.quit_action.setShortcut(QKeySequence("Ctrl+Q"))
        f.addAction(self.quit_action)

        v = mb.addMenu("&View")
        self.panel_actions: list[QAction] = []
        for s in self.slots:
            a = self._action(s.title, lambda _=False, t=s.title: self.show_panel(t))  # (keys: _key_the_panels_on_show)
            v.addAction(a)
            self.panel_actions.append(a)
        self._key_the_panels_on_show()
        v.addSeparator()
        self.fullscreen_action = self._action("&Full Screen", self._toggle_fullscreen, QKeySequence.StandardKey.FullScreen)
        self.fullscreen_action.setCheckable(True)
        v.addAction(self.fullscreen_action)

        self.device_menu = mb.addMenu("&Device")
        self.device_group = QActionGroup(self)
        self.device_group.setExclusive(True)
        self.device_actions: dict[str, QAction] = {}
        self._fill_device_menu()
        self._fill_dtype_menu()

        h = mb.addMenu("&Help")
        self.help_action = self._action("&What am I looking at?", self.show_panel_help, QKeySequence.StandardKey.HelpContents)
        if self.help_action.shortcut().isEmpty():
            self.help_action.setShortcut(QKeySequence("F1"))
        h.addAction(self.help_action)
        self.shortcuts_action = self._action("&Keyboard Shortcuts", self.show_shortcuts, "Ctrl+/")
        h.addAction(self.shortcuts_action)
        h.addSeparator()
        self.about_action = self._action("&About Transformer Explorer", self.show_about)
        h.addAction(self.about_action)

    def _fill_dtype_menu(self) -> None:
        """Device > Compute dtype: auto (what suits the device) or a dtype; the open model is reopened in it."""
        from ..core.devices import DTYPE_CHOICES

        self.device_menu.addSeparator()
        menu = self.device_menu.addMenu("Compute &dtype")
        group = QActionGroup(self)
        group.setExclusive(True)
        self.dtype_actions: dict[str, QAction] = {}
        for name in DTYPE_CHOICES:
            a = QAction("auto (suits the device)" if name == "auto" else name, self, checkable=True)
            a.triggered.connect(lambda _=False, d=name: self.state.set_dtype(d))
            group.addAction(a)
            menu.addAction(a)
            self.dtype_actions[name] = a
        self._check_dtype_action()
        self.state.dtype_changed.connect(self._check_dtype_action)  # (a bound method: no lambda keeps the window)

    def _check_dtype_action(self, _asked: str = "") -> None:
        a = getattr(self, "dtype_actions", {}).get(self.state.dtype or "auto")
        if a is not None:
            a.setChecked(True)

    def _fill_device_menu(self) -> None:
        from ..core.devices import available_devices

        for name in available_devices():
            label = {"cpu": "CPU", "mps": "MPS (Apple)"}.get(name, name.upper())
            a = QAction(label, self, checkable=True)
            a.setData(name)
            a.triggered.connect(lambda _=False, d=name: self.set_device(d))
            self.device_group.addAction(a)
            self.device_menu.addAction(a)
            self.device_actions[name] = a
        cards = [name for name in available_devices() if name.startswith("cuda")]
        if len(cards) > 1:  # the model's layers placed across every card (core/streamed.place_blocks)
            spec = ",".join(cards)
            a = QAction(f"All CUDA Devices (layers split over {len(cards)})", self, checkable=True)
            a.setData(spec)
            a.triggered.connect(lambda _=False, d=spec: self.set_device(d))
            self.device_group.addAction(a)
            self.device_menu.addAction(a)
            self.device_actions[spec] = a

    def _fill_recent_menu(self) -> None:
        self.recent_menu.clear()
        items = app_settings.recent_models()
        for path in items:
            a = self.recent_menu.addAction(path)
            a.setEnabled(model_folder_of(path) == path)  # a folder or a GGUF file still there
            a.triggered.connect(lambda _=False, p=path: self.open_model(p))
        if not items:
            self.recent_menu.addAction("(none)").setEnabled(False)
        else:
            self.recent_menu.addSeparator()
            self.recent_menu.addAction("Clear Recent", app_settings.clear_recent_models)

    # -- status bar ------------------------------------------------------------------------
    def _build_status_bar(self) -> None:
        sb = self.statusBar()
        self.model_label = QLabel("No model")
        self.device_label = QLabel("")
        self.memory_label = QLabel("")
        self.dtype_label = QLabel("")  # the compute dtype; its tooltip says why (devices.choose_compute_dtype)
        self.busy_bar = QProgressBar()
        self.busy_bar.setRange(0, 0)  # indeterminate
        self.busy_bar.setMaximumWidth(120)
        self.busy_bar.setVisible(False)
        from .widgets.elided_label import ElidedLabel
        self.busy_label = ElidedLabel("")  # a long message is cut with "…": the window never widens for it
        sb.addWidget(self.busy_bar)
        sb.addWidget(self.busy_label, 1)
        from .widgets.trace_progress import TraceProgress
        self.trace_progress = TraceProgress(self.state)  # the text's trace, layer by layer, with Cancel
        sb.addPermanentWidget(self.trace_progress)  # (permanent: a status message never covers it)
        sb.addPermanentWidget(self.model_label)
        sb.addPermanentWidget(self.device_label)
        sb.addPermanentWidget(self.dtype_label)
        sb.addPermanentWidget(self.memory_label)
        self._memory_timer = QTimer(self, interval=3000)
        self._memory_timer.timeout.connect(self.update_memory)
        self._memory_timer.start()

    def update_memory(self) -> None:
        from ..core.devices import memory_summary

        try:
            self.memory_label.setText(memory_summary(self.state.device))
        except Exception as exc:  # a device that went away must not spam errors every 3 s
            self.memory_label.setText(f"memory: n/a ({exc.__class__.__name__})")

    # -- state -> window -------------------------------------------------------------------
    def _on_model_changed(self, loaded) -> None:
        self._show_the_models_panels()
        cfg = loaded.config
        gguf = loaded.gguf
        dequantized = f" · dequantized from {gguf.file_type or 'quantized GGUF'}" if gguf and gguf.dequantized else ""
        params = f"{loaded.model.num_parameters():,} params"
        self.model_label.setText(f"{loaded.name} · {cfg.family} · {params}{dequantized}")
        self.model_label.setToolTip("\n".join(["what is shown: the file's weights dequantized (values on the "
                                               "quantization grid, computed in the dtype on the right)",
                                               *gguf.quantization_lines()]) if dequantized else "")
        self.setWindowTitle(f"{loaded.name} — Transformer Explorer")
        from ..core.devices import dtype_name

        self.dtype_label.setText(dtype_name(loaded.model.dtype))
        self.dtype_label.setToolTip(loaded.dtype_reason or "the compute dtype asked for (Device > Compute dtype)")
        # what opening it did besides (e.g. detached a dictionary that does not fit it) stays said after "Opened"
        said = "".join(f" \u2014 {n}" for n in self._notices_now)
        self.statusBar().showMessage(f"Opened {loaded.path or loaded.name}{said}", 8000 if said else 5000)
        if loaded.path is not None:  # a run's kept step (the timeline's slider) is remembered as its run, once
            from ..app.timeline import run_of

            run = run_of(loaded.path)
            app_settings.add_recent_model(run[0] if run is not None and run[1] is not None else loaded.path)
        self.update_memory()

    def _on_model_load_failed(self, message: str) -> None:
        log.warning("model failed to load: %s", message)
        previous = self.state.loaded.name if self.state.loaded is not None else "no model"
        if not self.interactive:
            self.statusBar().showMessage(f"Cannot open model: {message}")
            return
        QMessageBox.critical(self, "Cannot open model",
                             f"{message}\n\nThe current model ({previous}) stays open.")

    def _on_device_changed(self, device: str) -> None:
        self.device_label.setText(f"device: {device}")
        a = self.device_actions.get(device) if hasattr(self, "device_actions") else None
        if a is not None:
            a.setChecked(True)
        self.update_memory()

    def _on_busy(self, busy: bool, message: str) -> None:
        self.busy_bar.setVisible(busy)
        self.busy_label.setText(message if busy else "")

    def _show_in_status_bar(self, message: str) -> None:
        self.statusBar().showMessage(message, 8000)

    def _on_notice(self, message: str) -> None:
        self._notices_now.append(message)
        if len(self._notices_now) == 1:
            QTimer.singleShot(0, self, self._notices_now.clear)  # once this event is handled
        self._show_in_status_bar(message)

    # -- actions ---------------------------------------------------------------------------
    def open_model(self, path: str | Path) -> None:
        self.state.open_model(os.path.abspath(os.path.expanduser(str(path))))  # the summary and recent list show it

    def open_demo_model(self) -> None:
        from ..paths import demo_model_dir

        if not demo_model_dir().is_dir():
            QMessageBox.information(self, "No demo model", f"The demo model is not installed ({demo_model_dir()}).")
            return
        self.open_model(demo_model_dir())

    def open_model_dialog(self) -> None:
        start = str(self.state.loaded.path.parent) if self.state.loaded is not None and self.state.loaded.path else ""
        path = QFileDialog.getExistingDirectory(self, "Open model folder (config.json + model.safetensors)",
                                                app_settings.last_folder() or start)
        if path:
            app_settings.set_last_folder(Path(path).parent)
            self.open_model(path)

    def open_gguf_dialog(self) -> None:
        start = str(self.state.loaded.path.parent) if self.state.loaded is not None and self.state.loaded.path else ""
        path, _ = QFileDialog.getOpenFileName(self, "Open GGUF file", app_settings.last_folder() or start,
                                              GGUF_FILTER)
        if path:
            app_settings.set_last_folder(Path(path).parent)
            self.open_model(path)

    def open_features_dialog(self) -> None:
        from .panels.features import choose_dictionary_folder

        path = choose_dictionary_folder(self)
        if path:
            self.open_dictionaries([path])

    def open_graph_dialog(self) -> None:
        """File > Open Attribution Graph: the Graph panel asks for the file and draws it."""
        self.show_panel("Graph")
        self.panel("Graph").open_dialog()

    def _show_wanted_panel(self, title: str) -> None:
        """A panel asked for another (AppState.panel_wanted): shown, when this window has it."""
        try:
            self.show_panel(title)
        except KeyError:
            pass  # a window built with other panels (tests)

    def open_dictionaries(self, folders: list[str]) -> None:
        """Attach sparse dictionary folders to the open model and show the Features panel."""
        for folder in folders:
            self.state.open_dictionary(os.path.abspath(os.path.expanduser(str(folder))))
        try:
            self.show_panel("Features")
        except KeyError:
            pass  # a window built with other panels (tests)

    def _on_dictionary_failed(self, message: str) -> None:
        log.warning("sparse features not attached: %s", message)
        if not self.interactive:
            self.statusBar().showMessage(f"Cannot attach sparse features: {message}")
            return
        QMessageBox.warning(self, "Cannot attach sparse features", message)

    def open_hf_cache_dialog(self) -> None:
        from .hf_cache_dialog import HfCacheDialog

        dialog = HfCacheDialog(self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.model_chosen.connect(self.open_model)
        dialog.open()

    def open_local_stores_dialog(self) -> None:
        from .local_stores_dialog import LocalStoresDialog

        dialog = LocalStoresDialog(self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.model_chosen.connect(self.open_model)
        dialog.open()

    def set_device(self, device: str) -> None:
        self.state.set_device(device)

    def _on_device_failed(self, device: str, message: str) -> None:
        # e.g. out of memory moving the model: say so, keep (and re-check) the old device
        QMessageBox.warning(self, "Cannot switch device", f"Cannot move the model to {device}: {message}")
        self._on_device_changed(self.state.device)

    def export_current_view(self) -> None:
        """The panel's own export (export_view()) when it has one, else a PNG of its main view
        (export_widget()) or of the whole panel."""
        slot = self.current_slot()
        if slot is None or slot.panel is None:
            return
        export = getattr(slot.panel, "export_view", None)
        if callable(export):
            export()
            return
        bar = getattr(slot.panel, "export_bar", None)
        if callable(getattr(slot.panel, "current_view", None)) and bar is not None:
            bar.save_any()  # a panel of several views: the one shown, in every format it has
            return
        from .widgets.export import ask_save_path, save_widget_png

        view = slot.panel.export_widget() if callable(getattr(slot.panel, "export_widget", None)) else slot.panel
        path = ask_save_path(self, f"Export {slot.title} view", f"{slot.title.lower()}.png", "PNG image (*.png)")
        if path:
            save_widget_png(view or slot.panel, path)
            self.statusBar().showMessage(f"Saved {path}", 5000)

    def show_panel_help(self) -> None:
        from .dialogs import HelpDialog

        slot = self.current_slot()
        if slot is None:
            return
        text = getattr(slot.panel, "help_text", None) or f"The {slot.title} panel has no help text yet."
        HelpDialog(slot.title, text, self).exec()

    def shortcut_actions(self) -> list[QAction]:
        return [a for a in self.actions() if not a.shortcut().isEmpty()]

    def show_shortcuts(self) -> None:
        from .dialogs import ShortcutsDialog

        ShortcutsDialog(self.shortcut_actions(), self, self.panel_shortcuts()).exec()

    def panel_shortcuts(self) -> list[tuple[str, str]]:
        """(panel: what, key) for every panel class's `shortcuts`, built or not."""
        import importlib

        from .panels import PANELS

        rows = []
        for title, module, cls in PANELS:
            for key, what in getattr(getattr(importlib.import_module(module), cls), "shortcuts", ()):
                rows.append((f"{title}: {what}", key))
        return rows

    def show_about(self) -> None:
        from .dialogs import about_html

        QMessageBox.about(self, "About Transformer Explorer", about_html(self.state.device))

    def open_preferences(self) -> None:
        from ..core.devices import available_devices
        from .dialogs import PreferencesDialog

        dlg = PreferencesDialog(app_settings.Preferences.load(), available_devices(), self)
        if dlg.exec():
            self.apply_preferences(dlg.preferences(), save=True)

    def apply_preferences(self, prefs: app_settings.Preferences, save: bool = False) -> None:
        from ..core.devices import default_device

        if save:
            prefs.save()
        app = QApplication.instance()
        if app is not None:
            app_settings.apply_appearance(app, prefs.theme, prefs.font_size)
        self.state.dtype = None if prefs.dtype == "auto" else prefs.dtype  # None: what suits the device
        self._check_dtype_action()
        self.state.set_special_tokens(app_settings.special_tokens_on())  # the Model panel's checkbox, saved
        device = default_device() if prefs.device == "auto" else prefs.device
        if device in self.device_actions:
            self.set_device(device)

    def _toggle_fullscreen(self, checked: bool) -> None:
        self.showFullScreen() if checked else self.showNormal()

    # -- workspace -------------------------------------------------------------------------
    def capture_workspace(self) -> Workspace:
        slot = self.current_slot()
        loaded = self.state.loaded
        return Workspace(
            model_path=str(loaded.path) if loaded is not None and loaded.path is not None else None,
            text=self.state.text,
            target=self.state.target,
            panel=slot.title if slot is not None else "",
            device=self.state.device,
            geometry=bytes(self.saveGeometry().toBase64()).decode("ascii"),
            window_state=bytes(self.saveState().toBase64()).decode("ascii"),
            views={s.title: v for s in self.slots if (v := capture_view_state(s.panel) if s.panel is not None
                                                        else s.pending_view_state) is not None},
            dictionaries=[a.dictionary.path for a in self.state.dictionaries if a.dictionary.path],
        )

    def apply_workspace(self, ws: Workspace, open_model: bool = True) -> None:
        if ws.geometry:
            self.restoreGeometry(QByteArray.fromBase64(ws.geometry.encode("ascii")))
        if ws.window_state:
            self.restoreState(QByteArray.fromBase64(ws.window_state.encode("ascii")))
        if ws.device and ws.device in self.device_actions:
            self.set_device(ws.device)
        if ws.panel:
            try:
                self.show_panel(ws.panel)
            except KeyError:
                pass  # a panel from another version
        for title, data in ws.views.items():  # built panels now, the others when they are built
            try:
                slot = self.slot(title)
            except KeyError:
                continue  # a panel from another version
            if slot.panel is not None:
                apply_view_state(slot.panel, data)
            else:
                slot.pending_view_state = data
        self.state.set_target(ws.target)  # (both kept for any model; traced with the text)
        self.state.set_text(ws.text)  # kept for the model below: set_model re-traces state.text
        loaded = self.state.loaded
        same = loaded is not None and loaded.path is not None and ws.model_path is not None and \
            Path(loaded.path).resolve() == Path(ws.model_path).resolve()
        if open_model and ws.model_path and not same:
            self.open_model(ws.model_path)
        self.state.restore_dictionaries(ws.dictionaries)  # attached once the model is open

    def save_workspace_dialog(self) -> None:
        from .widgets.export import ask_save_path

        path = ask_save_path(self, "Save workspace", "workspace.json", "Workspace (*.json)")
        if path:
            try:
                save_workspace(path, self.capture_workspace())
            except OSError as exc:
                QMessageBox.critical(self, "Cannot save workspace", f"{path}: {exc}")
                return
            self.statusBar().showMessage(f"Saved workspace {path}", 5000)

    def open_workspace_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open workspace", app_settings.last_folder(),
                                              "Workspace (*.json);;All files (*)")
        if path:
            app_settings.set_last_folder(Path(path).parent)
            self.open_workspace(path)

    def open_workspace(self, path: str | Path) -> bool:
        try:
            ws = load_workspace(path)
        except WorkspaceError as exc:
            QMessageBox.critical(self, "Cannot open workspace", str(exc))
            return False
        if ws.model_path and not Path(ws.model_path).is_dir():
            QMessageBox.warning(self, "Model folder missing",
                                f"{path}: the workspace's model folder {ws.model_path} does not exist; "
                                "keeping the current model.")
            ws.model_path = None
        self.apply_workspace(ws)
        return True

    # -- window settings -------------------------------------------------------------------
    def restore_window_settings(self) -> None:
        geometry = app_settings.settings().value("window/geometry")
        if isinstance(geometry, QByteArray) and not geometry.isEmpty():
            self.restoreGeometry(geometry)

    def save_window_settings(self) -> None:
        s = app_settings.settings()
        s.setValue("window/geometry", self.saveGeometry())
        s.sync()

    # -- drag and drop ---------------------------------------------------------------------
    def dragEnterEvent(self, event) -> None:
        if model_folder_from_mime(event.mimeData()) is not None:
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event) -> None:
        from ..app.features import dictionary_folder_of

        mime = event.mimeData()
        dictionaries = [folder for url in (mime.urls() if mime.hasUrls() else []) if url.isLocalFile()
                        and (folder := dictionary_folder_of(url.toLocalFile())) is not None]
        if dictionaries:  # sparse features (one folder per hook, several at once) attach to the open model
            event.acceptProposedAction()
            self.open_dictionaries(list(dict.fromkeys(dictionaries)))
            return
        path = model_folder_from_mime(mime)
        if path is None:
            event.ignore()
            return
        event.acceptProposedAction()
        self.open_model(path)

    # -- closing ---------------------------------------------------------------------------
    session_path: Path | None = None  # where closeEvent saves the session (set by app.main)

    def closeEvent(self, event) -> None:
        training = any(s.class_name == "TrainingPanel" and s.panel is not None and s.panel.running for s in self.slots)
        if training and self.interactive:  # a run is work a person may not want to lose
            answer = QMessageBox.question(
                self, "Training in progress", "A training run is in progress. Stop it (its last checkpoint is "
                "kept) and quit?", QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
                QMessageBox.StandardButton.No)
            if answer != QMessageBox.StandardButton.Yes:
                event.ignore()
                return
        if self.session_path is not None:
            try:
                self.save_window_settings()
                save_workspace(self.session_path, self.capture_workspace())
            except OSError as exc:
                log.warning("could not save the session to %s: %s", self.session_path, exc)
        for slot in self.slots:  # a child's closeEvent does not run with ours: e.g. a training run stops with a checkpoint
            if slot.panel is not None:
                slot.panel.close()
        from .workers import shutdown

        shutdown()  # cancel running jobs and wait for them: none may deliver into the closed window
        super().closeEvent(event)
