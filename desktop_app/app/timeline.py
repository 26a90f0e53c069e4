"""Watching a model learn: per-head metrics over a training run's kept steps (the timeline, `scrub`).

A run trained with kept checkpoints (core.training.timeline: `train --keep-every K`) has a model folder at
each kept step. Here is what a front end computes over them; the timeline UI and `python -m desktop_app
scrub` share it. Qt-free; run it in a worker (it loads one model per step), with a JobControl to stop it.

    METRICS                                the per-head metrics (core.analysis.HEAD_SCORES): induction,
                                           prev-token, entropy, distance; and per layer (head -1 in rows):
                                           weight-norm (the Frobenius norm of all of a block's parameters),
                                           lipschitz (the local Lipschitz constant of the layer's attention,
                                           core.lipschitz's sweep on the fixed sequences), logit-lens (the
                                           probability of the correct next token read through the layer's
                                           logit lens), logit-lens-rank (its rank there, 0 = top), and
                                           grad-norm (the gradient norm of each block the trainer logged,
                                           at its logged steps, not at kept steps)
    probe_sequences(config, run_cfg, n, seed) -> (ids [n, T], period [n], start [n], (shortest, longest))
                                           the sequences they are measured on: random halves of several
                                           lengths, each repeated (the induction task's symbols and lengths
                                           for a run of that task, else up to 32 random ids of the
                                           vocabulary), so a fixed-offset head cannot score as induction
    scrub(run_dir, metric, ...) -> Scrub   the metric of every layer and head at every kept step still there
                                           (and the run's own latest checkpoint), the deleted steps named;
                                           `layers` chooses the layers of a per-layer metric, `text` a text
                                           of one's own for lipschitz and the logit lens (else the probe);
                                           `run_dir` may also be a Hugging Face cache repository whose
                                           revisions are training steps (timeline_at)
    lipschitz_per_layer(model, ids, layers)   [layers]: core.lipschitz's run_sweep on the sequences ids
    logit_lens_of_next(model, ids, first)  ([layers], [layers]): probability and rank of the next token
                                           through each layer's logit lens (the trace's blocks.L.logit_lens)
    grad_norm_scrub(run_dir)               the gradient norms the trainer logged (metrics.json), per block
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

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..core.analysis import HEAD_SCORES, head_scores, repeated_probe, stack_layers
from ..core.hf_cache import (REPO_PREFIX, NotInCacheError, main_revision, repo_of_snapshot, step_of_snapshot,
                             step_revisions, step_snapshot)
from ..core.training.timeline import (KEPT_DIR, STATE_FILE, KeptStep, KeptStepError, LossCurve, Timeline,
                                      describe_steps, kept_steps, model_bytes, step_folder, step_of)

WEIGHT_NORM = "weight-norm"
LIPSCHITZ = "lipschitz"
LOGIT_LENS = "logit-lens"
LOGIT_LENS_RANK = "logit-lens-rank"
GRAD_NORM = "grad-norm"
LAYER_METRICS = {  # metric -> what it is (per layer: head -1 in rows)
    WEIGHT_NORM: "Frobenius norm of each block's parameters",
    LIPSCHITZ: "local Lipschitz constant of each layer's attention (mean over the sequences)",
    LOGIT_LENS: "probability of the correct next token through each layer's logit lens (mean over positions)",
    LOGIT_LENS_RANK: "rank of the correct next token in each layer's logit lens (0 = top; mean over positions)",
    GRAD_NORM: "gradient norm of each block at the steps the trainer logged",
}
METRICS = tuple(HEAD_SCORES) + tuple(LAYER_METRICS)
TEXT_METRICS = (LIPSCHITZ, LOGIT_LENS, LOGIT_LENS_RANK)  # measured on a fixed text (`text`, else the probe)
COLUMNS = ("step", "layer", "head", "value")
MAX_PERIOD = 32
LIPSCHITZ_SEQUENCES = 4  # the Lipschitz constant is measured on the first 4 probe sequences (or 4 windows of a text)
LIPSCHITZ_WINDOW = 64  # tokens of a text's windows at most


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
    period: tuple[int, int] | None  # the probe's (shortest, longest) repeat; None without the probe
    sequences: int
    layers: list[int] | None = None  # the layers of values' axis 1 (None: 0 .. L-1)
    text: str | None = None  # the text of one's own measured on, if any (TEXT_METRICS)
    stacks: list[str] | None = None  # an encoder-decoder's: the stack of each layer of axis 1 (encoder / decoder)

    @property
    def per_head(self) -> bool:
        return self.metric in HEAD_SCORES

    @property
    def layer_ids(self) -> list[int]:
        if self.layers is not None:
            return list(self.layers)
        if self.stacks is not None:  # each stack's layers from 0
            return [self.stacks[:i].count(s) for i, s in enumerate(self.stacks)]
        return list(range(self.values.shape[1]))

    @property
    def layer_labels(self) -> list:
        """What names each layer of axis 1: its index, or an encoder-decoder's "encoder.L" / "decoder.L"."""
        ids = self.layer_ids
        return ids if self.stacks is None else [f"{s}.{l}" for s, l in zip(self.stacks, ids)]

    def rows(self) -> list[tuple[int, int | str, int, float]]:
        """(step, layer, head, value); head -1 for a whole layer's value (LAYER_METRICS); an encoder-decoder's
        layer is named with its stack (encoder.0, decoder.1)."""
        labels = self.layer_labels
        return [(s, labels[l], h if self.per_head else -1, float(self.values[i, l, h]))
                for i, s in enumerate(self.steps) for l in range(self.values.shape[1]) for h in range(self.values.shape[2])]

    def _best(self) -> tuple[int, int]:
        last = -self.values[-1] if self.metric == LOGIT_LENS_RANK else self.values[-1]
        row, head = np.unravel_index(int(np.argmax(last)), self.values.shape[1:])
        return int(row), int(head)

    def best_head(self) -> tuple[int | str, int]:
        """(layer, head) with the highest value at the last step (head -1 for a per-layer metric; the lowest
        value for logit-lens-rank, where lower is better)."""
        row, head = self._best()
        return self.layer_labels[row], head if self.per_head else -1

    def summary(self) -> dict:
        layer, head = self.best_head()
        series = self.values[:, self._best()[0], max(head, 0)]
        curve = self.timeline.curve
        return {
            "run": str(self.run_dir), "metric": self.metric,
            "what": HEAD_SCORES[self.metric][0] if self.per_head else LAYER_METRICS[self.metric],
            "steps": self.steps, "layers": int(self.values.shape[1]), "layer_ids": self.layer_labels,
            "heads": int(self.values.shape[2]) if self.per_head else None,
            "rows": int(self.values.size), "sequences": self.sequences,
            "period": list(self.period) if self.period else None,
            "text": self.text,
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


def _block(stack: str | None, layer: int) -> str:
    return f"{stack}.blocks.{layer}" if stack else f"blocks.{layer}"


def block_norms(model, rows=None) -> np.ndarray:
    """[rows]: the Frobenius norm of all the parameters of each block (core.training.trainer.layer_groups);
    `rows`: (stack, layer) pairs (default every block: analysis.stack_layers)."""
    from ..core.training.trainer import layer_groups

    groups = layer_groups(model)
    return np.array([float(torch.sqrt(sum((p.detach().double() ** 2).sum() for p in groups[_block(stack, l)])))
                     for stack, l in (rows if rows is not None else stack_layers(model.cfg))])


def lipschitz_per_layer(model, ids: torch.Tensor, layers, seed: int = 0, job=None) -> np.ndarray:
    """[len(layers)]: the local Lipschitz constant of each layer's attention (core.lipschitz's sweep on real
    inputs: the estimator, its tolerance), averaged over the sequences `ids` [K, n], each one input. `layers`:
    layer indices, or an encoder-decoder's (stack, layer) pairs (a decoder layer's self-attention reads the
    sequences as the decoder's input, the first one as the source)."""
    from ..core.lipschitz.sweep import SweepSpec, run_sweep

    K, n = ids.shape
    flat = ids.reshape(-1).tolist()  # K windows of n: window_starts takes exactly the K sequences
    rows = [row if isinstance(row, tuple) else (None, row) for row in layers]
    return np.array([float(run_sweep(SweepSpec(data="real", lengths=(n,), samples=K, model=model, layer=l,
                                               token_ids=flat, seed=seed, stack=stack,
                                               source_ids=ids[0].tolist() if stack == "decoder" else None),
                                     job=job).lengths[0].lipschitz.mean())
                     for stack, l in rows])


LENS_BATCH = 8  # sequences traced at once for the logit lens ([batch, T, vocab] per layer) at most,
LENS_BYTES = 256 * 2**20  # and fewer when their lenses ([batch, T, vocab] float32, every layer) would pass this


@torch.no_grad()
def logit_lens_of_next(model, ids: torch.Tensor, first) -> tuple[np.ndarray, np.ndarray]:
    """([layers], [layers]): the probability and the rank (0 = top) of the correct next token read through
    each layer's logit lens (the trace's blocks.l.logit_lens: final norm + unembedding of its residual
    stream), averaged over the positions t >= first[i] of each sequence i of `ids` [n, T] (t < T - 1)."""
    cfg = model.cfg
    seq2seq = bool(getattr(cfg, "is_encoder_decoder", False))  # the decoder's layers, reading ids as source too
    if not seq2seq and (not cfg.lm_head or not cfg.causal or cfg.input_kind != "tokens"):
        raise ValueError("the logit lens of the next token needs a decoder with a language-model head")
    L = cfg.n_decoder_layers if seq2seq else cfg.n_layers
    prefix = "decoder." if seq2seq else ""
    n, T = ids.shape
    first = np.broadcast_to(np.asarray(first), (n,))
    probs, ranks, count = np.zeros(L), np.zeros(L), 0
    per_batch = max(1, min(LENS_BATCH, LENS_BYTES // (4 * T * cfg.vocab_size * L)))
    for b0 in range(0, n, per_batch):
        batch = ids[b0:b0 + per_batch].to(model.device)
        if seq2seq:
            _, trace = model.run_with_trace(batch, batch, names=("decoder.blocks.*.logit_lens",))
        else:
            _, trace = model.run_with_trace(batch, names=("blocks.*.logit_lens",), compute_logits=False)
        target = batch[:, 1:]  # [B, T-1]: the next token of each position
        keep = torch.as_tensor(np.arange(T - 1)[None, :] >= first[b0:b0 + per_batch, None], device=model.device)
        count += int(keep.sum())
        for l in range(L):
            logits = trace[f"{prefix}blocks.{l}.logit_lens"][:, :-1].float()  # [B, T-1, vocab]
            right = logits.gather(-1, target[..., None])  # [B, T-1, 1]
            p = torch.softmax(logits, -1).gather(-1, target[..., None])[..., 0]
            r = (logits > right).sum(-1).double()
            probs[l] += float(p.double()[keep].sum())
            ranks[l] += float(r[keep].sum())
    if count == 0:
        raise ValueError("the text is too short for a logit lens of the next token (2 tokens at least)")
    return probs / count, ranks / count


def _run_config(run_dir: Path):
    from ..core.checkpoints import ModelLoadError
    from ..core.training.trainer import read_run_config

    try:
        return read_run_config(run_dir)
    except (ModelLoadError, ValueError, OSError):  # no readable run_config: the general sequences
        return None


def _check_layers(layers, n_layers: int) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    out = sorted({int(l) for l in layers})
    bad = [l for l in out if not 0 <= l < n_layers]
    if bad or not out:
        raise ValueError(f"layer {bad[0] if bad else '(none)'} is not a layer of this model (0 to {n_layers - 1})")
    return out


def timeline_at(run_dir: str | Path) -> Timeline:
    """The steps scrub measures: a training run's kept steps (core.training.timeline.kept_steps), or the step
    revisions of a Hugging Face cache repository (`run_dir` its folder or one of its snapshots: hf_timeline).
    KeptStepError for any other folder."""
    repo = _hf_repo(run_dir)
    return hf_timeline(repo) if repo is not None else kept_steps(run_dir)


def grad_norm_scrub(run_dir: str | Path, layers=None) -> Scrub:
    """The gradient norm of each block (before clipping) at every step the trainer logged (metrics.json's
    grad_norm.blocks.L): a per-layer Scrub whose steps are the logged steps. ValueError when the run
    logged none."""
    from ..core.training.timeline import METRICS_JSON, read_history

    run_dir = Path(run_dir)
    timeline = kept_steps(run_dir)
    history, unread = read_history(run_dir)
    if unread:
        raise ValueError(unread)
    first_block = ("grad_norm.blocks.0", "grad_norm.encoder.blocks.0")  # an encoder-decoder logs each stack's
    logged = [ev for ev in (history if isinstance(history, list) else []) if isinstance(ev, dict)
              and ev.get("event") == "step" and any(isinstance(ev.get(k), (int, float)) for k in first_block)]
    if not logged:
        raise ValueError(f"{run_dir / METRICS_JSON}: no gradient norm per block was logged")
    found = [(m[1] or "", int(m[2])) for k in logged[0] if (m := _GRAD_KEY.match(k))]
    stacks = sorted({s for s, _ in found}, key=lambda s: ("", "encoder", "decoder").index(s))
    depth = {s: 1 + max(l for t, l in found if t == s) for s in stacks}
    layers = _check_layers(layers, max(depth.values()))
    rows = [(s, l) for s in stacks for l in layers if l < depth[s]]
    values = np.array([[[float(ev.get(f"grad_norm.{_block(s or None, l)}", np.nan))] for s, l in rows]
                       for ev in logged])
    seq2seq = stacks != [""]
    return Scrub(run_dir, GRAD_NORM, [int(ev["step"]) for ev in logged], values, timeline, None, 0,
                 [l for _, l in rows], stacks=[s for s, _ in rows] if seq2seq else None)


_GRAD_KEY = re.compile(r"^grad_norm\.(?:(encoder|decoder)\.)?blocks\.(\d+)$")


def scrub(run_dir: str | Path, metric: str, sequences: int = 32, seed: int = 0, device: str = "cpu",
          control=None, on_step: Callable[[int, int, int], None] | None = None, layers=None,
          text: str | None = None) -> Scrub:
    """`metric` (METRICS) of every layer and head at each step of the run whose folder is there, on the same
    sequences (probe_sequences of the run's first model; for TEXT_METRICS `text`, when given, encoded by the
    first step's tokenizer); `layers` (per-layer metrics): the layers to measure (default all); `on_step(i,
    n, step)` after each, `control` (a core.jobs.JobControl) checked between steps. ValueError when the run
    has no step to open, or a layer or the text does not fit."""
    from ..core.checkpoints import load_model_folder
    from ..core.inputs import encode_text_or_ids

    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r} (known: {', '.join(METRICS)})")
    if text is not None and metric not in TEXT_METRICS:
        raise ValueError(f"a text of one's own is measured by {', '.join(TEXT_METRICS)} only, not {metric}")
    if metric == GRAD_NORM:
        return grad_norm_scrub(run_dir, layers)
    run_dir = Path(run_dir)
    timeline = timeline_at(run_dir)
    steps = timeline.openable()
    if not steps:
        raise ValueError(f"{run_dir}: no kept step is there any more (deleted: "
                         f"{describe_steps([k.step for k in timeline.missing()])})")
    run_cfg = _run_config(run_dir)
    ids = period = start = lengths = None
    values = []
    rows: list[tuple[str | None, int]] = []  # the (stack, layer) of each per-layer value
    for i, k in enumerate(steps):
        if control is not None:
            control.check()
        loaded = load_model_folder(k.path, device=device)
        loaded.model.eval()
        if i == 0:
            every = stack_layers(loaded.config)
            if metric in (LOGIT_LENS, LOGIT_LENS_RANK):  # only the decoder's layers read into the logits
                every = [row for row in every if row[0] != "encoder"]
            if metric not in HEAD_SCORES:
                layers = _check_layers(layers, 1 + max(l for _, l in every))
                rows = [row for row in every if row[1] in layers]
            else:
                rows = every
        if ids is None and metric in TEXT_METRICS and text is not None:
            ids = torch.tensor(encode_text_or_ids(loaded, text).ids)[None]
            if ids.shape[1] < 2:
                raise ValueError(f"the text is {ids.shape[1]} token long: {metric} needs 2 tokens at least")
            start = np.zeros(1, dtype=int)
        elif ids is None and metric != WEIGHT_NORM:
            ids, period, start, lengths = probe_sequences(loaded.config, run_cfg, sequences, seed)
        if metric == WEIGHT_NORM:
            values.append(block_norms(loaded.model, rows)[:, None])
        elif metric == LIPSCHITZ:
            if text is not None:  # windows of the text (window_starts spreads them over it)
                n = min(ids.shape[1], LIPSCHITZ_WINDOW, loaded.config.context_length)
                flat = ids[0]
                starts = sorted({int(round(x)) for x in np.linspace(0, len(flat) - n, LIPSCHITZ_SEQUENCES)})
                windows = torch.stack([flat[s:s + n] for s in starts])
            else:
                windows = ids[:LIPSCHITZ_SEQUENCES]
            values.append(lipschitz_per_layer(loaded.model, windows, rows if rows[0][0] else [l for _, l in rows],
                                              seed, control)[:, None])
        elif metric in (LOGIT_LENS, LOGIT_LENS_RANK):
            prob, rank = logit_lens_of_next(loaded.model, ids, start)
            values.append((prob if metric == LOGIT_LENS else rank)[[l for _, l in rows], None])
        else:
            values.append(head_scores(loaded.model, ids, metric, period, start))
        if on_step is not None:
            on_step(i + 1, len(steps), k.step)
    n_seq = 0 if metric == WEIGHT_NORM else (1 if text is not None else
                                             min(sequences, LIPSCHITZ_SEQUENCES) if metric == LIPSCHITZ else sequences)
    seq2seq = rows[0][0] is not None
    return Scrub(run_dir, metric, [k.step for k in steps], np.stack(values), timeline, lengths, n_seq,
                 None if metric in HEAD_SCORES else [l for _, l in rows], text,
                 stacks=[stack for stack, _ in rows] if seq2seq else None)


# -- the GUI's timeline ---------------------------------------------------------------------------


def run_of(path: str | Path | None) -> tuple[Path, int | None] | None:
    """(run folder, step) when `path` is a training run folder (step None: its own checkpoint's) or a kept
    step's folder inside one (RUN/checkpoints/step-NNNNNN: that step); (its repository folder, None) for a
    Hugging Face cache snapshot (timeline_of then looks for step revisions); None for any other folder. Only
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


def check_step_path(path: str | Path) -> None:
    """KeptStepError (one line) when `path` is a run's kept step (RUN/checkpoints/step-N) whose folder is a
    link leading out of the run: opened by its path (the last session, Recent), it is refused as --step is."""
    from ..core.training.timeline import kept_step_at

    run = run_of(path)
    if run is not None and run[1] is not None:
        k = kept_step_at(run[0], Path(path))
        if k.refused:
            raise KeptStepError(path, k.refused)


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
