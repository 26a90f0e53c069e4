#!/usr/bin/env bash
# Builds the separate virtual environment that holds circuit-tracer 0.5.0, the reference the attribution-graph
# parity test (tests/reference/) and `bench graph` compare against. It cannot share the app's environment:
# circuit-tracer 0.5.0 pins transformers <= 4.57.3 and needs nnsight >= 0.6.
#
#   packaging/circuit_tracer_env.sh [ENV_DIR]        (default: $CIRCUIT_TRACER_ENV, else /work/ctenv)
#
# Idempotent: a second run checks the environment and reinstalls only what is missing. torch is pinned to
# 2.13.0 on the same pip line as circuit-tracer so pip never swaps in another torch (a CUDA build would pull
# gigabytes of nvidia-* wheels); the script fails if any nvidia-* package ends up installed. Here pip finds the
# CPU wheel (2.13.0+cpu) among its configured local wheels; on a machine without one, point pip at PyTorch's CPU
# index: TORCH_INDEX=https://download.pytorch.org/whl/cpu packaging/circuit_tracer_env.sh
set -euo pipefail

ENV_DIR="${1:-${CIRCUIT_TRACER_ENV:-/work/ctenv}}"
PYTHON="${PYTHON:-python3.11}"
# what circuit-tracer 0.5.0 declares (its wheel's METADATA), resolved with the torch the app uses
PACKAGES=(
    "circuit-tracer==0.5.0"
    "torch==2.13.0"
    "transformers>=4.56.0,<=4.57.3"
    "nnsight>=0.6.0,<0.7"
    "pytest"
)

if [ ! -x "$ENV_DIR/bin/python" ]; then
    echo "creating $ENV_DIR with $($PYTHON --version)"
    "$PYTHON" -m venv "$ENV_DIR"
fi

if "$ENV_DIR/bin/python" - <<'EOF' 2>/dev/null
import importlib.metadata as md
assert md.version("circuit-tracer") == "0.5.0"
assert md.version("torch").split("+")[0] == "2.13.0"
import circuit_tracer, nnsight, transformers  # noqa: F401  (imports resolve: the environment is whole)
EOF
then
    echo "$ENV_DIR already holds circuit-tracer 0.5.0 with torch 2.13.0"
else
    LOG="$ENV_DIR/pip-install.log"
    EXTRA=()
    if [ -n "${TORCH_INDEX:-}" ]; then EXTRA=(--extra-index-url "$TORCH_INDEX"); fi
    "$ENV_DIR/bin/python" -m pip install ${EXTRA[@]+"${EXTRA[@]}"} "${PACKAGES[@]}" 2>&1 | tee "$LOG"
    if grep -qiE "(Downloading|Collecting) nvidia-" "$LOG"; then
        echo "error: pip fetched nvidia-* wheels (see $LOG): a CUDA torch was resolved" >&2
        exit 1
    fi
fi

if "$ENV_DIR/bin/python" -m pip list 2>/dev/null | grep -qi "^nvidia-"; then
    echo "error: $ENV_DIR holds nvidia-* packages: a CUDA torch was installed" >&2
    exit 1
fi
"$ENV_DIR/bin/python" -c "import circuit_tracer, nnsight, torch, transformers; \
print('circuit-tracer env ok:', '$ENV_DIR', 'torch', torch.__version__, 'transformers', transformers.__version__, \
'nnsight', nnsight.__version__)"
