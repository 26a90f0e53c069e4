"""Launchers: the icon set, and the desktop entry the install script writes (validated)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from PySide6.QtGui import QImage
from PySide6.QtSvg import QSvgRenderer

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "packaging" / "install_desktop_entry.sh"
ICONS = REPO / "resources" / "icons"
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def test_icon_set_has_every_size(qapp):
    assert QSvgRenderer(str(ICONS / "transformer-explorer.svg")).isValid()
    for size in SIZES:
        image = QImage(str(ICONS / f"transformer-explorer-{size}.png"))
        assert (image.width(), image.height()) == (size, size)
        assert image.hasAlphaChannel()
        # opaque in the middle of the tile, transparent in the rounded-off corner
        assert image.pixelColor(size // 2, size // 2).alpha() == 255
        assert image.pixelColor(0, 0).alpha() == 0


def run_install(prefix: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_DATA_HOME=str(prefix / "unused"))
    return subprocess.run(["sh", str(SCRIPT), "--prefix", str(prefix), *args], capture_output=True, text=True,
                          env=env, timeout=60, cwd=cwd)


def entry_fields(path: Path) -> dict[str, str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "[Desktop Entry]"
    return dict(line.split("=", 1) for line in lines[1:] if "=" in line)


def test_install_script_writes_entry_and_icons_and_uninstalls(tmp_path):
    program = tmp_path / "my apps" / "transformer-explorer"  # a space: Exec= must quote it
    r = run_install(tmp_path / "share", "--exec", str(program))
    assert r.returncode == 0, r.stderr
    entry = tmp_path / "share" / "applications" / "transformer-explorer.desktop"
    fields = entry_fields(entry)
    assert fields["Exec"] == f'"{program}" %f'
    assert fields["TryExec"] == str(program)
    assert fields["Icon"] == "transformer-explorer" and fields["Type"] == "Application"
    for size in SIZES:
        assert (tmp_path / "share" / "icons" / "hicolor" / f"{size}x{size}" / "apps" / "transformer-explorer.png").is_file()
    assert (tmp_path / "share" / "icons" / "hicolor" / "scalable" / "apps" / "transformer-explorer.svg").is_file()
    assert not list((tmp_path / "share" / "applications").glob(".*tmp"))

    r = run_install(tmp_path / "share", "--uninstall")
    assert r.returncode == 0, r.stderr
    assert not entry.exists()
    # nothing it wrote is left, caches included (update-desktop-database / gtk-update-icon-cache used to
    # leave a mimeinfo.cache and an icon-theme.cache behind)
    assert [p for p in (tmp_path / "share").rglob("*") if not p.is_dir()] == []


def test_a_relative_exec_is_written_absolute(tmp_path):
    """The menu starts the program from $HOME: `--exec dist/x` must not stay relative to where it was typed."""
    program = tmp_path / "here" / "dist" / "transformer-explorer"
    program.parent.mkdir(parents=True)
    r = run_install(tmp_path / "share", "--exec", "dist/transformer-explorer", cwd=tmp_path / "here")
    assert r.returncode == 0, r.stderr
    fields = entry_fields(tmp_path / "share" / "applications" / "transformer-explorer.desktop")
    assert fields["Exec"] == f"{program} %f" and fields["TryExec"] == str(program)


def test_what_the_script_did_not_write_is_left_alone(tmp_path):
    """A user's own entry of the same name is neither replaced nor removed; an icon that is not the
    shipped one survives --uninstall."""
    share = tmp_path / "share"
    entry = share / "applications" / "transformer-explorer.desktop"
    entry.parent.mkdir(parents=True)
    own = "[Desktop Entry]\nType=Application\nName=My own launcher\nExec=my-te\n"
    entry.write_text(own, encoding="utf-8")
    r = run_install(share, "--exec", "/usr/bin/transformer-explorer")
    assert r.returncode == 1 and "did not write it" in r.stderr
    r = run_install(share, "--uninstall")
    assert r.returncode == 0 and "left" in r.stderr
    assert entry.read_text(encoding="utf-8") == own

    entry.unlink()
    assert run_install(share, "--exec", "/usr/bin/transformer-explorer").returncode == 0
    other_icon = share / "icons" / "hicolor" / "48x48" / "apps" / "transformer-explorer.png"
    other_icon.write_bytes(b"not the shipped icon")
    assert run_install(share, "--uninstall").returncode == 0
    assert not entry.exists()
    assert [p.relative_to(share) for p in share.rglob("*") if not p.is_dir()] == [other_icon.relative_to(share)]


def test_the_entry_launches_its_own_environments_program_by_default(tmp_path, monkeypatch):
    """No --exec: the `transformer-explorer` beside the Python that installs (a venv's bin/), not another on PATH."""
    from desktop_app import desktop_entry

    bin_dir = tmp_path / "venv 1" / "bin"
    bin_dir.mkdir(parents=True)
    program = bin_dir / "transformer-explorer"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setattr(desktop_entry.sys, "executable", str(bin_dir / "python"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert desktop_entry.run(uninstalling=False, prefix=tmp_path / "share") == 0
    fields = entry_fields(tmp_path / "share" / "applications" / "transformer-explorer.desktop")
    assert fields["Exec"] == f'"{program}" %f' and fields["TryExec"] == str(program)


def test_exec_arguments_are_written_as_the_spec_reads_them():
    """Quoted with ", `, $ and \\ escaped inside, % doubled, then the string's \\ escape (read first)."""
    from desktop_app.desktop_entry import exec_argument

    assert exec_argument("/usr/bin/te") == "/usr/bin/te"
    assert exec_argument("/a b/te") == '"/a b/te"'
    assert exec_argument("/a$b/100%") == '"/a\\\\$b/100%%"'
    assert exec_argument('/a\\b') == '"/a\\\\\\\\b"'


def test_installed_entry_passes_desktop_file_validate(tmp_path):
    validator = shutil.which("desktop-file-validate")
    if validator is None:
        pytest.skip("desktop-file-validate not installed (apt-get install desktop-file-utils)")
    r = run_install(tmp_path / "share", "--exec", "/usr/bin/transformer-explorer")
    assert r.returncode == 0, r.stderr
    entry = tmp_path / "share" / "applications" / "transformer-explorer.desktop"
    v = subprocess.run([validator, str(entry)], capture_output=True, text=True, timeout=120)
    assert v.returncode == 0 and "error" not in v.stdout + v.stderr, v.stdout + v.stderr


def test_validator_would_catch_a_broken_entry(tmp_path):
    """The validation test can fail: a broken entry (no Name, bad Type) is rejected."""
    validator = shutil.which("desktop-file-validate")
    if validator is None:
        pytest.skip("desktop-file-validate not installed")
    bad = tmp_path / "bad.desktop"
    bad.write_text("[Desktop Entry]\nType=Program\nExec=x\n", encoding="utf-8")
    assert subprocess.run([validator, str(bad)], capture_output=True, timeout=120).returncode != 0
