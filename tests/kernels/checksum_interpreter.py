"""Run the digest kernel under the Triton interpreter and print one JSON result per case.

Started by test_checksum.py in a fresh interpreter (TRITON_INTERPRET=1 must be set before
triton is imported). Compares the kernel with the numpy definition and with the digest a
real store recorded at write time.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("checksum_interpreter.py needs TRITON_INTERPRET=1 in its environment")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from sglang_saria.digest import as_int64, digest  # noqa: E402
from sglang_saria.kernels.checksum import row_digests, triton_interpreted, verify_rows  # noqa: E402
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder  # noqa: E402
from sglang_saria.storage.config import StoreConfig  # noqa: E402
from sglang_saria.storage.store import SariaStore  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "u8": torch.uint8}


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    emit(case="interpreted", value=triton_interpreted())
    gen = torch.Generator().manual_seed(0)
    for label, dtype in DTYPES.items():
        # 4099 bytes of u8 leave a partial last word; the rest span several kernel blocks.
        cols = {"u8": 4099, "fp32": 5000, "bf16": 9000, "fp16": 9000}[label]
        raw = torch.randint(0, 256, (3, cols * torch.empty(0, dtype=dtype).element_size()), generator=gen, dtype=torch.uint8)
        rows = raw.view(dtype)
        kernel = row_digests(rows, backend="triton").tolist()
        reference = [as_int64(digest(r.numpy())) for r in raw]
        flipped = raw.clone()
        flipped[1, 7] ^= 1
        emit(
            case=f"rows-{label}",
            kernel_matches_numpy=kernel == reference,
            verified=verify_rows(rows, [d & ((1 << 64) - 1) for d in reference]).tolist(),
            flip_detected=verify_rows(flipped.view(dtype), [d & ((1 << 64) - 1) for d in reference]).tolist(),
        )
    with tempfile.TemporaryDirectory() as d:
        cfg = StoreConfig(data_dirs=[f"{d}/a", f"{d}/b"], capacity="4MiB", slot_bytes="16KiB")
        with SariaStore(cfg, victim_order=SSDVictimOrder()) as store:
            pages = torch.randint(0, 256, (4, 40_000), generator=gen, dtype=torch.uint8)
            assert all(store.put(f"p{i}", pages[i]).ok for i in range(4))
            back = torch.zeros_like(pages)
            assert all(store.get(f"p{i}", back[i]).ok for i in range(4))
            recorded = [store.digest_of(f"p{i}") for i in range(4)]
            emit(
                case="store",
                kernel_matches_store=row_digests(back).tolist() == [as_int64(r) for r in recorded],
                numpy_matches_store=[digest(p.numpy()) for p in pages] == recorded,
                verified=verify_rows(back, recorded).tolist(),
            )
    empty = torch.zeros((0, 64), dtype=torch.uint8)
    emit(case="empty", digests=row_digests(empty, backend="triton").tolist(), numpy_zero=digest(np.zeros(8, np.uint8)))


if __name__ == "__main__":
    main()
