"""Paper 4.5: fluid-model completion times equal hand-computed values."""

import pytest

from sglang_saria.config import BandwidthConfig
from sglang_saria.mem_cache.coordinator import RealTimePacer, TransferCoordinator

GB = 1e9
GiB = 2**30


def test_single_request_serial_overlap_coordinated_times():
    # paper 5.3 setup: 9.28125 GiB per tier, 24 GB/s ingress, 8 GB/s GDS allowance
    bw = BandwidthConfig(24, 8, 24)
    d = s = 9.28125 * GiB
    serial = d / (24 * GB) + s / (8 * GB)
    assert TransferCoordinator.single_request_time(bw, "serial", d, s) == pytest.approx(serial, rel=1e-12)
    # uncoordinated: the DRAM burst takes all ingress, so SSD progresses only afterwards
    assert TransferCoordinator.single_request_time(bw, "overlap", d, s) == pytest.approx(serial, rel=1e-12)
    # coordinated: DRAM paced to 16 GB/s while GDS reads at 8; DRAM ends at d/16, SSD at s/8
    assert TransferCoordinator.single_request_time(bw, "coordinated", d, s) == pytest.approx(s / (8 * GB), rel=1e-12)


def test_coordinated_residual_ingress_serves_other_requests_dram_parts():
    c = TransferCoordinator(BandwidthConfig(48, 20, 48), "coordinated")
    c.submit(0, 16 * GB, 16 * GB, 0.0)  # A: GDS 20, DRAM paced to 28 -> DRAM done at 16/28
    c.submit(1, 16 * GB, 0, 0.0)  # B: DRAM only, waits for residual ingress
    done = dict(c.advance(float("inf")))
    # A's SSD ends at 0.8 s; B got 28 GB/s from 4/7 s to 0.8 s (6.4 GB), then 48 GB/s for 9.6 GB
    assert done[0] == pytest.approx(0.8, rel=1e-12)
    assert done[1] == pytest.approx(1.0, rel=1e-12)


def test_dram_only_load_queued_ahead_does_not_hold_a_later_ssd_reload_back():
    # Issue 12: 10 GB DRAM-only load, then a 14.7 GB SSD reload; GDS keeps its 20 GB/s
    # allowance (0.735 s), the DRAM load gets the other 28 GB/s (before the fix: 0.94 s).
    c = TransferCoordinator(BandwidthConfig(48, 20, 48), "coordinated")
    c.submit(0, 10 * GB, 0, 0.0)
    c.submit(1, 0, 14.7 * GB, 0.0)
    done = dict(c.advance(float("inf")))
    assert done[1] == pytest.approx(0.735, rel=1e-12)
    assert done[0] == pytest.approx(10 / 28, rel=1e-12)


def test_coordinated_request_goes_to_full_dram_rate_after_its_ssd_part():
    c = TransferCoordinator(BandwidthConfig(48, 20, 48), "coordinated")
    c.submit(0, 40 * GB, 10 * GB, 0.0)  # SSD done at 0.5 s (DRAM 28 GB/s -> 14 GB), then 26 GB at 48
    assert c.advance(float("inf")) == [(0, pytest.approx(0.5 + 26 / 48, rel=1e-12))]


def test_arrival_mid_transfer_and_gds_fifo():
    c = TransferCoordinator(BandwidthConfig(48, 20, 48), "coordinated")
    c.submit(0, 0, 20 * GB, 0.0)  # 1 s of GDS
    assert c.submit(1, 0, 10 * GB, 0.5) == []  # queued behind request 0 on the SSD
    assert c.next_event_time() == pytest.approx(1.0)
    done = c.advance(10.0)
    assert done == [(0, pytest.approx(1.0)), (1, pytest.approx(1.5))]
    assert c.now == 10.0


def test_gds_saturating_ingress_leaves_no_pace_for_dram():
    c = TransferCoordinator(BandwidthConfig(20, 20, 48), "coordinated")
    c.submit(0, 10 * GB, 10 * GB, 0.0)
    assert c.allocate() == [(0.0, 20 * GB)]
    assert c.advance(float("inf")) == [(0, pytest.approx(0.5 + 0.5))]


def test_zero_byte_transfer_completes_on_submission():
    c = TransferCoordinator(BandwidthConfig(), "serial")
    c.submit(7, 0, 0, 3.0)
    assert c.advance(3.0) == [(7, 3.0)]


def test_bad_mode_and_time_travel_are_errors():
    with pytest.raises(ValueError, match="transfer mode"):
        TransferCoordinator(BandwidthConfig(), "parallel")
    c = TransferCoordinator(BandwidthConfig(), "serial")
    c.advance(5.0)
    with pytest.raises(ValueError, match="before the coordinator clock"):
        c.submit(0, 1, 1, 4.0)


class FakeClock:
    """Wall clock for the real-time pacer: reads are instant, only its sleeps advance time."""

    def __init__(self) -> None:
        self.t = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


@pytest.mark.parametrize("mode, ssd_done_s", [("coordinated", 1.0), ("overlap", 2.0)])
def test_real_time_pacer_holds_ssd_reads_to_their_gds_allowance(mode, ssd_done_s):
    clock = FakeClock()
    pacer = RealTimePacer(BandwidthConfig(10, 4, 10), mode, clock=clock, sleep=clock.sleep)
    rid = pacer.begin(0, 4 * GB)
    pacer.begin(10 * GB, 0)  # the next request's DRAM part, copying meanwhile
    for done in (1 * GB, 2 * GB, 3 * GB, 4 * GB):  # four chunks read instantly
        pacer.pace_ssd(rid, done)
    pacer.end(rid)
    # coordinated: GDS reads at 4 GB/s from the start (the DRAM copy gets the residual 6);
    # overlap: the DRAM burst takes all 10 GB/s for 1 s, then GDS reads at 4.
    assert clock.t - 100.0 == pytest.approx(ssd_done_s, rel=1e-9)
    assert pacer.slept_s == pytest.approx(ssd_done_s, rel=1e-9)


def test_real_time_pacer_never_delays_reads_slower_than_the_model():
    clock = FakeClock()
    pacer = RealTimePacer(BandwidthConfig(10, 4, 10), "coordinated", clock=clock, sleep=clock.sleep)
    rid = pacer.begin(0, 4 * GB)
    clock.t += 2.0  # the reads took 2 s: the model finished them at 1 s
    pacer.pace_ssd(rid, 4 * GB)
    assert clock.slept == []


@pytest.mark.parametrize("mode, dram_due", [("coordinated", [1.5, 3.0, 4.5, 6.0]), ("overlap", [6.0] * 4)])
def test_real_time_pacer_spreads_the_dram_part_over_the_ssd_reads_when_coordinated(mode, dram_due):
    clock = FakeClock()
    pacer = RealTimePacer(BandwidthConfig(10, 4, 10), mode, clock=clock, sleep=clock.sleep)
    rid = pacer.begin(6 * GB, 4 * GB)
    # coordinated: GDS 4 GB/s, DRAM paced to the residual 6 GB/s -> 1.5 GB per 1 GB SSD chunk;
    # overlap: DRAM takes the link first, all of it is due with the first chunk.
    due = [pacer.pace_ssd(rid, done * GB) / GB for done in (1, 2, 3, 4)]
    assert due == pytest.approx(dram_due, rel=1e-9)


def test_real_time_pacer_records_what_it_let_a_reload_do():
    clock = FakeClock()
    pacer = RealTimePacer(BandwidthConfig(10, 4, 10), "coordinated", clock=clock, sleep=clock.sleep)
    rid = pacer.begin(6 * GB, 4 * GB)
    dram_only = pacer.begin(1 * GB, 0)
    for done in (2, 4):
        pacer.pace_ssd(rid, done * GB)
    paced = pacer.end(rid)
    # (pacer seconds, SSD bytes read, DRAM bytes the model had copied): GDS at 4 GB/s, DRAM at the
    # residual 6 GB/s (the later DRAM-only load gets what this one leaves of the DRAM bandwidth).
    assert (paced.dram_bytes, paced.ssd_bytes, paced.begin_t) == (6 * GB, 4 * GB, 0.0)
    assert paced.steps == [pytest.approx((0.5, 2 * GB, 3 * GB)), pytest.approx((1.0, 4 * GB, 6 * GB))]
    assert pacer.end(dram_only) is None  # modelled only: nothing was paced


def test_ssd_writes_take_the_drive_from_concurrent_reads():
    # issue 25 item 4: 5 GB of writes at 10 GB/s drain in 0.5 s; a 15 GB SSD reload shares the
    # 20 GB/s drive: 10 GB/s while the writes drain (5 GB), then 20 GB/s for the other 10 GB
    c = TransferCoordinator(BandwidthConfig(48, 20, 48), "coordinated", ssd_write_gbps=10)
    c.submit_background(5 * GB, 0, 0.0)
    c.submit(0, 0, 15 * GB, 0.0)
    assert c.advance(float("inf")) == [(0, pytest.approx(0.5 + 0.5, rel=1e-12))]
    assert c.write_left == 0 and c.write_busy_s == pytest.approx(0.5, rel=1e-12)


def test_dram_pace_stays_the_configured_allowance_while_writes_drain():
    # the coordinator's DRAM pace is B_ingress - B_gds (28 GB/s) whatever the writes leave to GDS
    c = TransferCoordinator(BandwidthConfig(48, 20, 48), "coordinated", ssd_write_gbps=10)
    c.submit_background(100 * GB, 0, 0.0)
    c.submit(0, 28 * GB, 10 * GB, 0.0)
    assert c.allocate() == [(28 * GB, 10 * GB)]
    assert c.background_rates == (10 * GB, 0.0)


def test_promotions_take_what_dram_reads_leave_and_never_slow_them():
    c = TransferCoordinator(BandwidthConfig(48, 20, 40), "coordinated")
    c.submit_background(0, 12 * GB, 0.0)
    c.submit(0, 28 * GB, 0, 0.0)  # DRAM-only: min(dram 40, ingress 48) = 40 GB/s, alone
    assert c.allocate() == [(40 * GB, 0.0)]
    assert c.background_rates == (0.0, 0.0)  # DRAM reads take all of B_dram: promotions wait
    assert c.advance(float("inf")) == [(0, pytest.approx(0.7, rel=1e-12))]
    assert c.promo_left == 0 and c.now == pytest.approx(0.7 + 12 / 40, rel=1e-12)


def test_background_alone_drains_and_leaves_reads_their_full_rate():
    c = TransferCoordinator(BandwidthConfig(48, 20, 48), "coordinated", ssd_write_gbps=10)
    c.submit_background(2 * GB, 1 * GB, 0.0)
    assert c.submit(0, 0, 20 * GB, 1.0) == []  # writes done at 0.2 s, promotion at 1/48 s
    assert not c.background
    assert c.advance(float("inf")) == [(0, pytest.approx(2.0, rel=1e-12))]


def test_write_bandwidth_must_be_positive():
    with pytest.raises(ValueError, match="ssd_write_gbps=0"):
        TransferCoordinator(BandwidthConfig(), "coordinated", ssd_write_gbps=0)
