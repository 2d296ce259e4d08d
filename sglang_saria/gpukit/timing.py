"""Median wall-clock timing that waits for the GPU, shared by the benchmarks and the kit."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_seconds(
    fn: Callable[[], object], repeats: int, cuda: bool, warmup: int = 1, before: Callable[[], object] | None = None
) -> float:
    """Median of ``repeats`` timed calls after ``warmup`` untimed ones (first CUDA launches compile);
    ``before`` runs untimed ahead of each call (e.g. dropping the page cache)."""
    return statistics.median(sample_seconds(fn, repeats, cuda, warmup, before))


def sample_seconds(
    fn: Callable[[], object], repeats: int, cuda: bool, warmup: int = 1, before: Callable[[], object] | None = None
) -> list[float]:
    """The ``repeats`` timed calls of ``median_seconds``, each one: the raw records a benchmark keeps."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def sig(value: float, digits: int = 3) -> float:
    """``value`` to ``digits`` significant figures (a tiny CPU rate must not print as 0.0)."""
    return float(f"{value:.{digits}g}")
