"""The reload worker: SSD -> device reads and gathers off the scheduler thread.

SGLang's scheduler has one thread; a reload read there (`init_load_back`) stalls every
running request for the length of the read. Here the scheduler only decides and
publishes: at a request's arrival it allocates device slots for the SSD pages of its
plan and submits a `ReloadJob`; this worker reads the pages (the store's read pool on
CPU, kvikio on GPU), gathers them into the slots chunk by chunk in prefix order, paced
by the coordinator (`RealTimePacer`, whose waits now sleep here), and settles how many
leading pages every attention rank has (`agree`, a MIN all-reduce on the worker's own
process group: never on the scheduler thread). The scheduler polls `done` and
publishes that many pages as device nodes; it frees the other slots.

Jobs run one at a time in submission order, so on every rank the worker's collectives
pair up the same jobs (the scheduler submits at request arrival, in the same order on
all ranks). A job asked to stop (`stop()`: abort, a prefetch deadline) ends after the
chunk in flight with the leading run it has. Pages whose read failed (I/O error,
checksum mismatch) leave the store index (`drop_pages`), so the next request does not
stall on them again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from sglang_saria.mem_cache.coordinator import RealTimePacer
from sglang_saria.reload.device import DeviceReloader, StateLoad
from sglang_saria.reload.pacing_trace import PacingTrace

logger = logging.getLogger(__name__)

# Failed reads whose pages must leave the store index (a miss is already absent).
DROPPED_STATUSES = frozenset({"corrupt", "io_error", "size_mismatch"})


@dataclass
class ReloadJob:
    """One request's SSD pages on their way into device slots. The scheduler owns
    ``slots`` and frees them; the worker writes only the fields below the line."""

    rid: str
    page_hashes: list[str]
    slots: torch.Tensor  # page_size device slots per page, fresh (owned by no node): every slot the job holds
    dram_bytes: int = 0  # the plan's DRAM part, modelled by the pacer (HiCache copies most of it)
    state: Optional[StateLoad] = None  # hybrid: the plan's GDN checkpoint, into its own mamba slot
    # Host-pool pages gathered with the SSD pages (hybrid: FA pages the tree holds in host
    # memory past its last checkpoint): host slots -> device slots. With them ``slots`` is
    # the DRAM pages' slots then the SSD pages' (``ssd_slots``).
    host_slots: Optional[torch.Tensor] = None
    host_device_slots: Optional[torch.Tensor] = None
    submitted: float = field(default_factory=time.monotonic)
    # ---- written by the worker
    pages: int = 0  # leading pages agreed by all ranks and in their slots
    state_loaded: bool = False  # the checkpoint landed (after every page) on every rank
    host_pages: int = 0  # DRAM pages (``host_slots``) moved into their device slots
    reason: str = ""  # why fewer than all pages: the store's status, "stopped", "peer_rank"
    failed: list[tuple[str, str]] = field(default_factory=list)  # (page hash, status)
    seconds: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _done: threading.Event = field(default_factory=threading.Event)

    @property
    def tokens(self) -> int:
        return int(self.slots.numel())

    @property
    def ssd_slots(self) -> torch.Tensor:
        """The slots of ``page_hashes`` (``slots`` past the host pages')."""
        skip = 0 if self.host_device_slots is None else int(self.host_device_slots.numel())
        return self.slots[skip:]

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def stop(self) -> None:
        """Ask the worker to end this job after the chunk in flight (or skip it if queued)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._done.wait(timeout)


class ReloadWorker:
    """One thread that runs `ReloadJob`s in submission order."""

    def __init__(
        self,
        reloader: DeviceReloader,
        pacer: RealTimePacer,
        agree: Callable[[int], int],
        drop_pages: Callable[[Sequence[str]], Any],
        drop_state: Optional[Callable[[str], Any]] = None,
        trace: Optional[PacingTrace] = None,
    ) -> None:
        """``drop_state(page_hash)``: a checkpoint sidecar whose read failed leaves the store index;
        ``trace``: where each job's pacing goes (`transfer.pacing_trace`)."""
        self.trace = trace
        self.reloader = reloader
        self.pacer = pacer
        self.agree = agree
        self.drop_pages = drop_pages
        self.drop_state = drop_state
        self._queue: "queue.Queue[Optional[ReloadJob]]" = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="saria-reload", daemon=True)
        self._thread.start()

    def submit(self, job: ReloadJob) -> ReloadJob:
        self._queue.put(job)
        return job

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._run(job)
            except BaseException:  # noqa: BLE001 - a crashed job publishes nothing
                logger.exception("saria reload %s: worker failed; nothing published", job.rid)
                job.pages, job.reason, job.host_pages = 0, "worker_error", 0
            finally:
                job._done.set()

    def _run(self, job: ReloadJob) -> None:
        t0 = time.perf_counter()
        landed, reason, state_loaded = 0, "stopped", False
        if not job.stopping:
            bytes_per_token = self.reloader.page_bytes // self.reloader.geometry.page_size
            ssd_slots = job.ssd_slots
            ticket = self.pacer.begin(job.dram_bytes, int(ssd_slots.numel()) * bytes_per_token)
            try:
                outcome = self.reloader.load(
                    job.page_hashes,
                    ssd_slots,
                    host_slots=job.host_slots,
                    host_device_slots=job.host_device_slots,
                    pace=lambda done: self.pacer.pace_ssd(ticket, done),
                    stop=lambda: job.stopping,
                    state=job.state,
                )
            finally:
                paced = self.pacer.end(ticket)
            if self.trace is not None and paced is not None:
                host_pages = 0 if job.host_slots is None else int(job.host_slots.numel()) // self.reloader.geometry.page_size
                self.trace.write(job.rid, paced, host_pages * self.reloader.page_bytes)
            landed, reason, job.failed = outcome.pages, outcome.reason, outcome.failed
            job.host_pages = outcome.host_pages
            state_loaded = outcome.state_loaded
            bad = [h for h, status in outcome.failed if status in DROPPED_STATUSES]
            if bad:
                self.drop_pages(bad)
            if outcome.state_failed in DROPPED_STATUSES and self.drop_state is not None:
                self.drop_state(job.state.key)
        # Every rank takes the same leading run (each rank has its own store); a checkpoint
        # counts (as one more page) only when it landed after all pages on every rank.
        has_state = job.state is not None
        agreed = self.agree(landed + int(state_loaded))
        job.pages = min(agreed, landed)
        job.state_loaded = state_loaded and agreed == landed + 1
        whole = len(job.page_hashes) + int(has_state)
        if landed + int(state_loaded) < whole:
            job.reason = reason
        else:
            job.reason = "peer_rank" if agreed < landed + int(state_loaded) else ""
        job.seconds = time.perf_counter() - t0
