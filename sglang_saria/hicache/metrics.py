"""Prometheus counters of Saria inside SGLang, named like SGLang's own (`sglang:` prefix).

Created once per process (SGLang may build several caches in one process); the store's
byte and lifetime metrics live next to the store (`sglang_saria/storage/metrics.py`).
"""

from __future__ import annotations

from typing import Any, Optional


class SariaServingMetrics:
    """Admissions, host evictions, reloads by source, reload fallbacks, promotions."""

    _instance: Optional["SariaServingMetrics"] = None

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge

        self._tier_counters(Counter)
        self._audit_counters(Counter)
        self._gauges(Gauge)
        self._counter_log_metrics(Counter, Gauge)
        self._auto_metrics(Counter, Gauge)

    def _tier_counters(self, Counter: type) -> None:
        """Admissions, host evictions, reloads, promotions: what moved between the tiers."""
        self._admitted = Counter(
            "sglang:saria_ssd_admissions_total",
            "Nodes admitted to SSD, by admission event (state: a hybrid node's GDN state written beside its stored pages)",
            ["event"],
        )
        self._host_evictions = Counter(
            "sglang:saria_host_evictions_total", "Host (DRAM) node reclaims counted as evictions (E += 1)"
        )
        self._host_reclaims = Counter(
            "sglang:saria_host_reclaims_total",
            "Host leaf reclaims asked of the admission gate, by what the store held then (event): stored (written "
            "before: prewrite, insert, reuse), in_flight, deferred (write-before-reclaim started, reclaim postponed; "
            "also a hybrid node's GDN state the store lacks beside its stored pages), "
            "after_write (the postponed reclaim), dropped (no SSD copy)",
            ["event"],
        )
        self._host_leaf_splits = Counter(
            "sglang:saria_host_leaf_splits_total",
            "Host leaves split at host eviction so that their admitted leading pages are written (per-page admission)",
        )
        self._reload_tokens = Counter(
            "sglang:saria_reload_tokens_total",
            "Prompt tokens reloaded into the device KV pool, by source (dram: host pool, ssd: store direct)",
            ["source"],
        )
        self._reload_fallbacks = Counter(
            "sglang:saria_reload_fallbacks_total",
            "Reloads abandoned for recomputation, by reason (store read failure, no device memory, ...)",
            ["reason"],
        )
        self._pages_read = Counter(
            "sglang:saria_store_pages_read_total",
            "KV pages read from the store, by target (host: HiCache prefetch staging, device: direct reload)",
            ["target"],
        )
        self._promoted_tokens = Counter(
            "sglang:saria_promoted_tokens_total", "SSD-hit tokens copied from device to host (lazy partial promotion)"
        )
        self._reload_wasted = Counter(
            "sglang:saria_reload_tokens_wasted_total",
            "Tokens reloaded into the device pool and evicted before their request was admitted",
        )
        self._holds_released = Counter(
            "sglang:saria_reload_holds_released_total",
            "Reloaded prefixes unlocked before their request's prefill: its hold's deadline passed "
            "(transfer.reload_hold_s) or the scheduler stalled behind the holds",
            ["reason"],
        )
        self._reload_followers = Counter(
            "sglang:saria_reload_followers_total",
            "Requests that waited for another request's reload of their stored pages instead of reading them again",
        )

    def _audit_counters(self, Counter: type) -> None:
        """The tier audit's and the KV audit's checks and errors, and pages dropped after a failed read."""
        self._audits = Counter("sglang:saria_tier_audits_total", "Tier audits of the radix tree (SGLANG_SARIA_AUDIT_TIERS=1)")
        self._audit_errors = Counter(
            "sglang:saria_tier_audit_errors_total", "Tree locations or counters that disagree with the pools and store"
        )
        self._kv_audit_pages = Counter(
            "sglang:saria_kv_audit_pages_total",
            "Pages whose bytes the KV audit checked after a move, by path and pool (SGLANG_SARIA_AUDIT_KV=1)",
            ["path", "pool"],
        )
        self._kv_audit_errors = Counter(
            "sglang:saria_kv_audit_errors_total",
            "Moved pages whose bytes differ from what left the device, by path and pool",
            ["path", "pool"],
        )
        self._pages_dropped = Counter(
            "sglang:saria_reload_pages_dropped_total",
            "Pages whose reload read failed (I/O error, checksum) and that left the store index",
        )

    def _gauges(self, Gauge: type) -> None:
        """Reloads and writes in flight, the write budget's state, the tree's pages per tier."""
        self._reload_inflight = Gauge(
            "sglang:saria_reload_inflight_tokens",
            "Device slots held by direct reloads not yet admitted (read by the reload worker)",
            multiprocess_mode="mostrecent",
        )
        self._writes_in_flight = Gauge(
            "sglang:saria_storage_writes_in_flight",
            "Node writes to the SSD store requested by HiCache and not yet acknowledged",
            multiprocess_mode="livemax",
        )
        self._write_through_in_flight = Gauge(
            "sglang:saria_write_through_in_flight",
            "HiCache write-throughs (device -> host copies) not yet acknowledged; each may ask the store for writes at its ack",
            multiprocess_mode="livemax",
        )
        self._budget_theta_e = Gauge(
            "sglang:saria_budget_theta_e", "theta_E the budget:<DWPD> controller admits with now",
            multiprocess_mode="mostrecent",
        )
        self._budget_unspent = Gauge(
            "sglang:saria_budget_unspent_ratio",
            "Share of the budget:<DWPD> controller's write budget left in its sliding window",
            multiprocess_mode="mostrecent",
        )
        self._tree_pages = Gauge(
            "sglang:saria_tree_pages", "Pages of the radix tree held by each tier, at the last audit", ["tier"],
            multiprocess_mode="mostrecent",
        )

    def _counter_log_metrics(self, Counter: type, Gauge: type) -> None:
        """Admission counters kept across restarts (hicache/counter_log.py)."""
        self._counters_unsaved = Gauge(
            "sglang:saria_counters_unsaved",
            "Admission counter changes not yet durable in the store's index (0: a restart keeps them all)",
            multiprocess_mode="livesum",
        )
        self._counters_restored = Counter(
            "sglang:saria_counters_restored_total", "Page counters restored from the store at start (used within the window)"
        )
        self._counters_expired = Counter(
            "sglang:saria_counters_expired_total", "Page counters dropped at start: unused for a whole metadata window"
        )

    def _auto_metrics(self, Counter: type, Gauge: type) -> None:
        """The load signal and the decisions of the load-reading admissions (``auto``: ``mem_cache/learned.py``,
        ``loadaware``: ``mem_cache/auto.py``), and agents' hints (load_signal.py, hints.py)."""
        self._auto_backlog = Gauge(
            "sglang:saria_auto_backlog_seconds",
            "auto / loadaware admission: seconds of prefill queued on the scheduler (its load signal; smoothed "
            "for loadaware)",
            multiprocess_mode="mostrecent",
        )
        self._auto_queued = Gauge(
            "sglang:saria_auto_queued_prefill_tokens",
            "auto admission: uncached prompt tokens waiting for prefill (cached prefixes and storage hits "
            "left out), the load signal's tokens before they are divided by the measured prefill rate",
            multiprocess_mode="mostrecent",
        )
        self._auto_decisions = Counter(
            "sglang:saria_auto_decisions_total",
            "auto admission: DRAM evictions of blocks not on SSD decided, by reason: admit, cold (its learned "
            "reuse odds under the bar), victim (not more likely reused than the SSD copy it would displace), "
            "budget (the drive's write budget is spent)", ["reason"],
        )
        self._auto_ghost = Gauge(
            "sglang:saria_auto_ghost_blocks", "auto admission: evicted blocks its ghost tracks (bounded by auto_max_bytes)",
            multiprocess_mode="mostrecent",
        )
        self._auto_bar = Gauge(
            "sglang:saria_auto_bar", "auto admission: the reuse odds a write needs now (inf: none allowed)",
            multiprocess_mode="mostrecent",
        )
        self._loadaware_theta_e = Gauge(
            "sglang:saria_loadaware_theta_e", "loadaware admission: the DRAM evictions a block needs to be written now",
            multiprocess_mode="mostrecent",
        )
        self._loadaware_decisions = Counter(
            "sglang:saria_loadaware_decisions_total",
            "loadaware admission: writes admitted while loaded (state=spend) or idle (state=save)", ["state"],
        )
        self._hints = Counter(
            "sglang:saria_hints_total",
            "Agents' hints: end, expect_return, left_behind (hints taken), dropped (over the bound), skipped_writes "
            "(a write an end hint stopped), hinted_writes (a write only a return hint asked for), "
            "left_skipped_writes (a write stopped because the session went on without the page)", ["kind"],
        )
        self._exported: dict[tuple[str, str], int] = {}  # cumulative counts already added to the counters

    @classmethod
    def get(cls) -> "SariaServingMetrics":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def admitted(self, event: str) -> None:
        self._admitted.labels(event=event).inc()

    def host_evicted(self) -> None:
        self._host_evictions.inc()

    def host_leaf_split(self) -> None:
        self._host_leaf_splits.inc()

    def host_reclaim(self, gate: str) -> None:
        self._host_reclaims.labels(event=gate).inc()

    def reloaded(self, source: str, tokens: int) -> None:
        if tokens:
            self._reload_tokens.labels(source=source).inc(tokens)

    def reload_fallback(self, reason: str) -> None:
        self._reload_fallbacks.labels(reason=reason).inc()

    def hold_released(self, reason: str) -> None:
        self._holds_released.labels(reason=reason).inc()

    def reload_wasted(self, tokens: int) -> None:
        if tokens > 0:
            self._reload_wasted.inc(tokens)

    def reload_followed(self) -> None:
        self._reload_followers.inc()

    def promoted(self, tokens: int) -> None:
        if tokens:
            self._promoted_tokens.inc(tokens)

    def pages_read(self, target: str, pages: int) -> None:
        if pages:
            self._pages_read.labels(target=target).inc(pages)

    def audited(self, pages_by_tier: dict[str, int], errors: int) -> None:
        self._audits.inc()
        if errors:
            self._audit_errors.inc(errors)
        for tier, pages in pages_by_tier.items():
            self._tree_pages.labels(tier=tier).set(pages)

    def kv_audited(self, path: str, pool: str, pages: int, errors: int) -> None:
        self._kv_audit_pages.labels(path=path, pool=pool).inc(pages)
        if errors:
            self._kv_audit_errors.labels(path=path, pool=pool).inc(errors)

    def pages_dropped(self, pages: int) -> None:
        self._pages_dropped.inc(pages)

    def reload_inflight(self, tokens: int) -> None:
        self._reload_inflight.set(tokens)

    def storage_writes_in_flight(self, writes: int) -> None:
        self._writes_in_flight.set(writes)

    def write_through_in_flight(self, copies: int) -> None:
        self._write_through_in_flight.set(copies)

    def counters_unsaved(self, delta: int) -> None:
        self._counters_unsaved.inc(delta)

    def counters_restored(self, restored: int, expired: int) -> None:
        self._counters_restored.inc(restored)
        self._counters_expired.inc(expired)

    def auto_queued(self, tokens: int) -> None:
        """Once per scheduler step: the uncached tokens queued for prefill (``load_signal.py``)."""
        self._auto_queued.set(tokens)

    def auto_state(self, state: dict[str, float], decisions: dict[str, int], hint_counts: dict[str, int]) -> None:
        """Once per scheduler step: a load-reading admission's ``state()``, its decisions and its hints'
        counts (cumulative; what grew since the last step is added to the counters). ``auto``'s state
        has ``bar`` and ``ghost_blocks``, ``loadaware``'s ``theta_E``."""
        self._auto_backlog.set(state["backlog_s"])
        if "theta_E" in state:
            self._loadaware_theta_e.set(state["theta_E"])
            self._add_growth(self._loadaware_decisions, "state", decisions)
        else:
            self._auto_bar.set(state["bar"])
            self._auto_ghost.set(state["ghost_blocks"])
            self._add_growth(self._auto_decisions, "reason", decisions)
        self._add_growth(self._hints, "kind", hint_counts)

    def _add_growth(self, counter: Any, label: str, counts: dict[str, int]) -> None:
        exported = self._exported
        for name, value in counts.items():
            grown = value - exported.get((label, name), 0)
            if grown > 0:
                counter.labels(**{label: name}).inc(grown)
            exported[(label, name)] = value  # a new policy (attached at run time) counts from 0 again

    def budget(self, theta_e: float, unspent: float) -> None:
        self._budget_theta_e.set(theta_e)
        self._budget_unspent.set(unspent)
