#!/usr/bin/env bash
# Verify on a GPU host that the Saria store reads SSD objects straight into CUDA tensors
# through kvikio (GPUDirect Storage, or kvikio's compat mode where GDS is not set up).
#
#   scripts/gpu_check_storage.sh [DATA_DIR]     (default: $SARIA_GPU_DIR or a temp dir)
#   PYTHON=/path/to/python scripts/gpu_check_storage.sh
#
# Exits non-zero when CUDA or kvikio is missing, a GPU test skips, or any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
DATA_DIR="${1:-${SARIA_GPU_DIR:-$(mktemp -d /tmp/saria-gpu-XXXXXX)}}"

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
"$PY" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("FAIL: torch sees no CUDA device")
try:
    import kvikio, kvikio.defaults
except ImportError as e:
    sys.exit(f"FAIL: kvikio not importable: {e}")
print("torch", torch.__version__, "cuda", torch.version.cuda, "| kvikio", kvikio.__version__,
      "| compat_mode", kvikio.defaults.get("compat_mode"))
PY

# GPU tests must run, not skip.
"$PY" -m pytest tests/storage/test_storage_engines.py -q -rs -p no:warnings | tee /tmp/saria-gpu-pytest.log
if grep -q "SKIPPED" /tmp/saria-gpu-pytest.log; then
    echo "FAIL: a GPU storage test was skipped on a GPU host"; exit 1
fi

# End to end: 64 x 4 MiB objects striped over 2 dirs, written from and read into CUDA memory.
SARIA_GPU_DIR="$DATA_DIR" "$PY" - <<'PY'
import os, time, torch
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.store import SariaStore
base = os.environ["SARIA_GPU_DIR"]
cfg = StoreConfig(data_dirs=[f"{base}/gds0", f"{base}/gds1"], capacity="512MiB", slot_bytes="4MiB",
                  engine="auto", read_threads=8, write_threads=4)
with SariaStore(cfg) as store:
    assert store.engine.name == "kvikio", f"engine=auto picked {store.engine.name}, expected kvikio"
    n, size = 64, 4 << 20
    src = [torch.randint(0, 256, (size,), dtype=torch.uint8, device="cuda") for _ in range(n)]
    t = time.perf_counter()
    assert all(f.result().ok for f in store.put_batch([(f"g{i}", s) for i, s in enumerate(src)]))
    w = n * size / (time.perf_counter() - t) / 1e9
    dst = [torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(n)]
    torch.cuda.synchronize()
    t = time.perf_counter()
    assert all(f.result().ok for f in store.get_batch([f"g{i}" for i in range(n)], dst))
    torch.cuda.synchronize()
    r = n * size / (time.perf_counter() - t) / 1e9
    bad = [i for i in range(n) if not torch.equal(src[i], dst[i])]
    assert not bad, f"objects differ after GDS read: {bad[:5]}"
    print(f"OK: {n} x 4 MiB CUDA round trip via kvikio, write {w:.2f} GB/s, read {r:.2f} GB/s "
          f"(stats: {store.stats().counts})")
PY
echo "gpu_check_storage: PASS"
