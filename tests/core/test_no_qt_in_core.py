"""core/ is the science layer: it must never import Qt (DESIGN.md)."""
import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "desktop_app" / "core"
QT = ("PySide6", "pyqtgraph", "shiboken6", "PyQt5", "PyQt6")


def test_no_qt_import_statement_under_core():
    offenders = []
    for path in CORE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in QT]
    assert offenders == []


def test_importing_every_core_module_loads_no_qt():
    modules = [f"desktop_app.core.{p.stem}" for p in CORE.glob("*.py") if p.stem != "__init__"]
    if (CORE / "training").is_dir():
        modules.append("desktop_app.core.training")
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {QT!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
