"""Bucket sets for a served length distribution, without compiling anything: the candidate sizes, what a set
costs the traffic (expected latency, padded compute, arena), and the set minimising expected latency.

The figures per size (``SizeCost``: arena bytes, FLOPs, cost-model latency of the static program compiled at that
size) come from ``dynamic_report``, which compiles; everything here is arithmetic on them, so the optimizer can be
checked against a brute force over subsets.

A length ``n`` is served by the smallest bucket ``b >= n`` of a set: it pays ``b``'s latency and executes ``b``'s
FLOPs, of which ``flops(n)`` (the program compiled at exactly ``n``) are useful; the rest is padding. The runtime
runs one variant at a time, so the variants share one arena: the largest variant's. ``arena_sum`` is what they
would take with an arena each (QNN multi-graph style), for comparison.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

#: Relative slack under which two expected latencies count as equal (the smaller set is then preferred).
_TIE = 1e-12


@dataclass(frozen=True)
class SizeCost:
    """The static program compiled at one size of the symbol."""

    size: int
    arena_bytes: int
    flops: int
    latency_ms: float


@dataclass
class BucketSet:
    """One way to serve the traffic, and what it costs it."""

    name: str
    sizes: tuple[int, ...]
    expected_latency_ms: float  # per request: each length pays its bucket's latency, weighted by its count
    waste: float  # padded FLOPs / executed FLOPs, over the traffic
    arena_shared: int  # one arena for all variants (one runs at a time): the largest variant's
    arena_sum: int  # an arena per variant
    share: dict[int, float] = field(default_factory=dict)  # bucket -> fraction of the requests it serves


def candidate_sizes(low: int, high: int, max_observed: int, extra: Iterable[int] = ()) -> list[int]:
    """Powers of two and their 1.5x midpoints within ``[low, high]``, plus ``high``, ``max_observed`` and
    ``extra`` (the given buckets): the sizes the optimizer chooses among."""
    sizes = {high, max_observed, *extra}
    power = 1
    while power <= high:
        for size in (power, power + power // 2) if power >= 2 else (power,):
            if low <= size <= high:
                sizes.add(size)
        power *= 2
    return sorted(sizes)


def interpolation_grid(lengths: Sequence[int], sizes: Iterable[int], points: int) -> list[int]:
    """Where to cost the upper-bound plan when the observed lengths are many: ``points`` sizes spaced
    geometrically from the shortest to the longest observed length, and every candidate size between them (so a
    bucket's own figure is exact and the interpolated useful FLOPs of a length never exceed its bucket's)."""
    first, last = min(lengths), max(lengths)
    grid = {first, last, *(s for s in sizes if first <= s <= last)}
    if last > first:
        ratio = (last / first) ** (1 / max(points - 1, 1))
        grid.update(min(last, max(first, round(first * ratio ** i))) for i in range(points))
    return sorted(grid)


def interpolate(costs: Mapping[int, SizeCost], at: int, value: Callable[[SizeCost], float]) -> float:
    """``value`` at size ``at``: exact where measured, else linear between the measured sizes around it."""
    if at in costs:
        return float(value(costs[at]))
    below = max(s for s in costs if s < at)
    above = min(s for s in costs if s > at)
    t = (at - below) / (above - below)
    return (1 - t) * value(costs[below]) + t * value(costs[above])


def serving_bucket(sizes: Sequence[int], length: int) -> int | None:
    """The smallest of ``sizes`` (sorted) that holds ``length``; None when none does."""
    return next((s for s in sizes if s >= length), None)


def evaluate(name: str, sizes: Iterable[int], histogram: Mapping[int, int], costs: Mapping[int, SizeCost],
             useful_flops: Mapping[int, float]) -> BucketSet:
    """What serving ``histogram`` (length -> count) with the bucket ``sizes`` costs. Every length must fit the
    largest bucket; ``useful_flops`` gives each length's FLOPs unpadded."""
    ordered = tuple(sorted(set(sizes)))
    total = sum(histogram.values())
    latency = executed = useful = 0.0
    served = dict.fromkeys(ordered, 0)
    for length, count in histogram.items():
        bucket = serving_bucket(ordered, length)
        if bucket is None:
            raise ValueError(f"length {length} is longer than every bucket of {ordered}")
        served[bucket] += count
        latency += count * costs[bucket].latency_ms
        executed += count * costs[bucket].flops
        useful += count * min(useful_flops[length], costs[bucket].flops)
    arenas = [costs[s].arena_bytes for s in ordered]
    return BucketSet(name, ordered, latency / total, (executed - useful) / executed if executed else 0.0,
                     max(arenas), sum(arenas), {s: n / total for s, n in served.items()})


def suggest(histogram: Mapping[int, int], costs: Mapping[int, SizeCost], candidates: Iterable[int],
            max_buckets: int) -> tuple[int, ...] | None:
    """The subset of ``candidates`` (at most ``max_buckets``, the largest holding the longest length) with the
    least expected latency; None when no candidate holds the longest length. Exact: a dynamic programme over the
    sorted candidates, where ``best[k][j]`` is the least total latency of the lengths up to candidate ``j`` served
    by ``k`` buckets the largest of which is ``j``. Ties go to fewer buckets, then the smaller largest bucket."""
    sizes = sorted(set(candidates))
    longest = max(histogram)
    if not sizes or sizes[-1] < longest:
        return None
    # upto[j]: the requests of length <= sizes[j]
    upto = [sum(c for n, c in histogram.items() if n <= s) for s in sizes]
    lat = [costs[s].latency_ms for s in sizes]
    best = [[upto[j] * lat[j] for j in range(len(sizes))]]
    parent: list[list[int | None]] = [[None] * len(sizes)]
    for _ in range(1, max_buckets):
        row, back = [math.inf] * len(sizes), [None] * len(sizes)
        for j in range(len(sizes)):
            for i in range(j):
                cost = best[-1][i] + (upto[j] - upto[i]) * lat[j]
                if cost < row[j]:
                    row[j], back[j] = cost, i
        best.append(row)
        parent.append(back)
    choice, choice_cost = None, math.inf
    for k, row in enumerate(best):
        for j, cost in enumerate(row):
            if sizes[j] >= longest and cost < choice_cost * (1 - _TIE):
                choice, choice_cost = (k, j), cost
    k, j = choice
    chosen = []
    while j is not None:
        chosen.append(sizes[j])
        j, k = parent[k][j], k - 1
    return tuple(sorted(chosen))


__all__ = ["BucketSet", "SizeCost", "candidate_sizes", "evaluate", "interpolate", "interpolation_grid",
           "serving_bucket", "suggest"]
