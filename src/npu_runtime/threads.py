"""How many intra-op threads a run on the CPU backend uses: all of torch's, or one, whichever is faster now.

Why not always all of them: PyTorch's OpenMP pool (libgomp) splits every convolution, GEMM and elementwise
op statically between its threads, and its threads spin at each barrier. When a neighbour process takes a
core, the thread that lost it holds its share of every op until the scheduler gives the core back (a
tick, milliseconds), while the others spin, which makes the scheduler favour the neighbour further.
Measured on the 2-vCPU CI machine, ResNet-50 batch 1 with two neighbours starting short-lived processes
(``bench/runtime/load.py``): 2 threads 1,900 ms a run (p10-p90 1,200-2,900), 1 thread 280 ms (260-310),
onnxruntime's 2 threads 500 ms. On a quiet machine two threads are ~1.8x faster than one. Neither count
is right all the time, and the process cannot change libgomp's waiting (``OMP_WAIT_POLICY``,
``GOMP_SPINCOUNT``) once torch is imported: it reads them when it loads.

So :class:`RunThreads` times every run and keeps the last few times of each choice; a run uses the choice
with the lower mean (means, not medians: the stalls are the cost), and the other choice is tried now and
then, to notice that the machine changed. A try of the slower choice costs the difference between the
two, so tries are spaced to keep that cost near ``PROBE_SHARE`` of the time spent running (a stalled
two-thread try under load costs a second: it comes every ~30 s; a one-thread try on a quiet machine
costs a few ms: every second or so); and when the current choice gets 1.5x faster than it was at the
last try, the next try comes at once, since the machine got quieter and the other may be faster yet.
(When the current choice gets slower, nothing needs to be tried: once its mean passes the other's last
times, the other is chosen.)

The choice is applied with ``torch.set_num_threads`` (a fraction of a microsecond) for the run and the
count the caller had is restored after it, so PyTorch code around the runtime keeps its own setting.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


class RunThreads:
    """One thread or ``torch.get_num_threads()`` per run of one program, by the recent times of both.

    ``fixed``: always this many threads (no choice is made; ``CPUBackend(threads=N)``, ``--threads N``).
    ``clock`` returns nanoseconds (a parameter so that tests can drive the policy with synthetic times).
    """

    SAMPLES = 5  # times kept per choice
    EXPLORE = 3  # times of each choice gathered before choosing
    PROBE_SHARE = 0.02  # tries of the slower choice may cost about this share of the time spent
    MIN_PROBE_NS = 200_000_000
    MAX_PROBE_NS = 30_000_000_000
    MOVED = 1.5  # the current choice got this much faster since the last try: try the other at once

    def __init__(self, fixed: int | None = None, clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.fixed = fixed
        self.clock = clock
        self.all = 0  # the caller's thread count the samples below were taken with
        self.samples: dict[int, deque[float]] = {}
        self.warm: set[int] = set()  # choices whose first run (primitive caches, first touch) is behind them
        self.next_probe = 0
        self.probing = False
        # (choice, its mean) when the other was last tried: a much lower mean since says the machine changed
        self.baseline: tuple[int, float] = (0, 0.0)

    # -- the choice --------------------------------------------------------------------------------

    def pick(self, configured: int) -> int:
        """The thread count for the next run, when the caller has ``configured`` threads."""
        if self.fixed is not None:
            return self.fixed
        if configured <= 1:
            return configured
        if configured != self.all:  # the caller changed torch's count: what was measured no longer applies
            self._reset(configured)
        for choice in (configured, 1):  # a few runs of each first
            if len(self.samples[choice]) < self.EXPLORE:
                return choice
        best, other = self._ranked()
        if self.clock() >= self.next_probe:
            self.probing = True
            return other
        return best

    def record(self, threads: int, ns: int) -> None:
        """The time of a run with ``threads`` threads (as :meth:`pick` chose them)."""
        if self.fixed is not None or threads not in self.samples:
            return
        if threads not in self.warm:  # a first run per count builds oneDNN's primitives for that count
            self.warm.add(threads)
            return
        samples = self.samples[threads]
        if self.probing:  # what the other choice did a while ago is stale: the try speaks for it alone
            self.probing = False
            samples.clear()
            samples.append(ns)
            self._schedule_probe(cost=ns - self._mean(self._ranked()[0]))
            return
        samples.append(ns)
        if not self.next_probe:
            if all(len(s) >= self.EXPLORE for s in self.samples.values()):  # explored: the first try, later
                best, other = self._ranked()
                self._schedule_probe(cost=self._mean(other) - self._mean(best))
            return
        best = self._ranked()[0]
        if threads == best == self.baseline[0] and len(samples) == self.SAMPLES and \
                self._mean(best) * self.MOVED < self.baseline[1]:
            # the current choice got much faster: the machine is quieter, and the other may be faster yet
            self.next_probe = min(self.next_probe, self.clock())

    @contextmanager
    def run(self) -> Iterator[int]:
        """Around one run: torch's thread count set to the choice, the run timed, the caller's count restored."""
        configured = torch.get_num_threads()
        threads = self.pick(configured)
        if threads != configured:
            torch.set_num_threads(threads)
        start = self.clock()
        try:
            yield threads
        finally:
            elapsed = self.clock() - start
            if threads != configured:
                torch.set_num_threads(configured)
        self.record(threads, elapsed)  # a run that raised is not a time of anything

    # -- bookkeeping -------------------------------------------------------------------------------

    def _reset(self, configured: int) -> None:
        self.all = configured
        self.samples = {configured: deque(maxlen=self.SAMPLES), 1: deque(maxlen=self.SAMPLES)}
        self.warm.clear()
        self.next_probe = 0
        self.probing = False
        self.baseline = (0, 0.0)

    def _mean(self, choice: int) -> float:
        times = self.samples[choice]
        return sum(times) / len(times) if times else float("inf")

    def _ranked(self) -> tuple[int, int]:
        """(the faster choice, the other), by the means of their recent times; all threads on a tie."""
        one, many = self._mean(1), self._mean(self.all)
        return (1, self.all) if one < many else (self.all, 1)

    def _schedule_probe(self, cost: float) -> None:
        """Space the next try of the slower choice so that tries cost about ``PROBE_SHARE`` of the time."""
        interval = min(max(cost / self.PROBE_SHARE, self.MIN_PROBE_NS), self.MAX_PROBE_NS)
        self.next_probe = self.clock() + int(interval)
        best = self._ranked()[0]
        self.baseline = (best, self._mean(best))
