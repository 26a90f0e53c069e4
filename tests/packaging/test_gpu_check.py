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


NEEDS = pytest.mark.skipif(shutil.which("timeout") is None or shutil.which("bash") is None, reason="needs bash and timeout")
STEPS = ["env", "pytest-cuda", "bench-scale", "bench-scale-8b", "bench-lipschitz", "bench-generation", "bench-training",
         "train-bfloat16", "train-bfloat16-resume", "train-float16", "train-float16-resume"]  # in priority order


def _run_check(tmp_path, **extra) -> tuple[dict, Path]:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the check would run for real (run packaging/gpu_check.sh)")
    blocker = tmp_path / "noqt"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(NO_QT, encoding="utf-8")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_QUICK": "1", "PYTHONPATH": str(blocker),
           "OMP_NUM_THREADS": "1", **extra}
    env.pop("OUT", None)
    r = subprocess.run(["bash", str(SCRIPT), str(out)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads((out / "gpu_check.json").read_text(encoding="utf-8")), out


@NEEDS
def test_the_gpu_check_skips_the_cuda_parts_cleanly_without_cuda_and_without_qt(tmp_path):
    result, out = _run_check(tmp_path)
    steps = result["steps"]
    assert result["cuda"] is False and result["failed"] == [], result
    assert list(steps) == STEPS and result["budget_seconds"] == 540 and result["steps_asked"] == "all"
    env_info = steps["env"]["figures"]  # the core, the CLI and the benchmarks imported without Qt
    assert steps["env"]["status"] == "passed" and env_info["PySide6"] == "absent" and env_info["cuda_available"] is False
    # the real-device tests collected and ran without Qt, and every cuda one skipped for lack of CUDA
    assert steps["pytest-cuda"]["status"] == "skipped" and steps["pytest-cuda"]["tests"]["skipped"] >= 1
    assert "passed" not in steps["pytest-cuda"]["tests"] and "failed" not in steps["pytest-cuda"]["tests"]
    for name in STEPS[2:]:  # every bench (each takes --device now) and training step
        assert steps[name]["status"] == "skipped" and "no CUDA device" in steps[name]["reason"], (name, steps[name])
    for name, step in steps.items():  # every step accounted for, none failed, each one a log or a reason
        assert step["status"] in ("passed", "skipped", "absent"), (name, step)
        assert (out / f"{name}.log").is_file() or step["reason"], (name, step)
    log = (out / "pytest-cuda.log").read_text(encoding="utf-8")
    # every file with a cuda-marked test collected (its tests skipped here), the new ones included
    for name in ("test_devices_real.py", "test_to_host.py", "test_memory_cap_cuda.py", "test_bench_scale.py",
                 "test_lipschitz_cli.py"):
        assert f"{name}:" in log, name
    assert "error" not in steps["pytest-cuda"]["tests"] and "errors" not in steps["pytest-cuda"]["tests"]


@NEEDS
def test_gpu_check_steps_runs_a_subset_and_records_the_rest_as_not_asked(tmp_path):
    result, out = _run_check(tmp_path, GPU_CHECK_STEPS="bench-lipschitz,train", GPU_CHECK_BUDGET="300")
    steps = result["steps"]
    assert list(steps) == STEPS and result["steps_asked"] == "bench-lipschitz,train" and result["budget_seconds"] == 300
    assert steps["env"]["status"] == "passed"  # always
    for name in ("pytest-cuda", "bench-scale", "bench-scale-8b", "bench-generation", "bench-training"):
        assert steps[name]["status"] == "skipped" and steps[name]["reason"] == "not in GPU_CHECK_STEPS", name
    for name in ("bench-lipschitz", "train-bfloat16", "train-float16-resume"):  # asked: skipped for lack of CUDA
        assert "no CUDA device" in steps[name]["reason"], name
    assert not (out / "pytest-cuda.log").exists()
