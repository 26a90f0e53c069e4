"""The one training loop: when a run steps, logs, evaluates and checkpoints, and its pause, stop and resume.

Every trainer here (model training in trainer.py; dictionaries, per-layer and cross-layer transcoders in
sae.py; the lectures' MLP baseline in baselines.py) says what one step, one log line, one evaluation
and one checkpoint of its run are, as a `Run`; `Loop.run` decides when each happens:

    step n (counted from 1) is taken; then its "step" event when n % log_every == 0 or n is the last,
    an evaluation when n % eval_every == 0 or n is the last, a checkpoint when n % checkpoint_every == 0,
    n is the last, or the run keeps step n (Run.keeps: the kept steps of timeline.py).

A new run whose schedule keeps step 0 writes that checkpoint (the model as initialised) before the first
step. Between steps a paused TrainControl waits ("paused", then "resumed"; the time waited is not counted)
and a stopped one (JobControl.cancel) ends the loop after the step in progress: Run.stopped then writes
what the run keeps. A resumed run starts the loop at its checkpoint's step with the seconds it had spent.
The settings every run has are RunConfig's; TrainConfig and SaeTrainConfig add their own.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..jobs import Cancelled, JobControl


@dataclass(kw_only=True)
class RunConfig:
    """The run settings every trainer has (each subclass may give its own defaults)."""
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 0
    log_every: int = 10
    eval_every: int = 100
    checkpoint_every: int = 500
    device: str = "cpu"


class TrainControl(JobControl):
    """JobControl plus pause/resume; the loop waits (without counting time) while paused."""

    def __init__(self, on_progress=None) -> None:
        super().__init__(on_progress)
        self._running = threading.Event()
        self._running.set()

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def wait_while_paused(self) -> float:
        """Block while paused (cancel still works); returns the seconds spent waiting."""
        t0 = time.perf_counter()
        while not self._running.wait(0.1):
            self.check()
        return time.perf_counter() - t0


def pause_point(control: JobControl | None, emit: Callable[[dict], None], step: int) -> float:
    """Between steps: wait here while paused (announced by events), raise Cancelled when stopped; returns
    the seconds waited."""
    if control is None:
        return 0.0
    waited = 0.0
    if isinstance(control, TrainControl) and control.paused:
        emit({"event": "paused", "step": step})
        waited = control.wait_while_paused()
        emit({"event": "resumed", "step": step})
    control.check()
    return waited


class Run:
    """What one trainer does at each point of the loop (the loop decides when). `loop.step` is the step
    just taken (in `step`: the one being taken); `loop.elapsed` the run's seconds so far."""

    def step(self, loop: "Loop") -> None:
        """Take step loop.step: a batch, its loss, the backward pass, the optimiser's step."""
        raise NotImplementedError

    def log(self, loop: "Loop") -> None:
        """The "step" event of the step just taken."""

    def evaluate(self, loop: "Loop") -> None:
        """The "eval" event: the held-out measures after the step just taken."""

    def keeps(self, step: int) -> bool:
        """Does the run keep this step (a checkpoint off the checkpoint_every schedule)?"""
        return False

    def checkpoint(self, loop: "Loop") -> None:
        """Write the run's folder at the step just taken (what a resumed run goes on from)."""

    def stopped(self, loop: "Loop") -> None:
        """Stopped after loop.step steps: keep what the run has (by default its checkpoint, unless written
        at this step already)."""
        if loop.last_checkpoint != loop.step:
            self.checkpoint(loop)


class Loop:
    """The steps of one run from `start_step` (a resumed run's checkpoint step, with `elapsed` seconds spent
    before) to cfg.steps."""

    def __init__(self, cfg: RunConfig, start_step: int = 0, elapsed: float = 0.0, resumed: bool = False) -> None:
        self.cfg = cfg
        self.steps = cfg.steps
        self.start_step = self.step = start_step
        self.resumed = resumed
        self.last_checkpoint: int | None = start_step if resumed else None
        self._elapsed_before = elapsed
        self._started = time.perf_counter()
        self._waited = 0.0

    @property
    def elapsed(self) -> float:
        """Seconds the run has trained, this session's and those before a resume (pauses excluded)."""
        return self._elapsed_before + time.perf_counter() - self._started - self._waited

    @property
    def eta(self) -> float:
        """Seconds left at this session's pace."""
        done = self.step - self.start_step
        return (self.elapsed - self._elapsed_before) / done * (self.steps - self.step) if done else 0.0

    def logs(self, step: int) -> bool:
        """Is `step` logged (a "step" event)? A run may need to know while taking it (gradient norms)."""
        return step % self.cfg.log_every == 0 or step == self.steps

    def _checkpoint(self, run: Run) -> None:
        run.checkpoint(self)
        self.last_checkpoint = self.step

    def run(self, run: Run, control: JobControl | None = None,
            emit: Callable[[dict], None] = lambda ev: None) -> bool:
        """Take the steps; True when stopped by `control` (after run.stopped), False when all were taken.
        Any other exception (a diverged loss...) passes through, the last checkpoint as it was."""
        cfg = self.cfg
        self._started, self._waited = time.perf_counter(), 0.0
        if not self.resumed and run.keeps(self.step):  # the model as initialised, before the first step
            self._checkpoint(run)
        try:
            while self.step < self.steps:
                self._waited += pause_point(control, emit, self.step)
                self.step += 1
                try:
                    run.step(self)
                except BaseException:
                    self.step -= 1  # not taken
                    raise
                step, last = self.step, self.step == self.steps
                if self.logs(step):
                    run.log(self)
                    if control is not None:
                        control.progress(step, self.steps, f"step {step}/{self.steps}")
                if step % cfg.eval_every == 0 or last:
                    run.evaluate(self)
                if step % cfg.checkpoint_every == 0 or last or run.keeps(step):
                    self._checkpoint(run)
        except Cancelled:
            run.stopped(self)
            return True
        return False
