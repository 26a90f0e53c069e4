"""Issue 25, probes beyond its list (output paths): an output FILE named with a trailing separator
(`--out /tmp/new/`) wrote a FILE called /tmp/new, since Path() drops the slash; `--out ""` said "cannot
write .: is a folder" with exit 4. Both are bad input: one line, exit 2, nothing written, in every
command that writes a named file (the one rule: core.files.check_output_file)."""
from __future__ import annotations

import os

import pytest

from desktop_app.cli import EXIT_INPUT, main
from desktop_app.core.files import OutputFileError, check_output_file

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# each command that writes a named file, up to its output option
COMMANDS = {
    "trace": ["trace", "{model}", "--ids", "1,2", "--out"],
    "lipschitz": ["lipschitz", "--synthetic", "--d", "2", "--lengths", "2,3", "--samples", "1", "--csv"],
    "dynamics": ["dynamics", "--n", "3", "--d", "2", "--steps", "1", "--csv"],
    "attribute": ["attribute", "{model}", "--ids", "1,2", "--token-id", "1", "--csv"],
    "patch": ["patch", "{model}", "--clean-ids", "1,2", "--corrupted-ids", "2,1", "--answer-id", "1", "--csv"],
}


def _run(command, model, out) -> int:
    return main([a.replace("{model}", str(model)) for a in COMMANDS[command]] + [out])


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_output_name_ending_in_a_separator_names_a_folder(command, one_layer_gpt2_dir, tmp_path, capsys):
    out = str(tmp_path / "new") + os.sep
    assert _run(command, one_layer_gpt2_dir, out) == EXIT_INPUT
    assert _one_line(capsys.readouterr().err) == f"error: {out} ends in {os.sep!r}, so it names a folder: give a file name"
    assert not (tmp_path / "new").exists()  # neither a file called "new" nor a folder


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_empty_output_name_is_bad_input(command, one_layer_gpt2_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _run(command, one_layer_gpt2_dir, "") == EXIT_INPUT
    assert _one_line(capsys.readouterr().err) == "error: the output file name is empty: give a file name"
    assert os.listdir(tmp_path) == []


def test_the_rule_is_check_output_file(tmp_path):
    for bad in ("", str(tmp_path / "x") + "/"):
        with pytest.raises(OutputFileError):
            check_output_file(bad)
        with pytest.raises(OutputFileError):
            check_output_file(bad, overwrite=True)  # the check just before the write, too
    assert check_output_file(str(tmp_path / "x")) == tmp_path / "x"  # a plain new name is still fine
