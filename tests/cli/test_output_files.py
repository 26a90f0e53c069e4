"""Issue 25 §2, bullet 3: one rule for every named output FILE (core.files.check_output_file).

An existing file is kept byte for byte unless --overwrite is given; a symbolic link or a special file
(a fifo here) is refused with or without --overwrite, and the link's target is never touched. The same
in every command that writes a named file, and in the GUI's export path (ui/widgets/export.py).
"""
from __future__ import annotations

import os

import pytest

from desktop_app.cli import EXIT_INPUT, build_parser, main
from desktop_app.commands.args import OVERWRITE_HELP
from desktop_app.commands.export import EXPORT_OVERWRITE_HELP

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MINE = b"the user's own file\n"


# each command that writes a named file: (its arguments up to the output option, the option, a file name)
def _commands(model: str) -> dict[str, tuple[list[str], str, str]]:
    return {
        "trace": (["trace", model, "--ids", "1,2", "--out"], "--out", "t.npz"),
        "render": (["render", model, "--ids", "1,2", "--view", "attention", "--size", "200x150", "--out"], "--out",
                   "r.png"),
        "lipschitz": (["lipschitz", "--synthetic", "--d", "2", "--lengths", "2,3", "--samples", "1", "--csv"], "--csv",
                      "l.csv"),
        "dynamics": (["dynamics", "--n", "3", "--d", "2", "--steps", "1", "--csv"], "--csv", "d.csv"),
        "dynamics-positions": (["dynamics", "--n", "3", "--d", "2", "--steps", "1", "--csv", "{tmp}/other.csv",
                                "--positions"], "--positions", "p.npz"),
        "attribute": (["attribute", model, "--ids", "1,2", "--token-id", "1", "--csv"], "--csv", "a.csv"),
        "patch": (["patch", model, "--clean-ids", "1,2", "--corrupted-ids", "2,1", "--answer-id", "1", "--csv"], "--csv",
                  "c.csv"),
    }


NAMES = ("trace", "render", "lipschitz", "dynamics", "dynamics-positions", "attribute", "patch")


def _run(model, tmp_path, command, out, *extra):
    argv, _, _ = _commands(str(model))[command]
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    return main([*argv, str(out), *extra])


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("command", NAMES)
def test_an_existing_file_is_kept_unless_overwrite(command, one_layer_gpt2_dir, tmp_path, capsys):
    out = tmp_path / _commands("m")[command][2]
    out.write_bytes(MINE)
    assert _run(one_layer_gpt2_dir, tmp_path, command, out) == EXIT_INPUT
    assert _one_line(capsys.readouterr().err) == f"error: {out} exists; pass --overwrite to replace it"
    assert out.read_bytes() == MINE
    (tmp_path / "other.csv").unlink(missing_ok=True)
    assert _run(one_layer_gpt2_dir, tmp_path, command, out, "--overwrite") == 0, capsys.readouterr().err
    assert out.read_bytes() != MINE and out.stat().st_size > 0 and not out.is_symlink()


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("command", NAMES)
def test_a_symlink_is_never_written_through_or_replaced(command, overwrite, one_layer_gpt2_dir, tmp_path, capsys):
    target = tmp_path / "precious.txt"
    target.write_bytes(MINE)
    out = tmp_path / _commands("m")[command][2]
    out.symlink_to(target)
    code = _run(one_layer_gpt2_dir, tmp_path, command, out, *(["--overwrite"] if overwrite else []))
    line = _one_line(capsys.readouterr().err)
    assert code == EXIT_INPUT and line.startswith(f"error: {out} is a symbolic link"), line
    assert out.is_symlink() and os.readlink(out) == str(target) and target.read_bytes() == MINE


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no fifos here")
@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("command", NAMES)
def test_a_fifo_is_never_written(command, overwrite, one_layer_gpt2_dir, tmp_path, capsys):
    import stat

    out = tmp_path / _commands("m")[command][2]
    os.mkfifo(out)  # a writer opening it would block until a reader comes: refused before that
    code = _run(one_layer_gpt2_dir, tmp_path, command, out, *(["--overwrite"] if overwrite else []))
    line = _one_line(capsys.readouterr().err)
    assert code == EXIT_INPUT and line.startswith(f"error: {out} is a special file"), line
    assert stat.S_ISFIFO(os.lstat(out).st_mode)


def test_every_command_writing_a_file_documents_the_rule():
    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    writers = {name for name, p in sub.choices.items()
               if any(o in ("--out", "--csv") for a in p._actions for o in a.option_strings)} - {"train"}
    assert writers == {"trace", "render", "lipschitz", "dynamics", "attribute", "patch", "features", "scrub", "graph",
                       "export"}
    for name in writers:
        helps = [a.help for a in sub.choices[name]._actions if "--overwrite" in a.option_strings]
        assert helps == [EXPORT_OVERWRITE_HELP if name == "export" else OVERWRITE_HELP], name
        assert "--overwrite" in sub.choices[name].format_help()


# -- the GUI's export path: its save dialog asks about replacing; a link or special file is refused --


class _View:
    def export_arrays(self):
        import numpy as np
        return {"x": np.arange(3)}


def test_gui_export_refuses_a_symlink_and_a_fifo(tmp_path):
    from desktop_app.core.files import OutputFileError
    from desktop_app.ui.widgets.export import export_view

    target = tmp_path / "precious.npz"
    target.write_bytes(MINE)
    link = tmp_path / "link.npz"
    link.symlink_to(target)
    with pytest.raises(OutputFileError, match="is a symbolic link"):
        export_view(_View(), link)
    assert target.read_bytes() == MINE and link.is_symlink()
    fifo = tmp_path / "fifo.npz"
    os.mkfifo(fifo)
    with pytest.raises(OutputFileError, match="is a special file"):
        export_view(_View(), fifo)
    existing = tmp_path / "mine.npz"  # the dialog asked already: an existing regular file is replaced
    existing.write_bytes(MINE)
    export_view(_View(), existing)
    assert existing.read_bytes() != MINE


def test_the_export_bar_refuses_a_symlink_in_one_line(qtbot, tmp_path, monkeypatch):
    """Clicked: Data on a view whose chosen file is a link to the user's file says so and writes nothing."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QLabel, QToolButton

    from desktop_app.ui.widgets import export

    class View(_View):
        label = QLabel("x")

        def export_widget(self):
            return self.label

    view = View()
    bar = export.ExportBar(lambda: view, lambda: "view")
    qtbot.addWidget(bar)
    target = tmp_path / "precious.npz"
    target.write_bytes(MINE)
    link = tmp_path / "link.npz"
    link.symlink_to(target)
    monkeypatch.setattr(export, "ask_save_path", lambda *a, **k: str(link))
    said = []
    monkeypatch.setattr(bar, "_message_box", type("Box", (), {"warning": staticmethod(
        lambda parent, title, text: said.append(text))}))
    data = next(b for b in bar.findChildren(QToolButton) if b.text() == "Data")
    qtbot.mouseClick(data, Qt.MouseButton.LeftButton)
    assert len(said) == 1 and said[0].startswith(f"{link} is a symbolic link") and "\n" not in said[0]
    assert target.read_bytes() == MINE and link.is_symlink()
