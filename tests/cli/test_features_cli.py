"""`python -m desktop_app features` and `train --task sae` (issue 29)."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from desktop_app.cli import main
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.core.features import SparseDictionary, attach, feature_activations, load_dictionary, save_dictionary
from desktop_app.paths import resources_dir

pytestmark = pytest.mark.usefixtures("one_torch_thread")
DEMO = str(resources_dir() / "demo-model")


@pytest.fixture(scope="module")
def sae(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    folder = tmp_path_factory.mktemp("d") / "sae"
    save_dictionary(SparseDictionary(torch.randn(128, 64, generator=g) * 0.1, torch.randn(64, generator=g) * 0.1,
                                     torch.randn(64, 128, generator=g) * 0.1, torch.zeros(128),
                                     hook="blocks.2.hook_resid_post"), folder)
    return folder


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_features_writes_every_activation_and_says_l0_and_variance_explained(sae, tmp_path, capsys):
    out = tmp_path / "f.npz"
    assert main(["features", DEMO, "--sae", str(sae), "--text", "Alice was very tired", "--out", str(out)]) == 0
    said = _last_json(capsys.readouterr().out)
    loaded = load_model_folder(DEMO)
    ids = loaded.tokenizer.encode("Alice was very tired")
    run = feature_activations(loaded.model, ids, [attach(load_dictionary(sae), loaded.config)])[0]
    with np.load(out, allow_pickle=False) as z:
        assert z["acts"].dtype == np.float32 and z["acts"].shape == (len(ids), 64)
        np.testing.assert_allclose(z["acts"], run.acts.numpy(), rtol=1e-6, atol=1e-7)
        assert z["ids"].tolist() == ids
    assert said["hook"] == "blocks.2.hook_resid_post"
    assert said["l0"] == pytest.approx(run.mean_l0) and said["variance_explained"] == pytest.approx(run.variance_explained)
    # the output-file rule: refused without --overwrite, the file kept
    before = out.read_bytes()
    assert main(["features", DEMO, "--sae", str(sae), "--ids", "1,2,3", "--out", str(out)]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err and out.read_bytes() == before
    assert main(["features", DEMO, "--sae", str(sae), "--ids", "1,2,3", "--out", str(out), "--overwrite"]) == 0


def test_top_contexts_csv(sae, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text((resources_dir() / "demo-text.txt").read_text(encoding="utf-8")[:3000], encoding="utf-8")
    out = tmp_path / "top.csv"
    assert main(["features", DEMO, "--sae", str(sae), "--top-contexts", str(text), "--feature", "3", "--top", "5",
                 "--window", "64", "--csv", str(out)]) == 0
    said = _last_json(capsys.readouterr().out)
    rows = list(csv.reader(out.open(encoding="utf-8")))
    assert rows[0] == ["rank", "activation", "token_index", "token", "left", "right"]
    assert len(rows) == 6 and said["rows"] == 5 and said["feature"] == 3
    acts = [float(r[1]) for r in rows[1:]]
    assert acts == sorted(acts, reverse=True)


def test_top_contexts_say_their_progress_and_the_time_left_on_stderr(sae, tmp_path, capsys, monkeypatch):
    """Issue 41: 1 MB printed nothing for minutes; now a line every few seconds (every window here)."""
    from desktop_app.commands import Progress

    monkeypatch.setattr(Progress, "EVERY_S", 0.0)
    text = tmp_path / "t.txt"
    text.write_text((resources_dir() / "demo-text.txt").read_text(encoding="utf-8")[:3000], encoding="utf-8")
    assert main(["features", DEMO, "--sae", str(sae), "--top-contexts", str(text), "--feature", "3",
                 "--window", "8", "--csv", str(tmp_path / "top.csv")]) == 0
    captured = capsys.readouterr()
    windows = -(-_last_json(captured.out)["tokens"] // 8)
    lines = captured.err.strip().splitlines()
    assert lines and all("windows/s, about" in line and line.endswith(" left") for line in lines), lines
    assert lines[0].startswith("window 8/") and f"/{windows}," in lines[-1]


@pytest.mark.parametrize("argv,expected", [
    (["--ids", "1,2"], "give --out F.npz"),
    (["--top-contexts", "nowhere.txt", "--csv", "x.csv"], "--top-contexts needs --feature K and --csv"),
    (["--ids", "1,2", "--out", "x.npz", "--feature", "2"], "--csv and --feature go with --top-contexts"),
])
def test_wrong_combinations_are_one_line(sae, tmp_path, capsys, monkeypatch, argv, expected):
    monkeypatch.chdir(tmp_path)
    assert main(["features", DEMO, "--sae", str(sae), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1


def test_a_bad_dictionary_folder_is_one_line(tmp_path, capsys):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "cfg.json").write_text("{}", encoding="utf-8")
    assert main(["features", DEMO, "--sae", str(tmp_path / "bad"), "--ids", "1", "--out", str(tmp_path / "o.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path / "bad") in err and "neither" in err


def test_train_task_sae_saves_a_dictionary_the_features_command_reads(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text((resources_dir() / "demo-text.txt").read_text(encoding="utf-8")[:4000], encoding="utf-8")
    out = tmp_path / "sae"
    argv = ["train", "--task", "sae", "--model", DEMO, "--hook", "blocks.1.hook_mlp_out", "--text-file", str(text),
            "--d-sae", "64", "--k", "8", "--steps", "20", "--batch-size", "64", "--eval-every", "10", "--jsonl",
            "--out", str(out)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    events = [json.loads(line) for line in lines[:-1]]
    assert {"start", "step", "eval", "done"} <= {e["event"] for e in events}
    summary = json.loads(lines[-1])
    assert summary["l0"] <= 8 and summary["step"] == 20
    assert load_dictionary(out).hook == "blocks.1.hook_mlp_out"
    assert main(argv) == 2  # the folder holds the app's earlier output: refused without --overwrite
    assert "--overwrite" in capsys.readouterr().err
    assert main(["features", DEMO, "--sae", str(out), "--ids", "1,2,3", "--out", str(tmp_path / "a.npz")]) == 0
    assert _last_json(capsys.readouterr().out)["l0"] <= 8


def test_train_task_sae_needs_its_model_and_text(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--task", "sae", "--text-file", "x.txt", "--steps", "1", "--out", "o"]) == 2
    assert "needs --model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # argparse's refusal, from the flag's declared range
        main(["train", "--task", "sae", "--model", DEMO, "--steps", "1", "--out", "o", "--d-sae", "0"])
    assert refused.value.code == 2 and "argument --d-sae" in capsys.readouterr().err


def _events_until(proc, kind: str, seen: list) -> dict:
    """Read the run's JSON lines until an event of `kind` (the test's timeout guards the wait)."""
    for line in proc.stdout:
        if line.startswith("{"):
            ev = json.loads(line)
            seen.append(ev)
            if ev["event"] == kind:
                return ev
    raise AssertionError(f"the run ended before a {kind!r} event: {seen}")


def _say(proc, line: str) -> None:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def test_train_task_sae_pauses_resumes_stops_and_goes_on_with_resume(tmp_path, capsys, spawn):
    """As a model run: --control-stdin's pause / resume / stop (a stop writes the dictionary and its training
    state), then `--resume` goes on from that step with the checkpoint's own settings (only --steps given)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from desktop_app.core.training.sae import sae_checkpoint_step

    root = Path(__file__).resolve().parents[2]
    text = tmp_path / "t.txt"
    text.write_text((resources_dir() / "demo-text.txt").read_text(encoding="utf-8")[:4000], encoding="utf-8")
    out = tmp_path / "sae"
    proc = spawn([sys.executable, "-m", "desktop_app", "train", "--task", "sae", "--model", DEMO, "--hook",
                  "blocks.1.hook_resid_post", "--text-file", str(text), "--d-sae", "32", "--k", "4", "--steps",
                  "100000", "--batch-size", "32", "--log-every", "1", "--eval-every", "1000", "--jsonl",
                  "--control-stdin", "--out", str(out)], cwd=root, env={**os.environ, "OMP_NUM_THREADS": "1"},
                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # killed in teardown
    seen: list[dict] = []
    _events_until(proc, "step", seen)
    _say(proc, "pause")
    paused = _events_until(proc, "paused", seen)
    _say(proc, "resume")
    resumed = _events_until(proc, "resumed", seen)
    assert resumed["step"] == paused["step"]
    _events_until(proc, "step", seen)
    _say(proc, "stop")
    stopped = _events_until(proc, "stopped", seen)
    proc.stdin.close()
    assert proc.wait(120) == 0, proc.stderr.read()
    at = stopped["step"]
    assert at > paused["step"] and sae_checkpoint_step(out) == at
    assert main(["train", "--task", "sae", "--steps", str(at + 5), "--jsonl", "--resume", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    events = [json.loads(line) for line in lines[:-1]]
    assert events[0]["event"] == "start" and events[0]["step"] == at and events[0]["resumed"]
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(at + 1, at + 6))
    assert json.loads(lines[-1])["step"] == at + 5 == sae_checkpoint_step(out)
    assert load_dictionary(out).hook == "blocks.1.hook_resid_post" and load_dictionary(out).d_sae == 32
    # a resume that changes what the dictionary is refuses in one line, the folder as it was
    assert main(["train", "--task", "sae", "--steps", str(at + 9), "--d-sae", "64", "--resume", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "d_sae 32, not 64" in err and sae_checkpoint_step(out) == at + 5


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_train_task_sae_refuses_a_precision_it_would_ignore(tmp_path, capsys, precision):
    """Issue 41: --precision bfloat16 / float16 on train --task sae gave float32 weights without a word."""
    text = tmp_path / "t.txt"
    text.write_text("Alice was beginning to get very tired. " * 20, encoding="utf-8")
    out = tmp_path / "sae"
    assert main(["train", "--task", "sae", "--model", DEMO, "--hook", "blocks.1.hook_mlp_out", "--text-file",
                 str(text), "--steps", "2", "--precision", precision, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--precision {precision}" in err and "float32" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_a_dictionary_too_big_for_memory_is_refused_before_its_weights_exist(tmp_path, capsys, monkeypatch):
    """Issue 41's probes: `train --task clt --d-sae 1000000` on the demo model was killed by the kernel (rc 137);
    its weights, gradients and Adam's moments are estimated first (here against a 1 GB machine)."""
    from desktop_app.core import devices

    monkeypatch.setattr(devices, "available_memory", lambda device="cpu": 2**30)
    text = tmp_path / "t.txt"
    text.write_text((resources_dir() / "demo-text.txt").read_text(encoding="utf-8")[:2000], encoding="utf-8")
    for task, d_sae in (("clt", 100_000), ("transcoder", 100_000), ("sae", 1_000_000)):
        argv = ["train", "--task", task, "--model", DEMO, "--text-file", str(text), "--out", str(tmp_path / task),
                "--steps", "1", "--d-sae", str(d_sae)] + (["--hook", "blocks.1.hook_resid_post"] if task == "sae" else [])
        assert main(argv) == 2, task
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and f"--d-sae {d_sae:,}" in err and "needs about" in err, err


@pytest.mark.parametrize("flags", [["--hook", "blocks.0.hook_resid_post"],
                                   ["--hook", "blocks.0.hook_resid_post", "--hook-out", "blocks.1.hook_resid_post"]])
def test_a_hook_given_to_layered_transcoders_is_refused_not_ignored(tmp_path, capsys, flags):
    """Issue 41's probes: `train --task transcoder --hook ...` trained on mlp.hook_in at every layer without a word."""
    for task in ("transcoder", "clt"):
        assert main(["train", "--task", task, "--model", DEMO, "--text-file", str(resources_dir() / "demo-text.txt"),
                     "--out", str(tmp_path / task), "--steps", "1", *flags]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and f"--task {task} reads every layer's MLP input" in err, err
        assert not (tmp_path / task).exists()
