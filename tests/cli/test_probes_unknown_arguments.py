"""Issue 25, probes beyond its list: `generate M --prompt a --max-new-tokens 2` (an option generate does
not have) was refused as "python -m desktop_app: error: unrecognized arguments ... (see python -m
desktop_app --help)": the top parser's name and help, which do not list generate's options. The
subcommand that got the argument refuses it, points at its own --help and names the close option."""
from __future__ import annotations

from pathlib import Path

import pytest

from desktop_app.cli import EXIT_INPUT, build_parser, main


def _refusal(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == EXIT_INPUT
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_an_unknown_option_is_refused_by_its_subcommand_with_the_close_one(capsys):
    err = _refusal(["generate", "resources/demo-model", "--prompt", "a", "--max-new-tokens", "2"], capsys)
    assert err == ("python -m desktop_app generate: error: unrecognized arguments: --max-new-tokens 2 "
                   "(did you mean --max-new?) (see python -m desktop_app generate --help)")


@pytest.mark.parametrize("argv, guess", [
    (["info", "resources/demo-model", "--zzzz"], None),
    (["families", "--zzzz", "1"], None),
    (["generate", "resources/demo-model", "--prompt", "a", "--temprature", "1"], "--temperature"),
    (["lipschitz", "--synthetic", "--lengths", "2,3", "--csv", "l.csv", "--lenghts", "4"], "--lengths"),
])
def test_every_subcommand_names_itself_and_its_help(argv, guess, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [str(Path(__file__).parents[2] / a) if a.startswith("resources/") else a for a in argv]
    err = _refusal(argv, capsys)
    assert err.startswith(f"python -m desktop_app {argv[0]}: error: unrecognized arguments: ") and \
        err.endswith(f"(see python -m desktop_app {argv[0]} --help)"), err
    assert (f"(did you mean {guess}?)" in err) if guess else ("did you mean" not in err), err
    assert list(tmp_path.iterdir()) == []
