#!/bin/sh
# Build the one-folder bundle with PyInstaller, then smoke-test it: the bundled executable renders
# its main window offscreen on the embedded demo model (--screenshot) and must exit 0.
#
#   packaging/build_bundle.sh [PYTHON]      (default: .venv/bin/python, else python3)
#
# Needs the `package` extra: pip install -e '.[package]'. Output: dist/transformer-explorer/.
set -eu

repo=$(cd "$(dirname "$0")/.." && pwd)
python=${1:-}
if [ -z "$python" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi
cd "$repo"
"$python" -m PyInstaller --version >/dev/null 2>&1 || {
    echo "build_bundle.sh: PyInstaller is missing: $python -m pip install -e '.[package]'" >&2; exit 1; }

"$python" -m PyInstaller --noconfirm --clean --log-level WARN \
    --distpath "$repo/dist" --workpath "$repo/build/pyinstaller" packaging/transformer-explorer.spec

app="$repo/dist/transformer-explorer"
echo "bundle: $app ($(du -sh "$app" | cut -f1))"
shot=$(mktemp -d)/bundle-smoke.png
QT_QPA_PLATFORM=offscreen XDG_DATA_HOME=$(dirname "$shot") XDG_CONFIG_HOME=$(dirname "$shot") \
    "$app/transformer-explorer" --screenshot "$shot"
test -s "$shot"
echo "smoke test passed: $shot"
