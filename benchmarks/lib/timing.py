"""The median wall time of a call, for the scripts that time one operation in a loop
(`from benchmarks.lib.timing import median_ms`)."""
from __future__ import annotations

import statistics
import time


def median_seconds(fn, repeats: int = 30, warmup: int = 3) -> float:
    """Median seconds of `fn()` over `repeats` calls after `warmup` untimed ones (caches, allocator, lazy set-up)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def median_ms(fn, repeats: int = 30, warmup: int = 3) -> float:
    """`median_seconds` in milliseconds."""
    return 1e3 * median_seconds(fn, repeats, warmup)
