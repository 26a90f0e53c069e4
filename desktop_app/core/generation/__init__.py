"""Generation, in four rooms: the distribution (sampling.py), the history tree (tree.py), beam search (search.py,
transformers' rule for every model), the session that steps a model (session.py), masked filling (fill.py).

`from desktop_app.core.generation import X` keeps working for every name the package had as one module.
"""
from .fill import FillStep, MaskedFillSession
from .sampling import (EARLY_STOPPING, STRATEGIES, ContextLengthReached, Distribution, GenerationError,
                       GenerationSettings, process_logits, top_k_mask, top_p_mask)
from .session import RECORD_NAMES, GenerationSession, LensRow, generate
from .tree import Node

__all__ = ["EARLY_STOPPING", "RECORD_NAMES", "STRATEGIES", "ContextLengthReached", "Distribution", "FillStep",
           "GenerationError", "GenerationSession", "GenerationSettings", "LensRow", "MaskedFillSession", "Node",
           "generate", "process_logits", "top_k_mask", "top_p_mask"]
