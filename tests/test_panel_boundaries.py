"""Panels write the inputs and edits through the state, and never reach into the main window (issue 39), read
from the source with `ast`:

- no module under ui/panels or ui/widgets assigns an input of AppState (`state.text = ...`, `state.loaded = ...`
  ...: the Inputs model's fields, app/inputs.py) or its edits: an assignment would fire the input's event but
  trace nothing; AppState's methods (set_text, set_model(loaded, text=...), edits.add...) do both;
- no panel calls `<widget>.window()` to find the main window (a panel asks for another panel with
  AppState.panel_wanted, and works the same inside a window or alone). (widgets/export.py's status-bar line
  asks Qt for its window's QMainWindow status bar, a Qt idiom any widget may use: widgets are not checked for it.)
"""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from desktop_app.app.inputs import Inputs

ROOT = Path(__file__).resolve().parents[1] / "desktop_app" / "ui"
FILES = sorted([*(ROOT / "panels").rglob("*.py"), *(ROOT / "widgets").rglob("*.py")])
WRITTEN_THROUGH_THE_STATE = {f.name for f in dataclasses.fields(Inputs)} | {"interventions", "edits"}


def _is_state(node: ast.expr) -> bool:
    """`state` or `<anything>.state` (self.state, self.panel.state, p.state)."""
    return (isinstance(node, ast.Name) and node.id == "state") or (isinstance(node, ast.Attribute)
                                                                    and node.attr == "state")


def _offences(source: str, name: str, panel: bool = True) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, name)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(el, ast.Attribute) and el.attr in WRITTEN_THROUGH_THE_STATE and _is_state(el.value):
                    found.append(f"{name}:{node.lineno} assigns state.{el.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "window" \
                and not node.args and not isinstance(node.func.value, ast.Call) and panel:  # palette().window() is a colour
            found.append(f"{name}:{node.lineno} finds its window with .window()")
    return found


def test_the_check_sees_both_kinds_of_offence():
    probe = ("def f(self):\n    self.state.text = 'x'\n    self.panel.state.loaded, y = 1, 2\n"
             "    w = self.panel.window()\n    c = self.palette().window()\n    self.text = 'mine'\n")
    assert _offences(probe, "probe.py") == ["probe.py:2 assigns state.text", "probe.py:3 assigns state.loaded",
                                           "probe.py:4 finds its window with .window()"]


def test_panels_write_inputs_through_the_state_and_never_reach_for_the_main_window():
    assert FILES, ROOT
    found = [o for path in FILES for o in _offences(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)),
                                                    panel=path.parent.name == "panels")]
    assert not found, "\n".join(found)
