#!/usr/bin/env bash
# packaging/gpu_check.sh [OUT_DIR] -- the prepared device check of issue 31: every CUDA path and benchmark
# on a real GPU, in 9 minutes (GPU_CHECK_BUDGET, default 540 s), with the GPU machine's own Python (torch with CUDA, transformers,
# safetensors, tokenizers, numpy, pytest; no PySide6, no pyqtgraph, no registry) and PYTHONPATH=. from
# the repository root. Writes one log per step and gpu_check.json (every step's status and figures) into
# OUT_DIR (default: $OUT when set, else a temporary folder it prints). A step that fails or runs past its
# time box is recorded and the script goes on. Without CUDA (this CPU machine) the CUDA parts are
# recorded as skipped, and the pytest step still checks that the real-device tests collect without Qt.
#
#   PYTHON=.venv/bin/python packaging/gpu_check.sh /tmp/gpu-check   # the interpreter (default python3)
#   GPU_CHECK_QUICK=1 ...                                          # short time boxes (the test of this script)
#   GPU_CHECK_DEVICE=cpu ...                                       # the bench and train steps on the CPU
#                                                                  # (to try their arguments without a GPU)
#   GPU_CHECK_STEPS="bench-scale-8b bench-lipschitz" ...           # a subset (a rerun); env always runs
#   GPU_CHECK_BUDGET=540 ...                                       # seconds for all steps together
#
# Steps, most important first (a step starts only with 20 s of the budget left, and is cut to what is left):
#   pytest-cuda      every cuda-marked test (the files under tests/core and tests/cli that mark one), no Qt
#   bench-scale      Qwen2.5-0.5B shape, 1,024 tokens, --repeat 2 (trace, memory, generation against transformers)
#   bench-scale-8b   Llama-3.1-8B shape, 1,024 tokens, --memory-cap-gb 24 --repeat 1 (16 GB checkpoint drawn on
#                    the card, in a work folder outside OUT_DIR, removed after; needs 20 GB of free disk)
#   bench-lipschitz  demo model, lengths 8..256, 4 windows each, --repeat 1, on the card
#   bench-generation, bench-training, then train on CUDA with --precision bfloat16 and float16, each
#   stopped at a checkpoint and resumed (these passed in the first run: shortest boxes, last).
set -u
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
OUT_DIR=${1:-${OUT:-}}
if [ -z "$OUT_DIR" ]; then
    OUT_DIR=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || exit 2
    echo "gpu_check: writing logs and gpu_check.json to $OUT_DIR"
fi
mkdir -p "$OUT_DIR" || exit 2
OUT_DIR=$(cd "$OUT_DIR" && pwd)
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export QT_QPA_PLATFORM=offscreen PYTHONUNBUFFERED=1
QUICK=${GPU_CHECK_QUICK:-0}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-540}  # seconds for all steps together (the machine's command limit is 10 minutes)
WANTED=" $(echo "${GPU_CHECK_STEPS:-}" | tr ',' ' ') "
STEPS="$OUT_DIR/steps.tsv"
: > "$STEPS"
# the benches' temporary checkpoints (16 GB at the 8B shape) go to a work folder outside OUT_DIR, removed at exit
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-work.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT
export TMPDIR="$WORK"

box() {  # box NORMAL_SECONDS -> the time box for a step (short ones under GPU_CHECK_QUICK=1)
    if [ "$QUICK" = 1 ]; then echo 60; else echo "$1"; fi
}

record() {  # record NAME STATUS RC SECONDS REASON
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >> "$STEPS"
    echo "gpu_check: $1: $2${5:+ ($5)} [${4}s]"
}

wanted() {  # wanted NAME: whether GPU_CHECK_STEPS (when set) names the step ("train" names the four train steps)
    [ "$WANTED" = "  " ] || [[ "$WANTED" == *" $1 "* ]] || { [[ "$1" == train-* ]] && [[ "$WANTED" == *" train "* ]]; }
}

run_step() {  # run_step NAME SECONDS CMD... : time-boxed, its log kept, never stops the script
    local name=$1 limit=$2 t0 rc status reason=""
    shift 2
    if [ "$name" != env ] && ! wanted "$name"; then
        record "$name" skipped "" 0 "not in GPU_CHECK_STEPS"
        return
    fi
    local left=$((BUDGET - ($(date +%s) - START)))
    if [ "$left" -lt 20 ]; then
        record "$name" skipped "" 0 "no time left in the ${BUDGET} s budget"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    t0=$(date +%s)
    { echo "\$ $*"; echo; } > "$OUT_DIR/$name.log"
    timeout --kill-after=10 "$limit" "$@" >> "$OUT_DIR/$name.log" 2>&1
    rc=$?
    case $rc in
        0) status=passed ;;
        124|137) status=timed-out; reason="still running after ${limit} s" ;;
        *) status=failed; reason="exit status $rc: $(grep -v '^\s*$' "$OUT_DIR/$name.log" | tail -1 | cut -c1-200)" ;;
    esac
    record "$name" "$status" "$rc" "$(($(date +%s) - t0))" "$reason"
}

# -- the machine ------------------------------------------------------------------------------------
run_step env "$(box 60)" "$PY" -c '
import json, sys
import torch
info = {"python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available()}
if info["cuda_available"]:
    p = torch.cuda.get_device_properties(0)
    info.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gib=round(p.total_memory / 2**30, 1),
                capability=f"{p.major}.{p.minor}", bf16_supported=torch.cuda.is_bf16_supported(),
                device_count=torch.cuda.device_count())
for qt in ("PySide6", "pyqtgraph"):
    try:
        __import__(qt)
        info[qt] = "present"
    except ImportError:
        info[qt] = "absent"
import desktop_app.cli, desktop_app.core.training, desktop_app.benchmarks  # nothing here may need Qt
print(json.dumps(info))'
CUDA=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
NO_CUDA="no CUDA device: torch.cuda.is_available() is False"
case $DEVICE in cuda*) ;; *) CUDA=1 ;; esac  # GPU_CHECK_DEVICE=cpu: nothing to skip
command -v nvidia-smi > /dev/null && timeout 20 nvidia-smi > "$OUT_DIR/nvidia-smi.log" 2>&1

# -- every cuda-marked test (on a CPU machine they skip; the run still proves they collect without Qt) --
# the files that mark one (only those are collected: the others may import what the GPU machine lacks)
# -p no:pytest-qt: the GPU machine has no pytest-qt; where it is installed it would import Qt, which these tests never need
# --basetemp: its own temporary folder, so a run from inside a test session never prunes that session's
# numbered /tmp/pytest-of-USER folders (pytest keeps the newest three)
mapfile -t CUDA_TESTS < <(grep -l "pytest.mark.cuda" tests/core/*.py tests/core/*/*.py tests/cli/*.py 2>/dev/null)
[ "${#CUDA_TESTS[@]}" -gt 0 ] || CUDA_TESTS=(tests/core/test_devices_real.py)  # never the whole suite
run_step pytest-cuda "$(box 150)" "$PY" -m pytest -m cuda -p no:cacheprovider -p no:pytest-qt -q -rs \
    --basetemp "$OUT_DIR/pytest-tmp" "${CUDA_TESTS[@]}"

# -- benchmarks -------------------------------------------------------------------------------------
BENCHES=$("$PY" -m desktop_app bench --help 2>/dev/null | tr -c 'a-z\n' ' ')
bench() {  # bench STEP NAME SECONDS ARGS... : bench NAME with --device cuda, as step STEP
    local step=$1 name=$2 limit=$3
    shift 3
    if ! wanted "$step"; then
        record "$step" skipped "" 0 "not in GPU_CHECK_STEPS"
    elif ! echo " $BENCHES " | grep -q " $name "; then
        record "$step" absent "" 0 "there is no bench $name yet"
    elif ! "$PY" -m desktop_app bench "$name" --help 2>/dev/null | grep -q -- "--device"; then
        record "$step" skipped "" 0 "bench $name has no --device flag"
    elif [ "$CUDA" != 1 ]; then
        record "$step" skipped "" 0 "$NO_CUDA"
    else
        run_step "$step" "$limit" "$PY" -m desktop_app bench "$name" --device "$DEVICE" "$@"
    fi
}
bench bench-scale scale "$(box 120)" --shape qwen2.5-0.5b --repeat 2
free_gb=$(df -Pk "$WORK" 2>/dev/null | awk 'NR == 2 {print int($4 / 1048576)}')
if [ "$DEVICE" = cpu ]; then
    record bench-scale-8b skipped "" 0 "--memory-cap-gb is for CUDA (GPU_CHECK_DEVICE=cpu)"
elif [ "$CUDA" = 1 ] && [ "${free_gb:-0}" -lt 20 ]; then
    record bench-scale-8b skipped "" 0 "the 16 GB checkpoint needs 20 GB of free disk; $WORK has ${free_gb:-?} GB"
else
    bench bench-scale-8b scale "$(box 240)" --shape llama-3.1-8b --memory-cap-gb 24 --repeat 1
fi
rm -rf "${WORK:?}"/* 2> /dev/null  # a timed-out bench leaves its checkpoint behind
bench bench-lipschitz lipschitz "$(box 100)" resources/demo-model --lengths 8,16,32,64,128,256 --samples 4 --repeat 1
bench bench-generation generation "$(box 45)" --repeat 3
bench bench-training training "$(box 45)" --steps 20 --rounds 2

# -- training on CUDA: bfloat16 and float16 (loss scaling), each stopped at a checkpoint and resumed --
TRAIN=(--task copy --layers 2 --heads 2 --d-model 64 --eval-every 20 --checkpoint-every 20 --log-every 10
       --jsonl --device "$DEVICE")
for precision in bfloat16 float16; do
    if [ "$CUDA" != 1 ]; then
        record "train-$precision" skipped "" 0 "$NO_CUDA"
        record "train-$precision-resume" skipped "" 0 "$NO_CUDA"
        continue
    fi
    run_step "train-$precision" "$(box 30)" "$PY" -m desktop_app train "${TRAIN[@]}" --precision "$precision" \
        --steps 40 --out "$OUT_DIR/run-$precision"
    run_step "train-$precision-resume" "$(box 30)" "$PY" -m desktop_app train "${TRAIN[@]}" \
        --precision "$precision" --steps 60 --out "$OUT_DIR/run-$precision" --resume
done

# -- one JSON: every step's status, time and reason, and the figures each printed --------------------
"$PY" - "$OUT_DIR" "$CUDA" "$(($(date +%s) - START))" "$QUICK" "$BUDGET" "${GPU_CHECK_STEPS:-}" <<'EOF'
import json, re, sys
from pathlib import Path

out, cuda, total, quick = Path(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4] == "1"
budget, subset = int(sys.argv[5]), sys.argv[6]


def json_lines(text):
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except ValueError:
                pass


steps = {}
for row in (out / "steps.tsv").read_text(encoding="utf-8").splitlines():
    name, status, rc, seconds, reason = (row.split("\t") + [""] * 5)[:5]
    step = {"status": status, "rc": int(rc) if rc else None, "seconds": int(seconds), "reason": reason}
    log = out / f"{name}.log"
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    found = list(json_lines(text))
    if name == "pytest-cuda":
        m = re.findall(r"(\d+) (passed|failed|skipped|error|errors|deselected)", text)
        step["tests"] = {kind: int(n) for n, kind in m}
        if status == "passed" and not step["tests"].get("passed"):
            step["status"], step["reason"] = "skipped", "every cuda test skipped: " + (
                "no CUDA device" if not cuda else "see pytest-cuda.log")
    elif name.startswith("train-"):
        events = [e for e in found if "event" in e]
        if events:  # a resumed run's first event (start) says the step it resumed from
            step["first_step"] = events[0].get("step")
            for kind in ("step", "eval", "done"):  # the last of each: tokens/s, losses, the summary
                last = [e for e in events if e["event"] == kind]
                if last:
                    step[f"last_{kind}"] = {k: v for k, v in last[-1].items() if k != "grad_norms"}
    elif found:
        step["figures"] = found[-1]  # what the step printed last as JSON (env info, a bench's result)
    steps[name] = step

result = {"cuda": cuda, "quick": quick, "budget_seconds": budget, "steps_asked": subset or "all",
          "total_seconds": total, "steps": steps,
          "failed": sorted(n for n, s in steps.items() if s["status"] in ("failed", "timed-out"))}
(out / "gpu_check.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
print(f"gpu_check: {out / 'gpu_check.json'}: " + ", ".join(f"{n} {s['status']}" for n, s in steps.items()))
EOF
