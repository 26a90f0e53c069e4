"""The Train panel's form as data (no Qt): its view state is the TrainConfig the form describes.

A workspace saves TrainConfig.to_dict() (every training option, core.training.options) and the panel
shows it again with set_config, the code that fills the form from a resumed run's settings.
`config_from_dict` reads a workspace's dict tolerantly: unknown settings (a newer app) are dropped, and
a setting of the wrong kind or out of its range (a hand edit) keeps its default, so any file opens.
"""
from __future__ import annotations

import json
import math

from ..training.options import MODEL_OPTIONS, OPTION, TASK_OPTIONS
from ..training.trainer import TrainConfig

# what the form takes from the nested settings: the declared options (core.training.options), by kind
_MODEL_KINDS = {o.key: o.kind for o in MODEL_OPTIONS}
_TASK_OPTION_KINDS = {o.key: o.kind for o in TASK_OPTIONS}


def _of_kind(value, kind) -> bool:
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, kind)


def _known(d, kinds: dict) -> dict:
    if not isinstance(d, dict):
        return {}
    return {k: v for k, v in d.items() if k in kinds and _of_kind(v, kinds[k]) and not OPTION[k].problem(v)}


def config_from_dict(data) -> TrainConfig:
    """The TrainConfig a workspace saved, each setting checked on its own by TrainConfig.from_json."""
    good: dict = {}
    if not isinstance(data, dict):
        return TrainConfig()
    known = set(TrainConfig().to_dict())
    for key, value in data.items():
        if key not in known:
            continue
        if key == "model":
            value = _known(value, _MODEL_KINDS)
        elif key == "task_options":
            value = _known(value, _TASK_OPTION_KINDS)
        try:
            TrainConfig.from_json(json.dumps({**good, key: value}))
        except (ValueError, TypeError):
            continue  # the wrong kind of value: this setting keeps its default
        good[key] = value
    return TrainConfig.from_json(json.dumps(good))


def _percent(x) -> str:
    return f"{100 * x:.1f}%"


def end_of_run_line(ev: dict, events: list[dict]) -> str:
    """The Train panel's line when a run ends ("done" or "stopped" event `ev`), saying which numbers are
    which and at which step: the training loss and accuracy are those of the last logged training
    batches, the validation ones those of the last evaluation, which may be steps earlier, e.g.
    "Stopped at step 1200: training loss 0.4100, accuracy 91.0% (batches up to step 1195); validation
    loss 0.3500, accuracy 93.1% (evaluation at step 1000)". `events` are the run's events so far; a resumed
    run's numbers from before this session (in `ev` only) are said to be from the run's history."""
    end = "Finished" if ev["event"] == "done" else "Stopped"
    parts = []
    last_step = next((e for e in reversed(events) if e.get("event") == "step"), None)
    last_eval = next((e for e in reversed(events) if e.get("event") == "eval"), None)
    if last_step is not None:
        acc = last_step.get("train_accuracy")
        parts.append(f"training loss {last_step['train_loss']:.4f}"
                     + (f", accuracy {_percent(acc)}" if acc is not None else "")
                     + f" (batches up to step {last_step['step']})")
    elif ev.get("train_loss") is not None:
        parts.append(f"training loss {ev['train_loss']:.4f} (from the run's history)")
    if last_eval is not None:
        exact = last_eval.get("val_exact_match")  # an encoder-decoder's: whole held-out targets written right
        parts.append(f"validation loss {last_eval['val_loss']:.4f}, accuracy {_percent(last_eval['val_accuracy'])}"
                     + (f", exact match {_percent(exact)}" if exact is not None else "")
                     + f" (evaluation at step {last_eval['step']})")
    elif ev.get("val_accuracy") is not None:
        loss = f"validation loss {ev['val_loss']:.4f}, " if ev.get("val_loss") is not None else "validation "
        parts.append(f"{loss}accuracy {_percent(ev['val_accuracy'])} (last evaluation, from the run's history)")
    elif ev["event"] == "stopped":
        parts.append("no evaluation yet")
    return f"{end} at step {ev['step']}" + (": " + "; ".join(parts) if parts else "") + "."
