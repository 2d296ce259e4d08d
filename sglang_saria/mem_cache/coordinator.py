"""Transfer coordinator (paper 4.5): how DRAM copies and GDS reads share GPU ingress.

The decision is ``allocate()``: given the active transfers (FIFO by submission) it
returns each one's DRAM and GDS rate, under three global limits (ingress, GDS, DRAM
bandwidth). Modes:

- ``serial``: each request loads its DRAM part, then its SSD part (LMCache+ base).
- ``overlap``: both parts submitted at once, uncoordinated; DRAM bursts take the
  ingress first and GDS gets what is left (the SSD tail of paper Figure 16).
- ``coordinated``: GDS gets its allowance first; while a request's GDS reads are
  active its DRAM copies are paced to ``B_ingress - B_gds``; once its SSD part ends
  DRAM runs at full rate; leftover ingress serves later requests' DRAM parts.

Background traffic (the replay's ``submit_background``): SSD writes take the drive first, up
to ``ssd_write_gbps``, and GDS reads share what is left of ``B_gds`` (one drive, both
directions of its bandwidth); promotions (GPU -> DRAM copies after prefill) take what DRAM
reads leave of ``B_dram``. Neither uses GPU ingress, and nothing waits for them: a write or
a promotion counts at once in the tiers, only its bandwidth is charged.

The fluid driver (``advance``) integrates those rates exactly between events, so
completion times are exact. A real pacer (SGLang adapter) calls ``allocate()`` when a
transfer starts or finishes and throttles copies to the returned rates; the decision
logic only depends on the clock it is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from sglang_saria.config import TRANSFER_MODES, BandwidthConfig

_GB = 1e9


@dataclass
class Transfer:
    """One request's reload: bytes left per source."""

    req_id: int
    dram_left: float
    ssd_left: float
    submit_t: float

    @property
    def done(self) -> bool:
        return self.dram_left <= 0.0 and self.ssd_left <= 0.0


def _fifo_grants(rate: float, ingress: float, wants: list[bool]) -> tuple[list[float], float]:
    """Grant each transfer that wants this source, in FIFO order, what is left of the
    source's ``rate`` and of the shared link; returns the grants and the link left."""
    grants = []
    for want in wants:
        g = min(rate, ingress) if want else 0.0
        rate -= g
        ingress -= g
        grants.append(g)
    return grants, ingress


class TransferCoordinator:
    """Shares ingress among concurrent reloads; fluid (exact-time) model."""

    def __init__(self, bw: BandwidthConfig, mode: str = "coordinated", ssd_write_gbps: float = math.inf) -> None:
        if mode not in TRANSFER_MODES:
            raise ValueError(f"transfer mode {mode!r}: must be one of {', '.join(TRANSFER_MODES)}")
        if not ssd_write_gbps > 0:
            raise ValueError(f"ssd_write_gbps={ssd_write_gbps}: must be > 0")
        self.mode = mode
        self.ingress = bw.ingress_gbps * _GB
        self.gds_total = bw.gds_gbps * _GB
        self.gds = self.gds_total  # what SSD writes leave of it for reads
        self.dram = bw.dram_gbps * _GB
        self.ssd_write = min(ssd_write_gbps * _GB, self.gds_total)
        self.write_left = 0.0  # SSD write bytes queued (background)
        self.promo_left = 0.0  # GPU -> DRAM promotion bytes queued (background)
        self.background_rates = (0.0, 0.0)  # (write, promotion) bytes/s of the last decision
        self.write_busy_s = 0.0  # time the drive spent writing
        self.active: list[Transfer] = []
        self.now = 0.0
        # (rates, next finish) decided for the current state, until it changes: the replay asks for the
        # next event time, then advances to it, so each decision would otherwise be made twice
        self._decided: tuple[list[tuple[float, float]], float] | None = None

    def submit(self, req_id: int, dram_bytes: float, ssd_bytes: float, now: float) -> list[tuple[int, float]]:
        """Queue a reload at ``now``; returns transfers that finished while advancing to ``now``."""
        if now < self.now - 1e-12:
            raise ValueError(f"submit at t={now} is before the coordinator clock {self.now}")
        if dram_bytes < 0 or ssd_bytes < 0:
            raise ValueError(f"request {req_id}: negative transfer bytes ({dram_bytes}, {ssd_bytes})")
        finished = self.advance(now)
        self.active.append(Transfer(req_id, float(dram_bytes), float(ssd_bytes), now))
        self._decided = None
        return finished

    def submit_background(self, write_bytes: float, promo_bytes: float, now: float) -> list[tuple[int, float]]:
        """Queue SSD writes and promotions at ``now``; returns transfers that finished while advancing to ``now``."""
        finished = self.advance(now)
        if write_bytes > 0 or promo_bytes > 0:
            self.write_left += write_bytes
            self.promo_left += promo_bytes
            self._decided = None
        return finished

    @property
    def background(self) -> bool:
        return self.write_left > 0 or self.promo_left > 0

    def allocate(self) -> list[tuple[float, float]]:
        """The pacing decision: (dram_rate, gds_rate) in bytes/s per active transfer (background rates
        in ``background_rates``)."""
        write = self.ssd_write if self.write_left > 0 else 0.0
        self.gds = self.gds_total - write
        rates = self._allocate_reads()
        promo = max(0.0, self.dram - sum(d for d, _ in rates)) if self.promo_left > 0 else 0.0
        self.background_rates = (write, promo)
        return rates

    def _allocate_reads(self) -> list[tuple[float, float]]:
        ingress, gds, dram = self.ingress, self.gds, self.dram
        rates = [(0.0, 0.0)] * len(self.active)
        if self.mode == "overlap":
            dram_rates, ingress = _fifo_grants(dram, ingress, [tr.dram_left > 0 for tr in self.active])
            gds_rates, _ = _fifo_grants(gds, ingress, [tr.ssd_left > 0 for tr in self.active])
            return list(zip(dram_rates, gds_rates))
        if self.mode == "coordinated":
            return self._allocate_coordinated()
        for i, tr in enumerate(self.active):  # serial
            d = g = 0.0
            if tr.dram_left > 0:
                d = min(dram, ingress)
            elif tr.ssd_left > 0:
                g = min(gds, ingress)
            gds -= g
            dram -= d
            ingress -= d + g
            rates[i] = (d, g)
        return rates

    def _allocate_coordinated(self) -> list[tuple[float, float]]:
        """GDS allowances first, for every transfer in FIFO order; then DRAM out of what is
        left, paced to ``B_ingress - B_gds`` while the transfer's own GDS reads are active.
        (Granting DRAM per transfer in FIFO order let a DRAM-only load queued ahead take the
        whole link and hold a later SSD reload back.)"""
        dram, pace = self.dram, max(0.0, self.ingress - self.gds_total)  # the configured allowance
        gds_rates, ingress = _fifo_grants(self.gds, self.ingress, [tr.ssd_left > 0 for tr in self.active])
        rates = []
        for tr, g in zip(self.active, gds_rates):
            d = 0.0
            if tr.dram_left > 0:
                d = min(dram, ingress, pace) if g > 0 else min(dram, ingress)
            dram -= d
            ingress -= d
            rates.append((d, g))
        return rates

    def next_event_time(self) -> float | None:
        """When the next part (DRAM or SSD) of some transfer, or a background stream, finishes at current rates."""
        if not self.active and not self.background:
            return None
        return self._decide()[1]

    def _decide(self) -> tuple[list[tuple[float, float]], float]:
        """The rates of the current state and when the next part finishes at them (kept until the state changes)."""
        if self._decided is None:
            rates = self.allocate()
            self._decided = (rates, self._next_finish(rates))
        return self._decided

    def _next_finish(self, rates: list[tuple[float, float]]) -> float:
        best = math.inf
        now = self.now
        w, p = self.background_rates
        if w > 0:
            best = now + self.write_left / w
        if p > 0:
            best = min(best, now + self.promo_left / p)
        for tr, (d, g) in zip(self.active, rates):
            if tr.dram_left > 0 and d > 0:
                best = min(best, now + tr.dram_left / d)
            if tr.ssd_left > 0 and g > 0:
                best = min(best, now + tr.ssd_left / g)
        if best == math.inf and (self.active or self.background) and not any(tr.done for tr in self.active):
            raise RuntimeError("coordinator stalled: active transfers but no bandwidth allocated")
        return best

    def advance(self, until: float) -> list[tuple[int, float]]:
        """Integrate rates up to ``until``; return (req_id, completion time) of finished transfers.

        Each step ends at the next part (or background stream) completion, where rates are
        re-decided; a part whose computed finish time is that step's end is set to exactly zero,
        so every step makes progress and completion times are exact up to float rounding.
        """
        finished: list[tuple[int, float]] = []
        while self.active or self.background:
            if any(tr.done for tr in self.active):  # zero-byte parts finish on submission
                finished.extend((tr.req_id, self.now) for tr in self.active if tr.done)
                self.active = [tr for tr in self.active if not tr.done]
                self._decided = None
                continue
            rates, t_next = self._decide()
            now = self.now
            if t_next > until:
                dt = until - now
                if dt <= 0.0:  # nothing moves: the decision stands
                    break
                self._decided = None
                self._move(rates, dt, None)
                self.now = until
                if not any(tr.done for tr in self.active):
                    break
                continue
            self._decided = None
            self._move(rates, t_next - now, t_next)
            self.now = t_next
        if until != math.inf:
            self.now = max(self.now, until)
        return finished

    def _move(self, rates: list[tuple[float, float]], dt: float, event_t: float | None) -> None:
        """Move every part and background stream for ``dt`` at ``rates``; at an event (``event_t``) what
        finishes by then is set to exactly zero."""
        now = self.now

        def left_after(left: float, rate: float) -> float:
            if not rate or left <= 0:
                return left
            if event_t is not None and now + left / rate <= event_t:
                return 0.0
            return max(left - rate * dt, 0.0)

        w, p = self.background_rates
        if w and self.write_left > 0:
            self.write_busy_s += dt
        self.write_left = left_after(self.write_left, w)
        self.promo_left = left_after(self.promo_left, p)
        for tr, (d, g) in zip(self.active, rates):
            tr.dram_left = left_after(tr.dram_left, d)
            tr.ssd_left = left_after(tr.ssd_left, g)

    def drop(self, req_id: int) -> None:
        """Abandon a transfer: it finishes at the next ``advance`` with what it has moved."""
        for tr in self.active:
            if tr.req_id == req_id:
                tr.ssd_left = tr.dram_left = 0.0
                self._decided = None

    @staticmethod
    def single_request_time(bw: BandwidthConfig, mode: str, dram_bytes: float, ssd_bytes: float) -> float:
        """Completion time of one request alone (a convenience for planning and tests)."""
        c = TransferCoordinator(bw, mode)
        c.submit(0, dram_bytes, ssd_bytes, 0.0)
        done = c.advance(float("inf"))
        return done[0][1] if done else 0.0


@dataclass
class PacedReload:
    """What the pacer let one reload do, by its own clock (seconds since the pacer started):
    submitted at ``begin_t``; each step is (t, SSD bytes read, DRAM bytes the model had
    copied by then), taken when ``pace_ssd`` returned."""

    dram_bytes: float
    ssd_bytes: float
    begin_t: float
    steps: list[tuple[float, float, float]] = field(default_factory=list)


class RealTimePacer:
    """Real-mode driver of the coordinator (SGLang adapter): paces a live reload.

    Each reload is submitted with its DRAM and SSD bytes at the wall clock. After reading
    ``bytes_done`` of its SSD part, :meth:`pace_ssd` sleeps until the fluid model has moved
    that many bytes at the GDS rate ``allocate()`` gives this reload (other reloads' DRAM
    parts share the ingress), then says how many of its DRAM bytes the model has moved by
    then: the reloader copies that much of the DRAM part along with the chunk. So
    ``coordinated`` spreads the DRAM copy over the SSD reads at ``B_ingress - B_gds``,
    while ``overlap`` and ``serial`` copy it all up front. Reads slower than the model
    never wait.

    Thread-safe: the reload worker paces (and sleeps) on its own thread while the
    scheduler thread registers HiCache's DRAM-only loads; the lock is never held
    across a sleep, so the scheduler never waits on pacing.
    """

    def __init__(
        self,
        bw: BandwidthConfig,
        mode: str = "coordinated",
        clock=None,
        sleep=None,
    ) -> None:
        import threading
        import time

        self._lock = threading.Lock()
        self.coordinator = TransferCoordinator(bw, mode)
        self.clock = clock or time.monotonic
        self.sleep = sleep or time.sleep
        self._t0 = self.clock()
        self._next_id = 0
        self._paced: dict[int, PacedReload] = {}  # reload id -> its totals and steps so far
        self.slept_s = 0.0

    def _now(self) -> float:
        return max(self.clock() - self._t0, self.coordinator.now)

    def begin(self, dram_bytes: float, ssd_bytes: float) -> int:
        """Submit a reload now; returns its id for :meth:`pace_ssd` and :meth:`end`."""
        with self._lock:
            rid = self._next_id
            self._next_id += 1
            now = self._now()
            self.coordinator.submit(rid, dram_bytes, ssd_bytes, now)
            if ssd_bytes:  # a DRAM-only reload is only modelled: nothing to pace or end
                self._paced[rid] = PacedReload(float(dram_bytes), float(ssd_bytes), now)
            return rid

    def pace_ssd(self, rid: int, bytes_done: float) -> float:
        """Block until the model lets reload ``rid`` have read ``bytes_done`` SSD bytes;
        returns the DRAM bytes of ``rid`` the model has copied by then."""
        with self._lock:
            paced = self._paced[rid]
        while True:
            with self._lock:
                wait, dram_done = self._wait_for(rid, bytes_done, paced.dram_bytes, paced.ssd_bytes)
                if wait is None:
                    paced.steps.append((self._now(), float(bytes_done), dram_done))
                    return dram_done
            self.sleep(wait)
            self.slept_s += wait

    def _wait_for(
        self, rid: int, bytes_done: float, dram_total: float, ssd_total: float
    ) -> tuple[Optional[float], float]:
        """(seconds to sleep, None when none) and the DRAM bytes the model has moved."""
        while True:
            self.coordinator.advance(self._now())
            active = {tr.req_id: i for i, tr in enumerate(self.coordinator.active)}
            if rid not in active:
                return None, dram_total  # both parts are complete in the model
            tr = self.coordinator.active[active[rid]]
            ahead = bytes_done - (ssd_total - tr.ssd_left)
            if ahead <= 1.0:  # within a byte
                return None, dram_total - tr.dram_left
            _, gds_rate = self.coordinator.allocate()[active[rid]]
            wait = ahead / gds_rate if gds_rate > 0 else self.coordinator.next_event_time() - self.coordinator.now
            if wait < 1e-9:
                # Below the clock's float resolution: step the model past the event instead.
                self.coordinator.advance(self.coordinator.now + 1e-9)
                continue
            return wait, dram_total - tr.dram_left

    def end(self, rid: int) -> Optional[PacedReload]:
        """The reload is over (done or abandoned): drop what the model has left of it; returns
        what the pacer let it do (None for a DRAM-only reload)."""
        with self._lock:
            self.coordinator.drop(rid)
            return self._paced.pop(rid, None)
