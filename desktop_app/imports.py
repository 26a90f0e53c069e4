"""A process's start-up imports (torch, and Qt in the GUI) without garbage collection.

What these imports make (torch's and Qt's ~250,000 objects: modules, classes, functions) lives as long as
the process, yet a full collection walks every object made so far: three ran while torch imported, 0.1-0.6 s
each on a busy machine (one right after `import torch, PySide6`: 0.37 s). So none runs while they import,
and what they made is then frozen (gc.freeze): no later full collection walks it either (in the GUI those
run on the UI thread: ui/workers.UIThreadGarbageCollector).
"""
from __future__ import annotations

import gc
import sys
from contextlib import contextmanager


@contextmanager
def kept_for_good():
    """Garbage collection off while the block imports, and everything then frozen; only in a fresh process
    (torch not imported yet): in a caller's process, e.g. a test's, freezing would keep its garbage for good."""
    fresh = "torch" not in sys.modules and gc.isenabled()
    if fresh:
        gc.disable()
    try:
        yield
    finally:
        if fresh:
            gc.freeze()
            gc.enable()
