"""bench attention_stats at a small size: it runs both sides and reports times and their agreement."""
from __future__ import annotations

import math

from desktop_app.benchmarks import attention_stats


def test_bench_attention_stats_reports_times_and_agreement():
    out = attention_stats.main(["--layers", "2", "--heads", "2", "--tokens", "24", "--repeat", "1"])
    assert out["name"] == "attention_stats" and (out["layers"], out["heads"], out["tokens"]) == (2, 2, 24)
    for key in ("rollout_ours_s", "rollout_reference_s", "stats_ours_s", "stats_reference_s"):
        assert out[key] >= 0
    assert math.isclose(out["ours_s"], out["rollout_ours_s"] + out["stats_ours_s"], abs_tol=2e-3)
    for key in ("rollout", "entropy", "mean_distance", "first_token"):
        assert 0 <= out[f"{key}_max_rel_diff"] < 1e-5
