"""Qt user interface (PySide6 + pyqtgraph)."""
import builtins
import sys

# Python's own import function, kept before PySide6 replaces it with its hook (ui/app.py: import_torch)
PYTHON_IMPORT = builtins.__import__

if sys.version_info < (3, 12):
    import ctypes

    # PySide6 6.12 on CPython 3.11 drops one reference to None on every call of a Qt method that
    # returns void (measured: sys.getrefcount(None) falls by 1 per QGraphicsRectItem.setRect call),
    # and to True/False in some virtual-method round trips. Since 3.12 these objects are immortal
    # and the bug is invisible; before it, a session ends in "Fatal Python error: none_dealloc"
    # (or bool_dealloc). Give them a reference margin no session can use up.
    for _singleton in (None, True, False):
        ctypes.c_ssize_t.from_address(id(_singleton)).value += 1 << 40
    del _singleton

from ..app.images import set_image_codec  # noqa: E402
from ..image_codec import decode_image  # noqa: E402

set_image_codec(decode_image)  # image files other than .npy are decoded by Qt's QImage (app/ never imports Qt)
