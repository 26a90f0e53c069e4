"""core/files.py: atomic writes with the user's umask, one-line write errors, the output-folder rule."""
from __future__ import annotations

import errno
import os
import stat

import pytest

from desktop_app.core import files
from desktop_app.core.files import (MANIFEST, OutputFolderError, WriteError, atomic_write_bytes, atomic_write_dir,
                                    check_output_folder, remove_leftovers)


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_atomic_file_gets_the_users_umask(tmp_path, umask_027):
    atomic_write_bytes(tmp_path / "a.bin", b"x")
    assert _mode(tmp_path / "a.bin") == 0o640  # mkstemp alone gives 0o600


def test_atomic_dir_gets_the_users_umask(tmp_path, umask_027):
    atomic_write_dir(tmp_path / "run", lambda d: (d / "f.txt").write_text("x"))
    assert _mode(tmp_path / "run") == 0o750  # mkdtemp alone gives 0o700
    assert _mode(tmp_path / "run" / "f.txt") == 0o640
    assert files.read_manifest(tmp_path / "run") == {"f.txt"}


def test_atomic_dir_never_replaces_a_folder_with_foreign_files(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    with pytest.raises(OutputFolderError, match="did not write"):
        atomic_write_dir(out, lambda d: (d / "f.txt").write_text("x"))
    assert (out / "thesis.tex").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no temporary left either


def test_atomic_dir_replaces_its_own_folder_and_keeps_nothing_stale(tmp_path):
    out = tmp_path / "run"
    atomic_write_dir(out, lambda d: [(d / "a").write_text("1"), (d / "b").write_text("1")])
    atomic_write_dir(out, lambda d: (d / "a").write_text("2"))  # b was ours: it may go
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "a"]
    (out / "notes.txt").write_text("the user's")  # added later by the user: it must stay
    with pytest.raises(OutputFolderError):
        atomic_write_dir(out, lambda d: (d / "a").write_text("3"))
    assert (out / "notes.txt").exists() and (out / "a").read_text() == "2"


@pytest.mark.parametrize("case", ["is_dir", "parent_is_file", "enospc"])
def test_write_failures_are_one_line_write_errors(tmp_path, monkeypatch, case):
    if case == "is_dir":
        target = tmp_path / "d"
        target.mkdir()
        reason = "is a folder"
    elif case == "parent_is_file":
        (tmp_path / "f").write_text("x")
        target = tmp_path / "f" / "out.png"
        reason = "not a folder"
    else:
        target = tmp_path / "out.png"

        def full(*a, **k):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(files.os, "replace", full)
        reason = "No space left on device"
    with pytest.raises(WriteError) as info:
        atomic_write_bytes(target, b"x")
    assert str(info.value) == f"cannot write {target}: " + str(info.value).split(": ", 1)[1]
    assert reason in str(info.value) and "\n" not in str(info.value)
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_remove_leftovers_only_touches_own_temporaries(tmp_path):
    out = tmp_path / "run"
    atomic_write_dir(out, lambda d: (d / "a").write_text("1"))
    stale_dir = tmp_path / ".run.abcd_123.tmp"
    stale_dir.mkdir()
    stale_file = tmp_path / ".run.zz9zz9zz.tmp"
    stale_file.write_text("")
    old = tmp_path / "run.old"
    atomic_write_dir(old, lambda d: (d / "a").write_text("0"))  # a complete earlier copy
    keep = [tmp_path / ".run.tmp", tmp_path / ".run.toolongname.tmp", tmp_path / "run.tmp", tmp_path / ".other.abcdefgh.tmp"]
    for k in keep:
        k.write_text("user")
    removed = remove_leftovers(out)
    assert set(removed) == {stale_dir, stale_file, old}
    assert all(k.exists() for k in keep) and (out / "a").exists()


def test_old_copy_is_kept_when_it_is_the_only_complete_one(tmp_path):
    old = tmp_path / "run.old"
    atomic_write_dir(old, lambda d: (d / "a").write_text("0"))
    assert remove_leftovers(tmp_path / "run") == [] and old.exists()


def test_output_folder_rule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert check_output_folder(tmp_path / "new") == tmp_path / "new"
    (tmp_path / "empty").mkdir()
    check_output_folder(tmp_path / "empty")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.csv").write_text("1")
    for kw in ({}, {"overwrite": True}, {"resume": True}):
        with pytest.raises(OutputFolderError, match="did not write.*data.csv"):
            check_output_folder(foreign, **kw)
    with pytest.raises(OutputFolderError, match="current folder"):
        check_output_folder(".")
    run = tmp_path / "run"
    atomic_write_dir(run, lambda d: (d / "state.json").write_text("{}"))
    with pytest.raises(OutputFolderError, match="--resume.*--overwrite"):
        check_output_folder(run, marker="state.json")
    check_output_folder(run, marker="state.json", overwrite=True)
    check_output_folder(run, marker="state.json", resume=True)
    with pytest.raises(OutputFolderError, match="no checkpoint"):
        check_output_folder(tmp_path / "empty", marker="state.json", resume=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputFolderError, match="not a folder"):
        check_output_folder(tmp_path / "file")


def _snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _users_old(tmp_path, name="run"):
    """A folder of the user's that happens to be called NAME.old, holding their own model under the
    same file names the app writes (no manifest: the app did not write it)."""
    old = tmp_path / f"{name}.old"
    old.mkdir()
    (old / "a").write_bytes(b"the user's own weights \x00\xff")
    (old / "config.json").write_text('{"the": "user\'s"}')
    return old, _snapshot(old)


def test_a_users_old_folder_is_never_removed_nor_read(tmp_path, monkeypatch):
    # issue 25: `train --resume` / `--overwrite` deleted a user's RUN.old holding their own model
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    atomic_write_dir(out, lambda d: [(d / "a").write_text("1"), (d / "config.json").write_text("{}")])
    old, before = _users_old(tmp_path)
    assert remove_leftovers(out) == [] and _snapshot(old) == before
    for kw in ({"overwrite": True}, {"resume": True, "marker": "a"}):
        with pytest.raises(OutputFolderError, match=r"run\.old.*not a folder Transformer Explorer wrote") as info:
            check_output_folder(out, **kw)
        assert "\n" not in str(info.value)
    with pytest.raises(OutputFolderError, match=r"run\.old"):
        atomic_write_dir(out, lambda d: (d / "a").write_text("2"))
    assert _snapshot(old) == before and (out / "a").read_text() == "1"
    # with the run folder gone (what an interrupted swap leaves), the user's .old is not taken for it
    files.shutil.rmtree(out)
    assert files.interrupted_copy(out) is None
    with pytest.raises(OutputFolderError, match=r"run\.old"):
        check_output_folder(out)
    with pytest.raises(OutputFolderError, match=r"run\.old"):
        atomic_write_dir(out, lambda d: (d / "a").write_text("2"))
    assert _snapshot(old) == before and not out.exists()


def test_an_old_folder_of_the_app_with_a_file_added_stays(tmp_path):
    out, old = tmp_path / "run", tmp_path / "run.old"
    atomic_write_dir(out, lambda d: (d / "a").write_text("1"))
    atomic_write_dir(old, lambda d: (d / "a").write_text("0"))
    (old / "notes.txt").write_text("the user's")  # the manifest does not list it
    before = _snapshot(old)
    assert remove_leftovers(out) == []
    with pytest.raises(OutputFolderError, match=r"run\.old.*did not write \(notes\.txt\)"):
        atomic_write_dir(out, lambda d: (d / "a").write_text("2"))
    assert _snapshot(old) == before


def test_an_interrupted_swap_is_still_completed(tmp_path):
    out, old = tmp_path / "run", tmp_path / "run.old"
    atomic_write_dir(old, lambda d: (d / "a").write_text("0"))  # killed between the two renames
    assert files.interrupted_copy(out) == old
    atomic_write_dir(out, lambda d: (d / "a").write_text("1"))
    assert (out / "a").read_text() == "1" and not old.exists()


def test_a_kill_while_removing_old_leaves_a_temporary_not_a_half_folder(tmp_path, monkeypatch):
    out, old = tmp_path / "run", tmp_path / "run.old"
    atomic_write_dir(out, lambda d: [(d / "a").write_text("1"), (d / "b").write_text("1")])
    atomic_write_dir(old, lambda d: [(d / "a").write_text("0"), (d / "b").write_text("0")])
    real = files.shutil.rmtree

    def killed(path, *a, **k):
        raise KeyboardInterrupt  # the process dies in the middle of the removal
    monkeypatch.setattr(files.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        remove_leftovers(out)
    monkeypatch.setattr(files.shutil, "rmtree", real)
    assert not old.exists()  # renamed away first: never a half-emptied run.old
    (grave,) = [p for p in tmp_path.iterdir() if files.is_own_temp(p.name, "run")]
    assert remove_leftovers(out) == [grave] and not grave.exists() and (out / "a").read_text() == "1"


def test_probe_files_are_not_mistaken_for_leftovers(tmp_path):
    # a torchrun rank probing its output folder while rank 0 removes leftovers must not lose its probe
    seen = []
    real = files.tempfile.mkstemp

    def spy(*a, **k):
        fd, name = real(*a, **k)
        seen.append(os.path.basename(name))
        return fd, name
    files.tempfile.mkstemp = spy
    try:
        files.probe_writable(tmp_path / "run")
    finally:
        files.tempfile.mkstemp = real
    assert seen and not files.is_own_temp(seen[0], "run")


def test_a_run_from_before_manifests_is_recognised_only_by_its_marker(tmp_path):
    names = ("config.json", "model.safetensors", "state.json")
    legacy, downloaded = tmp_path / "legacy", tmp_path / "downloaded"
    for folder, present in ((legacy, names), (downloaded, names[:2])):
        folder.mkdir()
        for n in present:
            (folder / n).write_text("x")
    check_output_folder(legacy, marker="state.json", legacy_names=names, resume=True)
    check_output_folder(legacy, marker="state.json", legacy_names=names, overwrite=True)
    with pytest.raises(OutputFolderError, match="did not write"):
        check_output_folder(downloaded, marker="state.json", legacy_names=names, overwrite=True)


# -- issue 41: a lock is never written through a link ------------------------------------------------


@pytest.mark.skipif(os.name == "nt", reason="symbolic links need privileges on Windows")
def test_a_symlinked_or_hard_linked_lock_is_refused_and_never_followed(tmp_path):
    from desktop_app.core.files import WriteError, lock_file, lock_folder

    run = tmp_path / "run"
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes")
    lock = lock_file(run)
    lock.symlink_to(mine)
    with pytest.raises(WriteError, match="symbolic link") as info:
        with lock_folder(run):
            pass
    assert "\n" not in str(info.value) and mine.read_text() == "my notes" and lock.is_symlink()
    lock.unlink()
    gone = tmp_path / "elsewhere" / "created.json"  # a dangling link: its target is never created
    lock.symlink_to(gone)
    with pytest.raises(WriteError, match="symbolic link"):
        with lock_folder(run):
            pass
    assert not gone.exists() and not gone.parent.exists()
    lock.unlink()
    os.link(mine, lock)  # a second name of the user's file
    with pytest.raises(WriteError, match="not a lock file"):
        with lock_folder(run):
            pass
    assert mine.read_text() == "my notes"
    lock.unlink()
    with lock_folder(run):  # a plain lock works as before, and is removed after
        assert lock.is_file() and not lock.is_symlink()
    assert not lock.exists()


@pytest.mark.skipif(os.name == "nt", reason="symbolic links need privileges on Windows")
def test_train_refuses_a_symlinked_lock_in_one_line(tmp_path):
    from desktop_app.core.files import lock_file
    from desktop_app.core.training import TrainConfig, train

    mine = tmp_path / "notes.txt"
    mine.write_text("my notes")
    run = tmp_path / "run"
    lock_file(run).symlink_to(mine)
    with pytest.raises(OSError, match="symbolic link"):
        train(TrainConfig(task="sort", model={"n_layers": 1, "n_heads": 2, "d_model": 16, "d_ff": 32}, steps=1), run)
    assert mine.read_text() == "my notes"
