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
    assert r["ours_s"] > 0 and r["reference_s"] > 0
    assert r["speedup"] == pytest.approx(r["reference_s"] / r["ours_s"], rel=0.02)
    assert r["bfloat16"] == "skipped"
    assert isinstance(r["fused_optimizer_step"], bool)
    assert "profile" not in r  # only when asked


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
