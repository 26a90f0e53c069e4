"""The CLI's one-line refusal, as the tests of bad input read it."""
from __future__ import annotations

from desktop_app.cli import main


def refused(argv, capsys) -> str:
    """The command's one line on stderr (exit 2, no traceback)."""
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    return lines[0]
