#!/usr/bin/env bash
# GPU check kit: runs on a bare GPU host (no SGLang, no network), in under 8 minutes:
#   env       versions, the GPU, kvikio's GDS or compat mode; kit modules import without SGLang
#   store     the Saria store on kvikio: put/get into CUDA tensors, checksums, read GB/s vs a raw
#             kvikio read of the same slab bytes
#   queues    read latency into CUDA memory idle and beside a stream of puts (writes on the store's
#             own write pool, reads through kvikio): medians of 7 runs and their ratio
#   gather    compiled Triton gather, FA and FA+GDN plans, fp16/bf16/fp32: bit-exact vs torch,
#             GB/s vs index_copy_
#   checksum  device digest of pages read into GPU memory vs the digests the store recorded
#   reload    direct SSD -> CUDA pool vs SSD -> pinned host -> CUDA; coordinator pacing at the
#             measured link rates
# Each step has its own time limit and prints PASS/FAIL/SKIP; with OUT set, $OUT/gpu_kit.json
# (per step: status, seconds, reason, figures) and $OUT/gpu_kit.log are written.
#
# Usage:
#   scripts/gpu_kit.sh            GPU host; installs .whl/*.whl (scripts/gpu_wheels.sh) into a temp
#                                 dir first, else uses the interpreter's own kvikio
#   scripts/gpu_kit.sh --dry-run  CPU host: the same steps on the POSIX engine, the Triton
#                                 interpreter and CPU pools (CI runs this; no wheels, no network)
# PYTHON=... picks the interpreter (default: .venv/bin/python for --dry-run if present, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."

dry=()
case "${1:-}" in
  "") ;;
  --dry-run) dry=(--dry-run) ;;
  *) echo "usage: scripts/gpu_kit.sh [--dry-run]" >&2; exit 2 ;;
esac
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ ${#dry[@]} -gt 0 ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi

if [ ${#dry[@]} -eq 0 ]; then
  if compgen -G ".whl/*.whl" >/dev/null; then
    site=$(mktemp -d /tmp/saria-kit-site-XXXXXX)
    "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target "$site" .whl/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    echo "gpu kit: installed $(ls .whl/*.whl | wc -l) wheels from .whl/ into $site"
  else
    echo "gpu kit: no .whl/ here: using $PY's own kvikio (scripts/gpu_wheels.sh fetches the wheels)"
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out=()
[ -n "${OUT:-}" ] && out=(--out "$OUT")
exec timeout 480 "$PY" -m sglang_saria.gpukit "${dry[@]}" "${out[@]}"
