"""Writing files and folders safely: atomically, with the user's umask, never over what we did not write.

Every write that matters goes through atomic_write_bytes / atomic_write_dir: a temporary sibling
named `.<name>.<8 characters>.tmp` is filled, then renamed into place, so readers see the old
content or the new, never a part. A folder the app writes carries a small manifest (MANIFEST) that
lists its files; that is how the app later recognises its own output. check_output_folder is the
one rule for "may this command write that output folder", asked before any work starts.
A failed write raises WriteError: one line naming the path and the reason.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Callable, Collection, Iterator

MANIFEST = ".transformer-explorer.json"  # in every folder atomic_write_dir writes: {"app", "files"}
APP = "transformer-explorer"
_TEMP_TAIL = re.compile(r"\.[a-z0-9_]{8}\.tmp")  # tempfile's 8 random characters, then our suffix


class WriteError(OSError):
    """A file or folder that could not be written, and why (one line)."""

    def __init__(self, path: str | Path, reason: str, err: int | None = None) -> None:
        super().__init__(err if err is not None else errno.EIO, reason)
        self.path = Path(path)
        self.reason = reason

    def __str__(self) -> str:
        return f"cannot write {self.path}: {self.reason}"


class OutputFolderError(ValueError):
    """An output folder the command may not write (it holds someone else's files, or a run)."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def _write_error(path: Path, exc: OSError) -> WriteError:
    if isinstance(exc, WriteError):
        return exc
    return WriteError(path, exc.strerror or str(exc), exc.errno)


# -- modes -------------------------------------------------------------------------------------


def current_umask() -> int:
    """The process umask, read without changing it where the system allows (threads may be writing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """What open() would give a new file: 0o666 less the umask (mkstemp alone gives 0o600)."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    return 0o777 & ~current_umask()


# -- atomic writes -----------------------------------------------------------------------------


def _make_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:  # some ancestor is a regular file
        raise WriteError(path, "a parent path is not a folder", errno.ENOTDIR) from exc
    except OSError as exc:
        raise _write_error(path, exc) from exc


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write a file so that readers see the old content or the new, never a part."""
    atomic_write_file(path, lambda f: f.write(data))


def atomic_write_file(path: Path, fill: Callable) -> None:
    """atomic_write_bytes for content written by `fill(f)` into an open binary file (a writer that
    streams, e.g. a GGUF file tensor by tensor; f.name is the temporary file's path, for a check that
    reads it back): a temporary sibling, synced, then renamed into place."""
    path = Path(path)
    if path.is_dir():
        raise WriteError(path, "is a folder (give a file name)", errno.EISDIR)
    _make_parent(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        with open(tmp, "wb") as f:  # (by name, so that f.name is its path)
            os.fchmod(f.fileno(), file_mode())
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise _write_error(path, exc) from exc
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def read_manifest(folder: Path) -> set[str] | None:
    """The files the app wrote into `folder` (its manifest), None when it has no readable manifest."""
    try:
        d = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict) or d.get("app") != APP or not isinstance(d.get("files"), list):
        return None
    return {str(f) for f in d["files"]}


def _entries(folder: Path) -> set[str]:
    return {p.name for p in Path(folder).iterdir()}


def write_files(folder: Path, files: dict[str, bytes | str] | None) -> None:
    """Write each named file (bytes as they are, text as UTF-8) into `folder` (a fresh folder being filled:
    atomic_write_dir's temporary one), e.g. a run's state beside the weights it saves."""
    for name, data in (files or {}).items():
        if isinstance(data, bytes):
            (folder / name).write_bytes(data)
        else:
            (folder / name).write_text(data, encoding="utf-8")


def atomic_write_dir(path: Path, fill: Callable[[Path], None]) -> None:
    """Build a folder in a temporary sibling, then swap it in place of `path`.

    At every instant one complete folder exists: the current one is renamed to `path.old` (the
    previous `.old`, then redundant, is removed first), the new one is renamed into place, and only
    then is `.old` removed. When `path` is missing (an interrupted swap), `path.old` is kept until the
    new folder is in place. load_model_folder falls back to `path.old`. Temporary folders that a
    kill in the middle of a write left behind are removed first.

    An existing `path` is replaced only when nothing in it would be lost that the app did not write:
    it is empty, or each entry is in its manifest or is replaced by a file of the same name.
    An existing `path.old` is removed (or stands in for a missing `path`) only when it is one of the
    app's folders (is_own_folder: its manifest lists everything in it): a user's own folder that
    happens to be called `path.old` is never touched. Otherwise OutputFolderError, and nothing is
    changed. Folders are removed by renaming them to a temporary sibling first (discard), so a kill
    never leaves a half-removed `.old` behind.
    """
    path = Path(path)
    _make_parent(path)
    remove_leftovers(path)
    old = path.with_name(path.name + ".old")
    if os.path.lexists(old):  # before any work: is the `.old` in the way ours?
        require_own_old(path)
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        os.chmod(tmp, dir_mode())  # mkdtemp makes 0o700; the folder becomes the user's output
        fill(tmp)
        written = sorted(_entries(tmp) - {MANIFEST})
        (tmp / MANIFEST).write_text(json.dumps({"app": APP, "files": written}), encoding="utf-8")
        for f in tmp.iterdir():
            if f.is_dir() and not f.is_symlink():
                continue  # a sub-folder (a run's kept checkpoints) is written and synced by its own writer
            with open(f, "rb") as fh:
                os.fchmod(fh.fileno(), file_mode())  # some writers (safetensors) create 0o600
                os.fsync(fh.fileno())
        if os.path.lexists(old):
            require_own_old(path)  # again: the fill may have taken long
        if path.exists() or path.is_symlink():
            if not path.is_dir() or path.is_symlink():
                raise WriteError(path, "exists and is not a folder", errno.ENOTDIR)
            foreign = _entries(path) - (read_manifest(path) or set()) - set(written) - {MANIFEST}
            if foreign:
                raise OutputFolderError(path, f"holds files the app did not write ({', '.join(sorted(foreign)[:3])}); "
                                              "nothing was changed")
            if os.path.lexists(old):  # `path` is complete: the older copy (ours, checked above) is not needed
                discard(old, path.name)
            os.replace(path, old)  # from here `old` is the folder just checked: ours to remove
        os.replace(tmp, path)
        tmp = None
        if os.path.lexists(old):  # ours: moved there above, or checked by require_own_old
            discard(old, path.name)
    except OSError as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise _write_error(path, exc) from exc
    except BaseException as exc:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if type(exc).__name__ == "SafetensorError":  # safetensors' own I/O error (a full disk): a write failure
            raise _safetensors_write_error(path, exc) from exc
        raise


def _safetensors_write_error(path: Path, exc: BaseException) -> WriteError:
    """safetensors' error text (Rust's 'IoError(Os { code: 28, ... message: "No space left on device" })')
    as a WriteError: the OS's message and errno when it carries them."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    m = re.search(r'code: (\d+).*?message: "([^"]*)"', text)
    if m:
        return WriteError(path, m.group(2), int(m.group(1)))
    return WriteError(path, text)


def is_own_folder(folder: str | Path) -> bool:
    """Whether `folder` is a real folder (not a link) that carries the app's manifest and holds
    nothing the manifest does not list: the only kind of folder the app removes or falls back to."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return False
    listed = read_manifest(folder)
    return listed is not None and not (_entries(folder) - listed - {MANIFEST})


def require_own_old(path: str | Path) -> None:
    """OutputFolderError (one line naming it) when `path.old` exists and is not one of the app's
    folders (is_own_folder): the swap of `path` would remove it or take it for `path`."""
    path = Path(path)
    if not path.name:
        return
    old = path.with_name(path.name + ".old")
    if not os.path.lexists(old) or is_own_folder(old):
        return
    if old.is_symlink() or not old.is_dir():
        what = "is not a folder the app wrote"
    else:
        listed = read_manifest(old)
        unlisted = sorted(_entries(old) - (listed or set()) - {MANIFEST})
        shown = ", ".join(unlisted[:3]) + (", ..." if len(unlisted) > 3 else "")
        what = (f"holds files Transformer Explorer did not write ({shown})" if listed is not None else
                f"is not a folder Transformer Explorer wrote (no {MANIFEST})")
    raise OutputFolderError(old, f"{what}, and the app keeps its previous copy of {path.name} under that "
                                 f"name while replacing it; nothing was changed: rename or move {old.name}, "
                                 f"or choose another folder")


def discard(folder: Path, target: str) -> None:
    """Remove one of the app's own folders: first renamed to a temporary sibling of `target`
    (`.<target>.<8 chars>.tmp`, which remove_leftovers recognises), then deleted, so a kill in the
    middle leaves a temporary, never a half-emptied folder under a name the app reads."""
    folder = Path(folder)
    grave = Path(tempfile.mktemp(prefix=f".{target}.", suffix=".tmp", dir=folder.parent))
    os.replace(folder, grave)
    shutil.rmtree(grave, ignore_errors=True)


def interrupted_copy(path: str | Path) -> Path | None:
    """`path.old` when `path` is missing and `path.old` is one of the app's folders: the complete copy
    an interrupted atomic_write_dir left, to read in place of `path`. None otherwise (a user's own
    `path.old` is never read for `path`)."""
    path = Path(path)
    if not path.name:  # "/", "." or "": no folder of that name to stand in for
        return None
    old = path.with_name(path.name + ".old")
    if os.path.lexists(path) or not is_own_folder(old):
        return None
    return old


# -- leftovers and output folders --------------------------------------------------------------


def is_own_temp(name: str, target: str) -> bool:
    """Whether `name` is one of our temporary siblings of `target` (`.<target>.<8 chars>.tmp`)."""
    prefix = f".{target}."
    return name.startswith(prefix) and bool(_TEMP_TAIL.fullmatch(name[len(prefix) - 1:]))


def remove_leftovers(path: str | Path) -> list[Path]:
    """Remove what a killed atomic write of `path` left: its temporary siblings, and `path.old` when
    `path` itself is a complete folder of ours (otherwise `.old` is the copy to load) and `path.old`
    is one of the app's folders (is_own_folder). Nothing else."""
    path = Path(path)
    removed: list[Path] = []
    try:
        siblings = list(path.parent.iterdir())
    except OSError:
        return removed
    for p in siblings:
        if is_own_temp(p.name, path.name) and not p.is_symlink():
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    old = path.with_name(path.name + ".old")
    # `.old` goes only when `path` is a complete folder of ours and `.old` is ours too (its manifest
    # lists everything in it): a user's folder that happens to be called `path.old` stays
    if read_manifest(path) is not None and not path.is_symlink() and is_own_folder(old):
        try:
            discard(old, path.name)
            removed.append(old)
        except OSError:
            pass  # the swap that needs it gone says so
    return removed


def owned_entries(folder: Path, legacy_names: Collection[str] = ()) -> set[str]:
    """The entries of `folder` the app wrote: those its manifest lists; in a folder written before
    manifests existed, the entries named in `legacy_names` (a caller's own file names)."""
    listed = read_manifest(folder)
    if listed is not None:
        return (listed | {MANIFEST}) & _entries(folder)
    return set(legacy_names) & _entries(folder)


def check_output_folder(path: str | Path, *, overwrite: bool = False, resume: bool = False,
                        marker: str | None = None, legacy_names: Collection[str] = (),
                        legacy_marker: str | None = None, what: str = "output") -> Path:
    """Decide, before any work, whether a command may write the folder `path`; return it absolute.

    Allowed: a new folder (its parent writable), an empty one, or one of the app's own folders when
    `resume` (and `marker`, the file that marks a resumable run, is there) or `overwrite` is given.
    Refused with FolderLockedError: a folder another run is writing now (lock_folder). Refused with
    OutputFolderError: a `path.old` beside it that is not the app's (require_own_old); a folder holding anything the app did not write (nothing is ever
    deleted), the current folder or one of its parents (it would be swapped away under the shell),
    a path that is a file. A folder that cannot be written raises WriteError. A folder written before
    manifests existed counts as the app's when it holds `legacy_marker` (default: `marker`); then its
    entries named in `legacy_names` are the app's.
    """
    raw = Path(path)
    folder = Path(os.path.abspath(raw))
    if folder.name in ("", ".", ".."):
        raise OutputFolderError(raw, "give a folder with a name, e.g. ./run1")
    cwd = Path(os.path.abspath(os.getcwd()))
    if folder == cwd or folder in cwd.parents:
        raise OutputFolderError(raw, f"is the current folder (or holds it); choose a new {what} folder, "
                                     "e.g. ./run1")
    if os.environ.get("RANK", "0") == "0":  # under torchrun rank 0 takes the lock; the others write nothing
        holder = lock_holder(folder)
        if holder is not None:  # another run writes it now: refused before any work
            raise _locked_error(raw, holder)
    require_own_old(folder)  # a user's own `folder.old` is never removed, nor taken for the run
    target = interrupted_copy(folder) or folder  # an interrupted swap: the run lives in .old for now
    if target.is_symlink():  # (to a folder too: "is not a folder" misled)
        raise OutputFolderError(raw, f"is a symbolic link; the app never writes through one, even with --overwrite: "
                                     f"choose another {what} folder")
    if target.exists() and not target.is_dir():
        raise OutputFolderError(raw, f"exists and is not a folder; choose another {what} folder")
    if target.is_dir():
        entries = _entries(target)
        if entries:
            # a folder from before manifests counts as a run only with its marker (a downloaded
            # model's config.json and weights are not ours)
            sign = legacy_marker or marker
            legacy = legacy_names if sign is not None and sign in entries else ()
            mine = owned_entries(target, legacy)
            foreign = entries - mine
            is_run = bool(mine) and (marker is None or marker in mine)
            if foreign or not mine:
                shown = ", ".join(sorted(foreign)[:3]) + (", ..." if len(foreign) > 3 else "")
                hint = (" (--resume continues only a folder the app trained into)" if resume else
                        " (to continue a training run, give its own folder with --resume)" if marker else "")
                raise OutputFolderError(
                    raw, f"is not empty and holds files Transformer Explorer did not write ({shown}); "
                         f"nothing was changed: choose a new or empty {what} folder{hint}")
            if resume and not is_run:
                raise OutputFolderError(raw, "holds no checkpoint to resume; drop --resume to start a new run "
                                             "(with --overwrite to replace this folder)")
            if not resume and not overwrite:
                kind = "a training run" if marker is not None and marker in mine else "the app's earlier output"
                advice = "--resume to continue it, " if marker is not None and marker in mine else ""
                raise OutputFolderError(raw, f"already holds {kind}; use {advice}--overwrite to replace it, "
                                             f"or choose another {what} folder")
        elif resume:
            raise OutputFolderError(raw, "holds no checkpoint to resume; drop --resume to start a new run")
    elif resume:
        raise OutputFolderError(raw, "no such folder, so no checkpoint to resume; drop --resume to start a new run")
    probe_writable(folder)
    return folder


def probe_writable(folder: Path) -> None:
    """Create and remove a temporary file where `folder`'s contents will be written (WriteError if not)."""
    folder = Path(folder)
    where = folder.parent  # atomic_write_dir builds its temporary sibling there
    if not where.exists():
        _make_parent(folder)
    try:
        # not our temporary pattern: another process's remove_leftovers (a torchrun rank) leaves it alone
        fd, tmp = tempfile.mkstemp(prefix=f".{folder.name}.probe-", suffix=".tmp", dir=where)
        os.close(fd)
        Path(tmp).unlink(missing_ok=True)
    except OSError as exc:
        raise _write_error(folder, exc) from exc


def prepare_output_file(path: str | Path) -> Path:
    """Before a command's work: remove what a killed write of `path` left, and check that `path` can
    be written (WriteError naming it otherwise), so a failure costs no computation."""
    path = Path(path)
    if path.is_dir():
        raise WriteError(path, "is a folder (give a file name)", errno.EISDIR)
    _make_parent(path)
    remove_leftovers(path)
    probe_writable(path)
    return path


# -- run-folder locks ----------------------------------------------------------------------------


class FolderLockedError(OutputFolderError):
    """An output folder another process is writing now (its lock is held): names the holder."""


_HELD_LOCKS: dict[str, list] = {}  # lock file -> [fd, depth]: a process may take its own lock again
_LOCK_GUARD = threading.Lock()


def lock_file(folder: str | Path) -> Path:
    """Where the lock of `folder` lives: `.<name>.lock` beside it (the folder itself is swapped
    whole by atomic_write_dir, so a lock inside it would be swapped away). The run removes it."""
    folder = Path(os.path.abspath(folder))
    return folder.with_name(f".{folder.name}.lock")


def _os_lock(fd: int) -> bool | None:
    """Try to take the OS lock on `fd` without waiting: True taken, False held by another process,
    None when this file system or platform has no such lock (then the pid rule decides)."""
    try:
        import fcntl
    except ImportError:  # Windows: lock one byte far beyond the holder's note, so it stays readable
        try:
            import msvcrt
            os.lseek(fd, 1 << 30, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except ImportError:
            return None
        except OSError as exc:
            return False if exc.errno in (errno.EACCES, errno.EDEADLK) else None
        finally:
            os.lseek(fd, 0, os.SEEK_SET)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        return None  # ENOLCK, EOPNOTSUPP...: e.g. some network file systems


def _os_unlock(fd: int) -> None:
    try:
        import fcntl
        fcntl.flock(fd, fcntl.LOCK_UN)
    except ImportError:
        try:
            import msvcrt
            os.lseek(fd, 1 << 30, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        except (ImportError, OSError):
            pass
    except OSError:
        pass


def _read_holder(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        d = json.loads(os.read(fd, 4096).decode("utf-8"))
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def _describe_holder(d: dict) -> str:
    if not d.get("pid"):
        return "a process that left no note"
    return f"pid {d.get('pid')} on {d.get('host', '?')}, started {d.get('started', '?')}"


def _pid_alive_here(d: dict) -> bool:
    """Whether the holder `d` may still run: True unless it ran on this host and its pid is gone."""
    import socket

    if d.get("host") != socket.gethostname() or not isinstance(d.get("pid"), int):
        return True
    if os.name == "nt":  # os.kill would end the process there; no OS lock is the rare case: assume alive
        return True
    try:
        os.kill(d["pid"], 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists
        return True
    return True


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # a lock file is never opened through a link


def _open_lock(path: Path, create: bool) -> int:
    """The lock file's descriptor, opened without following a symbolic link (O_NOFOLLOW; O_CREAT | O_EXCL
    when it is not there, so nothing else is created in its place). Only a plain file with one link is a
    lock: a link (symbolic, or a second hard link to someone's file) is refused with a WriteError, never
    written through."""
    import stat

    if os.path.islink(path):  # (also where O_NOFOLLOW does not exist)
        raise WriteError(path, "is a symbolic link, not a lock file this app made; refusing to follow it "
                               "(remove it if no run writes the folder)")
    flags = os.O_RDWR | _NOFOLLOW
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, file_mode()) if create else None
    except FileExistsError:
        fd = None
    if fd is None:
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise WriteError(path, "is a symbolic link, not a lock file this app made; refusing to follow "
                                       "it (remove it if no run writes the folder)") from None
            raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        os.close(fd)
        raise WriteError(path, "is not a lock file this app made (not a plain file, or linked elsewhere too); "
                               "nothing was written to it")
    return fd


def lock_holder(folder: str | Path) -> str | None:
    """Who holds the lock of `folder` now ("pid N on HOST, started T"), None when nobody does (or this
    process itself). Asked before any work (check_output_folder); lock_folder takes the lock."""
    path = lock_file(folder)
    if str(path) in _HELD_LOCKS:
        return None
    try:
        fd = _open_lock(path, create=False)
    except OSError:
        return None  # no lock file (or not readable, or not a lock: lock_folder will say so)
    try:
        got = _os_lock(fd)
        d = _read_holder(fd)
        if got is True:
            _os_unlock(fd)
            return None
        if got is None and not (d and _pid_alive_here(d)):
            return None
        return _describe_holder(d)
    finally:
        os.close(fd)


def _locked_error(folder: Path, holder: str) -> FolderLockedError:
    return FolderLockedError(folder, f"another run is writing this folder ({holder}); nothing was changed: "
                                     "wait for it to finish or stop it, or choose another folder")


@contextlib.contextmanager
def lock_folder(folder: str | Path, on_note: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the lock of the output folder `folder` while a run writes it (lock_file: `.<name>.lock`
    beside it, holding the holder's pid, host and start time). Another process's lock: FolderLockedError
    (a ValueError, one line naming the holder). The OS lock (flock; msvcrt on Windows) is released by
    the system when the holder dies, even by kill -9; the lock file it leaves is then taken over, and
    `on_note` gets a line saying so. Where the file system has no OS lock, a lock whose pid no longer
    runs on this host is taken over the same way. The same process may take its own lock again."""
    import socket
    import time

    path = lock_file(folder)
    key = str(path)
    with _LOCK_GUARD:
        if key in _HELD_LOCKS:
            _HELD_LOCKS[key][1] += 1
            reentered = True
        else:
            reentered = False
    if reentered:
        try:
            yield
        finally:
            with _LOCK_GUARD:
                _HELD_LOCKS[key][1] -= 1
        return
    _make_parent(path)
    fd = None
    for _ in range(20):  # the holder may remove the file between our open and our lock: open again
        try:
            fd = _open_lock(path, create=True)
        except FileNotFoundError:
            continue  # removed between our two opens: create it again
        except OSError as exc:
            raise _write_error(path, exc) from exc
        got = _os_lock(fd)
        previous = _read_holder(fd)
        if got is False or (got is None and previous and _pid_alive_here(previous)
                            and previous.get("pid") != os.getpid()):
            os.close(fd)
            raise _locked_error(Path(os.path.abspath(folder)), _describe_holder(previous))
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except OSError:
            same = False
        if same:
            break
        _os_unlock(fd)
        os.close(fd)
        fd = None
    if fd is None:
        raise WriteError(path, "the lock file keeps changing under this run")
    try:
        if previous.get("pid") and on_note is not None:
            on_note(f"{path}: took over the lock of a run that is no longer running "
                    f"({_describe_holder(previous)})")
        note = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode("utf-8")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, note)
        os.fsync(fd)
    except OSError as exc:
        _os_unlock(fd)
        os.close(fd)
        raise _write_error(path, exc) from exc
    with _LOCK_GUARD:
        _HELD_LOCKS[key] = [fd, 1]
    try:
        yield
    finally:
        with _LOCK_GUARD:
            del _HELD_LOCKS[key]
        if os.name != "nt":  # removed while still held: a process waiting on the old file opens it again
            try:
                os.unlink(path)
            except OSError:
                pass
        _os_unlock(fd)
        os.close(fd)
        if os.name == "nt":
            try:
                os.unlink(path)
            except OSError:
                pass


def strict_json(value):
    """NaN and infinities -> None (JSON null), recursively through dicts, lists and tuples: strict
    JSON has no NaN (e.g. the CI of a fit through two points is undefined, a W2 without its twin run)."""
    import math

    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class JsonFileError(ValueError):
    """A JSON file that cannot be read: one line naming the file and the problem ("PATH: problem")."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list) -> dict:
    d: dict = {}
    for key, value in pairs:
        if key in d:
            raise _DuplicateKey(key)
        d[key] = value
    return d


# the most bytes read_json reads of a file by default: a config.json, generation_config.json or trainer_state.json
# is kilobytes (a SAELens cfg.json's cap too: features/dictionary.py); a 2 GB one would have been read whole
MAX_JSON_BYTES = 1 << 24
# a training run's metrics.json is ours and grows with its steps (~100 bytes a logged step): the 16 MB default would
# refuse a run past ~160 k logged steps; still a cap, so a damaged or foreign file is refused before it is read whole
METRICS_MAX_BYTES = 1 << 28


def read_json(path: str | Path, text: str | None = None, max_bytes: int | None = MAX_JSON_BYTES,
              duplicates: bool = False):
    """The one strict reader of a JSON file the app did not just build itself (a model's config.json, a
    run's trainer_state.json and metrics.json): the decoded value, or JsonFileError naming the file and
    the problem in one line: unreadable, not UTF-8, malformed (line and column), nested too deeply, or
    a key given twice in one object (which json.loads would silently resolve to the last one). `text`:
    the file's contents when the caller has read them already. `max_bytes`: a larger file is refused unread
    (a settings file that size is not one); None: no cap. `duplicates`: a key given twice keeps its last value,
    as json.loads and the tool that wrote the file read it (a tokenizer_config.json: transformers' own files)."""
    path = Path(path)
    try:
        if text is None and max_bytes is not None and path.stat().st_size > max_bytes:
            raise JsonFileError(path, f"is {path.stat().st_size:,} bytes, not a settings file (at most "
                                      f"{max_bytes:,} are read)")
        if text is None and max_bytes is not None:
            with open(path, "rb") as fh:  # at most max_bytes + 1: a file that grows, or a device, is not read on
                data = fh.read(max_bytes + 1)
            if len(data) > max_bytes:
                raise JsonFileError(path, f"is more than {max_bytes:,} bytes, not a settings file (at most "
                                          f"{max_bytes:,} are read)")
            text = data.decode("utf-8")
        if text is None:
            text = path.read_bytes().decode("utf-8")
        return json.loads(text, object_pairs_hook=None if duplicates else _unique_keys)
    except UnicodeDecodeError as exc:
        raise JsonFileError(path, f"not UTF-8 text ({exc.reason}: byte 0x{exc.object[exc.start]:02x} at "
                                  f"position {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise JsonFileError(path, f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except _DuplicateKey as exc:
        raise JsonFileError(path, f"the key {exc.args[0]!r} appears twice in one object; which one is meant "
                                  "is unclear (each key must appear once)") from None
    except RecursionError:
        raise JsonFileError(path, "JSON nested too deeply") from None
    except IsADirectoryError:
        raise JsonFileError(path, "is a folder, not a file") from None
    except OSError as exc:
        raise JsonFileError(path, f"cannot be read ({exc.strerror or exc})") from None


# -- named output files and array files read in ------------------------------------------------


class OutputFileError(ValueError):
    """An output file a command may not write: it exists (no --overwrite), or is a link or special file."""


def check_output_file(path: str | Path, overwrite: bool = False) -> Path:
    """The one rule for an output FILE the user names (trace --out, render --out, every --csv...), asked
    before any work and again just before the write (with overwrite=True: the link rule only).

    A new file is fine; an existing regular file only with `overwrite` (else OutputFileError "PATH
    exists; pass --overwrite to replace it"); a symbolic link, folder, device, pipe or socket never,
    even with `overwrite`: the write is atomic (a sibling renamed into place) and would replace the
    link itself, or cannot replace a special file. An empty name, or one ending in a separator ("out/":
    a folder's name, which Path() would turn into a file "out"), is refused (OutputFileError) before
    anything else. Then prepare_output_file (leftovers, writable)."""
    import stat

    if str(path) == "":
        raise OutputFileError("the output file name is empty: give a file name")
    if isinstance(path, str) and path.endswith(tuple(filter(None, (os.sep, os.altsep)))):
        # Path() would drop the separator and write a FILE of the folder's name
        raise OutputFileError(f"{path} ends in {path[-1]!r}, so it names a folder: give a file name")
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _write_error(path, exc) from exc
    if st is not None:
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            raise OutputFileError(f"{path} is a symbolic link; the app never writes through one, even with "
                                  "--overwrite: give the file's own path or a new name")
        if stat.S_ISDIR(mode):  # a folder in the way: a write failure, as prepare_output_file says it
            raise WriteError(path, "is a folder (give a file name)", errno.EISDIR)
        if not stat.S_ISREG(mode):
            raise OutputFileError(f"{path} is a special file (device, pipe or socket); the app writes only "
                                  "regular files: give a new file name")
        if not overwrite:
            raise OutputFileError(f"{path} exists; pass --overwrite to replace it")
    return prepare_output_file(path)


MAX_ARRAY_BYTES = 2**31  # an array file the app reads (matrices, an image) is small; 2 GB is far beyond


def file_problem(path: str | Path, what: str = "file") -> str | None:
    """Why `path` cannot be read as a {what} (no such one, a folder, a special file, no permission), or None
    when it is a regular file (or a link to one) that opens. Asked before a reader whose own words mislead:
    numpy took a folder for "no such file", safetensors an unreadable file for "No such file or directory"."""
    path = Path(path)
    if path.is_dir():
        return "is a folder, not a file"
    if not path.exists():
        return f"no such {what}"
    if not path.is_file():
        return f"is a special file (device, pipe or socket), not a {what}"
    try:
        open(path, "rb").close()
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return None


def require_file(path: str | Path, what: str = "file") -> Path:
    """`path` as a Path when it names a regular file that opens, before anything reads it; otherwise one line
    naming it and file_problem's reason: FileNotFoundError when there is none, else ValueError."""
    path = Path(path)
    problem = file_problem(path, what)
    if problem is None:
        return path
    raise (FileNotFoundError if problem.startswith("no such") else ValueError)(f"{path}: {problem}")


def read_npy_file(path: str | Path, what: str = ".npy file"):
    """The one reader of a single .npy array the user names (an image given as an array): the file's header
    first (check_array_file: a claimed huge array, or Python objects, refused unread), then the array, never
    through pickle: a numpy array. ValueError naming the file otherwise: missing (FileNotFoundError), a folder, no NumPy
    header (numpy.load would take it for a pickle and say so), or truncated."""
    import numpy as np

    path = require_file(path, what)
    if "" not in check_array_file(path):
        raise ValueError(f"{path}: not a .npy array (it does not start with NumPy's header; write one with numpy.save)")
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{path}: not a readable .npy array, truncated or damaged ({exc})") from None


def check_array_file(path: str | Path, max_bytes: int = MAX_ARRAY_BYTES) -> dict[str, tuple]:
    """Read the headers of a .npy file, or of each array in an .npz archive (compressed or not), before
    numpy reads the arrays: refuse (ValueError naming the file) an array whose header claims more than
    `max_bytes`, or that holds Python objects (pickle, never loaded). Returns name -> (shape, dtype) of
    the arrays whose headers were read ("" for a .npy), for the caller's own checks before reading them.
    A file that is not such an archive passes here and is refused by numpy.load as before."""
    import zipfile

    import numpy as np
    from numpy.lib import format as npy

    path = Path(path)
    headers: dict[str, tuple] = {}

    def check(f, name: str) -> None:
        try:
            version = npy.read_magic(f)
            shape, _, dtype = (npy.read_array_header_1_0(f) if version == (1, 0) else
                               npy.read_array_header_2_0(f))
        except (ValueError, EOFError, OSError):
            return  # not a .npy header: numpy.load says so
        what = f"{path}: {'array ' + repr(name) + ' ' if name else ''}"
        if dtype.hasobject:
            raise ValueError(f"{what}holds Python objects (pickle), which the app never loads")
        headers[name] = (tuple(int(n) for n in shape), dtype)
        size = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if size > max_bytes:
            from .devices import human_bytes
            raise ValueError(f"{what}claims shape {tuple(shape)} ({human_bytes(size)}); refusing to read it "
                             f"(at most {human_bytes(max_bytes)})")

    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                for info in z.infolist():
                    if info.filename.endswith(".npy"):
                        with z.open(info) as f:
                            check(f, info.filename[:-4])
        else:
            with open(path, "rb") as f:
                check(f, "")
    except (OSError, zipfile.BadZipFile, EOFError):
        pass  # unreadable: numpy.load's caller says so in its own words
    return headers
