"""The reload worker (reload/worker.py): SSD -> device reloads run on its thread,
paced there, settle a leading run agreed by all ranks, and drop pages whose read failed."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import torch

from sglang_saria.config import BandwidthConfig
from sglang_saria.mem_cache.coordinator import RealTimePacer
from sglang_saria.reload.pacing_trace import PacingTrace, read_pacing_trace
from sglang_saria.reload.worker import ReloadJob, ReloadWorker
from sglang_saria.reload.device import DeviceReloader
from sglang_saria.storage.store import GetStatus
from tests.reload.test_device import DIM, HEADS, LAYERS, PAGE, DevicePool, page_bytes, stored_page


def _store_pages(store, n: int) -> list[torch.Tensor]:
    kvs = [torch.randn(2, LAYERS, PAGE, HEADS, DIM).half() for _ in range(n)]
    for i, kv in enumerate(kvs):
        assert store.put(f"p{i}", stored_page(kv, "page_first")).ok
    return kvs


def _worker(read_page, pool, agree=lambda v: v, bw=BandwidthConfig(), dropped=None, chunk_pages=16, trace=None):
    reloader = DeviceReloader(read_page, pool, "page_first", PAGE, page_bytes(torch.float16), chunk_pages=chunk_pages)
    drops = dropped if dropped is not None else []
    return ReloadWorker(reloader, RealTimePacer(bw, "coordinated"), agree, drops.extend, trace=trace)


def test_job_loads_on_the_worker_thread_while_the_caller_goes_on(make_store):
    store = make_store(slot_bytes="4KiB")
    kvs = _store_pages(store, 3)
    readers: set[str] = set()

    def read_page(key, dest):
        readers.add(threading.current_thread().name)
        time.sleep(0.2)  # a slow drive
        return store.get_async(key, dest)

    pool = DevicePool(64, torch.float16)
    worker = _worker(read_page, pool)
    t0 = time.monotonic()
    job = worker.submit(ReloadJob("r", ["p0", "p1", "p2"], torch.arange(3 * PAGE)))
    assert time.monotonic() - t0 < 0.1 and not job.done
    assert job.wait(10)
    worker.close()
    assert (job.pages, job.reason, job.failed) == (3, "", [])
    assert readers == {"saria-reload"}
    for i, kv in enumerate(kvs):
        assert torch.equal(pool.k_buffer[1][i * PAGE : (i + 1) * PAGE], kv[0, 1])


def test_pacing_waits_on_the_worker_not_on_the_submitter(make_store):
    store = make_store(slot_bytes="4KiB")
    _store_pages(store, 2)
    pool = DevicePool(64, torch.float16)
    gds_bytes_per_s = page_bytes(torch.float16) * 2 / 0.5  # two pages take 0.5 s at the GDS allowance
    worker = _worker(store.get_async, pool, bw=BandwidthConfig(1.0, gds_bytes_per_s / 1e9, 1.0))
    t0 = time.monotonic()
    job = worker.submit(ReloadJob("r", ["p0", "p1"], torch.arange(2 * PAGE)))
    submitted_in = time.monotonic() - t0
    assert job.wait(10)
    worker.close()
    assert submitted_in < 0.1
    assert job.pages == 2 and job.seconds >= 0.45


def test_each_paced_job_leaves_a_private_line_in_the_pacing_trace(make_store, tmp_path, caplog):
    store = make_store(slot_bytes="4KiB")
    _store_pages(store, 4)
    trace = PacingTrace(tmp_path / "pacing.jsonl", "coordinated")
    worker = _worker(store.get_async, DevicePool(64, torch.float16), chunk_pages=2, trace=trace)
    first = worker.submit(ReloadJob("r1", ["p0", "p1", "p2", "p3"], torch.arange(4 * PAGE), dram_bytes=1000))
    second = worker.submit(ReloadJob("r2", ["p0"], torch.arange(4 * PAGE, 5 * PAGE)))
    assert first.wait(10) and second.wait(10)
    # A trace that cannot be written costs a warning, not the reload.
    worker.trace = PacingTrace(tmp_path / "missing" / "pacing.jsonl", "coordinated")
    third = worker.submit(ReloadJob("r3", ["p0"], torch.arange(PAGE)))
    fourth = worker.submit(ReloadJob("r4", ["p1"], torch.arange(PAGE, 2 * PAGE)))
    assert third.wait(10) and fourth.wait(10)
    worker.close()
    assert third.pages == fourth.pages == 1
    assert [r.message for r in caplog.records].count(
        f"saria: pacing trace {tmp_path / 'missing' / 'pacing.jsonl'} not written "
        f"([Errno 2] No such file or directory: '{tmp_path / 'missing' / 'pacing.jsonl'}'); reloads continue untraced"
    ) == 1
    assert (tmp_path / "pacing.jsonl").stat().st_mode & 0o777 == 0o600
    records = read_pacing_trace(tmp_path / "pacing.jsonl")
    assert [r["rid"] for r in records] == ["r1", "r2"]
    page = page_bytes(torch.float16)
    assert (records[0]["dram_bytes"], records[0]["ssd_bytes"], records[0]["host_gather_bytes"]) == (1000, 4 * page, 0)
    assert [step[1] for step in records[0]["steps"]] == [2 * page, 4 * page]  # one step per chunk of 2


def test_failed_read_keeps_the_leading_run_and_drops_the_failed_pages(make_store):
    store = make_store(slot_bytes="4KiB")
    _store_pages(store, 4)

    def read_page(key, dest):
        if key == "p2":
            failed: Future = Future()
            failed.set_result(GetStatus.IO_ERROR)
            return failed
        return store.get_async(key, dest)

    dropped: list[str] = []
    pool = DevicePool(64, torch.float16)
    worker = _worker(read_page, pool, dropped=dropped)
    job = worker.submit(ReloadJob("r", ["p0", "p1", "p2", "p3", "missing"], torch.arange(5 * PAGE)))
    assert job.wait(10)
    worker.close()
    assert (job.pages, job.reason) == (2, "io_error")
    assert job.failed == [("p2", "io_error"), ("missing", "miss")]
    assert dropped == ["p2"]  # a miss is not in the index to begin with
    assert pool.k_buffer[0][: 2 * PAGE].any() and not pool.k_buffer[0][2 * PAGE :].any()


def test_every_rank_publishes_the_shortest_leading_run(make_store):
    store = make_store(slot_bytes="4KiB")
    _store_pages(store, 3)
    worker = _worker(store.get_async, DevicePool(64, torch.float16), agree=lambda v: min(v, 1))
    job = worker.submit(ReloadJob("r", ["p0", "p1", "p2"], torch.arange(3 * PAGE)))
    assert job.wait(10)
    worker.close()
    assert (job.pages, job.reason) == (1, "peer_rank")


def test_stopped_job_ends_after_the_chunk_in_flight_and_a_queued_one_reads_nothing(make_store):
    store = make_store(slot_bytes="4KiB")
    _store_pages(store, 4)
    gate, reading = threading.Event(), threading.Event()

    def read_page(key, dest):
        reading.set()
        gate.wait(10)
        return store.get_async(key, dest)

    agreed: list[int] = []
    pool = DevicePool(64, torch.float16)
    worker = _worker(read_page, pool, agree=lambda v: agreed.append(v) or v, chunk_pages=2)
    first = worker.submit(ReloadJob("a", ["p0", "p1", "p2", "p3"], torch.arange(4 * PAGE)))
    queued = worker.submit(ReloadJob("b", ["p0"], torch.arange(4 * PAGE, 5 * PAGE)))
    assert reading.wait(10)  # the first chunk's reads are in flight
    first.stop()
    queued.stop()
    gate.set()
    assert first.wait(10) and queued.wait(10)
    worker.close()
    assert (first.pages, first.reason) == (2, "stopped")
    assert (queued.pages, queued.reason) == (0, "stopped")
    assert agreed == [2, 0], "a skipped job still takes part in the ranks' agreement"
    assert not pool.k_buffer[0][4 * PAGE :].any()


def test_job_gathers_host_pages_ahead_of_its_ssd_pages(make_store):
    """A hybrid tail: the tree's host pages past the match (DRAM) go into the job's first
    slots, the stored pages after them into the rest, in the same job."""
    from tests.reload.test_device import HostPool

    store = make_store(slot_bytes="4KiB")
    kvs = _store_pages(store, 2)
    host = HostPool(4, "page_first", torch.float16)
    pool = DevicePool(64, torch.float16)
    reloader = DeviceReloader(store.get_async, pool, "page_first", PAGE, page_bytes(torch.float16), host_pool=host)
    worker = ReloadWorker(reloader, RealTimePacer(BandwidthConfig(), "coordinated"), lambda v: v, [].extend)
    slots = torch.arange(4 * PAGE, 8 * PAGE)  # 2 host pages, then 2 SSD pages
    job = ReloadJob("r", ["p0", "p1"], slots, host_slots=torch.arange(PAGE, 3 * PAGE), host_device_slots=slots[: 2 * PAGE])
    assert torch.equal(job.ssd_slots, slots[2 * PAGE :]) and job.tokens == 4 * PAGE
    worker.submit(job)
    assert job.wait(10)
    worker.close()
    assert (job.pages, job.reason) == (2, "")
    for i in range(2):  # host pages 1, 2 -> device pages 4, 5; stored p0, p1 -> 6, 7
        assert torch.equal(pool.k_buffer[1][(4 + i) * PAGE : (5 + i) * PAGE], host.page(1 + i)[0, 1])
        assert torch.equal(pool.v_buffer[0][(6 + i) * PAGE : (7 + i) * PAGE], kvs[i][1, 0])
