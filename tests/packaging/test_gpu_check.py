"""packaging/gpu_check.sh (issue 31): on a machine without CUDA and without Qt it runs to the end, skips
the CUDA parts saying why, and writes its JSON; the real-device tests collect with PySide6 unimportable."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "packaging" / "gpu_check.sh"

# imported by Python at start (sitecustomize on PYTHONPATH): PySide6 and pyqtgraph cannot be imported,
# as on the GPU machine, so anything the check runs that needs Qt fails there and here alike
NO_QT = """
import sys

class _NoQt:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("PySide6", "pyqtgraph"):
            raise ImportError(f"{name} is blocked: the GPU machine has no Qt")
        return None

sys.meta_path.insert(0, _NoQt())
"""


@pytest.mark.skipif(shutil.which("timeout") is None or shutil.which("bash") is None, reason="needs bash and timeout")
def test_the_gpu_check_skips_the_cuda_parts_cleanly_without_cuda_and_without_qt(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the check would run for real (run packaging/gpu_check.sh)")
    blocker = tmp_path / "noqt"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(NO_QT, encoding="utf-8")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_QUICK": "1", "PYTHONPATH": str(blocker),
           "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    r = subprocess.run(["bash", str(SCRIPT), str(out)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads((out / "gpu_check.json").read_text(encoding="utf-8"))
    steps = result["steps"]
    assert result["cuda"] is False and result["failed"] == [], result
    env_info = steps["env"]["figures"]  # the core, the CLI and the benchmarks imported without Qt
    assert steps["env"]["status"] == "passed" and env_info["PySide6"] == "absent" and env_info["cuda_available"] is False
    # the real-device tests collected and ran without Qt, and every cuda one skipped for lack of CUDA
    assert steps["pytest-cuda"]["status"] == "skipped" and steps["pytest-cuda"]["tests"]["skipped"] >= 1
    assert "passed" not in steps["pytest-cuda"]["tests"] and "failed" not in steps["pytest-cuda"]["tests"]
    for name in ("bench-generation", "bench-training", "train-bfloat16", "train-bfloat16-resume",
                 "train-float16", "train-float16-resume"):
        assert steps[name]["status"] == "skipped" and "no CUDA device" in steps[name]["reason"], (name, steps[name])
    for name, step in steps.items():  # every step accounted for, none failed, each one a log or a reason
        assert step["status"] in ("passed", "skipped", "absent"), (name, step)
        assert (out / f"{name}.log").is_file() or step["reason"], (name, step)
    assert (out / "pytest-cuda.log").read_text(encoding="utf-8").count("SKIPPED") >= 1
