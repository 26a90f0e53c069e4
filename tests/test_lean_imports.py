"""What a process imports on the paths people wait for (issue 38): start-up and the headless commands.

Each check runs in a fresh Python process and reads its sys.modules, so an import added anywhere on the
path (a module-level import, or a torch function that imports a subsystem on first use, as
torch.broadcast_shapes imports torch.fx's symbolic shapes and sympy: ~1.4 s) fails here.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "resources" / "demo-model"

# torch itself imports a few torch.fx modules (torch.nested needs one): only what comes after it counts
HEAVY_AFTER_TORCH = ("sympy", "torch.fx", "torch._refs", "torch._dynamo", "torch._inductor")
NOT_IN_THE_CLI = ("PySide6", "shiboken6", "pyqtgraph", "transformers")
# imported only where needed: numpy.ma (np.unique imports it), the sparse dictionaries' package (once one is attached)
LAZY_AT_START = ("numpy.ma", "desktop_app.core.features")
# a command's own lazy imports: What if's module only for an encoder-decoder's decoder or cross stack
LAZY_IN = {"lipschitz": ("numpy.ma", "desktop_app.app.whatif")}


def _env(tmp_path: Path) -> dict:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_DATA_HOME=str(tmp_path / "data"),
               XDG_CONFIG_HOME=str(tmp_path / "config"))
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _modules_after(code: str, tmp_path: Path) -> dict:
    """Runs `code` after `import torch` in a fresh process: {"rc": ..., "new": modules imported after torch}."""
    script = ("import json, sys, torch\nbefore = set(sys.modules)\n" + code
              + "\nprint(json.dumps({'rc': rc, 'new': sorted(set(sys.modules) - before)}))\n")
    r = subprocess.run([sys.executable, "-c", script], env=_env(tmp_path), cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _heavy(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


def test_opening_the_demo_model_and_tracing_it_imports_no_sympy_or_torch_fx(tmp_path):
    """The GUI started on the demo model until its text is traced (bench startup's 'ready')."""
    out = _modules_after(f"sys.argv = ['desktop_app', {str(DEMO)!r}, '--quit-when-ready']\n"
                         "from desktop_app.ui.app import main\nrc = main()", tmp_path)
    assert out["rc"] == 0
    assert "desktop_app.core.attention" in out["new"]  # the trace ran
    assert _heavy(out["new"], HEAVY_AFTER_TORCH) == []
    # made lazy for start-up: the sparse dictionaries' package (only once one is attached), numpy.ma
    assert _heavy(out["new"], LAZY_AT_START) == []


def test_the_gui_imports_torch_past_pyside6s_import_hook_and_without_garbage_collection(tmp_path):
    """Once PySide6 is imported, its import hook reads the source of every module imported after it (looking
    for "PySide6"): ~0.5 s of CPU for torch's ~1,100 modules at start-up. The GUI imports torch past the hook
    (ui/app.import_torch), so only the few modules imported by name afterwards (`import torch` in the app's
    own modules) are read by it. No full garbage collection runs while torch imports (three did, walking
    every object made so far) and what the imports made is frozen (gc.freeze) so none walks it later."""
    script = ("import gc, json, sys\nfull = []\n"
              "gc.callbacks.append(lambda phase, info: full.append(1) if phase == 'stop' and info['generation'] == 2 "
              "else None)\n"
              f"sys.argv = ['desktop_app', {str(DEMO)!r}, '--quit-when-ready']\n"
              "from desktop_app.ui.app import main\nrc = main()\n"
              "import shibokensupport.feature as feature\n"
              "torch_modules = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
              "read = [m for m in feature.pyside_feature_dict if m == 'torch' or m.startswith('torch.')]\n"
              "print(json.dumps({'rc': rc, 'torch': len(torch_modules), 'read': read, 'full_collections': len(full),"
              " 'frozen': gc.get_freeze_count()}))\n")
    r = subprocess.run([sys.executable, "-c", script], env=_env(tmp_path), cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["rc"] == 0
    assert out["torch"] > 500  # torch is imported whole...
    assert len(out["read"]) < 20, out["read"]  # ...but its modules were not read by the hook (~600 before)
    assert out["full_collections"] == 0  # three before, 0.1-0.6 s each on a busy machine
    assert out["frozen"] > 100_000  # torch's and Qt's objects, out of every later collection's way


def test_a_cli_run_imports_without_garbage_collection(tmp_path):
    """The CLI builds its parser (importing torch) with garbage collection off and freezes what it made
    (cli.parse_args): three full collections ran during the imports, ~0.8 s at load 11 of a Lipschitz run."""
    command = ["lipschitz", str(DEMO), "--lengths", "8,16", "--samples", "1", "--csv", "out.csv"]
    script = ("import gc, json, sys\nfull = []\n"
              "gc.callbacks.append(lambda phase, info: full.append(1) if phase == 'stop' and info['generation'] == 2 "
              "else None)\n"
              f"sys.argv = ['desktop_app'] + {command!r}\n"
              "from desktop_app.__main__ import main\nrc = main()\n"
              "print(json.dumps({'rc': rc, 'full_collections': len(full), 'frozen': gc.get_freeze_count()}))\n")
    r = subprocess.run([sys.executable, "-c", script], env=_env(tmp_path), cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["rc"] == 0
    assert out["full_collections"] == 0
    assert out["frozen"] > 100_000


@pytest.mark.parametrize("command", [
    ["lipschitz", str(DEMO), "--lengths", "8,16", "--samples", "1", "--csv", "out.csv"],
    ["trace", str(DEMO), "--text", "The cat sat.", "--out", "trace.npz"],
    ["generate", str(DEMO), "--prompt", "The cat", "--max-new", "3"],
], ids=lambda c: c[0])
def test_the_cli_path_imports_no_qt_nor_transformers(tmp_path, command):
    out = _modules_after(f"sys.argv = ['desktop_app'] + {command!r}\n"
                         "from desktop_app.__main__ import main\nrc = main()", tmp_path)
    assert out["rc"] == 0
    assert f"desktop_app.commands.{command[0]}" in out["new"]
    assert _heavy(out["new"], NOT_IN_THE_CLI + HEAVY_AFTER_TORCH + LAZY_IN.get(command[0], ())) == []
    # the parser is the command's own: the other commands' modules (and what their options import) stay out
    other_commands = [m for m in out["new"] if m.startswith("desktop_app.commands.")
                      and m not in (f"desktop_app.commands.{command[0]}", "desktop_app.commands.args")]
    assert other_commands == []
