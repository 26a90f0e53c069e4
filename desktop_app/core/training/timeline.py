"""Kept checkpoints: a training run's model at chosen steps, written beside its latest checkpoint, found again.

A run trained with keep_every / keep_spacing (core.training.options; `train --keep-every K
[--keep-spacing log] [--keep-max-gb G]`) keeps, beside its own latest checkpoint (the run folder itself,
the only one with the optimiser state), a complete model folder at each kept step:

    RUN/checkpoints/step-000200/           config.json, model.safetensors, tokenizer.json, run_config.json
                                           (+ preprocessor_config.json for an image task): opens anywhere
    RUN/checkpoints/.transformer-explorer.json   the app's manifest: every step folder this run kept (also
                                           one since deleted, so that it is reported, not silently absent)

Which steps (kept_schedule): linear keeps 0, K, 2K, ...; log keeps 0, 1, 2, 4, 8, ... below K, then every
K (Pythia's series; with K = 0, powers of two to the end). A kept step is also a checkpoint of the run.

How they are written: the run folder is replaced whole at each checkpoint (core.files.atomic_write_dir),
so its new copy is given the kept folders before the swap (Keeper.fill): the folders already kept are
hard links to the same files (a copy where the file system has no hard links), the new one is written
there. A kill at any instant leaves one complete run folder whose kept steps match its checkpoint; a
resumed run goes on adding to them. Files a user put under checkpoints/ are carried along, never lost.
A disk bound (keep_max_gb) stops the keeping, with an event saying so ("keep_stopped"); the start event's
"keep" entry has the estimate made before the first step.

Reading (for the timeline UI and the commands; no Qt):
    kept_steps(run_dir) -> Timeline      every kept step (folder, present or deleted) and the run's own
                                         latest checkpoint, and the loss curve from the run's metrics
    step_folder(run_dir, step) -> Path   the model folder of step N (`--step N` of every command);
                                         KeptStepError (a ModelLoadError, one line) for a step not kept or
                                         deleted, or a folder that is not a run
    Timeline.openable()                  the steps whose folders are there, in order
    Timeline.curve                       LossCurve: train_loss per logged step, val_loss / val_accuracy /
                                         train_accuracy per evaluation
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..files import APP, MANIFEST, interrupted_copy, is_own_folder, read_manifest
from ..weights import ModelLoadError

KEPT_DIR = "checkpoints"
_STEP_NAME = re.compile(r"step-([0-9]{6,})")  # ASCII digits (\d takes '٣', which int() reads): as hf_cache's _STEP_REF
STATE_FILE = "trainer_state.json"  # trainer.STATE_FILE (the trainer imports this module)
METRICS_JSON = "metrics.json"
SPACINGS = ("linear", "log")


class KeptStepError(ModelLoadError):
    """A step that cannot be opened: not kept, deleted, or the folder is not a run (one line)."""


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def step_of(name: str) -> int | None:
    m = _STEP_NAME.fullmatch(name)
    return int(m.group(1)) if m else None


# -- which steps ---------------------------------------------------------------------------------


def is_kept(step: int, every: int, spacing: str = "linear") -> bool:
    """Whether `step` is on the schedule: multiples of `every` (0 included); with log spacing also 0 and
    the powers of two below `every` (every power of two when `every` is 0)."""
    if spacing == "log" and (step == 0 or step & (step - 1) == 0) and (every <= 0 or step < every):
        return True
    return every > 0 and step % every == 0


def kept_schedule(every: int, spacing: str, end: int, start: int = 0) -> list[int]:
    """The steps of [start, end] the schedule keeps, in order (without walking every step)."""
    steps: set[int] = set()
    if spacing == "log":
        p = 0
        while p <= end and (every <= 0 or p < every):
            if p >= start:
                steps.add(p)
            p = 1 if p == 0 else 2 * p
    if every > 0:
        first = -(-start // every) * every
        steps.update(range(first, end + 1, every))
    return sorted(steps)


def describe_steps(steps: list[int], most: int = 8) -> str:
    """'0, 1, 2, 4, ..., 800, 1000' (the first and last few)."""
    if len(steps) <= most:
        return ", ".join(map(str, steps))
    return ", ".join(map(str, steps[: most - 3])) + ", ..., " + ", ".join(map(str, steps[-2:]))


def human_gb(n: float) -> str:
    from ..hf_cache import format_size
    return format_size(int(n))


# -- writing (the trainer) -----------------------------------------------------------------------


def folder_bytes(folder: Path) -> int:
    """The bytes of the regular files under `folder` (links not followed)."""
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            try:
                st = os.lstat(os.path.join(root, f))
            except OSError:
                continue
            total += st.st_size
    return total


def model_bytes(model, tokenizer=None) -> int:
    """About what a kept model folder of `model` takes: its tensors (shared ones once), the tokenizer and
    the small JSON files."""
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    if tokenizer is not None:
        try:
            total += len(tokenizer.to_str().encode("utf-8"))
        except Exception:  # an estimate: a tokenizer that cannot say its size adds nothing
            pass
    return total + 8192


def _carry_foreign(old: Path, new: Path) -> None:
    """Into a kept step's new folder, the entries of its previous folder that the app did not write (not in
    that folder's manifest: a user's note): kept, never deleted. One whose name the new folder uses is
    carried as NAME.user."""
    if old.is_symlink() or not old.is_dir():
        return
    listed = read_manifest(old) or set()
    for entry in old.iterdir():
        if entry.name in listed or entry.name == MANIFEST:
            continue
        target = new / entry.name
        while target.exists() or target.is_symlink():
            target = target.with_name(target.name + ".user")
        _link_tree(entry, target)


def _link_tree(src: Path, dst: Path) -> None:
    """A copy of `src` at `dst` that shares the files: hard links (copies where links fail), sub-folders
    made anew, symbolic links recreated as links."""
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
    elif src.is_dir():
        dst.mkdir()
        for child in src.iterdir():
            _link_tree(child, dst / child.name)
        shutil.copymode(src, dst)
    else:
        try:
            os.link(src, dst)
        except OSError:  # no hard links here (FAT, some network file systems): a copy
            shutil.copy2(src, dst)


def _kept_dir(run_dir: Path) -> Path:
    return (interrupted_copy(run_dir) or run_dir) / KEPT_DIR


def listed_steps(run_dir: str | Path) -> list[str]:
    """The step folders the run's checkpoints manifest lists (the steps it kept), in order of step."""
    listed = read_manifest(_kept_dir(Path(run_dir))) or set()
    return sorted((n for n in listed if step_of(n) is not None), key=step_of)


class Keeper:
    """What a run keeps: its schedule, its disk bound, the steps kept so far; gives each checkpoint of the
    run folder its checkpoints/ sub-folder (fill). `resume`: go on from the steps the run folder lists (up
    to its checkpoint's step); else a new run (an overwritten run's kept steps are dropped, files a user
    put there kept)."""

    def __init__(self, out_dir: Path, every: int, spacing: str, max_gb: float, start_step: int,
                 resume: bool, emit: Callable[[dict], None]) -> None:
        self.out_dir = Path(out_dir)
        self.every, self.spacing = int(every), spacing
        self.max_bytes = float(max_gb) * 1e9
        self.emit = emit
        self.listed: list[str] = []
        self.sizes: dict[str, int] = {}
        if resume:
            kept = _kept_dir(self.out_dir)
            for name in listed_steps(self.out_dir):
                if step_of(name) > start_step:
                    continue  # (not possible with the app's own writes: a kept step is also a checkpoint)
                self.listed.append(name)
                if (kept / name).is_dir():
                    self.sizes[name] = folder_bytes(kept / name)
        self.stopped = False
        self.each: int | None = None  # bytes of one kept folder: the last written, or the estimate

    @property
    def active(self) -> bool:
        return self.every > 0 or self.spacing == "log"

    def wants(self, step: int) -> bool:
        return self.active and not self.stopped and is_kept(step, self.every, self.spacing)

    def kept_bytes(self) -> int:
        return sum(self.sizes.values())

    def plan(self, start: int, end: int, estimate: int) -> dict | None:
        """The estimate said before the run (the start event's "keep"): which steps, about how many bytes,
        the bound, and the last step that fits under it (None when all do)."""
        if not self.active:
            return None
        if self.sizes:  # a resumed run: what its last kept folder took, not an estimate
            estimate = self.sizes[max(self.sizes, key=step_of)]
        self.each = estimate
        steps = [s for s in kept_schedule(self.every, self.spacing, end, start) if step_name(s) not in self.listed]
        room = int(max(self.max_bytes - self.kept_bytes(), 0) // max(estimate, 1))
        return {"steps": len(steps), "first": steps[0] if steps else None, "last": steps[-1] if steps else None,
                "shown": describe_steps(steps), "bytes_each": estimate, "bytes": estimate * len(steps),
                "already": len(self.listed), "already_bytes": self.kept_bytes(), "max_bytes": self.max_bytes,
                "last_within_bound": None if room >= len(steps) else (steps[room - 1] if room else None),
                "folder": str(self.out_dir / KEPT_DIR)}

    def decide(self, step: int) -> bool:
        """Whether this checkpoint keeps `step`: on the schedule, and within the bound (else the keeping
        stops here, and a "keep_stopped" event says so, once)."""
        if not self.wants(step):
            return False
        each = self.each or 0
        if self.kept_bytes() + each > self.max_bytes:
            self.stopped = True
            last = max((step_of(n) for n in self.sizes), default=None)
            self.emit({"event": "keep_stopped", "step": step, "kept": len(self.sizes), "bytes": self.kept_bytes(),
                       "max_bytes": self.max_bytes, "message":
                       f"{self.out_dir / KEPT_DIR}: no more kept steps from step {step}: another "
                       f"{human_gb(each)} would pass the bound of {human_gb(self.max_bytes)} (--keep-max-gb); "
                       f"{len(self.sizes)} kept ({human_gb(self.kept_bytes())})"
                       + (f", the last at step {last}" if last is not None else "") + "; training goes on"})
            return False
        return True

    def fill(self, keep_step: int | None, write_model: Callable[[Path], None]) -> Callable[[Path], None]:
        """The run folder's extra fill (checkpoints.save_model_folder(extra_fill=...)): the kept steps so far
        and, when `keep_step` is given, that step's folder written by `write_model(folder)`."""
        def fill(tmp: Path) -> None:
            if not self.listed and keep_step is None and not self._foreign():
                return
            dst = tmp / KEPT_DIR
            dst.mkdir()
            src = _kept_dir(self.out_dir)
            ours = set(self.listed)
            if src.is_dir():
                for entry in src.iterdir():
                    if entry.name == MANIFEST or (keep_step is not None and entry.name == step_name(keep_step)):
                        continue
                    mine = step_of(entry.name) is not None and is_own_folder(entry)
                    if mine and entry.name not in ours:
                        continue  # an overwritten run's kept step: the app's, not this run's
                    _link_tree(entry, dst / entry.name)
            listed = list(self.listed)
            if keep_step is not None:
                name = step_name(keep_step)
                write_model(dst / name)
                _carry_foreign(src / name, dst / name)
                self.sizes[name] = self.each = folder_bytes(dst / name)
                if name not in listed:
                    listed.append(name)
            (dst / MANIFEST).write_text(json.dumps({"app": APP, "files": sorted(listed, key=step_of)}),
                                        encoding="utf-8")
            self.listed = listed
        return fill

    def _foreign(self) -> bool:
        """Whether the run folder's checkpoints/ holds anything not to drop (a user's files)."""
        src = _kept_dir(self.out_dir)
        if not src.is_dir():
            return False
        return any(e.name != MANIFEST and not (step_of(e.name) is not None and is_own_folder(e))
                   for e in src.iterdir())


# -- reading (the timeline, --step N) ------------------------------------------------------------


@dataclass(frozen=True)
class KeptStep:
    step: int
    path: Path
    present: bool  # False: kept, then its folder was deleted (or it is refused)
    latest: bool = False  # the run folder's own checkpoint (the only one with the optimiser state)
    refused: str = ""  # why a folder that is there is not opened: a link leading out of the run


@dataclass
class LossCurve:
    """The run's metrics (metrics.json): train_loss at each logged step; val_loss, val_accuracy and
    train_accuracy at each evaluation (None where an evaluation had no training accuracy)."""
    steps: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    val_accuracy: list[float] = field(default_factory=list)
    train_accuracy: list[float | None] = field(default_factory=list)

    @classmethod
    def from_history(cls, history: list) -> "LossCurve":
        c = cls()
        for ev in history if isinstance(history, list) else ():
            if not isinstance(ev, dict):
                continue
            if ev.get("event") == "step" and isinstance(ev.get("train_loss"), (int, float)):
                c.steps.append(int(ev["step"]))
                c.train_loss.append(float(ev["train_loss"]))
            elif ev.get("event") == "eval" and isinstance(ev.get("val_loss"), (int, float)):
                c.eval_steps.append(int(ev["step"]))
                c.val_loss.append(float(ev["val_loss"]))
                c.val_accuracy.append(float(ev.get("val_accuracy") or 0.0))
                c.train_accuracy.append(ev.get("train_accuracy"))
        return c


@dataclass
class Timeline:
    run_dir: Path
    steps: list[KeptStep]  # by step; the run's own checkpoint last where it is not a kept step
    curve: LossCurve
    latest_step: int | None
    # why the kept steps could not be listed (checkpoints/ holds step folders but its manifest is unreadable):
    # then only the run's own checkpoint is among `steps`, and every reader says so
    unlisted: str | None = None
    # why the loss curve is empty though metrics.json is there (beyond read_json's cap, malformed): one line naming it
    unread_metrics: str | None = None

    def openable(self) -> list[KeptStep]:
        return [k for k in self.steps if k.present]

    def missing(self) -> list[KeptStep]:
        return [k for k in self.steps if not k.present]

    def kept(self) -> list[KeptStep]:
        return [k for k in self.steps if not k.latest]


def _run_folder(run_dir: Path) -> Path:
    """The folder holding the run's files: the run folder, or the complete copy an interrupted swap left."""
    return interrupted_copy(run_dir) or run_dir


def kept_steps(run_dir: str | Path) -> Timeline:
    """The run's kept steps and its loss curve. KeptStepError when `run_dir` is not a training run folder."""
    run_dir = Path(run_dir)
    folder = _run_folder(run_dir)
    state = folder / STATE_FILE
    if not state.is_file():
        what = "no such folder" if not folder.exists() else (
            f"a kept step's folder (open it directly, or give its run folder {folder.parent.parent.name} "
            "with --step)" if step_of(folder.name) is not None and folder.parent.name == KEPT_DIR else
            f"not a training run folder (no {STATE_FILE}); --step N opens a step a run kept (train --keep-every K)")
        raise KeptStepError(run_dir, what)
    try:
        latest = int(json.loads(state.read_text(encoding="utf-8"))["step"])
    except (OSError, ValueError, KeyError, TypeError):
        raise KeptStepError(state, "unreadable (not the trainer's JSON)") from None
    kept = folder / KEPT_DIR
    steps = [kept_step_at(folder, kept / n) for n in listed_steps(run_dir)]
    unlisted = None
    if not steps and kept.is_dir() and read_manifest(kept) is None and any(
            step_of(p.name) is not None for p in kept.iterdir()):
        unlisted = (f"{kept / MANIFEST}: " + ("corrupt (not the app's JSON)" if (kept / MANIFEST).exists() else
                                               "missing") + "; the run's kept steps cannot be listed")
    if latest not in {k.step for k in steps}:
        steps.append(KeptStep(latest, run_dir, True, latest=True))
    steps.sort(key=lambda k: (k.step, k.latest))
    history, unread = read_history(folder)
    return Timeline(run_dir, steps, LossCurve.from_history(history), latest, unlisted, unread)


def read_history(folder: Path) -> tuple[list, str | None]:
    """The run's metrics.json events, and None; or [] and why it cannot be read (JsonFileError's one line: beyond
    the trainer's METRICS_MAX_BYTES, malformed...). No file: [] and None (a run that has logged nothing yet)."""
    from ..files import METRICS_MAX_BYTES, JsonFileError, read_json

    path = folder / METRICS_JSON
    if not path.is_file():
        return [], None
    try:
        history = read_json(path, max_bytes=METRICS_MAX_BYTES)
    except JsonFileError as exc:
        return [], str(exc)
    return (history, None) if isinstance(history, list) else ([], f"{path}: not a list of events (not the trainer's JSON)")


def kept_step_at(run: Path, path: Path) -> KeptStep:
    """A listed step's KeptStep: its folder must lie inside the run (a link elsewhere is refused, not opened
    as this run's step: the one rule for every folder the app reads, links stay inside it)."""
    step = step_of(path.name)
    if not (path.is_dir() or path.is_symlink()):
        return KeptStep(step, path, False)
    real = path.resolve()
    if path.is_symlink() or not real.is_relative_to(run.resolve()):
        return KeptStep(step, path, False, refused=f"a link to {real}, outside the run; refused (a kept step's "
                                                   "folder must lie inside its run)")
    return KeptStep(step, path, True)


def step_folder(run_dir: str | Path, step: int) -> Path:
    """The model folder of `step` in the run `run_dir`: a kept step's folder, or the run folder itself
    for its own checkpoint's step. KeptStepError (one line) otherwise: a step not kept (naming the kept
    ones), a kept step whose folder was deleted, a folder that is not a run."""
    tl = kept_steps(run_dir)
    for k in tl.steps:
        if k.step == step:
            if k.refused:
                raise KeptStepError(k.path, k.refused)
            if not k.present:
                there = [s.step for s in tl.openable()]
                raise KeptStepError(k.path, f"step {step} was kept but its folder has been deleted; steps "
                                            f"still there: {describe_steps(there) or 'none'}")
            return k.path
    if tl.unlisted:
        raise KeptStepError(run_dir, f"step {step} cannot be opened: {tl.unlisted}")
    kept = [k.step for k in tl.openable()]
    raise KeptStepError(run_dir, f"step {step} was not kept; the run has "
                                 + (f"steps {describe_steps(kept)}" if len(kept) > 1 else
                                    f"only its checkpoint at step {tl.latest_step} (train with --keep-every K "
                                    "to keep more)"))


def describe_keep_plan(plan: dict) -> str:
    """The start event's "keep" estimate in one line, as `train` prints it before the first step."""
    if not plan["steps"]:
        return f"keeping no more steps in {plan['folder']} (the schedule has none left before the end)"
    line = (f"keeping {plan['steps']} steps ({plan['shown']}) in {plan['folder']}: about "
            f"{human_gb(plan['bytes'])} ({human_gb(plan['bytes_each'])} each"
            + (f", beside {plan['already']} kept already, {human_gb(plan['already_bytes'])}" if plan["already"] else "")
            + f"); bound {human_gb(plan['max_bytes'])} (--keep-max-gb)")
    if plan["last_within_bound"] is not None:
        line += f": the keeping stops after step {plan['last_within_bound']}"
    elif plan["bytes"] + plan["already_bytes"] > plan["max_bytes"]:
        line += ": not even the first fits, nothing will be kept"
    return line
