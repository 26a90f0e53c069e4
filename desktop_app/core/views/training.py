"""The Train panel's form as data (no Qt): its view state is the TrainConfig the form describes.

A workspace saves TrainConfig.to_dict() and the panel shows it again with set_config, the code that
fills the form from a resumed run's settings. `config_from_dict` reads a workspace's dict tolerantly:
unknown settings (a newer app) are dropped, and a setting of the wrong kind (a hand edit) keeps its
default, so any file opens.
"""
from __future__ import annotations

import json
import math

from ..training.trainer import TrainConfig

# what the form's controls take from the nested settings: anything else there is dropped
_MODEL_KINDS = {"n_layers": int, "n_heads": int, "d_model": int, "d_ff": int, "context_length": int, "dropout": float,
                "norm_placement": str, "norm": str, "activation": str, "positions": str, "attention_kind": str,
                "init": str}
_TASK_OPTION_KINDS = {"length": int, "symbols": int, "p": int, "vocab_size": int, "n_train": int,
                      "train_fraction": float, "tokenizer": str, "text_file": str}


def _of_kind(value, kind) -> bool:
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, kind)


def _known(d, kinds: dict) -> dict:
    return {k: v for k, v in d.items() if k in kinds and _of_kind(v, kinds[k])} if isinstance(d, dict) else {}


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
