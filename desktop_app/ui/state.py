"""AppState: job orchestration over the app's evented inputs and edits, forwarded to every panel as Qt signals.

The inputs (model, text, target, image, special tokens, their key: app/inputs.py) and the what-if edits
(app/edits.py, which owns the rule for adding one) are Qt-free evented models; AppState holds one of each,
forwards their events as Qt signals, and runs the jobs they call for (loading, moving and tracing, in
workers, never on the UI thread), keeping what those jobs produced (token ids, the Trace on show). Panels
read these attributes, connect to the signals and write through the models (`state.edits.add(iv)`); they
never keep their own copy of the model, and never reach into another panel or the main window.
"""
from __future__ import annotations

import threading
import time
import weakref
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from ..app.edits import EditList
from ..app.inputs import (DICTIONARIES, EDITS, FEATURE_PARTS, INPUT, MODEL, PARTS, InputKey,  # noqa: F401 (panels' names)
                          Inputs)
from ..app.tracing import is_seq2seq, trace_image_or_digit, trace_input  # one record-name policy for the GUI and the CLI
from ..core.checkpoints import LoadedModel
from ..core.inputs import EncodedText, encode
from ..core.trace import Trace
from ..threads import every_free_core
from .workers import run_job


def _load(path: str, device: str, dtype: str | None, text: str) -> tuple[LoadedModel, tuple[str, str] | None]:
    """The model in `path`, and (task, sample text) when it was trained here on a task and its
    tokenizer cannot read `text` whole (a task model's tokenizer knows only the task's tokens: the
    app's English text would fail, or come out as unknown tokens)."""
    from ..core.formats import load_model_file
    from ..core.inputs import InputError
    from ..core.training.trainer import run_sample_text

    from ..app.timeline import check_step_path

    check_step_path(path)  # a kept step's folder linking out of its run is not opened as that step
    loaded = load_model_file(path, device=device, dtype=dtype or "auto")
    if loaded.config.input_kind == "patches":  # a ViT reads images: the text box is not its input
        return loaded, None
    if text.strip() and loaded.tokenizer is not None:
        try:
            ids = encode(loaded, text).ids
            if loaded.tokenizer.special_id("unk") not in ids:
                return loaded, None
        except InputError:
            pass
    return loaded, run_sample_text(path, loaded)


def _trace_in_pieces(loaded: LoadedModel, text: str, ids: list[int] | None, interventions: list,
                     layers: int | None = None, target: str = "", job=None, partial=None):
    """trace_input in a worker (run_job's job and partial): each layer reaches the UI thread as it is
    recorded (app.tracing.LayersReady), "layer k / L" the progress, and a cancel stops it between layers.
    `target`: an encoder-decoder's target text (ignored for other models). Without the logits: (encoding,
    trace, add_logits), which _add_logits runs next, in a job of its own, while the blocks are painted."""
    pair = {"target": target} if loaded.config.is_encoder_decoder else {}
    with every_free_core() as refit:  # the UI only shows progress meanwhile (threads.py)
        def layer_done(ready) -> None:
            refit()  # the cores free now, for the next layer
            if partial is not None:
                partial(ready)

        return trace_input(loaded, text, ids, interventions, layers=layers, job=job, on_layer=layer_done,
                           logits=False, **pair)


def _add_logits(add_logits, drawn: threading.Event, job=None) -> None:
    """A text trace's last step (trace_input's add_logits) in a worker, once `drawn` is set (AppState.hold_logits:
    the blocks painted); a cancel before it starts or while it runs (a new text) means its trace is never shown."""
    job.wait(drawn)  # (a cancel ends the wait)
    with every_free_core():
        add_logits()
    job.check()


def _moved(loaded: LoadedModel, device: str) -> LoadedModel:
    """A copy of the model on `device`. Jobs still running on the old model keep a consistent one,
    and each tensor is copied straight to the new device (no second copy on the old one)."""
    import copy
    import dataclasses

    import torch

    from ..core.streamed import streamed_of

    model = loaded.model
    if "," in device or streamed_of(model) is not None or getattr(model, "block_devices", None):
        # layers placed across devices, or read from the files while they compute: opened again for `device`
        if loaded.path is None:
            raise ValueError("only a model opened from a file or folder can be placed across devices")
        from ..core.devices import dtype_name
        from ..core.formats import load_model_file

        streamed = {"streamed": True} if streamed_of(model) is not None else {}  # (a folder's option)
        return load_model_file(loaded.path, device=device, dtype=dtype_name(model.dtype), **streamed)
    memo: dict[int, object] = {}
    for p in model.parameters():
        memo[id(p)] = torch.nn.Parameter(p.detach().to(device), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = b.to(device)
    moved = copy.deepcopy(model, memo).to(device)
    return dataclasses.replace(loaded, model=moved)


class ResultView:
    """Mixin for a panel that shows results computed from AppState's inputs (the one mechanism that
    keeps them from going stale): call `watch_inputs(state)` once, compute with `state.run(...)` (a
    result or error computed for inputs that changed meanwhile is never delivered), and implement
    `clear_results(changed)`, called whenever a part in `result_parts` changes (the model, the input,
    the edits): clear what is shown (and its status line), or compute it again for the new inputs."""
    result_parts: tuple[str, ...] = PARTS

    def watch_inputs(self, state: "AppState") -> None:
        state.inputs_changed.connect(self._inputs_changed)

    def _inputs_changed(self, _key: InputKey, changed: frozenset) -> None:
        if changed & set(self.result_parts):
            self.clear_results(changed)

    def clear_results(self, changed: frozenset) -> None:
        raise NotImplementedError


def _forwarded(field: str, doc: str) -> property:
    """An attribute that is the Inputs model's field (reading and writing go through it, so its event fires)."""
    return property(lambda self: getattr(self.inputs, field), lambda self, value: setattr(self.inputs, field, value),
                    doc=doc)


class AppState(QObject):
    model_changed = Signal(object)  # LoadedModel
    model_load_failed = Signal(str)  # message naming the file and the problem
    dtype_changed = Signal(str)  # the compute dtype asked for ("auto" or a dtype's name)
    device_changed = Signal(str)
    drawing_done = Signal()  # a hold_logits holder said it ended a paint (drawing_ended)
    device_failed = Signal(str, str)  # device asked for, why the model could not move there
    text_changed = Signal(str)  # the text was set: a new one, or the same set again to trace it again
    target_changed = Signal(str)  # an encoder-decoder's target text (AppState.target)
    tokens_changed = Signal(list)  # token ids of the current text
    trace_changed = Signal(object)  # Trace of the current text (or a generation step)
    busy_changed = Signal(bool, str)
    error = Signal(str)
    notice = Signal(str)  # something the app did for the user that they should know (status bar)
    interventions_changed = Signal(list)  # the what-if edits every text trace applies (AppState.edits changed)
    # (InputKey now current, frozenset of the parts that changed): emitted before model_changed,
    # tokens_changed / trace_changed and interventions_changed, so results are cleared first
    inputs_changed = Signal(object, object)
    dictionaries_changed = Signal(list)  # the attached sparse dictionaries (core.features.Attached)
    dictionary_failed = Signal(str)  # one line naming the dictionary folder and the problem
    # A text's trace arriving in pieces (app.tracing.LayersReady of the input now current, emitted after the
    # inputs_changed that made it so) and its progress: (layers done, of how many); (0, 0) once it ended.
    layers_ready = Signal(object)
    trace_progress = Signal(int, int)
    # A text's trace refused for memory that would fit through its first layers: (that many, of how many).
    trace_layers_offered = Signal(int, int)
    # A trace of the current model's input cancelled before any of it showed, and no newer one follows: no
    # trace_changed comes for it (what was on show before stays), so whoever waits for it hears it here.
    trace_cancelled = Signal()
    # A panel asks for another panel to be shown (its title; the main window shows it, if it has it).
    panel_wanted = Signal(str)
    # A trace shows its pieces and progress only once it has run this long: a quick one (a small model)
    # goes straight from the previous text's result to its own, without clearing the panels between.
    PIECES_AFTER_S = 0.3
    # The logits wait for what draws a trace's blocks (hold_logits, drawing_ended) this long at most.
    LOGITS_WAIT_S = 2.0

    # The inputs are the Inputs model's fields (app/inputs.py): read and written here as attributes.
    loaded = _forwarded("loaded", "the open model (LoadedModel), None before one is opened")
    text = _forwarded("text", "the text box's text (an encoder-decoder's source)")
    target = _forwarded("target", "an encoder-decoder's target text (the source is `text`)")
    image = _forwarded("image", "a ViT's input: pixel values [C, H, W] the Image panel chose")
    image_source = _forwarded("image_source", "what the image is")
    special_tokens = _forwarded("special_tokens", "the tokenizer's special tokens added to every text "
                                "(set_special_tokens; the saved choice is applied at start)")
    key = _forwarded("key", "what the model, input and edits are now (see InputKey)")

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.inputs = Inputs()
        self.inputs.events.text.connect(self._on_text)
        self.inputs.events.target.connect(self._on_target)
        self.inputs.events.key.connect(self._on_key)
        # The what-if edits every trace applies (app/edits.py: the one rule for adding an edit); a change
        # traces the input again with them.
        self.edits = EditList()
        self.edits.changed.connect(self._on_edits)
        self.device = "cpu"
        # the compute dtype of models opened: a name, or None for "auto" (what suits the device,
        # core.devices.choose_compute_dtype)
        self.dtype: str | None = None
        self.token_ids: list[int] = []
        # What an encoder-decoder's decoder read in the trace on show: [start token] + the target's ids
        # (app.tracing's convention); [] for other models.
        self.decoder_ids: list[int] = []
        self.trace: Trace | None = None
        # The key the trace on show was made for: after another model (or other edits) it stays on show, not
        # theirs, until their trace arrives (trace_is_current).
        self.trace_key: InputKey = self.key
        # Why there is no trace for this model (its text cannot be tokenized...); "" when traced or no text.
        self.trace_problem = ""
        # "text": token_ids/trace are the text box's; "generation": a generation step shown by show_trace;
        # "image": a ViT's image (set_image).
        self.trace_source = "text"
        self._trace_job = None
        self._pending_text: tuple[str, list[int] | None] | None = None
        self._cancelled = False  # the input's trace was cancelled, none started since (trace_was_cancelled)
        self._logits_holds: list[weakref.WeakMethod] = []  # hold_logits
        self._logits_waiting: threading.Event | None = None  # set to start the logits held (_once_drawn)
        # The text trace arriving in pieces and on show (app.tracing.LayersReady), until its end; None else.
        self.tracing = None
        self._tracing_job = None  # the job whose layers `tracing` shows
        # Record only the first this many layers of the text's traces (None: all): the choice offered when a
        # whole trace would not fit in memory (set_trace_layers); back to all at every model opened.
        self.trace_layers: int | None = None
        # The text box's encoding (which special tokens were added).
        self.encoded: EncodedText | None = None
        self.loading: str | None = None  # the model folder open_model is loading, until it arrives or fails
        # The timeline (open_step): the last steps' models opened (app.timeline.StepCache, bounded there),
        # the step asked for last (run folder, step, cache key; None once another model is opened) and its load.
        from ..app.timeline import StepCache
        self.step_cache = StepCache()
        self._wanted_step: tuple | None = None
        self._step_job = None
        # Sparse dictionaries (SAEs, transcoders) attached to the current model, one per hook
        # (core.features.Attached); folders to open once a model is open (a workspace restored first).
        self.dictionaries: list = []
        self._pending_dictionaries: list[str] = []

    # -- the evented models' events, forwarded as Qt signals ----------------------------------
    def _on_text(self, text: str, _old: str) -> None:
        self.text_changed.emit(text)

    def _on_target(self, target: str, _old: str) -> None:
        self.target_changed.emit(target)

    def _on_key(self, key: InputKey, old: InputKey) -> None:
        self.inputs_changed.emit(key, key.changed_parts(old))

    def _on_edits(self, edits: list) -> None:
        """The edits changed: results made with the old ones are stale, and the input is traced again with them."""
        self._advance(EDITS)
        self.interventions_changed.emit(list(edits))
        self.set_text(self.text)

    @property
    def interventions(self) -> list:
        """The what-if edits (core.interventions.Intervention) every trace applies, in order: a copy of `edits`."""
        return list(self.edits)

    # -- results: the one place that says whether a result is still current ------------------
    def _advance(self, *parts: str) -> None:
        self.inputs.advance(*parts)  # inputs_changed follows (_on_key)

    def is_current(self, key: InputKey, parts=PARTS) -> bool:
        """Whether a result computed for `key` still belongs to the model, input and edits (those of
        `parts`) shown now."""
        return key.same(self.key, parts)

    def run(self, fn, *args, parts=PARTS, **kwargs):
        """run_job(fn, *args, **kwargs) for a result that depends on `parts` of the current inputs: its
        result, error and progress reach the callbacks only while those parts are what they were when
        it started (a late result for another model or text is dropped); cancelled and finished
        always arrive, so buttons come back. The job's `key` is the InputKey it was computed for."""
        key = self.key
        job = run_job(fn, *args, accept=lambda: self.is_current(key, parts), **kwargs)
        job.key = key
        return job

    # -- model -----------------------------------------------------------------------------
    def open_model(self, path: str | Path, on_failed: Callable[[], None] | None = None) -> None:
        """Load a model folder in a worker; on failure the previous model stays (on_failed runs first)."""
        self.busy_changed.emit(True, f"Loading {path}…")
        device, text = self.device, self.text
        self.loading = str(path)
        self._wanted_step = None  # a step still loading for the timeline must not replace this model
        self.step_cache.clear()  # the timeline's steps cached: their memory is given back for this model

        def done(result: tuple[LoadedModel, tuple[str, str] | None]) -> None:
            loaded, sample = result
            self.loading = None
            self.busy_changed.emit(False, "")
            use_sample = sample is not None and self.text == text  # else the text was changed meanwhile
            self.set_model(loaded, text=sample[1] if use_sample else None)
            if use_sample:
                self.notice.emit(f"Opened {path}, trained on the {sample[0]} task: the text is now a sample of "
                                 f"that task (the model's tokenizer knows only its tokens).")
            if self.device != device:  # the device was switched while this model was loading
                self._move_model(loaded, self.device, device)

        def failed(exc: BaseException, tb: str) -> None:
            self.loading = None
            self.busy_changed.emit(False, "")
            if on_failed is not None:
                on_failed()
            self.model_load_failed.emit(str(exc))

        return run_job(_load, str(path), device, self.dtype, text, on_result=done, on_error=failed)

    def open_step(self, run_dir: str | Path, step: int) -> None:
        """Put every panel on the model of the training run `run_dir` at its kept `step` (the timeline):
        the step's folder opened in a worker as open_model does, or taken from step_cache; set_model then
        traces the same text again. While a step loads, the steps asked for meanwhile are coalesced: only
        the last one asked is loaded next. A step not kept or deleted: model_load_failed, one line."""
        from ..app.timeline import step_model_folder  # a run's kept step, or a cached model's step revision
        from ..core.training.timeline import KeptStepError

        try:
            folder = step_model_folder(run_dir, step)
        except KeptStepError as exc:
            self.model_load_failed.emit(str(exc))
            return
        key = (str(folder), self.device, self.dtype)
        self._wanted_step = (run_dir, step, key)
        if self.loaded is not None and self.loaded.path == Path(folder):
            return  # on show already (a step still loading, asked for before, is dropped: no longer wanted)
        cached = self.step_cache.get(key)
        if cached is not None:
            if cached is not self.loaded:
                self.set_model(cached)
            return
        if self._step_job is not None and not self._step_job.done:
            return  # its end loads the step wanted then
        self.busy_changed.emit(True, f"Loading step {step} of {run_dir}…")
        device, text = self.device, self.text
        self.loading = str(folder)

        def ended() -> bool:
            """Whether the step that ended is the one wanted now; if another is, it is loaded next."""
            self._step_job = None
            self.loading = None
            self.busy_changed.emit(False, "")
            wanted = self._wanted_step
            if wanted is not None and wanted[2] != key:
                self.open_step(*wanted[:2])
            return wanted is not None and wanted[2] == key

        def done(result: tuple[LoadedModel, tuple[str, str] | None]) -> None:
            loaded, sample = result
            self.step_cache.put(key, loaded)
            if ended():
                self.set_model(loaded, text=sample[1] if sample is not None and self.text == text else None)
                if self.device != device:  # the device was switched while this step was loading
                    self._move_model(loaded, self.device, device)

        def failed(exc: BaseException, tb: str) -> None:
            if ended():
                self._wanted_step = None
                self.model_load_failed.emit(str(exc))

        self._step_job = run_job(_load, str(folder), device, self.dtype, text, on_result=done, on_error=failed)

    def set_model(self, loaded: LoadedModel, text: str | None = None) -> None:
        """Make `loaded` the model every panel shows, and trace the text with it; with `text`, that text
        becomes the input first (a task model's sample: its tokenizer knows only the task's tokens)."""
        if text is not None:
            self.text = text
        new = loaded is not self.loaded
        if new:  # pixel values are made for one model's size and normalisation
            self.image, self.image_source = None, ""
        self.loaded = loaded
        if new:
            self.trace_layers = None  # the first layers only was a choice for the previous model
        if loaded.tokenizer is not None:  # every text any panel encodes for it follows the input setting
            loaded.tokenizer.special_tokens = self.special_tokens
        if new:  # every result of the previous model is stale, whatever panel shows it
            dictionaries_changed = self._reattach_dictionaries(loaded)
            self._advance(MODEL, INPUT, *((EDITS,) if dictionaries_changed else ()))
            if dictionaries_changed:
                self.interventions_changed.emit(list(self.interventions))
            self.dictionaries_changed.emit(list(self.dictionaries))
        self.model_changed.emit(loaded)
        if new and self._pending_dictionaries:
            pending, self._pending_dictionaries = self._pending_dictionaries, []
            for folder in pending:
                self.open_dictionary(folder)
        self.set_text(self.text)

    def set_dtype(self, dtype: str) -> None:
        """Compute in `dtype` ("auto": what suits the device) from now on: the open model is opened again
        in it (model_changed follows; a failure keeps it as it is, and the dtype it has: dtype_changed)."""
        dtype = None if dtype == "auto" else dtype
        if dtype == self.dtype:
            return
        previous, self.dtype = self.dtype, dtype
        self.dtype_changed.emit(dtype or "auto")
        if self.loaded is not None and self.loaded.path is not None:
            def keep_previous() -> None:  # the model on show is still in the previous dtype: so is the setting
                if self.dtype == dtype:  # (else another was asked for meanwhile)
                    self.dtype = previous
                    self.dtype_changed.emit(previous or "auto")

            self.open_model(self.loaded.path, on_failed=keep_previous)

    def set_device(self, device: str) -> None:
        """Make `device` the one models live on: new loads go there at once, and the current model
        is moved in a worker. On failure (out of memory...) the model stays where it was, the
        previous device is restored and `device_failed` says why."""
        if device == self.device:
            return
        previous, self.device = self.device, device
        if self.loaded is None:
            self.device_changed.emit(device)
            return
        self._move_model(self.loaded, device, previous)

    def _move_model(self, loaded: LoadedModel, device: str, previous: str) -> None:
        self.busy_changed.emit(True, f"Moving the model to {device}…")

        def done(moved: LoadedModel) -> None:
            self.busy_changed.emit(False, "")
            if loaded is self.loaded and device == self.device:  # else superseded meanwhile
                self.loaded = moved
                for a in self.dictionaries:  # the sparse dictionaries compute beside the model
                    a.dictionary.to(device)
                self.device_changed.emit(device)
                self.set_text(self.text)

        def failed(exc: BaseException, tb: str) -> None:
            self.busy_changed.emit(False, "")
            if device == self.device:
                self.device = previous
            self.device_failed.emit(device, str(exc))

        run_job(_moved, loaded, device, on_result=done, on_error=failed)

    # -- text ------------------------------------------------------------------------------
    def set_text(self, text: str, ids: list[int] | None = None) -> None:
        """Tokenize and trace `text` (or the given ids) with the current model, in a worker."""
        if text == self.text:
            self.text_changed.emit(text)  # set again (to trace it again): said as a change would be
        self.text = text  # text_changed (_on_text) when it is a new one
        if self.loaded is None:
            return
        if self.takes_images():  # the text box is not a ViT's input: trace its image instead
            self._trace_image()
            return
        if self._trace_job is not None and not self._trace_job.done:
            self._pending_text = (text, ids)  # coalesce fast typing: run the latest text next,
            self._trace_job.cancel()  # as soon as the running trace stops (at its next layer)
            return
        loaded = self.loaded
        job = None  # this trace's job (set below; its callbacks run on the UI thread, after that)
        started = time.monotonic()

        def ended() -> tuple[bool, object]:
            """The trace ended: forget it. (Whether what it traced is still wanted: the same model;
            the LayersReady of it on show, or None.)"""
            self._trace_job = None
            self.trace_progress.emit(0, 0)
            ready = self.tracing if self._tracing_job is job else None
            if ready is not None:
                self.tracing = self._tracing_job = None
                if loaded is not self.loaded:  # its layers of the previous model are on show: no longer
                    self._show_input([], None, "tracing the new model's input…", "text")
            return loaded is self.loaded, ready

        def done(result) -> None:
            if ended()[0]:
                self.encoded = result[0]
                self._show_input(result[0].ids, result[1], "", "text")
            self._run_pending()

        def blocks_done(result) -> None:
            """Every block is traced: the logits next, in a job of their own (the blocks are painted meanwhile;
            the trace is shown, to every panel, once they are in it)."""
            nonlocal job
            enc, trace, add_logits = result
            if self._pending_text is not None or loaded is not self.loaded or job.control.cancelled:
                cancelled()  # a newer text (or model) waits: this one is never shown
                return
            if trace is None:
                done((enc, None))
                return
            blocks, drawn = job, threading.Event()
            job = self._trace_job = run_job(_add_logits, add_logits, drawn, on_result=lambda _: done((enc, trace)),
                                            on_error=failed, on_cancelled=cancelled)
            self._once_drawn(drawn)
            if self._tracing_job is blocks:  # its layers on show are this job's now
                self._tracing_job = job

        def failed(exc: BaseException, tb: str) -> None:
            if ended()[0]:
                # Nothing of the previous text (or model) may stay on show: clear, and say why.
                self.encoded = None
                self._show_input([], None, str(exc), "text")
                if getattr(exc, "layers", 0):  # a memory refusal: its first layers would fit
                    self.trace_layers_offered.emit(exc.layers, loaded.config.n_layers)
            self.error.emit(str(exc))
            self._run_pending()

        def cancelled() -> None:
            current, ready = ended()
            self._cancelled = current and self._pending_text is None  # (said before the panels hear of it)
            if current and ready is not None:  # its first layers are on show: not left there as the text's
                self._show_input([], None, "tracing the new text…" if self._pending_text is not None else
                                 f"the trace was cancelled after layer {ready.done} of {ready.total}", "text")
            elif current and self._pending_text is None:
                self.trace_cancelled.emit()
            self._run_pending()

        def wanted() -> bool:
            """Still the trace to show (this model's, no newer text waiting, not cancelled), and a slow one."""
            return job is self._trace_job and loaded is self.loaded and self._pending_text is None \
                and not job.control.cancelled and time.monotonic() - started >= self.PIECES_AFTER_S

        def progress(layers: int, total: int, _message: str) -> None:
            if wanted():
                self.trace_progress.emit(layers, total)

        def partial(ready) -> None:
            if not wanted():
                return
            if self._tracing_job is not job:  # its first layer: the new text becomes the input on show
                self._tracing_job = job
                self.encoded, self.tracing = ready.enc, ready
                self._show_input(ready.enc.ids, None, "", "text")
            self.tracing = ready
            self.layers_ready.emit(ready)

        self._cancelled = False
        job = self._trace_job = run_job(_trace_in_pieces, loaded, text, ids, list(self.interventions),
                                        self.trace_layers, self.target, on_result=blocks_done, on_error=failed,
                                        on_cancelled=cancelled,
                                        on_progress=progress, on_partial=partial)

    def hold_logits(self, drawing: Callable[[], bool]) -> None:
        """`drawing`, a bound method, says True while its object paints a text's trace from the blocks (the
        Attention panel's model view, row by row, in a worker and on the UI thread; --screenshot's render of
        it), and its object calls drawing_ended() when that paint is done. The logits, a second step on every
        free core, wait for it (LOGITS_WAIT_S at most) instead of taking the cores from the last row's
        thumbnails and paint. Held weakly: a closed panel holds nothing."""
        self._logits_holds = [m for m in self._logits_holds if m() is not None] + [weakref.WeakMethod(drawing)]

    def drawing_ended(self) -> None:
        """A hold_logits holder has ended its paint: the logits waiting start once no holder draws."""
        self.drawing_done.emit()
        self._start_logits_if_drawn()

    def _start_logits_if_drawn(self) -> None:
        if self._logits_waiting is None or any(m() is not None and m()() for m in self._logits_holds):
            return
        drawn, self._logits_waiting = self._logits_waiting, None
        QTimer.singleShot(0, drawn.set)  # a turn of the event loop later: the paint they asked

    def _once_drawn(self, drawn: threading.Event) -> None:
        """Sets `drawn` once no hold_logits holder draws (now, or at a drawing_ended) or LOGITS_WAIT_S from now."""
        self._logits_waiting = drawn
        QTimer.singleShot(round(self.LOGITS_WAIT_S * 1000), drawn.set)
        self._start_logits_if_drawn()  # (no holder drawing now)

    def set_target(self, target: str) -> None:
        """An encoder-decoder's target text (the decoder reads [start] + its tokens): kept for every model,
        and the input traced again when the model open is an encoder-decoder."""
        if target == self.target:
            return
        self.target = target  # target_changed (_on_target)
        if self.loaded is not None and self.loaded.config.is_encoder_decoder:
            self.set_text(self.text)

    def is_seq2seq(self) -> bool:
        """Whether the model open is an encoder-decoder (a source and a target; core/seq2seq.py)."""
        return self.loaded is not None and is_seq2seq(self.loaded)

    def set_trace_layers(self, layers: int | None) -> None:
        """Record only the first `layers` layers of the text's traces from now on (None: all of them; a
        new model opened goes back to all), and trace the text again."""
        self.trace_layers = layers
        if self.loaded is not None:
            if layers is not None:
                self.notice.emit(f"Tracing the first {layers} of {self.loaded.config.n_layers} layers of "
                                 f"{self.loaded.name}: the whole trace would not fit in memory")
            self.set_text(self.text)

    def cancel_trace(self) -> None:
        """Stop the text's trace now running (the Cancel beside its progress), at its next layer: what was
        on show before it stays, or, once its first layers are on show, the panels say it was cancelled."""
        self._pending_text = None
        if self._trace_job is not None and not self._trace_job.done:
            self._trace_job.cancel()

    def set_special_tokens(self, on: bool) -> None:
        """Turn the tokenizer's special tokens on or off for every text, and trace the text again."""
        if on == self.special_tokens:
            return
        self.special_tokens = on
        if self.loaded is not None and self.loaded.tokenizer is not None:
            self.loaded.tokenizer.special_tokens = on
            self.set_text(self.text)

    # -- image (ViT) -----------------------------------------------------------------------
    def takes_images(self) -> bool:
        return self.loaded is not None and self.loaded.config.input_kind == "patches"

    def set_image(self, pixels, source: str = "") -> None:
        """Make pixel values [C, H, W] (preprocessed for the current ViT) the input, and trace them in a worker."""
        self.image, self.image_source = pixels, source
        if self.takes_images():
            self._trace_image()

    def _trace_image(self) -> None:
        """Trace the current image in a worker; without one (a ViT just opened), held-out digit #0, so
        every panel has an input before the Image panel is ever shown."""
        if self._trace_job is not None and not self._trace_job.done:
            self._pending_text = (self.text, None)  # set_text sends it back here once the running job ends
            return
        loaded, pixels = self.loaded, self.image

        def done(result) -> None:
            self._trace_job = None
            chosen, source, ids, trace = result
            if loaded is self.loaded and self.image is None:  # the default digit, nothing chosen meanwhile
                self.image, self.image_source = chosen, source
            if loaded is self.loaded and chosen is self.image:
                self._show_input(ids, trace, "", "image")
            self._run_pending()

        def failed(exc: BaseException, tb: str) -> None:
            self._trace_job = None
            if loaded is self.loaded:
                self._show_input([], None, str(exc), "image")
            self.error.emit(str(exc))
            self._run_pending()

        self._cancelled = False
        self._trace_job = run_job(trace_image_or_digit, loaded, pixels, self.image_source, list(self.interventions),
                                  on_result=done, on_error=failed)

    def _run_pending(self) -> None:
        if self._pending_text is not None:
            pending, self._pending_text = self._pending_text, None
            self.set_text(*pending)  # for a ViT, set_text traces the current image

    def set_interventions(self, interventions: list) -> None:
        """Replace the what-if edits as they are and trace the text again with them (an empty list: the plain
        model). A panel adding one edit calls `edits.add(iv)`, which applies the rule for adding one."""
        self.edits.set(interventions)

    def show_trace(self, trace: Trace, token_ids: list[int], decoder_ids: list[int] | None = None) -> None:
        """Hand a trace made elsewhere (e.g. a generation step) to every inspecting panel; an encoder-decoder's
        `token_ids` are its source and `decoder_ids` what its decoder read ([start] + the target)."""
        self._show_input(list(token_ids), trace, "", "generation", decoder_ids)

    def _show_input(self, ids: list[int], trace: Trace | None, problem: str, source: str,
                    decoder_ids: list[int] | None = None) -> None:
        """Make (ids, trace) the input every panel shows (problem: why there is none; source: text,
        image or generation): a new input, so results computed for the previous one are stale."""
        self.token_ids, self.trace = ids, trace
        self.trace_problem, self.trace_source = problem, source
        self.decoder_ids = (list(decoder_ids) if decoder_ids is not None else
                            list(getattr(self.encoded, "decoder_ids", [])) if source == "text" and ids else [])
        self._advance(INPUT)
        self.trace_key = self.key
        self.tokens_changed.emit(self.token_ids)
        self.trace_changed.emit(self.trace)

    def trace_is_current(self) -> bool:
        """The trace on show was made for the model, input and edits now current."""
        return self.trace is not None and self.is_current(self.trace_key)

    def trace_running(self) -> bool:
        """A trace of the input is being made, or waits to be (a newer text's, a new model's): trace_changed
        brings it, or why there is none (or trace_cancelled: cancelled before any of it showed)."""
        return self._trace_job is not None or self._pending_text is not None

    def trace_was_cancelled(self) -> bool:
        """The input's trace was cancelled (the Cancel beside its progress), before or after its first layers
        showed, and no trace has started since: there is no trace of it to wait for, set_text makes one."""
        return self._cancelled and not self.trace_running()

    def back_to_text(self) -> None:
        """Trace the text box's text again (after show_trace put a generation step on show)."""
        self.set_text(self.text)

    def no_trace_message(self) -> str:
        """What an inspecting panel says when there is no trace to show, and why."""
        if self.loaded is None:
            return "Open a model and enter a text."
        if self.takes_images():
            if self.trace_problem:
                return f"No image traced for this model: {self.trace_problem}"
            return ("This model reads images: pick a held-out digit or open an image in the Image panel, "
                    "and its [CLS] + patch tokens show here.")
        if self.tracing is not None:
            done, total = self.tracing.done, self.tracing.total
            return (f"Tracing the text: layer {done} of {total} ready…" if done < total else
                    f"Tracing the text: all {total} layers ready, the logits next…")
        if self.trace_problem:
            return f"No text traced for this model: {self.trace_problem}"
        return "No text traced: type a text in the Model panel."

    def token_strings(self, ids: list[int] | None = None) -> list[str]:
        ids = self.token_ids if ids is None else ids
        if self.takes_images():  # positions: 0 is [CLS], then the patches row by row
            return ["[CLS]" if i == 0 else f"p{i - 1}" for i in ids]
        if self.loaded is not None and self.loaded.tokenizer is not None:
            return self.loaded.tokenizer.token_strings(ids)
        return [str(i) for i in ids]

    # -- sparse dictionaries (issue 29) -----------------------------------------------------
    def open_dictionary(self, folder: str | Path) -> None:
        """Open a dictionary folder (SAELens' or Gemma Scope's) for the current model in a worker and
        attach it (replacing one at the same hook); a folder that cannot be read or does not fit the
        model is refused in one line (dictionary_failed) and nothing changes."""
        from ..app.features import open_dictionary

        folder = str(folder)
        if self.loading is not None:  # attached once the model being opened arrives
            self._pending_dictionaries.append(folder)
            return
        if self.loaded is None:
            self.dictionary_failed.emit(f"{folder}: open a model first (a dictionary reads a model's activations)")
            return
        if self.takes_images():
            self.dictionary_failed.emit(f"{folder}: sparse features read text models; {self.loaded.name} reads images")
            return
        # another model opened meanwhile: the dictionary was checked against the old one, drop it
        self.run(open_dictionary, folder, self.loaded, on_result=self.add_dictionary,
                 on_error=lambda exc, tb: self.dictionary_failed.emit(str(exc)), parts=(MODEL,))

    def add_dictionary(self, attached) -> None:
        """Attach a dictionary (core.features.Attached) checked against the current model; one already
        at the same hook is replaced, with its feature edits."""
        same = [a for a in self.dictionaries if a.names == attached.names]
        kept = [a for a in self.dictionaries if a.names != attached.names]
        self._set_dictionaries(kept + [attached], removed=same)

    def remove_dictionary(self, attached) -> None:
        """Detach a dictionary; the feature edits made with it go too."""
        self._set_dictionaries([a for a in self.dictionaries if a is not attached],
                               removed=[a for a in self.dictionaries if a is attached])

    def restore_dictionaries(self, folders: list[str]) -> None:
        """Make the dictionaries in `folders` the attached ones (a workspace): opened now, or once the
        model being opened arrives."""
        self._pending_dictionaries = []
        if self.dictionaries:
            self._set_dictionaries([], removed=list(self.dictionaries))
        # folders deleted since: one line for all of them (a message each was a modal dialog each)
        gone = [str(f) for f in folders if not Path(f).is_dir()]
        if gone:
            self.dictionary_failed.emit(f"{len(gone)} dictionary folder(s) the workspace lists no longer "
                                        "exist, not attached: " + ", ".join(gone[:3]) + (", …" if len(gone) > 3 else ""))
            folders = [f for f in folders if Path(f).is_dir()]
        if self.loaded is None and self.loading is None:  # the model comes later (the app's start)
            self._pending_dictionaries = [str(f) for f in folders]
            return
        for folder in folders:
            self.open_dictionary(folder)

    def dictionary_edits(self, attached) -> list:
        """The feature edits among the what-if edits that edit `attached`'s features."""
        return [iv for iv in self.interventions if _edits_dictionary(iv, attached)]

    def _set_dictionaries(self, dictionaries: list, removed: list) -> None:
        self.dictionaries = list(dictionaries)
        dropped = [iv for iv in self.interventions if any(_edits_dictionary(iv, a) for a in removed)]
        self._advance(DICTIONARIES)
        self.dictionaries_changed.emit(list(self.dictionaries))
        if dropped:
            self.edits.remove_if(lambda iv: any(iv is d for d in dropped))

    def _reattach_dictionaries(self, loaded) -> bool:
        """A new model: the dictionaries that fit it stay attached (checked again), the others are
        dropped with a notice, and their feature edits with them. True when an edit was dropped."""
        kept, removed = [], []
        for a in self.dictionaries:
            from ..core.features import attach  # in the loop: no import at start-up, when none is attached

            try:
                kept.append(attach(a.dictionary, loaded.config) if loaded.config.input_kind != "patches" else None)
            except ValueError as exc:
                removed.append(a)
                self.notice.emit(f"Detached {a.dictionary.name}: {exc}")
            else:
                if kept[-1] is None:
                    kept.pop()
                    removed.append(a)
        for new in kept:  # its edits now use the dictionary as attached to this model
            new.dictionary.to(loaded.model.device)
        self.dictionaries = kept
        with self.edits.changed.blocked():  # set_model says it (EDITS advanced with MODEL, then interventions_changed)
            dropped = self.edits.remove_if(lambda iv: any(_edits_dictionary(iv, a) for a in removed))
        return bool(dropped)


def _edits_dictionary(iv, attached) -> bool:
    """Whether the what-if edit `iv` is a feature edit of `attached`'s dictionary."""
    edit = getattr(iv, "features", None)
    return edit is not None and getattr(edit, "attached", None) is not None and \
        edit.attached.dictionary is attached.dictionary
