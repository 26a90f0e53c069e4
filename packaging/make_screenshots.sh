#!/bin/sh
# The README's screenshots of single panels, made by the app's own --screenshot mode on the demo model
# (offscreen, fresh settings), for the README.
#
#   packaging/make_screenshots.sh [OUTDIR]     (default: docs/screenshots; files <panel>.png: model, generate,
#                                               attention, layers, lipschitz, train)
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
# one panel title per line ("What if" has a space); the file is named after it with '-' for spaces
panels=$("$python" -c "from desktop_app.ui.panels import PANELS; print('\n'.join(t.lower() for t, _, _ in PANELS))")
# Attention and Layers show 200 tokens of Alice (the start of chapter I), the others the default text.
text200=$("$python" - <<'PY'
from desktop_app.core.checkpoints import load_model_folder
from desktop_app.paths import demo_model_dir, demo_text_path
tok = load_model_folder(demo_model_dir()).tokenizer
text = demo_text_path().read_text(encoding="utf-8")
text = " ".join(text[text.index("Alice was beginning"):].split())
print(tok.decode(tok.encode(text)[:200]))
PY
)
echo "$panels" | while IFS= read -r panel; do
    # the README's shots of the panels alone: Features, Graph, What if and Dynamics are made by make_*_figures.py
    # into the same folder (their features.png, graph.png here would overwrite them), and on the (text) demo
    # model --panel image is refused
    case "$panel" in
        attention|layers) set -- --text "$text200" ;;
        model|generate|lipschitz|train) set -- ;;
        *) continue ;;
    esac
    file=$(echo "$panel" | tr ' ' '-')
    QT_QPA_PLATFORM=offscreen XDG_DATA_HOME="$home" XDG_CONFIG_HOME="$home" \
        "$python" -m desktop_app --panel "$panel" --timeout 240 "$@" --screenshot "$out/$file.png" </dev/null
done
