"""Run the hybrid direct reload (FA pages + GDN checkpoint, one gather per chunk) with the
Triton kernel under the interpreter on CPU pools, and print one JSON result per case.

Started by test_hybrid_gather.py in a fresh interpreter: TRITON_INTERPRET=1 only takes
effect if set before triton is imported.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("hybrid_interpreter_check.py needs TRITON_INTERPRET=1 in its environment")

from sglang_saria.kernels import gather  # noqa: E402
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder  # noqa: E402
from sglang_saria.reload import device as device_reload  # noqa: E402
from sglang_saria.storage.config import StoreConfig  # noqa: E402
from sglang_saria.storage.store import SariaStore  # noqa: E402
from tests.kernels.hybrid_cases import CASES, DTYPES, case  # noqa: E402

LAUNCHES = {"triton": 0, "gathers": 0}


def _count(module, name: str, key: str) -> None:
    real = getattr(module, name)

    def counted(*args, **kwargs):
        LAUNCHES[key] += 1
        return real(*args, **kwargs)

    setattr(module, name, counted)


def main() -> None:
    _count(gather, "_gather_mixed_triton", "triton")
    _count(device_reload, "gather_rows", "gathers")
    with tempfile.TemporaryDirectory() as root:
        store = SariaStore(StoreConfig(data_dirs=[root], capacity="16MiB", slot_bytes="4KiB"), victim_order=SSDVictimOrder())
        try:
            for name in CASES:
                for dtype_name in DTYPES:
                    LAUNCHES.update(triton=0, gathers=0)
                    result = case(name, dtype_name).run(store, chunk_pages=2)
                    print(json.dumps({"case": f"{name}/{dtype_name}", **result, **LAUNCHES}), flush=True)
        finally:
            store.close()


if __name__ == "__main__":
    main()
