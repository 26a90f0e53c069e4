"""The Linux desktop entry (menu launcher) and icons, for the current user: install, and remove only what was installed.

    transformer-explorer --install-desktop-entry      # from any install: a wheel, a checkout, the bundle
    transformer-explorer --uninstall-desktop-entry
    python -m desktop_app.desktop_entry [--exec PROGRAM] [--prefix DIR] [--uninstall]   # packaging/install_desktop_entry.sh

The entry launches PROGRAM: by default this bundle, else the `transformer-explorer` of this Python's environment
(beside it) or on PATH, else this Python with `-m desktop_app`. DIR defaults to ${XDG_DATA_HOME:-~/.local/share};
nothing is written outside it. The entry carries MARKER: an entry of the same name without it (the user's own) is
neither replaced nor removed, and an icon is removed only when it is the shipped one (the same bytes).
Standard library only: packaging/install_desktop_entry.sh runs it with whatever Python it finds.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

NAME = "transformer-explorer"
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
# how an uninstall knows the entry is ours; the value the shell script wrote before, so its entries still are
MARKER = "X-Transformer-Explorer-Installer=install_desktop_entry.sh"
# an Exec= argument holding one of these is double-quoted (Desktop Entry spec, "The Exec key")
RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")


class EntryError(Exception):
    """One line saying why nothing (more) was done."""


def data_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")


def shipped_icons() -> dict[str, Path]:
    """{path under icons/hicolor: the shipped file}."""
    from .paths import resources_dir

    icons = resources_dir() / "icons"
    shipped = {f"scalable/apps/{NAME}.svg": icons / f"{NAME}.svg"}
    shipped.update({f"{s}x{s}/apps/{NAME}.png": icons / f"{NAME}-{s}.png" for s in SIZES})
    return shipped


def default_command() -> list[str]:
    """What the entry launches when no --exec is given (see the module's doc)."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    beside = Path(sys.executable).parent / NAME  # not resolved: a venv's python is a link out of its bin/
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which(NAME)
    if found:
        return [found]
    if importlib.util.find_spec("PySide6") is None:  # this Python cannot run the app
        raise EntryError("no transformer-explorer found; install the package or pass --exec")
    return [sys.executable, "-m", "desktop_app"]


def absolute_program(program: str) -> str:
    """A relative path made absolute (the menu starts programs from $HOME); a bare name stays (PATH)."""
    if os.sep not in program or os.path.isabs(program):
        return program
    folder = os.path.dirname(os.path.abspath(program))
    if not os.path.isdir(folder):
        raise EntryError(f"--exec {program}: its folder does not exist")
    return os.path.join(folder, os.path.basename(program))


def exec_argument(arg: str) -> str:
    """One argument as Exec= holds it: quoted when it has a reserved character (with ", `, $ and \\ escaped
    inside the quotes), % doubled, then the string type's \\ escape, which a reader undoes first."""
    if any(c in "\n\r" for c in arg):
        raise EntryError(f"{arg!r}: a line break cannot be written in a desktop entry")
    if any(c in RESERVED for c in arg):
        arg = '"' + "".join("\\" + c if c in '"`$\\' else c for c in arg) + '"'
    return arg.replace("%", "%%").replace("\\", "\\\\")


def entry_text(command: list[str]) -> str:
    from .paths import resources_dir

    template = (resources_dir() / f"{NAME}.desktop.in").read_text(encoding="utf-8")
    fields = {"@EXEC@": " ".join(exec_argument(a) for a in command),
              "@TRYEXEC@": command[0].replace("\\", "\\\\"), "@ICON@": NAME}
    for key, value in fields.items():
        template = template.replace(key, value)
    return template.rstrip("\n") + "\n" + MARKER + "\n"


def ours(entry: Path) -> bool:
    try:
        return entry.is_file() and MARKER in entry.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return False


def _write(path: Path, data: bytes) -> None:
    """Atomically: the menu (or an icon theme) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.tmp")
    part.write_bytes(data)
    os.replace(part, path)


def _refresh_icon_cache(icons: Path) -> None:
    """Update the user's icon cache if there is one; never create one (it would outlive the uninstall)."""
    tool = shutil.which("gtk-update-icon-cache")
    if (icons / "icon-theme.cache").is_file() and tool:
        subprocess.run([tool, "-q", "-t", str(icons)], capture_output=True, timeout=120)


def install(prefix: Path, command: list[str]) -> list[str]:
    """Write the entry and icons under `prefix`; the lines to say."""
    entry = prefix / "applications" / f"{NAME}.desktop"
    if entry.exists() and not ours(entry):
        raise EntryError(f"{entry} exists and this installer did not write it; move it away first")
    text = entry_text(command)
    validator = shutil.which("desktop-file-validate")
    if validator:
        check = prefix / "applications" / f".{NAME}.check.desktop"
        _write(check, text.encode())
        try:
            done = subprocess.run([validator, str(check)], capture_output=True, text=True, timeout=120)
        finally:
            check.unlink()
        if done.returncode != 0:
            raise EntryError(f"desktop-file-validate refused the entry: {(done.stdout + done.stderr).strip()}")
    icons = prefix / "icons" / "hicolor"
    for where, shipped in shipped_icons().items():
        _write(icons / where, shipped.read_bytes())
    _write(entry, text.encode())
    # no update-desktop-database: it indexes MimeType= only, which this entry has none of (it would leave a
    # mimeinfo.cache behind that an uninstall cannot tell from the user's own)
    _refresh_icon_cache(icons)
    return [f"installed {entry} (Exec={' '.join(exec_argument(a) for a in command)})"]


def uninstall(prefix: Path) -> tuple[list[str], list[str]]:
    """Remove the entry if ours and the icons that are the shipped ones; (lines to say, warnings)."""
    entry = prefix / "applications" / f"{NAME}.desktop"
    said, warned = [], []
    if ours(entry):
        entry.unlink()
        said.append(f"removed {entry}")
    elif entry.exists():
        warned.append(f"left {entry} alone: this installer did not write it")
    icons = prefix / "icons" / "hicolor"
    for where, shipped in shipped_icons().items():
        icon = icons / where
        if icon.is_file() and shipped.is_file() and icon.read_bytes() == shipped.read_bytes():
            icon.unlink()
    _refresh_icon_cache(icons)
    said.append(f"removed its icons from {icons}")
    return said, warned


def run(*, uninstalling: bool, prefix: Path | None = None, program: str | None = None,
        prog: str = "transformer-explorer") -> int:
    """Install or uninstall, saying what was done (stdout) or why not (one line on stderr); the exit status."""
    if not sys.platform.startswith("linux"):
        print(f"{prog}: error: desktop entries are Linux's (freedesktop.org); see docs/packaging.md for macOS "
              "and Windows", file=sys.stderr)
        return 2
    prefix = prefix if prefix is not None else data_home()
    try:
        if uninstalling:
            said, warned = uninstall(prefix)
        else:
            said, warned = install(prefix, [absolute_program(program)] if program else default_command()), []
    except (EntryError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    for line in warned:
        print(f"{prog}: {line}", file=sys.stderr)
    for line in said:
        print(line)
    return 0


def main(argv: list[str] | None = None, prog: str = "python -m desktop_app.desktop_entry") -> int:
    p = argparse.ArgumentParser(prog=prog, description="Install (or remove) Transformer Explorer's desktop entry "
                                                       "and icons for the current user.")
    p.add_argument("--exec", dest="program", metavar="PROGRAM", help="the executable the entry launches")
    p.add_argument("--prefix", type=Path, metavar="DIR", help="where (default ${XDG_DATA_HOME:-~/.local/share})")
    p.add_argument("--uninstall", action="store_true", help="remove the entry and icons this installer wrote")
    args = p.parse_args(argv)
    return run(uninstalling=args.uninstall, prefix=args.prefix, program=args.program, prog=prog)


if __name__ == "__main__":
    sys.exit(main())
