#!/usr/bin/env bash
# GPU-host check of Saria inside SGLang (one script, < 8 min on one GPU):
#  1. the store's kvikio path and the compiled Triton gather (gpu_check_storage.sh,
#     gpu_check_gather.sh);
#  2. direct reload on CUDA: stored pages read by kvikio into a CUDA staging buffer and
#     scattered into a CUDA device pool by the compiled gather, bit-exact;
#  3. bench_reload.py on CUDA: direct SSD -> GPU pool vs HiCache's host staging (ratios);
#  4. the serving benchmark on a CUDA server with the tiny model: WEKA agent sessions
#     through full-duplicate and eviction:E2, direct and host-staged reload, printing TTFT
#     per policy (ratios vs a cold server) and failing unless every logprob equals cold.
# Usage: scripts/gpu_check.sh   (PYTHON=/path/to/python to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
unset TRITON_INTERPRET

status=0
run() {  # run NAME CMD...: report PASS/FAIL, keep going
  local name="$1"; shift
  echo "== $name =="
  if "$@"; then echo "PASS: $name"; else echo "FAIL: $name"; status=1; fi
}

run "store via kvikio" timeout 240 bash scripts/gpu_check_storage.sh
run "compiled Triton gather" timeout 300 bash scripts/gpu_check_gather.sh
run "direct reload into a CUDA pool" timeout 120 "$PY" -m pytest -q -p no:cacheprovider -rs \
  tests/storage/test_device_reload.py -m gpu
run "reload path: direct vs host-staged on CUDA" timeout 300 "$PY" scripts/bench_reload.py --device cuda --pages 16 64 --layers 32
run "serving: TTFT per policy, logprobs equal cold" timeout 900 "$PY" scripts/bench_serving.py --device cuda --check
exit $status
