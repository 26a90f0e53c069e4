#!/bin/sh
# Screenshots of every panel, made by the app's own --screenshot mode on the demo model
# (offscreen, fresh settings), for the README.
#
#   packaging/make_screenshots.sh [OUTDIR]     (default: docs/screenshots; files <panel>.png)
#
# Panels with a screenshot_demo() hook first play it (Generate: steps and a forced branch;
# Lipschitz: real against adversarial sweeps; Train: a motif run, shown after four evaluations).
set -eu

repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$repo/docs/screenshots}
python=${PYTHON:-}
if [ -z "$python" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi
mkdir -p "$out"
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
cd "$repo"
panels=$("$python" -c "from desktop_app.ui.panels import PANELS; print(' '.join(t.lower() for t, _, _ in PANELS))")
for panel in $panels; do
    QT_QPA_PLATFORM=offscreen XDG_DATA_HOME="$home" XDG_CONFIG_HOME="$home" \
        "$python" -m desktop_app --panel "$panel" --timeout 240 --screenshot "$out/$panel.png"
done
