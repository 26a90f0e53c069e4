#!/bin/sh
# Install (or remove) Transformer Explorer's desktop entry and icons for the current user.
#
#   packaging/install_desktop_entry.sh [--exec PROGRAM] [--prefix DIR] [--uninstall]
#
# PROGRAM (the executable to launch) defaults to the `transformer-explorer` of this checkout's .venv or on
# PATH, else this checkout's .venv python running `-m desktop_app`, else the PyInstaller bundle in dist/. DIR
# defaults to ${XDG_DATA_HOME:-~/.local/share}. Nothing is written outside DIR.
# The entry it writes carries a marker line; --uninstall removes an entry only with that marker and
# icons only when they are the ones shipped here, and an entry without the marker is never replaced.
# The work is desktop_app/desktop_entry.py's (an installed package: transformer-explorer --install-desktop-entry).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
if [ -x "$repo/.venv/bin/python" ]; then
    python="$repo/.venv/bin/python"
elif command -v python3 >/dev/null 2>&1; then
    python=python3
else
    echo "install_desktop_entry.sh: no python3 found" >&2; exit 1
fi
case " $* " in
    *" --exec "*|*" --uninstall "*|*" -h "*|*" --help "*) ;;
    *)  # no environment with the app here: the bundle built in dist/
        if [ "$python" = python3 ] && ! command -v transformer-explorer >/dev/null 2>&1 \
                && [ -x "$repo/dist/transformer-explorer/transformer-explorer" ]; then
            set -- --exec "$repo/dist/transformer-explorer/transformer-explorer" "$@"
        fi ;;
esac
# this checkout's package first on the path, whatever the folder it is run from
exec "$python" -c 'import sys; sys.path.insert(0, sys.argv.pop(1))
from desktop_app.desktop_entry import main
sys.exit(main(sys.argv[1:], prog="install_desktop_entry.sh"))' "$repo" "$@"
