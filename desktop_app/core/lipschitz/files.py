"""The Lipschitz lab's files: a sweep's CSV (written atomically through core/files.py), the A and V
of a synthetic head read from an .npz archive, and strict JSON for the summaries."""
from __future__ import annotations

import numpy as np
import torch

CSV_COLUMNS = ("n", "sample", "lipschitz", "radius", "upper_bound", "lower_bound", "iterations")


def save_csv(path, result) -> None:
    """One row per input of a SweepResult (result.rows()), columns CSV_COLUMNS; written atomically."""
    import csv
    import io
    from pathlib import Path

    from ..files import atomic_write_bytes

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS)
    w.writerows(result.rows())
    atomic_write_bytes(Path(path), buf.getvalue().encode("utf-8"))


def load_matrices(path) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, V) as float64 [d, d] tensors from an .npz archive holding arrays named "A" and "V"
    (numpy.savez(path, A=A, V=V)). Raises FileNotFoundError or ValueError with a message naming the
    file and the problem: not an .npz, a missing array, not a real square matrix, shapes that
    disagree, non-finite values."""
    import zipfile
    from pathlib import Path

    path = Path(path)
    from ..files import check_array_file, require_file

    require_file(path)  # missing, or a folder: said so before anything is read
    check_array_file(path)  # the headers first: a claimed (100000, 100000) array is refused unread
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):  # numpy's own wording stays out of the message
        raise ValueError(f"{path}: not a NumPy .npz archive (save A and V with numpy.savez(path, A=A, V=V))") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: holds a single array, not an .npz archive with arrays A and V "
                         "(save them with numpy.savez(path, A=A, V=V))")
    with data:
        missing = [name for name in ("A", "V") if name not in data.files]
        if missing:
            found = ", ".join(data.files) or "none"
            raise ValueError(f"{path}: no array named {' or '.join(missing)} (found: {found}); "
                             "expected arrays A and V of shape [d, d]")
        try:
            arrays = {name: data[name] for name in ("A", "V")}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile):
            raise ValueError(f"{path}: cannot read A and V: the archive is damaged or holds pickled objects") from None
    for name, M in arrays.items():
        if M.dtype.kind not in "iuf":
            raise ValueError(f"{path}: {name} has dtype {M.dtype}; expected real numbers")
        if M.ndim != 2 or M.shape[0] != M.shape[1] or M.shape[0] == 0:
            raise ValueError(f"{path}: {name} has shape {list(M.shape)}; expected a square matrix [d, d]")
        bad = int(np.size(M) - np.isfinite(M).sum())
        if bad:
            raise ValueError(f"{path}: {name} has {bad} non-finite value(s) (NaN or infinity)")
    A, V = arrays["A"], arrays["V"]
    if A.shape != V.shape:
        raise ValueError(f"{path}: A has shape {list(A.shape)} but V has shape {list(V.shape)}; "
                         "both must be [d, d] with the same d")
    return torch.from_numpy(A.astype(np.float64)), torch.from_numpy(V.astype(np.float64))


from ..files import strict_json  # noqa: E402,F401 - general; its home is core/files.py
