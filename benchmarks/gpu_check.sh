#!/usr/bin/env bash
# The GPU check, in one prepared script (docs/gpu.md "Benchmarks on a GPU").
#
# On a GPU machine, from the repository root, offline:
#
#     bash benchmarks/gpu_check.sh [--wheels DIR] [--out DIR]
#
# It uses the PyTorch already installed there (`python3`, or $PYTHON) and this checkout's
# src/ (nothing is installed from an index). With --wheels DIR it first installs the wheels
# in DIR with `pip install --no-index --no-deps --target` into a temporary folder on
# PYTHONPATH: the pure-Python dependencies the machine lacks (dp-accounting and Deprecated;
# opendp only for the device's secure sampler, which these checks do not use). Make DIR
# here, where an index is reachable, with
#
#     bash benchmarks/gpu_check.sh --download-wheels DIR
#
# Then it runs tests/test_cuda.py and tests/test_device.py (CPU against CUDA: one round of
# each method, a run trained, evaluated and reloaded across devices) and
# benchmarks/gpu_round_speed.py (clients per second of the fedrec and dp-fedavg rounds at
# 1,000 and 10,000 clients, default and published-size NRMS, CPU and CUDA), and writes into
# --out (default: $OUT when set, else benchmarks/results/gpu_check):
#   env.json             python, torch, CUDA, GPU
#   tests.log, tests.xml the tests' output and JUnit report
#   gpu_round_speed.json the benchmark's JSON; gpu_round_speed.log its rows as they come
#   summary.json         each step's exit status and seconds
# Each step has its own time limit; the whole script stays under 8 minutes on one H200.
set -uo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
WHEELS=""
SMOKE=""
OUT_DIR="${OUT:-benchmarks/results/gpu_check}"
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS="$2"; shift 2 ;;
    --out) OUT_DIR="$2"; shift 2 ;;
    --smoke) SMOKE=1; shift ;;  # tiny benchmark, no CUDA-side training: checks this script
    --download-wheels)
      mkdir -p "$2"
      exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$2" \
        dp-accounting==0.6.0 Deprecated==1.3.1 opendp==0.16.0 ;;
    *) echo "unknown argument $1; usage: $0 [--wheels DIR] [--out DIR] | --download-wheels DIR" >&2
       exit 2 ;;
  esac
done
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1

if [ -n "$WHEELS" ]; then
  SITE="$(mktemp -d)"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl || { echo "installing the wheels of $WHEELS failed" >&2; exit 1; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

"$PY" - > "$OUT_DIR/env.json" <<'EOF'
import json, platform, torch
print(json.dumps({
    "python": platform.python_version(), "torch": torch.__version__,
    "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    "cpu_threads": torch.get_num_threads()}, indent=2))
EOF
cat "$OUT_DIR/env.json"

declare -A STATUS SECONDS_TAKEN
step() {  # step NAME LIMIT_S COMMAND...: run it under a time limit, record status and time
  local name="$1" limit="$2"; shift 2
  local started=$SECONDS
  echo "=== $name (limit ${limit} s)"
  timeout "$limit" "$@"
  STATUS[$name]=$?
  SECONDS_TAKEN[$name]=$((SECONDS - started))
  echo "=== $name: exit ${STATUS[$name]} after ${SECONDS_TAKEN[$name]} s"
}

if [ -n "$SMOKE" ]; then
  TESTS="tests/test_cuda.py tests/test_device.py -k 'not train_evaluate and not checkpoint'"
  BENCH="--smoke"
else
  TESTS="tests/test_cuda.py tests/test_device.py"
  BENCH="--clients 1000 10000 --cpu-clients 50 --repeats 3"
fi
step tests 200 bash -c "set -o pipefail; '$PY' -m pytest $TESTS -q -p no:cacheprovider -rs \
  --junitxml='$OUT_DIR/tests.xml' 2>&1 | tee '$OUT_DIR/tests.log'"
step gpu_round_speed 270 bash -c "set -o pipefail; '$PY' benchmarks/gpu_round_speed.py $BENCH \
  --out '$OUT_DIR/gpu_round_speed.json' 2> '$OUT_DIR/gpu_round_speed.log' > /dev/null"

"$PY" - "$OUT_DIR/summary.json" \
  tests "${STATUS[tests]}" "${SECONDS_TAKEN[tests]}" \
  gpu_round_speed "${STATUS[gpu_round_speed]}" "${SECONDS_TAKEN[gpu_round_speed]}" <<'EOF'
import json, sys
path, rest = sys.argv[1], sys.argv[2:]
steps = {rest[i]: {"exit": int(rest[i + 1]), "seconds": int(rest[i + 2])}
         for i in range(0, len(rest), 3)}
json.dump({"steps": steps, "ok": all(s["exit"] == 0 for s in steps.values())},
          open(path, "w"), indent=2)
print(json.dumps(steps))
EOF
[ "${STATUS[tests]}" -eq 0 ] && [ "${STATUS[gpu_round_speed]}" -eq 0 ]
