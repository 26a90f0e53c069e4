"""Sparse features: sparse dictionaries (SAEs, transcoders) opened, attached to a model, edited, trained.

The API a panel or a command uses (all Qt-free; tensors float32 on the CPU unless moved):

Open and attach
    d = load_dictionary(folder, hook=None)   SparseDictionary from SAELens' folder (cfg.json +
                                             sae_weights.safetensors) or Gemma Scope's params.safetensors /
                                             params.npz; DictionaryError (a ValueError) names the file and
                                             the problem in one line (missing keys, shapes, non-finite values)
    a = attach(d, loaded.config)             Attached: d checked against the model; a.read / a.write are
                                             HookPoints (app trace names: TransformerLens names such as
                                             blocks.2.hook_resid_post map onto them, see features.hooks)
    d.encode(x), d.decode(acts), d.reconstruct(x)   SAELens' formulas (features.dictionary)
    save_dictionary(d, folder)               SAELens' format, atomically

Read features on a text (one forward; several dictionaries at once)
    runs = feature_activations(model, ids, [a, ...], interventions=None) -> [FeatureActivations]
        .acts [T, d_sae], .recon, .target, .error, .l0 [T], .mean_l0, .token_variance_explained [T],
        .variance_explained, .top(position, n) -> [(feature, activation)]

Edit features (through core.interventions, like an ablation; pass with the others as interventions=)
    iv = feature_edit(a, [FeatureOp(k, "zero" | "clamp" | "scale" | "add", value)], positions=None)
    An edit that changes no activation leaves the outputs bit-identical.

Attribute a logit to features
    fa = feature_attribution(model, ids, a, position, token_id) -> FeatureAttribution
        .features, .activations, .contributions (largest first), .bias, .skip, .error, .direct, .total, .rows()

Dashboards over a text file (memory bounded: the file is read in pieces and run in windows)
    top_contexts(loaded, a, path, feature, top=20, window=None, job=None) -> TopContexts
        .rows (activation, token index, token, left context, right context), .histogram (counts, edges)
    decoder_logits(model, d, feature, n) -> (promoted, suppressed): [(token_id, weight)] through the unembedding

Train one (core.training.sae)
    train_sae(SaeTrainConfig(...), model=loaded, out_dir=..., on_event=..., control=...) -> summary
        events like the trainer's: start, step (l0, mse, variance_explained, dead), eval (held out), done
"""
from .activations import Attached, FeatureActivations, attach, feature_activations, read_point, variance_explained
from .contexts import TopContexts, decoder_logits, top_contexts
from .dictionary import DictionaryError, SparseDictionary, load_dictionary, saelens_cfg, save_dictionary
from .edits import (ATTRIBUTION_COLUMNS, FEATURE_HOWS, FeatureAttribution, FeatureEdit, FeatureOp,
                    feature_attribution, feature_edit)
from .hooks import HookPoint, app_point, hook_point, tl_name

__all__ = ["Attached", "FeatureActivations", "attach", "feature_activations", "read_point", "variance_explained",
           "TopContexts", "decoder_logits", "top_contexts", "DictionaryError", "SparseDictionary",
           "load_dictionary", "saelens_cfg", "save_dictionary", "ATTRIBUTION_COLUMNS", "FEATURE_HOWS",
           "FeatureAttribution", "FeatureEdit", "FeatureOp", "feature_attribution", "feature_edit", "HookPoint",
           "app_point", "hook_point", "tl_name"]
