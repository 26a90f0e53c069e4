"""Watching a model learn: per-head metrics over a training run's kept steps (the timeline, `scrub`).

A run trained with kept checkpoints (core.training.timeline: `train --keep-every K`) has a model folder at
each kept step. Here is what a front end computes over them; the timeline UI and `python -m desktop_app
scrub` share it. Qt-free; run it in a worker (it loads one model per step), with a JobControl to stop it.

    METRICS                                the per-head metrics (core.analysis.HEAD_SCORES): induction,
                                           prev-token, entropy, distance; and weight-norm, per layer: the
                                           Frobenius norm of all of a block's parameters (head -1 in rows)
    probe_sequences(config, run_cfg, n, seed) -> (ids [n, T], period [n], start [n], (shortest, longest))
                                           the sequences they are measured on: random halves of several
                                           lengths, each repeated (the induction task's symbols and lengths
                                           for a run of that task, else up to 32 random ids of the
                                           vocabulary), so a fixed-offset head cannot score as induction
    scrub(run_dir, metric, ...) -> Scrub   the metric of every layer and head at every kept step still there
                                           (and the run's own latest checkpoint), the deleted steps named
    Scrub.values                           [steps, layers, heads]; Scrub.steps, Scrub.timeline (the steps'
                                           folders and the loss curve: core.training.timeline.kept_steps)
    Scrub.rows()                           (step, layer, head, value): the CSV `scrub --csv` writes
    Scrub.summary()                        JSON: the best head (highest at the last step), its first and last
                                           values, the step where it rose past halfway and the step where
                                           the training loss fell past halfway (a phase change shows both
                                           together)
    open_step(run_dir, step, **kw)         the LoadedModel of a step (KeptStepError, one line, if not there)

For the GUI's timeline (the step slider, the Train panel's loss curve):
    run_of(path) -> (run_dir, step) | None the run a model folder belongs to (a run folder: its checkpoint's
                                           step; a kept step's folder: that step), None for other folders
    timeline_of(path) -> (Timeline, step) | None   that run's timeline, when it kept steps to scrub
                                           (also a Hugging Face cache snapshot of a repository whose refs name
                                           training steps, Pythia's step1000 ...: hf_timeline; run_of gives its
                                           repository folder, step_model_folder a step's snapshot)
    nearest_step(steps, x) -> int          the kept step nearest to step x (a click on a loss curve)
    StepCache                              the last few steps' models opened, bounded (see its docstring)
    scrub_metrics(run_dir, metrics, job)   scrub of several metrics (the plots across training): metric -> Scrub
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..core.analysis import HEAD_SCORES, head_scores, repeated_probe
from ..core.hf_cache import (REPO_PREFIX, NotInCacheError, main_revision, repo_of_snapshot, step_of_snapshot,
                             step_revisions, step_snapshot)
from ..core.training.timeline import (KEPT_DIR, STATE_FILE, KeptStep, KeptStepError, LossCurve, Timeline,
                                      describe_steps, kept_steps, model_bytes, step_folder, step_of)

WEIGHT_NORM = "weight-norm"
METRICS = tuple(HEAD_SCORES) + (WEIGHT_NORM,)
COLUMNS = ("step", "layer", "head", "value")
MAX_PERIOD = 32


def probe_sequences(config, run_cfg=None, n: int = 32, seed: int = 0):
    """(ids [n, T], period [n], start [n], (shortest, longest)) for the metrics of a model of `config` (a
    ModelConfig) trained by `run_cfg` (a TrainConfig, or None): core.analysis.repeated_probe's random halves
    of several lengths, each repeated, ending at T (within the context): from the induction task's
    min_length (else half its length) to its length, in its symbols, for such a run; else from a quarter to
    half the context (at most MAX_PERIOD), in the vocabulary. Several lengths, so that a head looking a
    fixed distance back does not pass for an induction head."""
    if run_cfg is not None and run_cfg.task == "induction":
        from ..core.training.tasks import DECLARED_TASKS

        defaults = DECLARED_TASKS["induction"].defaults
        longest = int(run_cfg.task_options.get("length") or defaults["length"])
        shortest = int(run_cfg.task_options.get("min_length") or max(2, longest // 2))
        symbols = int(run_cfg.task_options.get("symbols") or defaults["symbols"])
        length = min(2 * longest, config.context_length)
    else:
        longest, symbols = min(MAX_PERIOD, config.context_length // 2), config.vocab_size
        shortest, length = max(1, longest // 2), min(2 * longest, config.context_length)
    longest = min(longest, length // 2)
    shortest = min(shortest, longest)
    if longest < 1:
        raise ValueError(f"a context of {config.context_length} tokens is too short for sequences that repeat")
    ids, period, start = repeated_probe(n, (shortest, longest), symbols, length, seed)
    return ids, period, start, (shortest, longest)


def open_step(run_dir: str | Path, step: int, **load_kw):
    """The model of `run_dir` at `step` (a kept step, or the run's own checkpoint), loaded."""
    from ..core.checkpoints import load_model_folder

    return load_model_folder(step_model_folder(run_dir, step), **load_kw)


@dataclass
class Scrub:
    run_dir: Path
    metric: str
    steps: list[int]
    values: np.ndarray  # [steps, layers, heads]
    timeline: Timeline
    period: tuple[int, int] | None  # the probe's (shortest, longest) repeat; None for weight-norm (no sequences)
    sequences: int

    @property
    def per_head(self) -> bool:
        return self.metric != WEIGHT_NORM

    def rows(self) -> list[tuple[int, int, int, float]]:
        """(step, layer, head, value); head -1 for a whole layer's value (weight-norm)."""
        return [(s, l, h if self.per_head else -1, float(self.values[i, l, h])) for i, s in enumerate(self.steps)
                for l in range(self.values.shape[1]) for h in range(self.values.shape[2])]

    def best_head(self) -> tuple[int, int]:
        """(layer, head) with the highest value at the last step (head -1 for weight-norm)."""
        layer, head = np.unravel_index(int(np.argmax(self.values[-1])), self.values.shape[1:])
        return int(layer), int(head) if self.per_head else -1

    def summary(self) -> dict:
        layer, head = self.best_head()
        series = self.values[:, layer, max(head, 0)]
        curve = self.timeline.curve
        return {
            "run": str(self.run_dir), "metric": self.metric,
            "what": HEAD_SCORES[self.metric][0] if self.per_head else "Frobenius norm of each block's parameters",
            "steps": self.steps, "layers": int(self.values.shape[1]),
            "heads": int(self.values.shape[2]) if self.per_head else None,
            "rows": int(self.values.size), "sequences": self.sequences,
            "period": list(self.period) if self.period else None,
            "deleted": [k.step for k in self.timeline.missing()],
            "best": {"layer": layer, "head": head, "first": float(series[0]), "last": float(series[-1]),
                     "max": float(series.max()), "rise_step": halfway_step(self.steps, series)},
            "loss_drop_step": halfway_step(curve.steps, -np.asarray(curve.train_loss)) if curve.steps else None,
        }


def halfway_step(steps, values) -> int | None:
    """The first step whose value has gone at least halfway from the first value to the last (None for fewer
    than two points or no change): where a curve's rise, or a loss's drop (values negated), happens."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2 or v[-1] == v[0]:
        return None
    mid = (v[0] + v[-1]) / 2
    past = (v >= mid) if v[-1] > v[0] else (v <= mid)
    return int(steps[int(np.argmax(past))])


def block_norms(model) -> np.ndarray:
    """[layers]: the Frobenius norm of all the parameters of each block (core.training.trainer.layer_groups)."""
    from ..core.training.trainer import layer_groups

    groups = layer_groups(model)
    return np.array([float(torch.sqrt(sum((p.detach().double() ** 2).sum() for p in groups[f"blocks.{l}"])))
                     for l in range(model.cfg.n_layers)])


def scrub(run_dir: str | Path, metric: str, sequences: int = 32, seed: int = 0, device: str = "cpu",
          control=None, on_step: Callable[[int, int, int], None] | None = None) -> Scrub:
    """`metric` (METRICS) of every layer and head at each step of the run whose folder is there, on the same
    sequences (probe_sequences of the run's first model); `on_step(i, n, step)` after each, `control` (a
    core.jobs.JobControl) checked between steps. ValueError when the run has no step to open."""
    from ..core.checkpoints import ModelLoadError, load_model_folder
    from ..core.training.trainer import read_run_config

    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (known: {', '.join(METRICS)})")
    run_dir = Path(run_dir)
    timeline = kept_steps(run_dir)
    steps = timeline.openable()
    if not steps:
        raise ValueError(f"{run_dir}: no kept step is there any more (deleted: "
                         f"{describe_steps([k.step for k in timeline.missing()])})")
    try:
        run_cfg = read_run_config(run_dir)
    except (ModelLoadError, ValueError, OSError):  # no readable run_config: the general sequences
        run_cfg = None
    ids = period = start = lengths = None
    values = []
    for i, k in enumerate(steps):
        if control is not None:
            control.check()
        loaded = load_model_folder(k.path, device=device)
        if metric == WEIGHT_NORM:
            values.append(block_norms(loaded.model)[:, None])
            if on_step is not None:
                on_step(i + 1, len(steps), k.step)
            continue
        if ids is None:
            ids, period, start, lengths = probe_sequences(loaded.config, run_cfg, sequences, seed)
        loaded.model.eval()
        values.append(head_scores(loaded.model, ids, metric, period, start))
        if on_step is not None:
            on_step(i + 1, len(steps), k.step)
    return Scrub(run_dir, metric, [k.step for k in steps], np.stack(values), timeline, lengths, sequences)


# -- the GUI's timeline ---------------------------------------------------------------------------


def run_of(path: str | Path | None) -> tuple[Path, int | None] | None:
    """(run folder, step) when `path` is a training run folder (step None: its own checkpoint's) or a kept
    step's folder inside one (RUN/checkpoints/step-NNNNNN: that step); None for any other folder. Only
    names and one file's presence are looked at (cheap enough for the UI thread)."""
    if path is None:
        return None
    path = Path(path)
    step = step_of(path.name)
    if step is not None and path.parent.name == KEPT_DIR and (path.parent.parent / STATE_FILE).is_file():
        return path.parent.parent, step
    if (path / STATE_FILE).is_file():
        return path, None
    repo = repo_of_snapshot(path)  # a Hugging Face cache snapshot: its repository's step revisions, if any
    return (repo, None) if repo is not None else None


def _hf_repo(run_dir: str | Path) -> Path | None:
    """The Hugging Face cache repository folder (models--org--name) `run_dir` is, or holds as a snapshot;
    None for a training run folder or any other folder."""
    run_dir = Path(run_dir)
    if (run_dir / STATE_FILE).is_file():
        return None
    repo = repo_of_snapshot(run_dir)
    if repo is None and run_dir.name.startswith(REPO_PREFIX) and (run_dir / "snapshots").is_dir():
        repo = run_dir
    return repo


def hf_timeline(repo: str | Path) -> Timeline:
    """The timeline of a cached model whose revisions are training steps (core.hf_cache.step_revisions: Pythia's
    step1000 ...): each step's snapshot, those the cache lacks as deleted; no loss curve (the cache has none);
    the latest step: the one main points at, else the last."""
    revs = step_revisions(repo)
    main = main_revision(repo)
    latest = next((r.step for r in revs if r.revision == main), revs[-1].step if revs else None)
    return Timeline(Path(repo), [KeptStep(r.step, r.folder, r.present) for r in revs], LossCurve(), latest)


def step_model_folder(run_dir: str | Path, step: int) -> Path:
    """The model folder of `step` on a timeline: a training run's kept step (core.training.timeline.step_folder),
    or the snapshot of a cached model's revision step{step} (`run_dir` its repository folder or one of its
    snapshots). KeptStepError, one line, when there is no such step."""
    repo = _hf_repo(run_dir)
    if repo is None:
        return step_folder(run_dir, step)
    try:
        return step_snapshot(repo, step)
    except NotInCacheError as exc:
        raise KeptStepError(repo, str(exc).removeprefix(f"{repo}: ")) from None


def timeline_of(path: str | Path | None) -> tuple[Timeline, int] | None:
    """(the run's timeline, the step `path` holds) when `path` is a run folder or a kept step's folder of a
    run that kept at least two steps still there (something to scrub); else None. Reads the run's
    manifest and metrics: call it in a worker."""
    run = run_of(path)
    if run is None:
        return None
    repo = _hf_repo(path)
    if repo is not None:  # a cached model: its step revisions; the step on show is None when it is none of them
        tl = hf_timeline(repo)
        return (tl, step_of_snapshot(path)) if len(tl.openable()) >= 2 else None
    try:
        tl = kept_steps(run[0])
    except KeptStepError:
        return None
    if len(tl.openable()) < 2:
        return None
    return tl, run[1] if run[1] is not None else tl.latest_step


def nearest_step(steps: list[int], x: float) -> int:
    """The step of `steps` (not empty) nearest to `x`; the earlier one on a tie."""
    return min(steps, key=lambda s: (abs(s - x), s))


class StepCache:
    """The models of the last few steps opened, newest last, so that scrubbing back and forth over nearby
    steps (or Play run again) shows them at once instead of loading each again.

    Bounded by count and by bytes: each entry is a whole copy of a model's weights in memory beside the
    one on show. A run trained here is small (a few MB a step), so MOST steps are kept; a run of a
    larger model is held to MAX_BYTES in all, at least the newest one (the model on show). Keys are what
    decides the tensors: (folder, device, dtype)."""

    MOST = 8
    MAX_BYTES = 512 * 2**20

    def __init__(self, most: int = MOST, max_bytes: int = MAX_BYTES) -> None:
        self.most, self.max_bytes = most, max_bytes
        self._items: list[tuple[tuple, object, int]] = []  # (key, LoadedModel, bytes), oldest first

    def get(self, key: tuple):
        for i, (k, loaded, size) in enumerate(self._items):
            if k == key:
                self._items.append(self._items.pop(i))  # now the most recently used
                return loaded
        return None

    def put(self, key: tuple, loaded) -> None:
        self._items = [it for it in self._items if it[0] != key]
        self._items.append((key, loaded, model_bytes(loaded.model)))
        while len(self._items) > 1 and (len(self._items) > self.most or self.bytes() > self.max_bytes):
            self._items.pop(0)

    def bytes(self) -> int:
        return sum(size for _, _, size in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        self._items.clear()


def scrub_metrics(run_dir: str | Path, metrics=tuple(HEAD_SCORES), job=None) -> dict[str, Scrub]:
    """scrub() of each of `metrics` in turn (the GUI's plots across training): metric -> Scrub. `job` (a
    core.jobs.JobControl) hears the progress over all of them and stops them between steps."""
    out: dict[str, Scrub] = {}
    for m, metric in enumerate(metrics):
        def on_step(i: int, n: int, step: int, m: int = m, metric: str = metric) -> None:
            if job is not None:
                job.progress(m * n + i, len(metrics) * n, f"{metric}: step {step}")
        out[metric] = scrub(run_dir, metric, control=job, on_step=on_step)
    return out
