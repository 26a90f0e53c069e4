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
"""
from __future__ import annotations

from dataclasses import dataclass


def open_dictionary(folder, loaded, hook: str | None = None):
    """The dictionary in `folder` attached to the loaded model (core.features.attach)."""
    from ..core.features import attach, load_dictionary

    d = load_dictionary(folder, hook=hook)
    d.to(loaded.model.device)
    return attach(d, loaded.config)


def features_on(loaded, ids, attached, interventions=None):
    from ..core.features import feature_activations

    return feature_activations(loaded.model, ids, list(attached), interventions=interventions)


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
