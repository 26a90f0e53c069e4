"""Attribution graphs over transcoder features (issue 37): transcoders.py reads circuit-tracer's transcoder
folders, replacement.py is one prompt's local replacement model, attribution.py the graph (rows, pruning,
scores), files.py its JSON (the frontend's / Neuronpedia's schema) and raw safetensors files."""
from .attribution import (Context, Graph, Pruned, Targets, attribute, build_context, difference_target,  # noqa: F401
                          graph_scores, prune_graph, salient_targets, token_targets, with_leading_special)
from .replacement import graph_problem  # noqa: F401
from .transcoders import TranscoderError, Transcoders, load_transcoders  # noqa: F401
