"""Prometheus metrics of the SSD store, SGLang style ("sglang:saria_...").

Collectors are process-wide and created once: several stores in one process
(tests, TP ranks in one process) share them through labels instead of
registering duplicates. prometheus_client is imported on first use, never at module import:
SGLang's launcher validates the saria extra-config (importing this package) before it sets
PROMETHEUS_MULTIPROC_DIR, and prometheus_client picks its multiprocess mode when first imported.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge, Histogram

_LOCK = threading.Lock()
_METRICS: Optional["StoreMetrics"] = None


def _get_or_create(cls, name: str, doc: str, labels, **kw):
    from prometheus_client import REGISTRY, Counter

    try:
        return cls(name=name, documentation=doc, labelnames=labels, **kw)
    except ValueError:
        # Registered earlier in this process (e.g. a module reload): reuse it.
        base = name[: -len("_total")] if cls is Counter and name.endswith("_total") else name
        return REGISTRY._names_to_collectors[base]


@dataclass
class StoreMetrics:
    ssd_bytes_written: Counter
    ssd_bytes_read: Counter
    ssd_projected_lifetime_years: Gauge
    ssd_observed_dwpd: Gauge
    ssd_write_budget_used: Gauge
    ops: Counter
    evictions: Counter
    objects: Gauge
    used_bytes: Gauge
    capacity_bytes: Gauge
    online: Gauge
    disk_full: Gauge
    op_seconds: Histogram
    info: Gauge


def store_metrics() -> StoreMetrics:
    from prometheus_client import Counter, Gauge, Histogram

    global _METRICS
    with _LOCK:
        if _METRICS is None:
            dev, store = ["device"], ["store"]
            _METRICS = StoreMetrics(
                ssd_bytes_written=_get_or_create(
                    Counter,
                    "sglang:saria_ssd_bytes_written_total",
                    "Bytes written to the SSD by the Saria store",
                    dev,
                ),
                ssd_bytes_read=_get_or_create(
                    Counter,
                    "sglang:saria_ssd_bytes_read_total",
                    "Bytes read from the SSD by the Saria store",
                    dev,
                ),
                ssd_projected_lifetime_years=_get_or_create(
                    Gauge,
                    "sglang:saria_ssd_projected_lifetime_years",
                    "Projected drive lifetime at the observed write rate, from the drive rating",
                    dev,
                    multiprocess_mode="mostrecent",
                ),
                ssd_observed_dwpd=_get_or_create(
                    Gauge,
                    "sglang:saria_ssd_observed_dwpd",
                    "Observed drive writes per day",
                    dev,
                    multiprocess_mode="mostrecent",
                ),
                ssd_write_budget_used=_get_or_create(
                    Gauge,
                    "sglang:saria_ssd_write_budget_used_ratio",
                    "Fraction of the rated lifetime writes already used",
                    dev,
                    multiprocess_mode="mostrecent",
                ),
                ops=_get_or_create(
                    Counter,
                    "sglang:saria_store_ops_total",
                    "Store operations by result (op=recover: damage found at start, result = what)",
                    ["store", "op", "result"],
                ),
                evictions=_get_or_create(
                    Counter,
                    "sglang:saria_store_evictions_total",
                    "Objects evicted by the store for space",
                    store,
                ),
                objects=_get_or_create(
                    Gauge, "sglang:saria_store_objects", "Objects held", store, multiprocess_mode="mostrecent"
                ),
                used_bytes=_get_or_create(
                    Gauge,
                    "sglang:saria_store_used_bytes",
                    "Slot bytes in use",
                    store,
                    multiprocess_mode="mostrecent",
                ),
                capacity_bytes=_get_or_create(
                    Gauge,
                    "sglang:saria_store_capacity_bytes",
                    "Store capacity",
                    store,
                    multiprocess_mode="mostrecent",
                ),
                online=_get_or_create(
                    Gauge,
                    "sglang:saria_store_online",
                    "1 while the store serves; 0 once its data dir was removed while serving",
                    store,
                    multiprocess_mode="mostrecent",
                ),
                disk_full=_get_or_create(
                    Gauge,
                    "sglang:saria_store_disk_full",
                    "1 while the store refuses puts after ENOSPC (retrying with back-off); reads go on",
                    store,
                    multiprocess_mode="mostrecent",
                ),
                op_seconds=_get_or_create(
                    Histogram,
                    "sglang:saria_store_op_seconds",
                    "Latency of one object get/put",
                    ["store", "op"],
                    buckets=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0),
                ),
                info=_get_or_create(
                    Gauge,
                    "sglang:saria_store_info",
                    "1 for the store this process holds, labelled with the model fingerprint its KV belongs to",
                    ["store", "fingerprint"],
                    multiprocess_mode="mostrecent",
                ),
            )
        return _METRICS
