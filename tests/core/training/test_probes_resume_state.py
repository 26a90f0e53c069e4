"""Issue 25, probes beyond its list (resume): a run folder's trainer_state.json, optimizer.safetensors and
metrics.json, edited or damaged, ended a resumed run in tracebacks (TypeError, KeyError, SafetensorError),
in a wrong "no checkpoint to resume from", in torch's or the codec's words naming no file, or were accepted
(step -1 / 2.5 / "4" / 10**30, format 99, elapsed NaN). One checked reader (core/training/state.py) now
refuses each in one line naming the file and the field, before the first step."""
from __future__ import annotations

import json
import shutil

import pytest

from desktop_app.cli import EXIT_INPUT, main
from desktop_app.core.checkpoints import ModelLoadError
from desktop_app.core.training import TrainConfig, checkpoint_step, train
from desktop_app.core.training.state import read_trainer_state

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = {"n_layers": 1, "n_heads": 2, "d_model": 16, "d_ff": 32}
CFG = dict(task="copy", model=SMALL, log_every=1, eval_every=4, checkpoint_every=4)


@pytest.fixture(scope="module")
def run4(tmp_path_factory):
    out = tmp_path_factory.mktemp("r") / "run"
    train(TrainConfig(**CFG, steps=4), out)
    return out


@pytest.fixture
def run(run4, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run4, out)
    return out


def _edit(run, change, name="trainer_state.json"):
    d = json.loads((run / name).read_text())
    change(d)
    (run / name).write_text(json.dumps(d))


def _resume(run) -> str:
    with pytest.raises(ModelLoadError) as exc:
        train(TrainConfig(**CFG, steps=6), run, resume=True)
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


STATE_EDITS = {
    "a list": (lambda d: None, b"[]", "expected a JSON object, got list"),
    "no optimizer": (lambda d: d.pop("optimizer"), None, "no 'optimizer' object"),
    "step missing": (lambda d: d.pop("step"), None, "no 'step'"),
    "step -1": (lambda d: d.update(step=-1), None, "'step' must be an integer from 0 to 1,000,000,000, got -1"),
    "step 2.5": (lambda d: d.update(step=2.5), None, "'step' must be an integer from 0 to 1,000,000,000, got 2.5"),
    "step '4'": (lambda d: d.update(step="4"), None, "'step' must be an integer from 0 to 1,000,000,000, got '4'"),
    "step 1e30": (lambda d: d.update(step=10**30), None, "'step' must be an integer from 0 to 1,000,000,000"),
    "step NaN": (lambda d: d.update(step=float("nan")), None, "'step' must be an integer from 0 to 1,000,000,000, got nan"),
    "format 99": (lambda d: d.update(format=99), None, "'format' is 99: written by a newer version"),
    "elapsed 'x'": (lambda d: d.update(elapsed="x"), None, "'elapsed' must be a non-negative number of seconds, got 'x'"),
    "elapsed NaN": (lambda d: d.update(elapsed=float("nan")), None, "'elapsed' must be a non-negative number"),
    "nested": (lambda d: None, b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply"),
    "groups []": (lambda d: d["optimizer"].update(param_groups=[]), None, "'optimizer.param_groups' must be a non-empty list"),
    "betas 'x'": (lambda d: d["optimizer"]["param_groups"][0].update(betas="x"), None,
                  "'optimizer.param_groups[0].betas' must be two numbers, got 'x'"),
    "duplicate key": (lambda d: None, b'{"format": 1, "step": 4, "step": 0}', "the key 'step' appears twice"),
}


@pytest.mark.parametrize("case", sorted(STATE_EDITS))
def test_a_damaged_trainer_state_is_refused_naming_the_file_and_the_field(case, run):
    change, raw, expected = STATE_EDITS[case]
    if raw is None:
        _edit(run, change)
    else:
        (run / "trainer_state.json").write_bytes(raw)
    msg = _resume(run)
    assert msg.startswith(f"{run / 'trainer_state.json'}: ") and expected in msg, msg
    assert "no checkpoint to resume from" not in msg


@pytest.mark.parametrize("params", [[0, 1, 99], [0]])
def test_optimizer_groups_that_do_not_fit_the_model_name_the_file(params, run):
    _edit(run, lambda d: d["optimizer"]["param_groups"][0].update(params=params))
    msg = _resume(run)
    assert msg.startswith(f"{run / 'trainer_state.json'}: the optimiser state (with optimizer.safetensors) does not "
                          "fit this model: "), msg


def test_a_truncated_optimizer_file_is_named(run):
    f = run / "optimizer.safetensors"
    f.write_bytes(f.read_bytes()[:3000])
    assert _resume(run).startswith(f"{f}: corrupt or truncated safetensors file (")


def test_a_missing_optimizer_file_is_named(run):
    (run / "optimizer.safetensors").unlink()
    assert _resume(run) == f"{run / 'optimizer.safetensors'}: is missing; the checkpoint is incomplete"


@pytest.mark.parametrize("raw, expected", [(b"\xff\xfe garbage", "not UTF-8 text"),
                                           (b'{"a": 1}', "expected a JSON list of events, got dict"),
                                           (b"[1]", "entry 0 must be an object")])
def test_a_damaged_metrics_file_is_named(raw, expected, run):
    (run / "metrics.json").write_bytes(raw)
    msg = _resume(run)
    assert msg.startswith(f"{run / 'metrics.json'}: ") and expected in msg, msg


def test_checkpoint_step_still_says_none_for_an_unreadable_state(run):
    assert checkpoint_step(run) == 4 and read_trainer_state(run).step == 4
    (run / "trainer_state.json").write_bytes(b"[]")
    assert checkpoint_step(run) is None  # the Train panel's question; a resume says why


def test_the_cli_says_it_in_one_line_with_exit_2(run, capsys):
    _edit(run, lambda d: d.update(step=2.5))
    code = main(["train", "--task", "copy", "--layers", "1", "--d-model", "16", "--d-ff", "32", "--heads", "2",
                 "--steps", "6", "--eval-every", "4", "--checkpoint-every", "4", "--log-every", "1",
                 "--out", str(run), "--resume"])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_INPUT and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{run / 'trainer_state.json'}: 'step' must be an integer" in err, err


def test_an_intact_run_still_resumes(run):
    summary = train(TrainConfig(**CFG, steps=6), run, resume=True)
    assert summary["step"] == 6 and checkpoint_step(run) == 6
