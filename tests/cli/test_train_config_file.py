"""`train --config FILE`: the run's TrainConfig as JSON is the other way to give the flags' settings."""
from __future__ import annotations

import json

import pytest

from desktop_app.cli import EXIT_INPUT, build_parser, main
from desktop_app.commands.train import config_from_args, config_to_args
from desktop_app.core.training.trainer import TrainConfig

FLAGS = ["--task", "modadd", "--p", "11", "--layers", "1", "--heads", "2", "--d-model", "32", "--lr", "0.002",
         "--grad-clip", "0", "--schedule", "constant", "--steps", "3", "--log-every", "1", "--eval-every", "3"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def run(capsys, *args) -> tuple[int, str]:
    code = main(["train", *args])
    return code, capsys.readouterr().err


def test_config_file_gives_the_same_run_config_as_the_flags(tmp_path, capsys):
    code, err = run(capsys, *FLAGS, "--out", str(tmp_path / "flags"))
    assert code == 0, err
    by_flags = (tmp_path / "flags" / "run_config.json").read_text(encoding="utf-8")
    config = tmp_path / "settings.json"
    config.write_text(by_flags, encoding="utf-8")
    code, err = run(capsys, "--config", str(config), "--out", str(tmp_path / "file"))
    assert code == 0, err
    assert (tmp_path / "file" / "run_config.json").read_text(encoding="utf-8") == by_flags
    # and back: the flags config_to_args writes for that config build it again
    cfg = TrainConfig.from_json(by_flags)
    assert config_from_args(build_parser().parse_args(["train", *config_to_args(cfg), "--out", "x"])) == cfg


def test_a_resume_from_a_config_file_takes_its_new_settings(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(capsys, *FLAGS, "--out", str(out))[0] == 0
    cfg = TrainConfig.from_json((out / "run_config.json").read_text(encoding="utf-8"))
    cfg.steps, cfg.lr = 5, 0.0005
    config = tmp_path / "more.json"
    config.write_text(cfg.to_json(), encoding="utf-8")
    code, err = run(capsys, "--config", str(config), "--out", str(out), "--resume")
    assert code == 0, err
    saved = TrainConfig.from_json((out / "run_config.json").read_text(encoding="utf-8"))
    assert saved.steps == 5 and saved.lr == 0.0005 and saved.model == cfg.model


@pytest.mark.parametrize("content,problem", [
    ("{not json", "not JSON"),
    ("[1, 2]", "not a training configuration"),
    ('{"task": "modadd", "lr": "fast"}', "'lr' must be a number"),
    ('{"task": "modadd", "learning_rate": 0.1}', "unknown training settings: learning_rate"),
    ('{"task": "juggling"}', "unknown task 'juggling'"),
])
def test_a_bad_config_file_is_one_line_naming_it(tmp_path, capsys, content, problem):
    config = tmp_path / "bad.json"
    config.write_text(content, encoding="utf-8")
    code, err = run(capsys, "--config", str(config), "--out", str(tmp_path / "run"))
    assert code == EXIT_INPUT
    (line,) = err.strip().splitlines()
    assert str(config) in line and problem in line
    assert not (tmp_path / "run").exists()


def test_a_missing_config_file_and_conflicting_flags_are_refused(tmp_path, capsys):
    code, err = run(capsys, "--config", str(tmp_path / "none.json"), "--out", str(tmp_path / "run"))
    assert code == EXIT_INPUT and "none.json" in err and "cannot read" in err
    config = tmp_path / "ok.json"
    config.write_text(json.dumps({"task": "modadd", "steps": 2}), encoding="utf-8")
    code, err = run(capsys, "--config", str(config), "--lr", "0.1", "--steps", "9", "--out", str(tmp_path / "run"))
    assert code == EXIT_INPUT and "--lr" in err and "--steps" in err and str(config) in err
    code, err = run(capsys, "--out", str(tmp_path / "run"))
    assert code == EXIT_INPUT and "--task" in err and "--config" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("content,problem", [
    ('{"task": "modadd", "model": {"n_layers": 0}}', "setting 'model.n_layers' must be an integer from 1"),
    ('{"task": "copy", "task_options": {"length": 0}}', "setting 'task_options.length' must be an integer from 1"),
    ('{"task": "modadd", "optimizer": "sgdd"}', "setting 'optimizer' must be one of adamw, adam, sgd, lion"),
    ('{"task": "modadd", "family": "gpt5"}', "unknown family 'gpt5'"),
])
def test_a_config_file_meets_every_declared_option_range(tmp_path, capsys, content, problem):
    """The model's and the task's options too (core.training.options): the ranges the flags have."""
    config = tmp_path / "bad.json"
    config.write_text(content, encoding="utf-8")
    code, err = run(capsys, "--config", str(config), "--out", str(tmp_path / "run"))
    assert code == EXIT_INPUT
    (line,) = err.strip().splitlines()
    assert str(config) in line and problem in line
    with pytest.raises(ValueError, match=problem.replace("(", r"\(")):
        TrainConfig.from_json(content)
    with pytest.raises(SystemExit) as exit_:  # the flag meets the same range (argparse's type, from the table)
        main(["train", "--task", "copy", "--length", "0", "--steps", "1", "--out", str(tmp_path / "run")])
    assert exit_.value.code == 2 and "argument --length: must be an integer from 1" in capsys.readouterr().err
