#!/usr/bin/env bash
# Full GPU-host check with SGLang, for hosts with network after `scripts/setup.sh --gpu`
# (< 15 min on one GPU). Bare hosts without SGLang or network run scripts/gpu_kit.sh alone.
#  1. the GPU kit (scripts/gpu_kit.sh): kvikio store, compiled Triton gather, device digest,
#     direct reload into a CUDA pool and coordinated pacing, without SGLang;
#  2. every pytest test marked `gpu` (kvikio engine, compiled kernels, CUDA direct reload),
#     failing if any of them skips on this host;
#  3. the hybrid reload on the GPU: FA pages + GDN checkpoint (fp32 recurrent + bf16 conv)
#     from a kvikio store into a CUDA hybrid pool, direct (one compiled gather per chunk) vs
#     host-staged (pinned host pools), timed in one run; the bit-exact checks are the
#     `gpu`-marked tests of tests/kernels/test_hybrid_gather.py in step 2;
#  4. the serving benchmark on a CUDA server with the tiny model: WEKA agent sessions
#     through full-duplicate and eviction:E2, direct and host-staged reload, printing TTFT
#     per policy (ratios vs a cold server) and failing unless every logprob equals cold.
# Usage: scripts/gpu_check.sh   (PYTHON=/path/to/python to pick the interpreter; default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
unset TRITON_INTERPRET

status=0
run() {  # run NAME CMD...: report PASS/FAIL, keep going
  local name="$1"; shift
  echo "== $name =="
  if "$@"; then echo "PASS: $name"; else echo "FAIL: $name"; status=1; fi
}
gpu_tests() {  # a skip on a GPU host is a failure
  timeout 600 "$PY" -m pytest tests -q -m gpu -rs -p no:cacheprovider | tee /tmp/saria-gpu-pytest.log
  [ "${PIPESTATUS[0]}" -eq 0 ] || return 1
  ! grep -q "SKIPPED" /tmp/saria-gpu-pytest.log || { echo "a gpu test skipped on a GPU host"; return 1; }
}

run "GPU kit (store, queues, gather, digest, reload)" env PYTHON="$PY" bash scripts/gpu_kit.sh
run "pytest -m gpu" gpu_tests
run "hybrid reload: FA pages + GDN state, direct vs host-staged" timeout 300 "$PY" -m sglang_saria.bench.reload --device cuda --hybrid-only --pages 16 64 256
run "serving: TTFT per policy, logprobs equal cold" timeout 900 "$PY" scripts/bench_serving.py --device cuda --check
run "serving: decoders beside SSD hits, per reload path" timeout 900 "$PY" scripts/bench_serving.py --device cuda --scenario concurrent
exit $status
