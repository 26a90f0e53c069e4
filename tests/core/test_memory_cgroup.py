"""Issue 41: the memory estimates refuse what the container's limit (cgroup) does not allow, not only what
/proc/meminfo reports: `generate --beams 100000` on the demo model was killed by the kernel at 24 GB on a
machine whose MemAvailable said more."""
from __future__ import annotations

import pytest

from desktop_app.core import devices


def _cgroup(tmp_path, monkeypatch, limit: str, used: int) -> None:
    (tmp_path / "memory.max").write_text(limit + "\n")
    (tmp_path / "memory.current").write_text(f"{used}\n")
    monkeypatch.setattr(devices, "CGROUP_MEMORY", ((str(tmp_path / "memory.max"), str(tmp_path / "memory.current")),))


def test_a_cgroup_limit_bounds_the_available_memory(tmp_path, monkeypatch):
    _cgroup(tmp_path, monkeypatch, str(3 * 2**30), 2**30)
    assert devices.cgroup_memory_left() == 2 * 2**30
    assert devices.available_memory("cpu") <= 2 * 2**30
    with pytest.raises(devices.MemoryEstimateError, match="this machine has 2.15 GB available"):
        devices.check_memory(5 * 2**30, "--beams 100000")
    _cgroup(tmp_path, monkeypatch, "max", 2**30)  # no limit: the machine's own figure
    assert devices.cgroup_memory_left() is None


def test_generate_beams_are_refused_under_the_containers_limit(tmp_path, monkeypatch, capsys):
    from desktop_app.cli import main
    from desktop_app.paths import resources_dir

    _cgroup(tmp_path, monkeypatch, str(4 * 2**30), 2**30)
    assert main(["generate", str(resources_dir() / "demo-model"), "--prompt-ids", "1,2,3", "--strategy", "beam",
                 "--beams", "100000"]) != 0
    err = capsys.readouterr().err.strip()
    assert "--beams 100000 needs about" in err and len(err.splitlines()) == 1
