"""Sparse features for the front ends: open a dictionary for the loaded model, read its features on a
text, a feature's dashboard, feature edits, training. The science is core.features (its docstring lists
the API); here is what a panel or a command does with it, once for both.

    attached = open_dictionary(folder, loaded, hook=None)   load + attach; ValueError in one line
    runs = features_on(loaded, ids, [attached, ...], interventions=None)
    lens = feature_lens(run, n=5)        per token: [(feature, activation)], l0, error norm, variance explained
    tc = dashboard(loaded, attached, path, feature, top=20, window=None, job=None)   top contexts + histogram
    up, down = decoder_tokens(loaded, attached, feature, n=10)   [(token text, weight)]
    iv = feature_edit_from(attached, feature, how, value, positions=None)   an Intervention, like an ablation
    fa = attribute_features(loaded, ids, attached, position, token_id, interventions=None)

For the GUI's Features panel (edits resolved as every panel resolves them):
    dictionary_folder_of(path)            a dropped path's dictionary folder, or None (a model folder)
    lens_on(loaded, ids, attached, interventions, n)   [(run, [TokenFeatures])] per dictionary, one forward
    attribute_next_token(loaded, ids, attached, interventions)   (FeatureAttribution, top next token)
    cached_dashboard(loaded, attached, path, feature, ..., job=)   (TopContexts, from_cache): cached on disk

For the Train panel's dictionary mode (the CLI's `train --task sae` is commands.features.run_train_sae):
    dictionary_problems(loaded, cfg)      why a SaeTrainConfig cannot train on the loaded model ([] when it can)
    train_dictionary(loaded, cfg, out_dir, on_event=None, control=dictionary_control(), job=None, resume=False)
                                          into a new folder, or on from a stopped run's (a worker); the summary
    resumed_dictionary_config(folder)     a stopped dictionary run's own settings (SaeTrainConfig), or None
    dictionary_resume_problems(loaded, cfg, folder)   why `cfg` cannot go on from that run ([] when it can)
    dictionary_settings_from_dict(data)   a workspace's saved dictionary settings (SaeTrainConfig), read tolerantly
"""
from __future__ import annotations

from dataclasses import dataclass


def open_dictionary(folder, loaded, hook: str | None = None):
    """The dictionary in `folder` attached to the loaded model (core.features.attach)."""
    from ..core.features import attach, load_dictionary

    d = load_dictionary(folder, hook=hook)
    d.to(loaded.model.device)
    return attach(d, loaded.config)


def features_on(loaded, ids, attached, interventions=None, decoder_ids=None, job=None):
    """Each attached dictionary's FeatureActivations on `ids` (an encoder-decoder's source; `decoder_ids` its
    decoder's input, [start] + the target, read by decoder hooks). `job`: "layer k / L" and cancel."""
    from ..core.features import feature_activations

    return feature_activations(loaded.model, ids, list(attached), interventions=interventions,
                               decoder_ids=decoder_ids, job=job)


@dataclass
class TokenFeatures:
    position: int
    top: list[tuple[int, float]]
    l0: int
    error_norm: float
    variance_explained: float


def feature_lens(run, n: int = 5) -> list[TokenFeatures]:
    """Per token of a FeatureActivations: its `n` top features, L0, error norm and variance explained."""
    l0, err, fve = run.l0.tolist(), run.error_norm.tolist(), run.token_variance_explained.tolist()
    return [TokenFeatures(t, run.top(t, n), int(l0[t]), float(err[t]), float(fve[t])) for t in range(len(l0))]


def dashboard(loaded, attached, path, feature: int, top: int = 20, window: int | None = None, job=None,
              interventions=None):
    from ..core.features import top_contexts

    return top_contexts(loaded, attached, path, feature, top=top, window=window, job=job,
                        interventions=interventions)


def decoder_tokens(loaded, attached, feature: int, n: int = 10):
    """The tokens the feature's decoder direction promotes and suppresses, as (text, weight) lists."""
    from ..core.features import decoder_logits

    up, down = decoder_logits(loaded.model, attached.dictionary, feature, n)
    tok = loaded.tokenizer
    name = (lambda i: tok.decode([i])) if tok is not None else str
    return [(name(i), w) for i, w in up], [(name(i), w) for i, w in down]


def feature_edit_from(attached, feature: int, how: str, value: float = 0.0, positions=None):
    from ..core.features import FeatureOp, feature_edit

    return feature_edit(attached, [FeatureOp(int(feature), how, float(value))], positions)


def attribute_features(loaded, ids, attached, position: int, token_id: int, interventions=None):
    from ..core.features import feature_attribution

    return feature_attribution(loaded, ids, attached, position, token_id, interventions=interventions)


# -- what the Features panel asks for (GUI; Qt-free) ---------------------------------------------

DICTIONARY_WEIGHTS = ("sae_weights.safetensors", "params.safetensors", "params.npz")


def dictionary_folder_of(path) -> str | None:
    """The dictionary folder a path names (the folder itself, or the folder of a file in it, as a drop
    hands over), None when it holds no dictionary's weights (SAELens' sae_weights.safetensors, Gemma
    Scope's params.safetensors / params.npz). A model folder (model.safetensors) is not one."""
    from pathlib import Path

    path = Path(path)
    folder = path if path.is_dir() else path.parent if path.is_file() else None
    if folder is None or not any((folder / name).is_file() for name in DICTIONARY_WEIGHTS):
        return None
    return str(folder)


def lens_on(loaded, ids, attached, interventions=None, n: int = 5, decoder_ids=None, job=None):
    """The feature lens of `ids` at every attached dictionary, on the edited model: [(FeatureActivations,
    [TokenFeatures])], one per dictionary, in one forward. An encoder-decoder's `ids` are its source and
    `decoder_ids` ([start] + the Model panel's target) its decoder's input: an encoder hook's rows are the
    source's tokens, a decoder hook's the decoder input's. `job` (core.jobs.JobControl): the forward's "layer
    k / L" and its cancel, between blocks."""
    from .tracing import _resolved

    if not ids:
        raise ValueError("no text: type a text in the Model panel")
    decoder_ids = None if decoder_ids is None else list(decoder_ids)
    edits = _resolved(loaded, list(ids), interventions, decoder_ids)
    runs = features_on(loaded, ids, attached, interventions=edits, decoder_ids=decoder_ids, job=job)
    return [(run, feature_lens(run, n)) for run in runs]


def attribute_next_token(loaded, ids, attached, interventions=None, position: int = -1):
    """(FeatureAttribution, token id): the direct attribution of the edited model's top next token at
    `position` (default the last) to `attached`'s active features, bias, skip and error terms."""
    import torch

    from .tracing import _resolved

    from ..core.features.edits import check_seq2seq_attribution

    if not ids:
        raise ValueError("no text: type a text in the Model panel")
    check_seq2seq_attribution(loaded.config)
    ivs = _resolved(loaded, list(ids), interventions)
    T = len(ids)
    if not -T <= position < T:
        raise ValueError(f"position {position} is outside the text (0..{T - 1})")
    with torch.no_grad():
        logits = loaded.model(torch.tensor([list(ids)], device=loaded.model.device), interventions=ivs).logits
    token = int(logits[0, position].argmax())
    return attribute_features(loaded, ids, attached, position, token, interventions=ivs), token


# -- dashboards cached on disk ------------------------------------------------------------------
#
# One folder per (model, dictionary, text file, feature, settings) under the user's data folder:
#   <data>/feature-dashboards/<key>/dashboard.json   (+ the app's manifest, core.files.atomic_write_dir)
# <key> is a hash of what the result depends on: the model's and the dictionary's files (names, sizes,
# modification times), the compute dtype and special-token setting, the text file (path, size, time),
# the feature and the settings. A changed file makes a new key; old entries are pruned oldest first
# beyond MAX_CACHED_DASHBOARDS, and only folders that are the app's own (is_own_folder) are removed.

DASHBOARD_CACHE = "feature-dashboards"
DASHBOARD_FILE = "dashboard.json"
MAX_CACHED_DASHBOARDS = 200
_KEY_LENGTH = 32


def dashboard_cache_dir():
    from ..paths import user_data_dir

    return user_data_dir() / DASHBOARD_CACHE


def _files_of(folder) -> list:
    from pathlib import Path

    folder = Path(folder)
    out = []
    for p in sorted(folder.iterdir()) if folder.is_dir() else []:
        if p.is_file():
            st = p.stat()
            out.append([p.name, st.st_size, st.st_mtime_ns])
    return out


def dashboard_key(loaded, attached, path, feature: int, top: int, window: int | None) -> str | None:
    """The cache key of a dashboard (see above); None when the model or dictionary has no folder."""
    import hashlib
    import json
    from pathlib import Path

    d = attached.dictionary
    if loaded.path is None or not d.path:
        return None
    text = Path(path).resolve()
    st = text.stat()
    what = {"model": [str(Path(loaded.path).resolve()), _files_of(loaded.path)],
            "dtype": str(loaded.model.dtype),
            "special_tokens": getattr(loaded.tokenizer, "special_tokens", None),
            "dictionary": [str(Path(d.path).resolve()), _files_of(d.path), d.hook, d.hook_out],
            "points": [attached.read.name, attached.write.name],
            "text": [str(text), st.st_size, st.st_mtime_ns],
            "feature": int(feature), "top": int(top), "window": window}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode("utf-8")).hexdigest()[:_KEY_LENGTH]


def _dashboard_to_json(tc, key: str) -> str:
    import json

    counts, edges = tc.histogram
    return json.dumps({"key": key, "feature": tc.feature, "tokens_seen": tc.tokens_seen,
                       "active_tokens": tc.active_tokens, "rows": [list(r) for r in tc.rows],
                       "counts": [int(c) for c in counts], "edges": [float(e) for e in edges]})


def _dashboard_from_json(text: str, key: str):
    import json

    import numpy as np

    from ..core.features import TopContexts

    data = json.loads(text)
    if not isinstance(data, dict) or data.get("key") != key:
        raise ValueError("not this dashboard")
    rows = [(int(r[0]), float(r[1]), int(r[2]), str(r[3]), str(r[4]), str(r[5])) for r in data["rows"]]
    return TopContexts(int(data["feature"]), int(data["tokens_seen"]), int(data["active_tokens"]), rows,
                       (np.asarray(data["counts"], dtype=np.int64), np.asarray(data["edges"], dtype=np.float64)))


def cached_dashboard(loaded, attached, path, feature: int, top: int = 20, window: int | None = None,
                     cache_dir=None, job=None, interventions=None, ids=()):
    """(TopContexts, from_cache): the feature's dashboard over the file `path`, read from the cache when
    it was computed before for the same model, dictionary, file and settings, else computed (`job`:
    progress and cancel) and cached. With what-if edits it is computed for the edited model and not
    cached (a "mean" edit is the mean over `ids`, the text shown, as in every panel). A cache that
    cannot be read or written is not an error: the dashboard is computed."""
    from pathlib import Path

    from ..core.files import atomic_write_dir, is_own_folder

    try:
        key = None if interventions else dashboard_key(loaded, attached, path, feature, top, window)
    except OSError:  # a file that cannot be read: the dashboard below says so, naming it
        key = None
    root = Path(cache_dir) if cache_dir is not None else dashboard_cache_dir()
    entry = root / key if key is not None else None
    if entry is not None and is_own_folder(entry):
        try:
            return _dashboard_from_json((entry / DASHBOARD_FILE).read_text(encoding="utf-8"), key), True
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            pass  # unreadable: computed again and written over (the folder is the app's own)
    from .tracing import _resolved

    tc = dashboard(loaded, attached, path, feature, top=top, window=window, job=job,
                   interventions=_resolved(loaded, list(ids) or [0], interventions))
    if entry is not None:
        try:
            atomic_write_dir(entry, lambda tmp: (tmp / DASHBOARD_FILE).write_text(_dashboard_to_json(tc, key),
                                                                                 encoding="utf-8"))
            prune_dashboard_cache(root)
        except (OSError, ValueError):
            pass
    return tc, False


def prune_dashboard_cache(root, keep: int = MAX_CACHED_DASHBOARDS) -> list:
    """Remove the oldest cached dashboards beyond `keep`: only folders named like a key that are the
    app's own (their manifest lists everything in them). Returns the folders removed."""
    import re
    from pathlib import Path

    from ..core.files import discard, is_own_folder

    root = Path(root)
    pattern = re.compile(f"[0-9a-f]{{{_KEY_LENGTH}}}")
    try:
        entries = [p for p in root.iterdir() if pattern.fullmatch(p.name) and is_own_folder(p)]
    except OSError:
        return []
    entries.sort(key=lambda p: p.stat().st_mtime_ns, reverse=True)
    removed = []
    for p in entries[keep:]:
        try:
            discard(p, p.name)
            removed.append(p)
        except OSError:
            pass
    return removed


# -- training a dictionary from the Train panel ----------------------------------------------------------


def dictionary_problems(loaded, cfg) -> list[str]:
    """What stops `cfg` (core.training.sae.SaeTrainConfig) from training on `loaded` ([] when nothing does):
    each one line, checked cheaply (the text itself is read by the run, which says what is wrong with it)."""
    from pathlib import Path

    from ..core.features.hooks import hook_point

    if loaded is None:
        return ["Open a model first: a dictionary is trained on its activations."]
    if getattr(loaded.config, "input_kind", "tokens") == "patches":
        return [f"Sparse dictionaries read text models; {loaded.name} reads images."]
    problems = []
    problem = cfg.problem()
    if problem:
        problems.append(problem[:1].upper() + problem[1:] + ".")
    if cfg.layered:  # transcoders for attribution graphs: the model must be one `graph` handles
        from ..core.graphs import graph_problem

        problem = graph_problem(loaded.config)
        if problem:
            problems.append(f"Transcoders here are for attribution graphs: {problem}.")
    for hook in ((cfg.hook, cfg.hook_out) if not cfg.layered else ()):
        if hook:
            try:
                point = hook_point(hook, loaded.config)
            except ValueError as exc:
                problems.append(str(exc))
                continue
            if point.stack == "decoder":
                problems.append(f"Hook {hook} reads the decoder, whose input is a target: a dictionary trains on "
                                "a text file read as the encoder's source; choose an encoder hook "
                                "(encoder.blocks.L.*).")
    if not cfg.text_file:
        problems.append("Choose a text file: the dictionary learns the model's activations on it.")
    elif not Path(cfg.text_file).expanduser().is_file():
        problems.append(f"{cfg.text_file}: no such file.")
    return problems


def train_dictionary(loaded, cfg, out_dir, on_event=None, control=None, job=None,
                     resume: bool = False) -> dict:
    """Train a dictionary (core.training.sae.train_sae) on the loaded model's activations into `out_dir`, a new
    or empty folder (refused otherwise, before any work), or with `resume` on from the checkpoint a stopped run
    left there (its own folder only: check_output_folder, then train_sae's refusals), saved in SAELens' format
    with its training state. `control` (dictionary_control()) pauses and stops it; `job` (a worker's JobControl)
    stops it too (the application closing). Returns the held-out summary (step, mse, l0, variance_explained, dead)."""
    from ..core.files import check_output_folder
    from ..core.training.sae import SAE_STATE_FILE, train_sae

    check_output_folder(out_dir, resume=resume, marker=SAE_STATE_FILE, what="dictionary")
    if control is not None:
        control.job = job
    summary, _ = train_sae(cfg, loaded, out_dir, on_event=on_event, control=control or job, resume=resume)
    return summary


def resumed_dictionary_config(folder):
    """The settings (core.training.sae.SaeTrainConfig) a stopped dictionary run in `folder` was trained with,
    what resuming it goes on with; None when the folder holds no readable dictionary checkpoint."""
    from ..core.training.sae import resumed_sae_config

    try:
        return resumed_sae_config(folder, {}, set())[1]
    except (ValueError, OSError):
        return None


_read_checkpoint_memo: list = []  # [(key, (state, tensors) | None | ValueError)]: the form checks on every key


def _read_checkpoint(folder):
    """read_sae_checkpoint(folder), read again only when its files change (the form checks on every keystroke)."""
    import os

    from ..core.training.sae import SAE_STATE_FILE, SAE_STATE_TENSORS, read_sae_checkpoint

    def stamp(p):
        try:
            st = os.stat(p)
            return st.st_mtime_ns, st.st_size
        except OSError:
            return None

    key = (str(folder), stamp(folder / SAE_STATE_FILE), stamp(folder / SAE_STATE_TENSORS))
    if _read_checkpoint_memo and _read_checkpoint_memo[0][0] == key:
        read = _read_checkpoint_memo[0][1]
    else:
        try:
            read = read_sae_checkpoint(folder)
        except ValueError as exc:
            read = exc
        _read_checkpoint_memo[:] = [(key, read)]
    if isinstance(read, ValueError):
        raise read
    return read


def dictionary_resume_problems(loaded, cfg, folder) -> list[str]:
    """Why `cfg` cannot go on from the dictionary run in `folder` on `loaded` ([] when it can), each one line
    naming the folder, as `train --task sae --resume` refuses it: no folder, a model's run, no checkpoint, a
    damaged one, another text, hook or shape than the run's, another model, no steps left."""
    from pathlib import Path

    from ..core.training import checkpoint_step
    from ..core.training.sae import sae_resume_problem

    if not str(folder).strip():
        return ["Choose the dictionary run folder to resume."]
    folder = Path(str(folder).strip()).expanduser().absolute()
    if not folder.is_dir():
        return [f"{folder}: no such folder, so no dictionary checkpoint to resume from."]
    try:
        read = _read_checkpoint(folder)
    except ValueError as exc:
        return [str(exc)]
    if read is None:
        if checkpoint_step(folder) is not None:
            return [f"{folder}: a model's training run, not a dictionary's; resume it with Train: a model."]
        return [f"{folder}: no dictionary checkpoint to resume from."]
    if loaded is None:
        return []  # dictionary_problems says it
    problem = sae_resume_problem(folder, read[0], read[1], cfg, loaded)
    return [problem] if problem else []


def dictionary_settings_from_dict(data):
    """The dictionary settings (SaeTrainConfig) a workspace saved: each setting of the right kind kept, the others
    (an older or newer app, a hand edit) at their defaults; the form's boxes hold each within its range."""
    from dataclasses import fields

    from ..core.training.sae import SaeTrainConfig

    cfg = SaeTrainConfig(text_file="")
    if not isinstance(data, dict):
        return cfg
    for f in fields(cfg):
        if f.name not in data:
            continue
        value, default = data[f.name], getattr(cfg, f.name)
        if f.name == "hook_out":
            ok = value is None or isinstance(value, str)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        else:
            ok = isinstance(value, str)
        if ok:
            setattr(cfg, f.name, value)
    return cfg


def dictionary_control():
    """A TrainControl for a dictionary run in a worker (pause / resume / stop) that also stops once the
    worker's own job is cancelled (the window closing), paused or not: pass it as train_dictionary's `control`."""
    from ..core.training import TrainControl

    class DictionaryControl(TrainControl):
        job = None  # the worker's JobControl (train_dictionary sets it)

        def check(self) -> None:
            if self.job is not None and self.job.cancelled:
                self.cancel()
            super().check()

    return DictionaryControl()
