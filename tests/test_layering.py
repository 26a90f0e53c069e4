"""The layering contract (DESIGN.md, issue 26) and no import circle, read from the source.

Every module under desktop_app/ is parsed with `ast`; every import in it counts, at module level and
inside functions alike (an import deferred into a function is still a dependency, only a later one),
relative imports resolved. From that graph:

- core/ imports neither Qt nor the layers above it (app/, ui/, commands/, cli);
- app/ (the Qt-free use cases) imports neither ui/ nor commands/ nor Qt;
- ui/ never imports commands/, and commands/ imports ui/ only in `render` (it draws panels to files):
  what both front ends need lives in app/;
- no module below the front ends (core/, app/, ui/, commands/) imports desktop_app.cli, the CLI's entry
  point: what the GUI and the commands share with it (command names, exit statuses) is in app/command_line.py;
- ui/ runs no model forward (no `<x>.model(x)`, `.forward(x)` or `.run_with_trace(x)` call): the
  forward passes the panels show are in app/ or core/, run by the panels in workers;
- no import circle: no strongly connected component of more than one module.

Each failure names the importing file, its line and the imported module (a circle is printed as a
chain of such imports).
"""
from __future__ import annotations

import ast
from collections import deque
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "desktop_app"
QT = ("PySide6", "pyqtgraph", "shiboken6", "PyQt5", "PyQt6")

def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@lru_cache(maxsize=1)
def sources() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def _resolve(name: str, modules: dict[str, Path]) -> str:
    """The most specific module of ours that `name` lies in (a.b.C -> a.b), or `name` as it is."""
    while name and name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports_of(module: str, path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement in the file, wherever it stands."""
    modules = sources()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(_resolve(a.name, modules), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                full = f"{target}.{alias.name}"
                found.append((full if full in modules else _resolve(target, modules), node.lineno))
    return found


@lru_cache(maxsize=1)
def graph() -> dict[str, dict[str, int]]:
    """module -> {imported module (ours, or an outside top-level name): first line importing it}."""
    edges: dict[str, dict[str, int]] = {}
    for module, path in sources().items():
        out: dict[str, int] = {}
        for target, line in imports_of(module, path):
            if not target.startswith(PACKAGE):
                target = target.split(".")[0]
            if target != module:
                out.setdefault(target, line)
        edges[module] = out
    return edges


def where(src: str, dst: str) -> str:
    path = sources()[src].relative_to(ROOT)
    return f"{path}:{graph()[src][dst]} imports {dst}"


def in_layer(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


def offenders(src_layer: str, forbidden: tuple[str, ...]) -> list[str]:
    return [where(src, dst) for src, targets in graph().items() if in_layer(src, src_layer)
            for dst in targets if any(in_layer(dst, f) for f in forbidden)]


def test_the_graph_sees_module_and_function_level_and_relative_imports():
    g = graph()
    assert "desktop_app.core.config" in g["desktop_app.core.model"]  # `from .config import ModelConfig`
    assert "torch" in g["desktop_app.core.model"]
    # function-level imports count: the CLI defers its heavy imports into functions
    assert any(dst.startswith("desktop_app.commands") for dst in g["desktop_app.cli"])
    # `from . import bert` in a package's __init__ is an import of the submodule
    assert "desktop_app.core.families.bert" in g["desktop_app.core.families"]


def test_core_imports_no_qt_and_no_layer_above_it():
    up = tuple(f"{PACKAGE}.{x}" for x in ("ui", "commands", "app", "cli", "__main__")) + QT
    assert offenders(f"{PACKAGE}.core", up) == []


def test_app_layer_imports_neither_ui_nor_commands_nor_qt():
    forbidden = tuple(f"{PACKAGE}.{x}" for x in ("ui", "commands", "cli", "__main__")) + QT
    assert offenders(f"{PACKAGE}.app", forbidden) == []


# commands/ -> ui/: `render` draws a panel offscreen to a file (the one documented exception, issue 26)
RENDER_DRAWS_PANELS = f"{PACKAGE}.commands.render"


def test_ui_never_imports_commands():
    """ui/ never imports commands/: what the GUI and the CLI both need lives in app/ (or core/)."""
    assert offenders(f"{PACKAGE}.ui", (f"{PACKAGE}.commands",)) == [], \
        "ui/ must not import commands/: put what both front ends need in desktop_app/app/"


def test_commands_import_ui_only_to_render():
    found = [where(src, dst) for src, targets in graph().items() if in_layer(src, f"{PACKAGE}.commands")
             and src != RENDER_DRAWS_PANELS for dst in targets if in_layer(dst, f"{PACKAGE}.ui")]
    assert found == [], "commands/ must not import ui/ (only `render` draws panels): use desktop_app/app/"


def test_nothing_below_the_front_ends_imports_the_cli():
    """core/, app/, ui/ and commands/ never import desktop_app.cli (nor __main__): the constants the GUI's
    --help and the commands share with the CLI live in app/command_line.py."""
    cli = (f"{PACKAGE}.cli", f"{PACKAGE}.__main__")
    found = [x for layer in ("core", "app", "ui", "commands") for x in offenders(f"{PACKAGE}.{layer}", cli)]
    assert found == [], "import the shared constants from desktop_app/app/command_line.py instead"


# loaded.model(x), m.forward(x), m.run_with_trace(x): a call with arguments (a Qt view's .model() has none)
FORWARD_CALLS = ("model", "forward", "run_with_trace")


def model_forward_calls(path: Path) -> list[str]:
    """'file:line calls NAME(...)' for every call, with arguments, of an attribute or a name in FORWARD_CALLS."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Call) and (node.args or node.keywords):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in FORWARD_CALLS:
                found.append(f"{path.name}:{node.lineno} calls {name}(...)")
    return found


def test_ui_runs_no_model_forward():
    """The panels draw; the model's forward passes they show are app/'s or core/'s (one line: no call of
    `.model(...)`, `.forward(...)` or `.run_with_trace(...)` anywhere under ui/)."""
    found = [f"{p.parent.relative_to(ROOT)}/{x}" for m, p in sources().items() if in_layer(m, f"{PACKAGE}.ui")
             for x in model_forward_calls(p)]
    assert found == [], "move the forward pass to desktop_app/app/ (the panel runs it in a worker)"


def test_the_forward_rule_sees_a_forward_call(tmp_path):
    source = tmp_path / "panel.py"
    source.write_text("def f(loaded, x):\n    return loaded.model(x)\n")
    assert model_forward_calls(source) == ["panel.py:2 calls model(...)"]


def strongly_connected(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's components of the graph restricted to our modules (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for start in g:
        if start in index:
            continue
        work = [(start, iter(sorted(d for d in g[start] if d in g)))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(d for d in g[child] if d in g))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def a_cycle(g: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """A shortest import chain from the component's first module back to itself."""
    members, start = set(component), component[0]
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for dst in sorted(g[node]):
            if dst == start:
                chain = [node]
                while chain[-1] != start:
                    chain.append(parent[chain[-1]])
                return chain[::-1] + [start]
            if dst in members and dst not in parent:
                parent[dst] = node
                queue.append(dst)
    return component


def test_no_import_circle():
    g = graph()
    circles = [c for c in strongly_connected(g) if len(c) > 1]
    report = []
    for component in circles:
        chain = a_cycle(g, component)
        report.append(f"{len(component)} modules in a circle, e.g.:\n    "
                      + "\n    ".join(where(a, b) for a, b in zip(chain, chain[1:])))
    assert not circles, "import circle(s):\n" + "\n".join(report)


def test_a_circle_is_found_and_printed():
    g = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1, "d": 1}, "d": {}}
    assert [c for c in strongly_connected(g) if len(c) > 1] == [["a", "b", "c"]]
    assert a_cycle(g, ["a", "b", "c"]) == ["a", "b", "c", "a"]


def test_model_config_needs_no_family_module():
    """ModelConfig sits below the families: building and validating one (the classic presets too)
    imports no family module, no registry, no model code."""
    import subprocess
    import sys
    code = ("import sys\n"
            "from desktop_app.core.config import ModelConfig\n"
            "cfg = ModelConfig.llama(n_heads=4, n_kv_heads=2, sliding_window=3)\n"
            "assert ModelConfig.gpt2() == ModelConfig() and ModelConfig.bert().causal is False\n"
            "assert cfg.layer_window(0) == 3\n"
            "print(sorted(m for m in sys.modules if m.startswith('desktop_app.core.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['desktop_app.core.config']"


def test_an_unknown_family_is_refused_where_families_are_looked_up(tmp_path):
    """ModelConfig no longer checks `family` against the registry; the registry does, by name, where a
    family is looked up: a folder whose config names an unknown family is one ModelLoadError."""
    import json

    import pytest

    from desktop_app.core.checkpoints import CONFIG, ModelLoadError, load_model_folder, new_model, save_model_folder
    from desktop_app.core.config import ConfigError, ModelConfig
    from desktop_app.core.families import REGISTRY, family_of

    cfg = ModelConfig.gpt2(vocab_size=20, d_model=8, n_layers=1, n_heads=2, d_ff=16, context_length=8)
    save_model_folder(new_model(cfg, seed=0), tmp_path / "m")
    assert family_of(cfg) is REGISTRY["gpt2"]
    with pytest.raises(ConfigError, match="unknown family 'mamba' \\(known: gpt2, bert"):
        family_of(cfg.replace(family="mamba"))
    d = json.loads((tmp_path / "m" / CONFIG).read_text())
    d["transformer_explorer"]["family"] = "mamba"
    (tmp_path / "m" / CONFIG).write_text(json.dumps(d))
    with pytest.raises(ModelLoadError, match="config.json: invalid configuration: unknown family 'mamba'"):
        load_model_folder(tmp_path / "m")
