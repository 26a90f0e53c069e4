"""The local Hugging Face cache: which models are there, and `org/name` -> a snapshot folder.

Read only, and never the network: nothing here downloads, and a repository that is not in the
cache is an error, not a fetch. The layout is huggingface_hub's:

    <root>/models--org--name/
        refs/main                 the revision (commit hash) 'main' points at
        snapshots/<revision>/     the files of that revision, as links into blobs/
        blobs/<hash>              the file contents

One rule for what counts as a snapshot: a folder snapshots/<40 hex digits> that is not a link out of
its repository, reached through a ref that holds such a commit id. A ref holding anything else
('../..', an absolute path) or naming a snapshot the cache lacks is refused, never read as a path nor
replaced by another snapshot. The files in a snapshot may link only into the repository's own blobs/
(checked by the loader, weights.check_links, which applies the same rule to any model folder).

Training steps as revisions: a repository whose refs name steps (Pythia's branches step0 ... step143000,
refs/step1000 written by huggingface_hub for each revision downloaded by name) has a timeline:
step_revisions(repo) lists them with their snapshots, step_snapshot(repo, step) gives one (app.timeline
builds the step slider on them).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .hf_layout import _COMMIT, REPO_PREFIX, _refs, _repo_id, is_snapshot, snapshot_repo_ref  # noqa: F401 (the API)

# A Hugging Face repository id: `name` or `org/name`, optionally `@revision` (a ref, tag or commit). ASCII only,
# as the Hub names them (\w and \d alone take 'é', '٣' Arabic-Indic three, '３' full-width three).
_REPO_REF = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.\-]*(?:/[A-Za-z0-9][\w.\-]*)?)(?:@(?P<rev>[\w.\-/]+))?$", re.ASCII)
_FALLBACK_FAMILIES = ("gpt2", "bert", "llama")


class NotInCacheError(FileNotFoundError):
    """`org/name` names no model in the local cache (FileNotFoundError: the CLI reports it as bad input)."""


def cache_roots() -> list[Path]:
    """The cache folders to look in, first one first, as huggingface_hub chooses its own:
    $HF_HUB_CACHE, then $HF_HOME/hub, then ~/.cache/huggingface/hub ($XDG_CACHE_HOME honoured).
    All of them are listed (not only the first that is set), so a model cached under the default
    location is still found when a variable points elsewhere; duplicates are dropped."""
    env = os.environ
    candidates: list[str] = []
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):  # the second is huggingface_hub's older name
        if env.get(var):
            candidates.append(env[var])
    if env.get("HF_HOME"):
        candidates.append(os.path.join(env["HF_HOME"], "hub"))
    xdg = env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    candidates.append(os.path.join(xdg, "huggingface", "hub"))
    roots: list[Path] = []
    for c in candidates:
        p = Path(os.path.expandvars(os.path.expanduser(c)))
        if p not in roots:
            roots.append(p)
    return roots


def supported_families() -> tuple[str, ...]:
    """The model_types the loader knows: the families registry when it exists, else the three built in."""
    try:
        from .families import REGISTRY  # type: ignore[attr-defined]
    except ImportError:
        return _FALLBACK_FAMILIES
    return tuple(REGISTRY)


@dataclass(frozen=True)
class CachedModel:
    repo_id: str            # "org/name"
    revision: str           # the snapshot's folder name (a commit hash)
    refs: tuple[str, ...]   # the refs pointing at it ("main", ...); empty for an older snapshot
    folder: Path            # .../models--org--name/snapshots/<revision>
    model_type: str | None  # from config.json; None when it has none or cannot be read
    weights_bytes: int      # total size of the weight files (the blobs the links point at)
    supported: bool
    reason: str             # why it cannot be opened; "" when supported

    @property
    def is_current(self) -> bool:
        return "main" in self.refs

    @property
    def ref_text(self) -> str:
        """'org/name' for the main revision, 'org/name@step1000' for another one a ref names (the first ref
        by name), else 'org/name@abc123456789'."""
        if self.is_current:
            return self.repo_id
        return f"{self.repo_id}@{self.refs[0] if self.refs else self.revision[:12]}"


def repo_folder_name(repo_id: str) -> str:
    return REPO_PREFIX + repo_id.replace("/", "--")


def _snapshot_of_ref(repo: Path, ref: str, value: str) -> Path:
    """The snapshot the ref file refs/`ref` names, or NotInCacheError naming that file."""
    where = repo / "refs" / ref
    if not _COMMIT.match(value):
        raise NotInCacheError(f"{where}: holds {value[:80]!r}, not a commit id (40 hex digits); refused")
    snap = repo / "snapshots" / value
    if not is_snapshot(snap, repo / "snapshots"):
        raise NotInCacheError(f"{where}: names revision {value}, which is not a snapshot in the cache "
                              f"({snap} is missing or a link elsewhere); refused")
    return snap


def _weight_size(snapshot: Path) -> tuple[int, bool, bool]:
    """(bytes of the weight files, has safetensors, has pickle weights only)."""
    size, safetensors, pickle = 0, False, False
    for f in snapshot.iterdir():
        name = f.name
        is_st, is_pickle = name.endswith(".safetensors"), name.endswith((".bin", ".pt", ".ckpt", ".pth"))
        if not (is_st or is_pickle):
            continue
        try:
            size += f.stat().st_size  # follows the link to the blob
        except OSError:
            continue  # a dangling link: a file whose download never finished
        safetensors |= is_st
        pickle |= is_pickle
    return size, safetensors, pickle and not safetensors


def _config(snapshot: Path):
    """The snapshot's config.json through the one strict, capped reader (files.read_json: a 2 GB one is not read
    whole to list the cache)."""
    from .files import read_json

    return read_json(snapshot / "config.json")


def _model_type(snapshot: Path) -> tuple[str | None, str]:
    """(config.json's model_type, or None and why: what read_json said of the file, or that it names none)."""
    from .files import JsonFileError

    try:
        d = _config(snapshot)
    except JsonFileError as exc:  # too large, malformed, not UTF-8...: its own words, not a generic line
        return None, "config.json" + (" " if exc.problem.startswith("is ") else ": ") + exc.problem
    except (OSError, ValueError, RecursionError):
        return None, "config.json cannot be read"
    mt = d.get("model_type") if isinstance(d, dict) else None
    return (mt, "") if isinstance(mt, str) else (None, "config.json names no model_type")


def _support(snapshot: Path, model_type: str | None, has_st: bool, pickle_only: bool, config_problem: str = "") -> str:
    """Why the app cannot open this snapshot, in a few words; "" when it can. `config_problem`: _model_type's why."""
    if not (snapshot / "config.json").is_file():
        return "no config.json in this revision"
    if model_type is None:
        return config_problem or "config.json names no model_type"
    try:
        from .families import encoder_decoder_problem
        problem = encoder_decoder_problem(_config(snapshot))
    except (ImportError, OSError, ValueError, RecursionError, AttributeError):
        problem = None  # no families registry, or a config.json _model_type could not read either
    if problem:
        return problem
    families = supported_families()
    if model_type not in families:
        return f"model_type {model_type!r} is not supported (supported: {', '.join(families)})"
    if pickle_only:
        return "only pickle weights (.bin); this app loads safetensors only"
    if not has_st:
        return "no weights in this revision"
    from .checkpoints import ModelLoadError, check_links, read_config  # torch comes with it: only when needed

    try:
        check_links(snapshot)  # the loader's rule: files link only into this repository's blobs/
        read_config(snapshot)  # the loader's own checks on the configuration (activation, rope, ...)
    except ModelLoadError as exc:
        return exc.problem
    return ""


def _snapshot_entry(repo: Path, snapshot: Path, refs: dict[str, str]) -> CachedModel:
    mt, config_problem = _model_type(snapshot)
    size, has_st, pickle_only = _weight_size(snapshot)
    reason = _support(snapshot, mt, has_st, pickle_only, config_problem)
    names = tuple(sorted(r for r, rev in refs.items() if rev == snapshot.name))
    return CachedModel(repo_id=_repo_id(repo.name), revision=snapshot.name, refs=names, folder=snapshot,
                       model_type=mt, weights_bytes=size, supported=not reason, reason=reason)


def list_cached_models(roots: list[Path] | None = None) -> list[CachedModel]:
    """Every model snapshot in the cache roots, by repository id, the current (main) revision first.
    Datasets and spaces (datasets--, spaces--) are not models and are skipped."""
    out: list[CachedModel] = []
    seen: set[tuple[str, str]] = set()
    for root in cache_roots() if roots is None else roots:
        try:
            repos = sorted(p for p in root.iterdir() if p.name.startswith(REPO_PREFIX) and p.is_dir())
        except OSError:
            continue  # a root that does not exist or cannot be read holds nothing
        for repo in repos:
            snapshots = repo / "snapshots"
            if not snapshots.is_dir():
                continue
            refs = _refs(repo)
            for snap in sorted(s for s in snapshots.iterdir() if is_snapshot(s, snapshots)):
                key = (_repo_id(repo.name), snap.name)
                if key not in seen:
                    seen.add(key)
                    out.append(_snapshot_entry(repo, snap, refs))
    out.sort(key=lambda m: (m.repo_id.lower(), not m.is_current, m.revision))
    return out


def find_in_cache(repo_id: str, revision: str | None = None, roots: list[Path] | None = None) -> Path | None:
    """The snapshot folder of `repo_id` at `revision` (a ref such as 'main', or a commit hash or
    its prefix; default 'main', else the only snapshot there is), or None. A ref that does not hold
    the commit id of a snapshot in the cache raises NotInCacheError naming the ref file."""
    for root in cache_roots() if roots is None else roots:
        repo = root / repo_folder_name(repo_id)
        snapshots = repo / "snapshots"
        if not snapshots.is_dir():
            continue
        refs = _refs(repo)
        want = revision or "main"
        if want in refs:
            return _snapshot_of_ref(repo, want, refs[want])
        present = sorted(s.name for s in snapshots.iterdir() if is_snapshot(s, snapshots))
        if revision is None:
            if len(present) == 1:
                return snapshots / present[0]
            continue
        matches = [s for s in present if s.startswith(revision)]
        if len(matches) == 1:
            return snapshots / matches[0]
    return None


def resolve_model_ref(text: str | os.PathLike) -> Path:
    """A model folder from what a user typed: a path that exists, as is; else a Hugging Face
    repository id (`org/name`, `org/name@revision`) looked up in the local cache only.

    Raises NotInCacheError (one line: what, where it looked, that nothing is downloaded)."""
    raw = os.fspath(text)
    path = Path(os.path.expanduser(raw))
    if path.exists():
        return path
    m = _REPO_REF.match(raw)
    if m is None:
        return path  # not a repository id: the loader says what is wrong with the path
    repo_id, rev = m.group("repo"), m.group("rev")
    found = find_in_cache(repo_id, rev)
    if found is not None:
        return found
    if "/" not in repo_id and rev is None:
        return path  # a bare word ('gpt2', 'model'): more likely a mistyped folder than a repository
    looked = ", ".join(str(r) for r in cache_roots())
    what = f"{repo_id}@{rev}" if rev else repo_id
    raise NotInCacheError(f"{what} is not a folder, and not in the local Hugging Face cache "
                          f"(looked in: {looked}); nothing is downloaded")


# -- training steps as revisions (Pythia's `step1000` branches): the timeline of a cached model ------------

_STEP_REF = re.compile(r"step([0-9]{1,12})")  # ASCII digits: refs/step٣ is no step 3


@dataclass(frozen=True)
class StepRevision:
    step: int
    ref: str        # the ref naming it: "step1000"
    revision: str   # the commit id the ref holds
    folder: Path    # snapshots/<revision>
    present: bool   # False: the ref is there but the cache lacks its snapshot (deleted, or never downloaded)


def repo_of_snapshot(folder: str | os.PathLike) -> Path | None:
    """The repository folder (models--org--name) of a cache snapshot folder, else None. Names only: no
    file is read (the UI thread asks it of every model it shows)."""
    snap = Path(folder)
    repo = snap.parent.parent
    if snap.parent.name != "snapshots" or not repo.name.startswith(REPO_PREFIX) or not _COMMIT.match(snap.name):
        return None
    return repo


def step_revisions(repo: str | os.PathLike) -> list[StepRevision]:
    """The repository's revisions named by a training step (refs/step1000 ...: Pythia's branches, as
    huggingface_hub writes a ref for each revision downloaded by name), in order of step. A ref that holds
    anything but a commit id is left out (never read as a path); one whose snapshot the cache lacks is
    listed, not present. Two refs of one step (step1000, step01000): the first by name."""
    repo = Path(repo)
    out: dict[int, StepRevision] = {}
    for name, value in sorted(_refs(repo).items()):
        m = _STEP_REF.fullmatch(name)
        if m is None or not _COMMIT.match(value) or int(m.group(1)) in out:
            continue
        snap = repo / "snapshots" / value
        out[int(m.group(1))] = StepRevision(int(m.group(1)), name, value, snap, is_snapshot(snap, repo / "snapshots"))
    return [out[k] for k in sorted(out)]


def main_revision(repo: str | os.PathLike) -> str | None:
    """The commit id refs/main holds, or None."""
    return _refs(Path(repo)).get("main")


def step_of_snapshot(folder: str | os.PathLike) -> int | None:
    """The training step of a cache snapshot folder (the step revision whose ref names it), else None."""
    repo = repo_of_snapshot(folder)
    if repo is None:
        return None
    name = Path(folder).name
    return next((r.step for r in step_revisions(repo) if r.revision == name), None)


def step_snapshot(repo: str | os.PathLike, step: int) -> Path:
    """The snapshot folder of the repository's revision `step{step}`. NotInCacheError (one line, naming the
    repository and the steps it has) when no such ref is there or the cache lacks its snapshot."""
    repo = Path(repo)
    revs = step_revisions(repo)
    for r in revs:
        if r.step == step:
            return _snapshot_of_ref(repo, r.ref, r.revision)
    there = [r.step for r in revs if r.present]
    shown = ", ".join(map(str, there[:6])) + (f", ..., {there[-1]}" if len(there) > 6 else "")
    raise NotInCacheError(f"{repo}: no revision step{step} in the local Hugging Face cache (its step revisions: "
                          f"{shown or 'none'}); nothing is downloaded")


def format_size(n: int) -> str:
    """'512 B', '3.4 MB', '1.20 GB' (decimal units, as the Hugging Face Hub shows file sizes)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"
    return f"{n} B"
