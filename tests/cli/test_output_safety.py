"""Issue 14 (items 1, 2, 6, 8): output folders are never lost, every write failure is one line with
its own exit code, a resume does what the user says, leftovers go and outputs get the user's umask."""
from __future__ import annotations

import errno
import json
import os
import stat

import pytest

from desktop_app.cli import EXIT_INPUT, EXIT_WRITE, build_parser, main
from desktop_app.core import files
from desktop_app.core.training import checkpoint_step
from desktop_app.core.training.trainer import RUN_FILE, read_run_config
from tiny_models import save_tiny_model

TINY = ["--task", "modadd", "--p", "7", "--layers", "1", "--heads", "2", "--d-model", "16", "--log-every", "1",
        "--eval-every", "100", "--schedule", "constant", "--warmup", "0", "--jsonl"]
TEXT = "attention is all you need"


@pytest.fixture(autouse=True)
def one_thread_and_umask(one_torch_thread):
    mask = os.umask(0o022)
    yield
    os.umask(mask)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("m") / "model", TEXT, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                           context_length=32)


def train(capsys, *args) -> tuple[int, list[dict], str]:
    code = main(["train", *TINY, *args])
    out = capsys.readouterr()
    events = [json.loads(line) for line in out.out.splitlines() if line.startswith("{")]
    return code, events, out.err


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- item 1: nothing the app did not write is ever deleted ------------------------------------


def test_out_folder_with_other_files_is_refused_and_kept(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    os.chmod(out, 0o755)
    code, events, err = train(capsys, "--steps", "2", "--out", str(out))
    line = _one_line(err)
    assert code == EXIT_INPUT and "thesis.tex" in line and "did not write" in line
    assert "choose a new or empty" in line and "--resume" in line and events == []  # refused before any step
    assert (out / "thesis.tex").read_text() == "precious" and sorted(os.listdir(out)) == ["thesis.tex"]
    assert _mode(out) == 0o755 and sorted(os.listdir(tmp_path)) == ["mine"]


def test_export_folder_with_other_files_is_refused_before_training(tmp_path, capsys):
    export = tmp_path / "export"
    export.mkdir()
    (export / "notes.md").write_text("mine")
    code, events, err = train(capsys, "--steps", "2", "--out", str(tmp_path / "run"), "--export", str(export))
    assert code == EXIT_INPUT and "notes.md" in _one_line(err) and events == []
    assert os.listdir(export) == ["notes.md"] and checkpoint_step(tmp_path / "run") is None


def test_out_dot_is_refused_cleanly(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.csv").write_text("1,2")
    code, events, err = train(capsys, "--steps", "2", "--out", ".")
    assert code == EXIT_INPUT and "empty name" not in err and events == []
    assert "current folder" in _one_line(err)
    assert sorted(os.listdir(tmp_path)) == ["data.csv"]


def test_an_existing_run_is_replaced_only_with_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(capsys, "--steps", "2", "--out", str(out))[0] == 0
    assert _mode(out) == 0o755  # the user's umask, not mkdtemp's 0700
    assert all(_mode(f) == 0o644 for f in out.iterdir())
    before = (out / "model.safetensors").read_bytes()
    code, events, err = train(capsys, "--steps", "2", "--seed", "1", "--out", str(out))
    line = _one_line(err)
    assert code == EXIT_INPUT and "--resume" in line and "--overwrite" in line and events == []
    assert (out / "model.safetensors").read_bytes() == before
    code, events, err = train(capsys, "--steps", "2", "--seed", "1", "--out", str(out), "--overwrite")
    assert code == 0, err
    assert (out / "model.safetensors").read_bytes() != before and read_run_config(out).seed == 1


def test_overwrite_never_deletes_files_added_to_a_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(capsys, "--steps", "2", "--out", str(out))[0] == 0
    (out / "my_analysis.ipynb").write_text("{}")
    code, _, err = train(capsys, "--steps", "2", "--out", str(out), "--overwrite")
    assert code == EXIT_INPUT and "my_analysis.ipynb" in _one_line(err)
    assert (out / "my_analysis.ipynb").exists() and checkpoint_step(out) == 2


def test_export_over_an_earlier_export_needs_overwrite(tmp_path, capsys):
    run, export = tmp_path / "run", tmp_path / "export"
    assert train(capsys, "--steps", "2", "--out", str(run), "--export", str(export))[0] == 0
    assert _mode(export) == 0o755
    code, _, err = train(capsys, "--steps", "3", "--out", str(run), "--resume", "--export", str(export))
    assert code == EXIT_INPUT and "--overwrite" in _one_line(err) and checkpoint_step(run) == 2
    code, _, err = train(capsys, "--steps", "3", "--out", str(run), "--resume", "--export", str(export), "--overwrite")
    assert code == 0, err
    assert json.loads((export / RUN_FILE).read_text())["steps"] == 3


# -- item 2: write failures are one line, exit EXIT_WRITE ---------------------------------------


def test_exit_codes_are_documented(capsys):
    assert f"{EXIT_WRITE} an output could not be written" in build_parser().format_help()
    for command in ("train", "render", "trace", "lipschitz"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert f"{EXIT_WRITE} an output could not be written" in " ".join(capsys.readouterr().out.split())


def test_train_into_a_path_under_a_file_fails_before_the_first_step(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code, events, err = train(capsys, "--steps", "2", "--out", str(tmp_path / "file" / "run"))
    line = _one_line(err)
    assert code == EXIT_WRITE and line.startswith(f"error: cannot write {tmp_path / 'file' / 'run'}: ")
    assert events == []


def test_export_under_a_file_fails_before_training(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code, events, err = train(capsys, "--steps", "2", "--out", str(tmp_path / "run"),
                              "--export", str(tmp_path / "file" / "export"))
    assert code == EXIT_WRITE and "cannot write" in _one_line(err) and events == []


def test_train_disk_full_at_a_checkpoint_is_one_line(tmp_path, capsys, monkeypatch):
    def full(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(files.os, "replace", full)
    code, events, err = train(capsys, "--steps", "2", "--out", str(tmp_path / "run"))
    assert code == EXIT_WRITE
    assert _one_line(err) == f"error: cannot write {tmp_path / 'run'}: No space left on device"
    assert not list(tmp_path.glob(".run.*"))  # the temporary folder went too


def _trace(model_dir, out):
    return main(["trace", str(model_dir), "--text", "attention", "--out", str(out)])


def _render(model_dir, out):
    return main(["render", str(model_dir), "--text", "attention", "--view", "attention", "--layer", "0",
                 "--out", str(out)])


def _lipschitz(model_dir, out):
    return main(["lipschitz", "--synthetic", "--d", "3", "--lengths", "2,3", "--samples", "1", "--csv", str(out)])


COMMANDS = {"trace": (_trace, "t.npz"), "render": (_render, "r.png"), "lipschitz": (_lipschitz, "l.csv")}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("case", ["is_a_folder", "parent_is_a_file", "disk_full"])
def test_write_failures_are_one_line(model_dir, tmp_path, capsys, monkeypatch, command, case):
    run, name = COMMANDS[command]
    out = tmp_path / name
    if case == "is_a_folder":
        out.mkdir()
    elif case == "parent_is_a_file":
        (tmp_path / "f").write_text("x")
        out = tmp_path / "f" / name
    else:
        def full(src, dst):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(files.os, "replace", full)
    code = run(model_dir, out)
    line = _one_line(capsys.readouterr().err)
    assert code == EXIT_WRITE and line.startswith(f"error: cannot write {out}: ")
    if case == "disk_full":
        assert line.endswith("No space left on device") and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permissions")
def test_read_only_folder(model_dir, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    try:
        assert _trace(model_dir, ro / "t.npz") == EXIT_WRITE
        assert "Permission denied" in _one_line(capsys.readouterr().err)
        code, events, err = train(capsys, "--steps", "2", "--out", str(ro / "run"))
        assert code == EXIT_WRITE and "Permission denied" in _one_line(err) and events == []
    finally:
        os.chmod(ro, 0o755)


# -- item 6: a resume does what the user says ---------------------------------------------------


def test_resume_applies_new_optimisation_settings_and_says_so(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(capsys, "--steps", "2", "--out", str(out))[0] == 0
    code, events, err = train(capsys, "--steps", "4", "--out", str(out), "--resume", "--lr", "0.0005",
                              "--grad-clip", "0.5", "--weight-decay", "0.1")
    assert code == 0, err
    start = events[0]
    assert start["event"] == "start" and start["step"] == 2
    assert start["changed"] == {"lr": [0.001, 0.0005], "weight_decay": [0.01, 0.1], "grad_clip": [1.0, 0.5]}
    assert [e["lr"] for e in events if e.get("event") == "step"] == [0.0005, 0.0005]
    saved = read_run_config(out)
    assert (saved.lr, saved.grad_clip, saved.weight_decay) == (0.0005, 0.5, 0.1)
    # and without --jsonl the change is printed for a person
    assert main(["train", *[a for a in TINY if a != "--jsonl"], "--steps", "5", "--out", str(out), "--resume",
                 "--lr", "0.0002"]) == 0
    assert "resuming with new settings: lr 0.0005 -> 0.0002" in capsys.readouterr().out


def test_resume_keeps_what_was_not_given(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(capsys, "--steps", "2", "--out", str(out), "--lr", "0.003", "--batch-size", "8")[0] == 0
    code, events, err = train(capsys, "--steps", "3", "--out", str(out), "--resume")
    assert code == 0, err
    assert "changed" not in events[0]
    assert read_run_config(out).lr == 0.003 and read_run_config(out).batch_size == 8


def test_resume_weight_decay_reaches_the_optimizer(tmp_path):
    from desktop_app.core.training import TrainConfig
    from desktop_app.core.training import trainer as tr

    cfg = TrainConfig(task="modadd", task_options={"p": 7}, model={"n_layers": 1, "n_heads": 2, "d_model": 16},
                      steps=1, batch_size=4, eval_every=100, checkpoint_every=1, log_every=1, weight_decay=0.01)
    tr.train(cfg, tmp_path / "run")
    seen = {}
    real = tr.make_optimizer

    def spy(*a, **k):
        opt = real(*a, **k)
        seen["opt"] = opt
        return opt
    tr.make_optimizer = spy
    try:
        tr.train(TrainConfig(**{**cfg.to_dict(), "steps": 2, "weight_decay": 0.2}), tmp_path / "run", resume=True)
    finally:
        tr.make_optimizer = real
    assert [g["weight_decay"] for g in seen["opt"].param_groups] == [0.2, 0.0]


def test_resume_with_another_task_or_model_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(capsys, "--steps", "2", "--out", str(out))[0] == 0
    before = (out / "model.safetensors").read_bytes()
    code = main(["train", "--task", "copy", "--layers", "1", "--heads", "2", "--d-model", "16", "--steps", "4",
                 "--out", str(out), "--resume"])
    line = _one_line(capsys.readouterr().err)
    assert code == EXIT_INPUT and "task='modadd'" in line and "keeps its task" in line
    code, events, err = train(capsys, "--steps", "4", "--out", str(out), "--resume", "--p", "11")
    assert code == EXIT_INPUT and "task_options" in _one_line(err)
    code, events, err = train(capsys, "--steps", "4", "--out", str(out), "--resume", "--layers", "2")
    assert code == EXIT_INPUT and "n_layers" in _one_line(err)
    assert (out / "model.safetensors").read_bytes() == before and checkpoint_step(out) == 2


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_resume_without_a_checkpoint_is_refused(tmp_path, capsys, where):
    out = tmp_path / "run"
    if where == "empty":
        out.mkdir()
    code, events, err = train(capsys, "--steps", "2", "--out", str(out), "--resume")
    assert code == EXIT_INPUT and "no checkpoint to resume" in _one_line(err) and events == []
    assert checkpoint_step(out) is None


def test_core_resume_without_a_checkpoint_is_refused(tmp_path):
    from desktop_app.core.training import TrainConfig, train as core_train

    with pytest.raises(ValueError, match="no checkpoint to resume"):
        core_train(TrainConfig(task="modadd", task_options={"p": 7}, steps=1), tmp_path / "none", resume=True)
    assert not (tmp_path / "none").exists()


# -- item 8: leftovers of a killed run go; outputs get the user's umask -------------------------


def test_leftovers_of_a_killed_run_are_removed_at_the_next_start(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(capsys, "--steps", "2", "--out", str(out))[0] == 0
    stale_tmp = tmp_path / ".run.k1ll3d_x.tmp"  # mkdtemp's name for a checkpoint being written
    stale_tmp.mkdir()
    (stale_tmp / "model.safetensors").write_bytes(b"half")
    import shutil
    shutil.copytree(out, tmp_path / "run.old")  # killed between the two renames of a later checkpoint
    keep = [tmp_path / ".run.tmp", tmp_path / "run.bak", tmp_path / ".run.notmine.txt"]
    for k in keep:
        k.write_text("the user's")
    assert train(capsys, "--steps", "3", "--out", str(out), "--resume", "--checkpoint-every", "100")[0] == 0
    assert not stale_tmp.exists() and not (tmp_path / "run.old").exists()
    assert all(k.read_text() == "the user's" for k in keep)


def test_file_leftovers_are_removed_and_outputs_get_the_umask(model_dir, tmp_path, capsys):
    stale = tmp_path / ".t.npz.abcd1234.tmp"
    stale.write_bytes(b"half")
    mine = tmp_path / ".t.npz.keep.tmp"
    mine.write_bytes(b"the user's")
    assert _trace(model_dir, tmp_path / "t.npz") == 0
    assert not stale.exists() and mine.exists()
    assert _mode(tmp_path / "t.npz") == 0o644
    assert _render(model_dir, tmp_path / "r.png") == 0 and _mode(tmp_path / "r.png") == 0o644
    assert _lipschitz(model_dir, tmp_path / "l.csv") == 0 and _mode(tmp_path / "l.csv") == 0o644


def test_an_export_from_before_manifests_is_replaced_with_overwrite(tmp_path, capsys):
    run, export = tmp_path / "run", tmp_path / "export"
    assert train(capsys, "--steps", "2", "--out", str(run), "--export", str(export))[0] == 0
    (export / files.MANIFEST).unlink()  # as resources/demo-model, exported before manifests
    code, _, err = train(capsys, "--steps", "3", "--out", str(run), "--resume", "--export", str(export))
    assert code == EXIT_INPUT and "--overwrite" in _one_line(err)
    code, _, err = train(capsys, "--steps", "3", "--out", str(run), "--resume", "--export", str(export), "--overwrite")
    assert code == 0, err
    assert json.loads((export / RUN_FILE).read_text())["steps"] == 3
