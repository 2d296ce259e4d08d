"""Run the direct reload's device verification under the Triton interpreter on CPU tensors
and print one JSON result per case.

Started by test_device.py in a fresh interpreter (TRITON_INTERPRET=1 must be set
before triton is imported): the same code that verifies staged pages on a GPU (one digest
kernel launch per chunk, the store's host check off) runs here on a CPU pool, through a
real store, a flipped byte on disk and the reload worker.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("device_verify_interpreter.py needs TRITON_INTERPRET=1 in its environment")

import torch  # noqa: E402

from sglang_saria.config import BandwidthConfig  # noqa: E402
from sglang_saria.kernels.checksum import kernel_runs_on  # noqa: E402
from sglang_saria.mem_cache.coordinator import RealTimePacer  # noqa: E402
from sglang_saria.mem_cache.ssd_order import SSDVictimOrder  # noqa: E402
from sglang_saria.reload import device as device_reload  # noqa: E402
from sglang_saria.reload.device import DeviceReloader  # noqa: E402
from sglang_saria.reload.worker import ReloadJob, ReloadWorker  # noqa: E402
from sglang_saria.storage import store as store_module  # noqa: E402
from sglang_saria.storage.config import StoreConfig  # noqa: E402
from sglang_saria.storage.store import SariaStore  # noqa: E402
from tests.reload.test_device import PAGE, DevicePool, flip_stored_byte, page_bytes, stored_page  # noqa: E402
from tests.reload.test_device import DIM, HEADS, LAYERS  # noqa: E402

CALLS = {"launches": 0, "host_hashes": 0}


def _count(module, name: str, key: str) -> None:
    real = getattr(module, name)

    def counted(*args, **kwargs):
        CALLS[key] += 1
        return real(*args, **kwargs)

    setattr(module, name, counted)


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def landed(pool: DevicePool, kvs: list[torch.Tensor], pages: range) -> bool:
    return all(
        torch.equal(pool.k_buffer[layer][i * PAGE : (i + 1) * PAGE], kvs[i][0, layer])
        and torch.equal(pool.v_buffer[layer][i * PAGE : (i + 1) * PAGE], kvs[i][1, layer])
        for i in pages
        for layer in range(LAYERS)
    )


def run(store: SariaStore, kvs: list[torch.Tensor], case: str) -> None:
    pool = DevicePool(64, torch.float16)
    reloader = DeviceReloader(
        store.get_async, pool, "page_first", PAGE, page_bytes(torch.float16), chunk_pages=2,
        page_digest=store.digest_of, verify="device",
    )
    CALLS.update(launches=0, host_hashes=0)
    outcome = reloader.load([f"p{i}" for i in range(5)], torch.arange(5 * PAGE))
    emit(
        case=case,
        kernel=kernel_runs_on("cpu"),
        verify=reloader.verify,
        ok=outcome.ok,
        pages=outcome.pages,
        reason=outcome.reason,
        failed=outcome.failed,
        launches=CALLS["launches"],
        host_hashes=CALLS["host_hashes"],
        landed_exactly=landed(pool, kvs, range(5)),
        leading_run_landed=landed(pool, kvs, range(outcome.pages)),
        rest_untouched=all(not buf[outcome.pages * PAGE :].any() for buf in pool.k_buffer + pool.v_buffer),
    )


def worker_case(store: SariaStore) -> None:
    reloader = DeviceReloader(
        store.get_async, DevicePool(64, torch.float16), "page_first", PAGE, page_bytes(torch.float16),
        chunk_pages=2, page_digest=store.digest_of, verify="device",
    )
    dropped: list[str] = []

    def drop(keys):
        dropped.extend(keys)
        store.evict(keys)

    worker = ReloadWorker(reloader, RealTimePacer(BandwidthConfig(), "coordinated"), lambda v: v, drop)
    job = worker.submit(ReloadJob("r", [f"p{i}" for i in range(5)], torch.arange(5 * PAGE)))
    finished = job.wait(60)
    worker.close()
    emit(case="worker", finished=finished, pages=job.pages, reason=job.reason, failed=job.failed, dropped=dropped, stored=sorted(store.keys()))


def main() -> None:
    _count(device_reload, "row_digests", "launches")  # one call = one kernel launch over a chunk
    _count(store_module, "xxh3", "host_hashes")
    gen = torch.Generator().manual_seed(0)
    kvs = [torch.randn(2, LAYERS, PAGE, HEADS, DIM, generator=gen).half() for _ in range(5)]
    with tempfile.TemporaryDirectory() as d:
        with SariaStore(StoreConfig(data_dirs=[f"{d}/a"], capacity="1MiB", slot_bytes="4KiB"), victim_order=SSDVictimOrder()) as store:
            for i, kv in enumerate(kvs):
                assert store.put(f"p{i}", stored_page(kv, "page_first")).ok
            run(store, kvs, "clean")
            flip_stored_byte(store, "p3")
            run(store, kvs, "flipped")
            worker_case(store)


if __name__ == "__main__":
    main()
