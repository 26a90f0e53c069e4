"""The startup benchmark runs end to end and reports what it promises (slow: several cold starts)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_startup_benchmark_prints_its_json(tmp_path):
    r = subprocess.run([sys.executable, "-m", "desktop_app", "bench", "startup", "--repeat", "1"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["name"] == "startup"
    assert result["ours_s"] > 0 and result["reference_s"] > 0
    assert result["ratio"] == pytest.approx(result["ours_s"] / result["reference_s"], rel=0.01)
    # the app did real work beyond the bare imports: it cannot start faster than importing torch and Qt
    assert result["ours_cpu_s"] > 0.8 * result["reference_cpu_s"]
