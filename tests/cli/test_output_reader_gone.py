"""A command whose output's reader has gone (`te-cli families | head -3`) ends quietly with a shell's SIGPIPE
status: it printed "error: Broken pipe" (or Python's "Exception ignored ... BrokenPipeError")."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("argv", [["families"], ["families", "--json"]], ids=["table", "json"])
def test_a_command_whose_reader_has_gone_ends_without_an_error_line(argv):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-m", "desktop_app", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, cwd=REPO)
    p.stdout.close()  # the reader goes before the command writes anything (its start takes far longer)
    err = p.stderr.read().decode()
    rc = p.wait(timeout=120)
    assert err == "" and rc == 141, (rc, err)
