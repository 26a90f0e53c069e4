"""A training run's own state, read back with every field checked before a resumed run uses it.

trainer_state.json (format, step, elapsed seconds, the optimiser's hyper-parameters and scalars, the
float16 loss scale), optimizer.safetensors (the optimiser's tensors and the RNG states) and metrics.json
(the metric history) are the app's own files, but a run folder is the user's: edited, truncated or
copied from a newer version, each problem is one ModelLoadError naming the file and the field
("RUN/trainer_state.json: 'step' must be an integer from 0 to 1,000,000,000, got 2.5"), never a
traceback or a wrong "no checkpoint". The trainer and every other reader of these files read them here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load

from ..files import MAX_JSON_BYTES, METRICS_MAX_BYTES, JsonFileError, read_json
from ..numbers import MAX_COUNT
from ..weights import ModelLoadError

STATE_FILE = "trainer_state.json"
OPTIM_FILE = "optimizer.safetensors"
METRICS_JSON = "metrics.json"
FORMAT = 1  # trainer_state.json's format, written by this version


@dataclass
class TrainerState:
    step: int
    elapsed: float
    optimizer: dict[str, Any]  # {"param_groups": [...], "scalars": {...}}: optim.optimizer_state_from_tensors
    scaler: dict[str, Any] | None = None  # the float16 GradScaler's state, None when not saved


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _json(path: Path, max_bytes: int | None = MAX_JSON_BYTES) -> Any:
    if path.is_dir():
        raise ModelLoadError(path, "is a folder, not a file")
    if not path.exists():
        raise ModelLoadError(path, "is missing; the checkpoint is incomplete")
    try:
        return read_json(path, max_bytes=max_bytes)
    except JsonFileError as exc:
        raise ModelLoadError(path, exc.problem) from None


def read_step(folder: str | Path) -> int:
    """The step of trainer_state.json in a checkpoint folder, its format and step checked (not the rest:
    whether there is a checkpoint, and where, is all some callers ask)."""
    return _checked_step(Path(folder) / STATE_FILE)[1]


def _checked_step(path: Path) -> tuple[dict, int]:
    d = _json(path)

    def bad(problem: str) -> ModelLoadError:
        return ModelLoadError(path, problem)

    if not isinstance(d, dict):
        raise bad(f"expected a JSON object, got {type(d).__name__}")
    fmt = d.get("format", FORMAT)  # checkpoints written before the field are format 1
    if not _is_int(fmt) or fmt < 1:
        raise bad(f"'format' must be a positive integer, got {fmt!r}")
    if fmt > FORMAT:
        raise bad(f"'format' is {fmt}: written by a newer version of the app (this one reads format {FORMAT})")
    if "step" not in d:
        raise bad("no 'step': the checkpoint's step is unknown")
    step = d["step"]
    if not _is_int(step) or not 0 <= step <= MAX_COUNT:
        raise bad(f"'step' must be an integer from 0 to {MAX_COUNT:,}, got {step!r}")
    return d, step


def read_trainer_state(folder: str | Path) -> TrainerState:
    """trainer_state.json of a checkpoint folder, every field checked (ModelLoadError naming the field)."""
    path = Path(folder) / STATE_FILE
    d, step = _checked_step(path)

    def bad(problem: str) -> ModelLoadError:
        return ModelLoadError(path, problem)

    elapsed = d.get("elapsed", 0.0)
    if not _is_real(elapsed) or elapsed < 0:
        raise bad(f"'elapsed' must be a non-negative number of seconds, got {elapsed!r}")
    opt = d.get("optimizer")
    if not isinstance(opt, dict):
        raise bad("no 'optimizer' object (the optimiser's hyper-parameters)" if opt is None else
                  f"'optimizer' must be an object, got {type(opt).__name__}")
    groups = opt.get("param_groups")
    if not isinstance(groups, list) or not groups:
        raise bad(f"'optimizer.param_groups' must be a non-empty list, got {groups!r:.60}")
    for i, g in enumerate(groups):
        where = f"'optimizer.param_groups[{i}]"
        if not isinstance(g, dict):
            raise bad(f"{where}' must be an object, got {g!r:.60}")
        params = g.get("params")
        if not isinstance(params, list) or not all(_is_int(p) and p >= 0 for p in params):
            raise bad(f"{where}.params' must be a list of parameter indices, got {params!r:.60}")
        if "lr" in g and not isinstance(g["lr"], (int, float)):  # NaN is harmless: the schedule sets lr each step
            raise bad(f"{where}.lr' must be a number, got {g['lr']!r:.60}")
        if "betas" in g and not (isinstance(g["betas"], list) and len(g["betas"]) == 2
                                 and all(_is_real(b) for b in g["betas"])):
            raise bad(f"{where}.betas' must be two numbers, got {g['betas']!r:.60}")
    scalars = opt.get("scalars", {})
    if not isinstance(scalars, dict) or not all(isinstance(v, dict) and k.isdigit() for k, v in scalars.items()):
        raise bad("'optimizer.scalars' must map parameter indices to objects")
    scaler = d.get("scaler")
    if scaler is not None and not isinstance(scaler, dict):
        raise bad(f"'scaler' must be an object or null, got {scaler!r:.60}")
    return TrainerState(step=step, elapsed=float(elapsed), optimizer=opt, scaler=scaler or None)


def read_optimizer_tensors(folder: str | Path) -> dict[str, torch.Tensor]:
    """optimizer.safetensors of a checkpoint folder: the optimiser's tensors and the RNG states."""
    path = Path(folder) / OPTIM_FILE
    if path.is_dir():
        raise ModelLoadError(path, "is a folder, not a file")
    try:
        tensors = st_load(path.read_bytes())
    except FileNotFoundError:
        raise ModelLoadError(path, "is missing; the checkpoint is incomplete") from None
    except OSError as exc:
        raise ModelLoadError(path, f"cannot be read ({exc.strerror or exc})") from None
    except (SafetensorError, ValueError) as exc:
        raise ModelLoadError(path, f"corrupt or truncated safetensors file ({exc})") from None
    for name in ("rng.batches", "rng.torch"):
        if name not in tensors:
            raise ModelLoadError(path, f"no tensor {name!r} (the random state a resumed run goes on from)")
    for name in tensors:
        parts = name.split(".", 2)
        if not name.startswith("rng.") and (len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit()):
            raise ModelLoadError(path, f"unexpected tensor {name!r} (expected state.INDEX.NAME or rng.*)")
    return tensors


def read_metrics(folder: str | Path) -> list[dict[str, Any]]:
    """metrics.json of a checkpoint folder: the run's history, a list of event objects."""
    path = Path(folder) / METRICS_JSON
    history = _json(path, METRICS_MAX_BYTES)
    if not isinstance(history, list):
        raise ModelLoadError(path, f"expected a JSON list of events, got {type(history).__name__}")
    for i, ev in enumerate(history):
        if not isinstance(ev, dict):
            raise ModelLoadError(path, f"entry {i} must be an object, got {ev!r:.60}")
    return history
