"""`bench training` output contract on a tiny configuration (the figures themselves are not asserted)."""
from __future__ import annotations

import pytest


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.mark.slow  # imports transformers and runs both loops: ~15 s on a busy 2-core machine
def test_training_benchmark_reports_both_sides():
    pytest.importorskip("transformers")
    from desktop_app.benchmarks.training import main

    r = main(["--steps", "4", "--window", "2", "--rounds", "1", "--layers", "1", "--heads", "2", "--d-model", "32",
              "--context", "16", "--batch", "4", "--no-bf16"])
    assert r["name"] == "training" and r["tokens_per_step"] == 64
    assert r["ours_s"] > 0 and r["reference_s"] > 0 and r["speedup"] > 0
    assert r["pairs"] == 1  # 2 windows of 2 steps, the first (warm-up) left out
    assert r["cpu"]["ours_s"] > 0 and r["cpu"]["reference_s"] > 0  # one torch thread: CPU time too
    assert r["bfloat16"] == "skipped"
    assert isinstance(r["fused_optimizer_step"], bool)
    assert "profile" not in r  # only when asked


@pytest.mark.slow  # as above
def test_the_reference_takes_its_windows_between_ours(monkeypatch):
    """Each window of ours is paired with a window of the reference taken right after it, in the same run."""
    pytest.importorskip("transformers")
    from desktop_app.benchmarks import training
    from desktop_app.core.training import trainer

    order = []
    step, ref_steps = trainer._ModelRun.step, training._Reference.steps
    monkeypatch.setattr(trainer._ModelRun, "step", lambda self, loop: (order.append("ours"), step(self, loop))[1])
    monkeypatch.setattr(training._Reference, "steps", lambda self, n: (order.append(f"reference {n}"),
                                                                       ref_steps(self, n))[1])
    r = training.main(["--steps", "6", "--window", "2", "--rounds", "1", "--layers", "1", "--heads", "2",
                       "--d-model", "32", "--context", "16", "--batch", "4", "--no-bf16"])
    timed = order[-9:]  # after the warm-up run's (ours, reference 1) x 2
    assert timed == ["ours", "ours", "reference 2"] * 3
    assert r["pairs"] == 2


@pytest.mark.slow  # as above, one more run of each side under torch.profiler
def test_training_benchmark_profiles_a_step_of_each_side():
    pytest.importorskip("transformers")
    from desktop_app.benchmarks.training import PROFILE_KINDS, main

    r = main(["--steps", "4", "--window", "2", "--rounds", "1", "--layers", "1", "--heads", "2", "--d-model", "32",
              "--context", "16", "--batch", "4", "--no-bf16", "--profile"])
    kinds = [kind for kind, _ in PROFILE_KINDS] + ["optimizer", "other"]
    for side in ("ours", "reference"):
        p = r["profile"][side]
        assert list(p["self_cpu_ms"]) == kinds
        assert p["self_cpu_ms"]["products"] > 0 and p["self_cpu_ms"]["attention"] > 0 and p["aten_ops"] > 0
        assert p["step_ms"] > 0 and p["self_cpu_ms"]["optimizer"] > 0  # the ops inside Optimizer.step
