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
    (tmp_path / "self").write_text("")  # no cgroup of its own: only the container's
    monkeypatch.setattr(devices, "PROC_CGROUP", str(tmp_path / "self"))


def test_a_cgroup_limit_bounds_the_available_memory(tmp_path, monkeypatch):
    _cgroup(tmp_path, monkeypatch, str(3 * 2**30), 2**30)
    assert devices.cgroup_memory_left() == 2 * 2**30
    assert devices.available_memory("cpu") <= 2 * 2**30
    with pytest.raises(devices.MemoryEstimateError, match="this machine has 2.15 GB available"):
        devices.check_memory(5 * 2**30, "--beams 100000")
    _cgroup(tmp_path, monkeypatch, "max", 2**30)  # no limit: the machine's own figure
    assert devices.cgroup_memory_left() is None


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_cgroup_of_its_own_and_its_ancestors_bound_the_available_memory(tmp_path, monkeypatch, version):
    """A process in a cgroup below the mount's root (`systemd-run --scope -p MemoryMax=8G ...`): the least
    that its own cgroup and each ancestor still allow."""
    GiB = 2**30
    v1 = version == "v1"
    root = tmp_path / "memory" if v1 else tmp_path
    limit, used = ("memory.limit_in_bytes", "memory.usage_in_bytes") if v1 else ("memory.max", "memory.current")
    for folder, cap, use in ((root / "a", 20 * GiB, 15 * GiB), (root / "a" / "b", 8 * GiB, GiB)):
        folder.mkdir(parents=True)
        (folder / limit).write_text(f"{cap}\n")
        (folder / used).write_text(f"{use}\n")
    (tmp_path / "self").write_text("4:memory:/a/b\n" if v1 else "0::/a/b\n")
    monkeypatch.setattr(devices, "PROC_CGROUP", str(tmp_path / "self"))
    monkeypatch.setattr(devices, "CGROUP_MOUNT", str(tmp_path))
    monkeypatch.setattr(devices, "CGROUP_MEMORY", ())
    assert devices.cgroup_memory_left() == 5 * GiB  # the parent's 20 - 15, below its own 8 - 1
    (root / "a" / limit).write_text("max\n" if not v1 else f"{2**63 - 4096}\n")  # the parent unlimited
    assert devices.cgroup_memory_left() == 7 * GiB
    assert devices.available_memory("cpu") <= 7 * GiB


def test_generate_beams_are_refused_under_the_containers_limit(tmp_path, monkeypatch, capsys):
    from desktop_app.cli import main
    from desktop_app.paths import resources_dir

    _cgroup(tmp_path, monkeypatch, str(4 * 2**30), 2**30)
    assert main(["generate", str(resources_dir() / "demo-model"), "--prompt-ids", "1,2,3", "--strategy", "beam",
                 "--beams", "100000"]) != 0
    err = capsys.readouterr().err.strip()
    assert "--beams 100000 needs about" in err and len(err.splitlines()) == 1
