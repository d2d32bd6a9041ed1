"""How many intra-op threads a run on the CPU backend uses: all of torch's, or one, whichever is faster now.

Why not always all of them: PyTorch's OpenMP pool (libgomp) splits every convolution, GEMM and elementwise
op statically between its threads, and its threads spin at each barrier. When a neighbour process takes a
core, the thread that lost it holds its share of every op until the scheduler gives the core back (a
tick, milliseconds), while the others spin, which makes the scheduler favour the neighbour further.
Measured on the 2-vCPU CI machine, ResNet-50 batch 1 beside two neighbours that keep starting short-lived,
allocating processes (``bench/runtime/run.py --load 2``): all threads every run 381 ms median (p10-p90
270-625) against 56 ms quiet; onnxruntime 191 ms against 49. On a quiet machine two threads are ~2x
faster than one. Neither count is right all the time, and the process cannot change libgomp's waiting
(``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) once torch is imported: it reads them when it loads.

So :class:`RunThreads` times every run and keeps the last few times of each choice; a run uses the choice
with the lower mean (means, not medians: the stalls are the cost), and the other choice is tried now and
then, to notice that the machine changed. A try of the slower choice costs the difference between the
two, so tries are spaced to keep that cost near ``PROBE_SHARE`` of the time spent running (a stalled
two-thread try of ResNet-50 under load costs ~300 ms: one per ~15 s of runs; a one-thread try on a quiet
machine ~60 ms: one per ~3 s of runs); and when the current choice's median gets 1.5x faster or slower than
just after the last try, the next try comes at once: the machine changed, and the other may be faster now.

The first try of one thread is priced the same way. A program starts on all threads; after a few runs it
tries one thread at once only when those runs look stalled (their times more than 1.5x apart), and else
when its running time has paid for the try at ``PROBE_SHARE`` (a one-thread run takes up to the thread count
times as long), or after 5 s of it (a steady neighbour slows every run alike). It used to try one thread in
every program's fifth to eighth runs: an LLM's prefill, one run per request, then took twice the time in four
requests of the first eight.

The choice is applied with ``torch.set_num_threads`` (a fraction of a microsecond) for the run and the
count the caller had is restored after it, so PyTorch code around the runtime keeps its own setting.
(oneDNN packs a convolution's weight for the thread count it is packed at, so the CPU backend's
convolutions keep one packed weight per count: ``cpu_kernels.Conv2d``.) With this, the same load costs
ResNet-50 144 ms (p10-p90 108-248): 2.6x its quiet time, where onnxruntime takes 3.9x; quiet medians are
unchanged (within the few percent the machine's noise moves them). ``bench/runtime/README.md`` has the
tables, ResNet-18 too.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class RunThreads:
    """One thread or ``torch.get_num_threads()`` per run of one program, by the recent times of both.

    ``fixed``: always this many threads (no choice is made; ``CPUBackend(threads=N)``, ``--threads N``).
    :meth:`run` wraps a run; :meth:`pick` and :meth:`record` are the policy itself (tests drive them with
    synthetic times).
    """

    SAMPLES = 5  # times kept per choice
    EXPLORE = 3  # runs on all threads timed before the first try of one thread is scheduled
    PROBE_SHARE = 0.02  # tries of the slower choice may cost about this share of the time spent
    MIN_PROBE_NS = 200_000_000  # of run time between tries, at least and at most
    MAX_PROBE_NS = 30_000_000_000
    # the first try of one thread waits at most this much run time: a steady neighbour makes every run on all
    # threads slow without making them look stalled, and nothing else would say so
    MAX_FIRST_TRY_NS = 5_000_000_000
    MOVED = 1.5  # the current choice's median moved this much since the last try: try the other at once

    def __init__(self, fixed: int | None = None) -> None:
        self.fixed = fixed
        self.all = 0  # the caller's thread count the samples below were taken with
        self.samples: dict[int, deque[float]] = {}
        self.warm: set[int] = set()  # choices whose first run (primitive caches, first touch) is behind them
        self.explored = False  # EXPLORE times of all threads are in
        self.spent = 0  # ns of runs since the other choice was last tried
        self.probe_after = 0  # ... and how many ns of runs to wait before the next try
        self.probing = False
        # the current choice, its runs since it became current or the other was last tried, and the median of
        # the first SAMPLES of them (None until then): a much lower median later says the machine got quieter
        self.current = 0
        self.fresh = 0
        self.baseline: float | None = None

    # -- the choice --------------------------------------------------------------------------------

    def pick(self, configured: int) -> int:
        """The thread count for the next run, when the caller has ``configured`` threads."""
        if self.fixed is not None:
            return self.fixed
        if configured <= 1:
            return configured
        if configured != self.all:  # the caller changed torch's count: what was measured no longer applies
            self._reset(configured)
        if not self.explored:  # a few runs of all threads first
            return configured
        best, other = self._ranked()
        if self.spent >= self.probe_after:
            self.probing = True
            return other
        return best

    def record(self, threads: int, ns: int) -> None:
        """The time of a run with ``threads`` threads (as :meth:`pick` chose them)."""
        if self.fixed is not None or threads not in self.samples:
            return
        self.spent += ns
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
        if not self.explored:
            if len(samples) >= self.EXPLORE:
                self.explored = True
                self._schedule_first_try(samples)
            return
        self._watch(threads)

    def _schedule_first_try(self, times: deque[float]) -> None:
        """After the first runs on all threads: try one thread at once if they look stalled (a neighbour holds
        a core), else once the running time pays for the try (a warm-up run and a timed one, each up to the
        thread count times as long as a run on all threads), or after ``MAX_FIRST_TRY_NS`` of it."""
        if max(times) > self.MOVED * min(times):
            self.spent, self.probe_after = 0, 0
            return
        self._schedule_probe(cost=2 * (self.all - 1) * self._mean(self.all), longest=self.MAX_FIRST_TRY_NS)

    def _watch(self, threads: int) -> None:
        """After a run of the current choice: bring the next try forward if it got much faster or slower."""
        best = self._ranked()[0]
        if threads != best:
            return
        if best != self.current:  # chosen without a try (the other got slower): watch it from now on
            self.current, self.fresh, self.baseline = best, 0, None
        self.fresh += 1
        # medians here, not means: one stalled run in a window must not read as the machine getting quieter
        if self.baseline is None:
            if self.fresh >= self.SAMPLES:  # a window of its own times since it became current
                self.baseline = statistics.median(self.samples[best])
        elif not self.baseline / self.MOVED <= statistics.median(self.samples[best]) <= self.baseline * self.MOVED:
            # the current choice got much faster or slower: the machine changed, and the other may be faster now
            # (a slower one is also left once its mean passes the other's times, if the other has any yet)
            self.probe_after = 0

    @contextmanager
    def run(self) -> Iterator[int]:
        """Around one run: torch's thread count set to the choice, the run timed, the caller's count restored."""
        configured = torch.get_num_threads()
        threads = self.pick(configured)
        if threads != configured:
            torch.set_num_threads(threads)
        start = time.perf_counter_ns()
        try:
            yield threads
        finally:
            elapsed = time.perf_counter_ns() - start
            if threads != configured:
                torch.set_num_threads(configured)
        self.record(threads, elapsed)  # a run that raised is not a time of anything

    # -- bookkeeping -------------------------------------------------------------------------------

    def _reset(self, configured: int) -> None:
        self.all = configured
        self.samples = {configured: deque(maxlen=self.SAMPLES), 1: deque(maxlen=self.SAMPLES)}
        self.warm.clear()
        self.explored = False
        self.spent = self.probe_after = 0
        self.probing = False
        self.current, self.fresh, self.baseline = 0, 0, None

    def _mean(self, choice: int) -> float:
        times = self.samples[choice]
        return sum(times) / len(times) if times else float("inf")

    def _ranked(self) -> tuple[int, int]:
        """(the faster choice, the other), by the means of their recent times; all threads on a tie."""
        one, many = self._mean(1), self._mean(self.all)
        return (1, self.all) if one < many else (self.all, 1)

    def _schedule_probe(self, cost: float, longest: int = MAX_PROBE_NS) -> None:
        """Space the next try of the slower choice so that tries cost about ``PROBE_SHARE`` of the time spent
        running (run time, not wall time: a caller that runs now and then is not made to try more often), at most
        ``longest`` ns of it."""
        self.probe_after = int(min(max(cost / self.PROBE_SHARE, self.MIN_PROBE_NS), longest))
        self.spent = 0
        self.current, self.fresh, self.baseline = 0, 0, None  # the next window of the current choice is its own
