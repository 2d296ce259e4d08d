#!/usr/bin/env bash
# GPU-host check of the compiled Triton mixed-source gather (< 2 min on one GPU).
#  1. pytest GPU tests: compiled kernel vs row oracle and torch reference, bit-exact
#     (bf16/fp16/fp32; device staging + pinned host-pool sources in one launch).
#  2. bench_gather.py --check on CUDA: every method bit-exact vs the row loop (bf16, fp16),
#     PASS/FAIL per case, median timings with ratios against the torch reference.
# Usage: scripts/gpu_check_gather.sh   (PYTHON=/path/to/python to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"

"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "FAIL: torch sees no CUDA device")'
unset TRITON_INTERPRET  # the compiled kernel is what this script checks

status=0
echo "== compiled kernel tests (bit-exact) =="
if timeout 300 "$PY" -m pytest tests/hybrid_gather -q -m gpu -p no:cacheprovider; then
  echo "PASS: compiled kernel tests"
else
  echo "FAIL: compiled kernel tests"; status=1
fi

echo "== bench + bit-exact check: device staging + pinned host pool =="
if timeout 300 "$PY" scripts/bench_gather.py --device cuda --host-pool cpu --tokens 1024 4096 --dtypes bf16 fp16 --check; then
  echo "PASS: bench check (pinned host pool)"
else
  echo "FAIL: bench check (pinned host pool)"; status=1
fi
echo "== bench + bit-exact check: all sources on device =="
if timeout 300 "$PY" scripts/bench_gather.py --device cuda --host-pool device --tokens 1024 4096 --dtypes bf16 fp16 --check; then
  echo "PASS: bench check (device sources)"
else
  echo "FAIL: bench check (device sources)"; status=1
fi
[ "$status" -eq 0 ] && echo "gpu_check_gather: ALL PASS" || echo "gpu_check_gather: FAIL"
exit "$status"
