"""The Hugging Face cache's folder layout, the part the loader needs: what a snapshot folder is, and
the repository a snapshot belongs to (its name in messages). No import of ours: checkpoints and
core.weights sit on it, hf_cache (the listing, which uses the loader) above them.

    <root>/models--org--name/refs/main, snapshots/<revision>/, blobs/<hash>
"""
from __future__ import annotations

import os
import re
from pathlib import Path

REPO_PREFIX = "models--"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")  # a snapshot's folder name, and what a ref file holds


def _repo_id(folder_name: str) -> str:
    return folder_name[len(REPO_PREFIX):].replace("--", "/")


def _refs(repo: Path) -> dict[str, str]:
    """ref name -> revision, from refs/ (refs/main, refs/pr/1, ...)."""
    out: dict[str, str] = {}
    refs = repo / "refs"
    if refs.is_dir():
        for f in refs.rglob("*"):
            if f.is_file():
                try:
                    out[f.relative_to(refs).as_posix()] = f.read_text(encoding="utf-8").strip()
                except (OSError, UnicodeDecodeError):
                    continue  # an unreadable ref names nothing
    return out


def is_snapshot(folder: Path, snapshots: Path) -> bool:
    """`folder` (in `snapshots`) is a snapshot: named by a commit id, a folder, not a link elsewhere."""
    try:
        return (bool(_COMMIT.match(folder.name)) and folder.is_dir()
                and folder.resolve().parent == snapshots.resolve())
    except OSError:
        return False


def snapshot_repo_ref(folder: str | os.PathLike) -> str | None:
    """'org/name' (or 'org/name@step1000', the first ref by name that points at it, for a revision main does
    not point at; 'org/name@abc123456789' when none does) when `folder` is a cache snapshot, else None: a
    better model name than the snapshot's commit hash."""
    snap = Path(folder)
    repo = snap.parent.parent
    if snap.parent.name != "snapshots" or not repo.name.startswith(REPO_PREFIX):
        return None
    repo_id, refs = _repo_id(repo.name), _refs(repo)
    if refs.get("main") == snap.name:
        return repo_id
    named = sorted(r for r, rev in refs.items() if rev == snap.name)
    return f"{repo_id}@{named[0] if named else snap.name[:12]}"
