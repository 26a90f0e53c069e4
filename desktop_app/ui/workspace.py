"""Workspace files: what to bring back next time (model folder, text, an encoder-decoder's target, panel,
each panel's view state, window layout).

A workspace is a small JSON file written atomically. The last session is saved the same way to
the user's data folder when the window closes and restored at the next start.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ..core.files import atomic_write_text
from ..paths import user_data_dir

FORMAT = "transformer-explorer-workspace"
VERSION = 1


class WorkspaceError(ValueError):
    def __init__(self, path: str | Path, problem: str) -> None:
        self.path, self.problem = Path(path), problem
        super().__init__(f"{path}: {problem}")


@dataclass
class Workspace:
    model_path: str | None = None
    text: str = ""
    panel: str = ""
    device: str = ""
    geometry: str = ""  # QMainWindow.saveGeometry(), base64
    window_state: str = ""  # QMainWindow.saveState() (toolbars, docks), base64
    # panel title -> its view state as a plain dict (core.views.state_to_dict); read back tolerantly
    views: dict[str, dict] = field(default_factory=dict)
    # the sparse dictionary folders attached to the model (AppState.dictionaries), attached again on open
    dictionaries: list[str] = field(default_factory=list)
    target: str = ""  # an encoder-decoder's target text (what its decoder reads after the start token)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, "version": VERSION, **asdict(self)}, indent=2, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str, path: str | Path = "<workspace>") -> "Workspace":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorkspaceError(path, f"not valid JSON ({exc})") from None
        except RecursionError:  # e.g. 100,000 nested brackets: json gives up; so do we, in one line
            raise WorkspaceError(path, "JSON nested too deeply to be a workspace") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise WorkspaceError(path, f"not a Transformer Explorer workspace (no \"format\": \"{FORMAT}\")")
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise WorkspaceError(path, f"workspace version {version!r} is not a version number")
        if version > VERSION:
            raise WorkspaceError(path, f"workspace version {version!r} is newer than this app understands")
        kw = {}
        for f in fields(cls):
            if f.name not in data or data[f.name] is None:
                continue
            value = data[f.name]
            if f.name == "views":  # per-panel choices are a convenience: a malformed entry is dropped, not fatal
                kw[f.name] = {str(k): v for k, v in value.items() if isinstance(v, dict)} if isinstance(value, dict) else {}
                continue
            if f.name == "dictionaries":
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise WorkspaceError(path, f"field {f.name!r} should be a list of folder names")
                kw[f.name] = list(value)
                continue
            if not isinstance(value, str):
                raise WorkspaceError(path, f"field {f.name!r} should be a string, got {type(value).__name__}")
            if f.name in ("geometry", "window_state") and not _BASE64.fullmatch(value):
                raise WorkspaceError(path, f"field {f.name!r} should be base64 (what the window saved), "
                                           f"got {value[:20]!r}")
            kw[f.name] = value
        return cls(**kw)


_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")


def save_workspace(path: str | Path, ws: Workspace) -> None:
    atomic_write_text(Path(path), ws.to_json())


def load_workspace(path: str | Path) -> Workspace:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise WorkspaceError(path, f"cannot read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise WorkspaceError(path, "not UTF-8 text") from None
    return Workspace.from_json(text, path)


def last_session_path() -> Path:
    return user_data_dir() / "last-session.json"


def move_aside(path: str | Path) -> Path:
    """Rename a file the app wrote but cannot read (a bad last session) to `NAME.bad-YYYYmmdd-HHMMSS`
    beside it, never over another file, so the next start is clean and nothing is deleted. Returns
    the new path; raises OSError when it cannot be moved."""
    path = Path(path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.bad-{stamp}")
    n = 1
    while target.exists() or target.is_symlink():
        n += 1
        target = path.with_name(f"{path.name}.bad-{stamp}-{n}")
    path.rename(target)
    return target
