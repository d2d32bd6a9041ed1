"""Profiling a run: time per dispatch, per kernel kind, and the runtime's own overhead.

How the figures are taken, and why:

* **Warm-up until stable.** The first runs of a program pay for oneDNN building its primitives, pages
  faulted in and caches filled: one warm-up run left ``demo`` reporting 72-176 ms a run for programs
  whose steady state is 0.3 ms. So runs are repeated until the median of the last ``WARMUP_WINDOW``
  stops moving (within ``WARMUP_TOLERANCE`` of the median of the ``WARMUP_WINDOW`` before), up to a cap
  in runs and seconds; the profile says whether it settled.
* **Median and spread.** A run's time is reported as the median with p10-p90 of runs without timers
  (what a user pays). When p90/p10 exceeds ``NOISY_RATIO`` the profile says so: on a shared machine
  another process taking a core stalls PyTorch's thread pool, and the numbers are then the neighbour's.
* **Per kernel from the same runs.** Every timed run (a timer around each dispatch) is interleaved with
  a plain run, and the per-dispatch figures are the means over the middle half of the timed runs (by
  run time). So the kernels' times add up exactly to those runs' time minus the runtime's own (input
  copy, dispatch loop, output copies, the timers), which the table shows, next to the plain runs'
  median: per-dispatch medians of other runs summed to 2.9 ms beside a 0.59 ms run.
* **A fixed thread count.** ``Executor.run`` may switch between one thread and all of torch's from run
  to run (``npu_runtime.threads``); a profile runs every run at one count (``threads``, else torch's),
  and says which.

On a GPU backend (WebGPU) two more figures come per dispatch: the host's *encode* time (recording the
dispatch into the run's command encoder: what the runtime costs per dispatch when the GPU is busy) and,
when the adapter has timestamp queries, the *GPU* time between the start and end of the dispatch's pass.
There the timed runs synchronize after every dispatch, so their dispatches add up to more than a run.

Host dispatches (``compile(fallback="cpu")``: ops run on the host CPU by their reference implementation) are
marked: ``DispatchTime.host``, and ``[host]`` after the op in the tables, so the time the fallback costs shows
(not to be confused with the *host overhead*, the runtime's own time per dispatch and per run).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .executor import Executor, Step


HOST_TAG = "[host]"
# p90/p10 of the run times above which a profile is called noisy: a quiet machine gives 1.0-1.2
NOISY_RATIO = 1.5
# warm-up: the median of the last WARMUP_WINDOW runs within WARMUP_TOLERANCE of the WARMUP_WINDOW before
WARMUP_WINDOW = 5
WARMUP_TOLERANCE = 0.05
WARMUP_MAX_RUNS = 200
WARMUP_MAX_SECONDS = 10.0
# kernels + the runtime's own time of the timed runs against the median of the plain runs: within this, the
# per-kernel figures describe the runs reported; beyond it the table says why they may not
CONSISTENCY_TOLERANCE = 0.10


# -- statistics ------------------------------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), interpolated between the two nearest ranks (as numpy's default)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Spread:
    """Median and p10-p90 of some times (in whatever unit they were given)."""

    median: float
    p10: float
    p90: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), percentile(values, 10), percentile(values, 90))

    @property
    def ratio(self) -> float:
        """p90/p10: 1.0 for identical runs."""
        return self.p90 / self.p10 if self.p10 > 0 else math.inf

    def text(self, unit: str = "ms", digits: int = 3) -> str:
        return f"{self.median:.{digits}f} {unit} (p10-p90 {self.p10:.{digits}f}-{self.p90:.{digits}f})"


def noise_warning(times: Sequence[float], limit: float = NOISY_RATIO) -> str | None:
    """A warning when the spread of ``times`` is too wide for their median to mean much, else None."""
    if len(times) < 2:
        return None
    ratio = Spread.of(times).ratio
    if ratio <= limit:
        return None
    return (f"noisy: p90/p10 = {ratio:.2f} (above {limit:g}): another process is using the CPU{_load_note()}, "
            "and the figures are partly its: rerun on a quiet machine, with more --runs, or with --threads 1")


def _load_note() -> str:
    """The machine's recent load against its CPU count, where the OS tells it."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not on every platform
        return ""
    return f" (load average {load:.1f} on {os.cpu_count()} CPUs)"


# -- warm-up ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Warmup:
    """What the warm-up did: ``runs`` runs, and whether they settled (None: a fixed number was asked for)."""

    runs: int
    stable: bool | None

    def text(self) -> str:
        if self.stable is None:
            return f"{self.runs} warm-up runs"
        return f"{self.runs} warm-up runs " + ("until stable" if self.stable else "(capped: NOT stable)")


def settled(times: Sequence[float], window: int = WARMUP_WINDOW, tolerance: float = WARMUP_TOLERANCE) -> bool:
    """Whether the median of the last ``window`` times is within ``tolerance`` of the median of the ``window``
    before it: the runs have stopped getting faster (or slower)."""
    if window < 1 or len(times) < 2 * window:
        return False
    last, before = statistics.median(times[-window:]), statistics.median(times[-2 * window:-window])
    return abs(last - before) <= tolerance * before


def warm_up(run: Callable[[], float], *, window: int = WARMUP_WINDOW, tolerance: float = WARMUP_TOLERANCE,
            max_runs: int = WARMUP_MAX_RUNS, max_seconds: float = WARMUP_MAX_SECONDS) -> Warmup:
    """Call ``run`` (which returns the time it took) until its times settle (:func:`settled`), or ``max_runs``
    calls, or ``max_seconds`` of wall time, whichever comes first."""
    times: list[float] = []
    deadline = time.perf_counter() + max_seconds
    while len(times) < max_runs:
        times.append(run())
        if settled(times, window, tolerance):
            return Warmup(len(times), True)
        if time.perf_counter() >= deadline:
            break
    return Warmup(len(times), False)


# -- the profile ------------------------------------------------------------------------------------------

@dataclass
class DispatchTime:
    index: int
    kernel: str
    node: str
    # mean µs over the middle half of the timed runs (by run time): the dispatches add up to those runs
    us: float
    # a host dispatch (the op's reference on the host CPU), not a kernel of the target
    host: bool = False
    # GPU backends: host time to record the dispatch, and GPU time from timestamp queries (None: not measured)
    encode_us: float | None = None
    gpu_us: float | None = None

    @property
    def median_us(self) -> float:
        """The former name of :attr:`us` (kept for callers of the first profile API)."""
        return self.us

    @property
    def label(self) -> str:
        """The kernel as the tables show it: ``[host]`` after a host dispatch's op."""
        return f"{self.kernel} {HOST_TAG}" if self.host else self.kernel


@dataclass
class Profile:
    """``runs`` plain runs (no timers) and ``runs`` timed runs, interleaved, at ``threads`` threads, after a
    warm-up. ``dispatches`` come from the middle half of the timed runs (see the module's docstring)."""

    model_name: str
    runs: int
    dispatches: list[DispatchTime]
    # a whole run (copy in, dispatch loop, copy out) without per-dispatch timers: median, and every run
    run_ms: float
    # the dispatch loop with every kernel replaced by a no-op, per dispatch: the runtime's own cost
    host_us_per_dispatch: float
    # a run with no-op kernels minus the loop: input checks, copy in, output copies
    host_us_per_run: float
    # the backend, and on a GPU backend its adapter
    device: str = "cpu"
    samples_ms: list[float] = field(default_factory=list)
    # the mean time of the timed runs the dispatches come from (kernels + the runtime's own time)
    timed_run_ms: float = 0.0
    threads: int = 0  # torch's intra-op threads, read inside the runs
    warmup: Warmup = field(default_factory=lambda: Warmup(0, None))

    @property
    def spread(self) -> Spread:
        """Median and p10-p90 of the plain runs, ms."""
        return Spread.of(self.samples_ms or [self.run_ms])

    @property
    def noisy(self) -> str | None:
        """Why the run times are not to be trusted (their spread), or None."""
        return noise_warning(self.samples_ms)

    @property
    def kernel_ms(self) -> float:
        """The dispatches' times added up."""
        return sum(d.us for d in self.dispatches) / 1e3

    @property
    def own_ms(self) -> float:
        """What the timed runs spent outside the dispatches: input copy, dispatch loop, output copies, timers."""
        return self.timed_run_ms - self.kernel_ms

    @property
    def consistent(self) -> bool:
        """Whether the timed runs (kernels + own time) are within ``CONSISTENCY_TOLERANCE`` of the plain runs'
        median, so that the per-kernel figures describe the runs reported."""
        return abs(self.timed_run_ms - self.run_ms) <= CONSISTENCY_TOLERANCE * self.run_ms

    @property
    def encode_us_per_dispatch(self) -> float | None:
        """Median host time to record one dispatch (GPU backends), None elsewhere."""
        times = [d.encode_us for d in self.dispatches if d.encode_us is not None]
        return statistics.median(times) if times else None

    @property
    def gpu_ms(self) -> float | None:
        """Sum of the dispatches' GPU times (timestamp queries), None where the adapter has none."""
        times = [d.gpu_us for d in self.dispatches if d.gpu_us is not None]
        return sum(times) / 1e3 if times else None

    @property
    def dispatch_count(self) -> int:
        return len(self.dispatches)

    def by_kernel(self) -> list[tuple[str, int, float, float]]:
        """``(kernel, dispatches, total µs, share of all kernel time)``, slowest kernel first; host dispatches
        are grouped apart from kernels of the same name, as ``"<op> [host]"``."""
        totals: dict[str, list[float]] = {}
        for d in self.dispatches:
            totals.setdefault(d.label, []).append(d.us)
        all_us = sum(d.us for d in self.dispatches) or 1.0
        rows = [(k, len(v), sum(v), sum(v) / all_us) for k, v in totals.items()]
        return sorted(rows, key=lambda r: (-r[2], r[0]))

    def consistency(self) -> str:
        """One line: how the per-kernel figures add up to a run, and whether that agrees with the run's median."""
        line = (f"kernels {self.kernel_ms:.3f} ms + runtime's own {self.own_ms:.3f} ms (input copy, dispatch loop, "
                f"output copies, timers) = {self.timed_run_ms:.3f} ms, the middle half of the timed runs: ")
        off = (self.timed_run_ms - self.run_ms) / self.run_ms if self.run_ms else 0.0
        if self.consistent:
            return line + f"{off:+.0%} of the run's median (within ±{CONSISTENCY_TOLERANCE:.0%})"
        why = ("each dispatch is synchronized on its own in the timed runs" if self.encode_us_per_dispatch is not None
               else "the machine's load changed between runs" if self.noisy else "the per-dispatch timers")
        return line + f"{off:+.0%} of the run's median, beyond ±{CONSISTENCY_TOLERANCE:.0%}: {why}"

    def table(self, top: int = 10) -> str:
        """A text report: the run, per kernel kind, then the slowest dispatches."""
        host = sum(d.host for d in self.dispatches)
        on_host = f" ({host} {HOST_TAG}: on the host CPU)" if host else ""
        lines = [f"profile of {self.model_name} on {self.device}: {self.dispatch_count} dispatches{on_host}, "
                 f"{self.threads} thread{'s' if self.threads != 1 else ''}, {self.runs} runs after "
                 f"{self.warmup.text()}",
                 f"run: {self.spread.text()}; host overhead {self.host_us_per_dispatch:.2f} µs/dispatch "
                 f"+ {self.host_us_per_run:.1f} µs/run (input copy, output copies)"]
        if self.noisy:
            lines.append(self.noisy)
        lines.append(self.consistency())
        if self.encode_us_per_dispatch is not None:
            lines.append(f"encode: {self.encode_us_per_dispatch:.2f} µs/dispatch (median host time to record one)")
            gpu = self.gpu_ms
            lines.append(f"GPU time (timestamp queries): {gpu:.3f} ms" if gpu is not None else
                         "GPU time: this adapter has no timestamp queries; the times below are wall clock, the "
                         "backend synchronized after each dispatch")
        lines += ["", f"{'kernel':<32} {'count':>6} {'total µs':>10} {'share':>7}"]
        lines += [f"{k:<32} {n:>6} {us:>10.1f} {share:>7.1%}" for k, n, us, share in self.by_kernel()]
        lines += ["", f"slowest {min(top, self.dispatch_count)} dispatches:",
                  f"{'#':>4} {'kernel':<32} {'node':<32} {'µs':>9} {'encode µs':>10} {'GPU µs':>9}"]
        slowest = sorted(self.dispatches, key=lambda d: -d.us)[:top]
        lines += [f"{d.index:>4} {d.label:<32} {d.node[:32]:<32} {d.us:>9.1f} {_us(d.encode_us):>10} "
                  f"{_us(d.gpu_us):>9}" for d in slowest]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        spread = self.spread
        return {
            "model_name": self.model_name, "runs": self.runs, "run_ms": self.run_ms, "run_p10_ms": spread.p10,
            "run_p90_ms": spread.p90, "noisy": self.noisy, "samples_ms": self.samples_ms, "threads": self.threads,
            "warmup_runs": self.warmup.runs, "warmup_stable": self.warmup.stable,
            "timed_run_ms": self.timed_run_ms, "kernel_ms": self.kernel_ms, "own_ms": self.own_ms,
            "consistent": self.consistent,
            "host_us_per_dispatch": self.host_us_per_dispatch, "host_us_per_run": self.host_us_per_run,
            "device": self.device, "encode_us_per_dispatch": self.encode_us_per_dispatch, "gpu_ms": self.gpu_ms,
            "dispatches": [{**vars(d), "median_us": d.us} for d in self.dispatches],
            "by_kernel": [dict(zip(("kernel", "count", "total_us", "share"), r)) for r in self.by_kernel()],
        }


# -- measuring --------------------------------------------------------------------------------------------

def profile_executor(executor: Executor, inputs: Mapping[str, Any], weights: Any = None, *, runs: int = 10,
                     warmup: int | None = None, threads: int | None = None) -> Profile:
    """Profile ``executor`` on ``inputs``: ``warmup`` runs first (None: until the times settle, see
    :func:`warm_up`), then ``runs`` plain and ``runs`` timed runs, interleaved, at ``threads`` intra-op threads
    (None: torch's count as it is; the count the caller had is restored after)."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    executor.ensure_bound(weights)
    with _thread_count(threads):
        return _profile(executor, inputs, runs, warmup)


@contextmanager
def _thread_count(threads: int | None) -> Iterator[None]:
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _profile(executor: Executor, inputs: Mapping[str, Any], runs: int, warmup: int | None) -> Profile:
    def plain() -> int:
        return _plain_run(executor, inputs)

    if warmup is None:
        warmed = warm_up(plain)
    else:
        for _ in range(warmup):
            plain()
        warmed = Warmup(warmup, None)
    threads: list[int] = []
    plain_ns, timed = [], []
    for _ in range(runs):  # interleaved: a change of the machine's load touches both alike
        plain_ns.append(plain())
        timed.append(_timed_run(executor, inputs, threads))
    middle = _middle_runs([total for total, _ in timed])
    per_dispatch = [statistics.fmean(timed[r][1][i] for r in middle) / 1e3 for i in range(len(executor.steps))]
    encode, gpu = _gpu_figures(executor, inputs, runs)
    loop_us, run_us = host_overhead(executor, inputs, runs=max(runs, 20))
    program = executor.program
    return Profile(
        model_name=program.model_name, runs=runs,
        dispatches=[DispatchTime(i, d.kernel, d.node, us, d.host is not None,
                                 statistics.median(encode[i]) / 1e3 if encode and d.host is None else None,
                                 gpu.get(i))
                    for i, (d, us) in enumerate(zip(program.dispatches, per_dispatch))],
        run_ms=statistics.median(plain_ns) / 1e6,
        host_us_per_dispatch=loop_us / max(len(executor.steps), 1),
        host_us_per_run=max(run_us - loop_us, 0.0),
        device=repr(executor.device.backend),
        samples_ms=[ns / 1e6 for ns in plain_ns],
        timed_run_ms=statistics.fmean(timed[r][0] for r in middle) / 1e6,
        threads=threads[0] if threads else torch.get_num_threads(),
        warmup=warmed,
    )


def _plain_run(executor: Executor, inputs: Mapping[str, Any]) -> int:
    """ns of one run as ``Executor.run`` does it, minus its thread choice (a profile keeps one count)."""
    start = time.perf_counter_ns()
    executor.copy_in(inputs)
    executor.run_steps()
    executor.copy_out()
    executor.device.backend.synchronize()
    return time.perf_counter_ns() - start


def _timed_run(executor: Executor, inputs: Mapping[str, Any], threads: list[int]) -> tuple[int, list[int]]:
    """ns of one run with a timer around each dispatch (the backend synchronized after each), and the ns of
    each dispatch; ``threads`` gets torch's thread count as the run sees it."""
    sync = executor.device.backend.synchronize
    times = [0] * len(executor.steps)

    def timed(index: int, step: Step) -> None:
        run, ins, outs = step
        t0 = time.perf_counter_ns()
        run(ins, outs)
        sync()
        times[index] = time.perf_counter_ns() - t0

    threads.append(torch.get_num_threads())
    start = time.perf_counter_ns()
    executor.copy_in(inputs)
    executor.run_steps(timed)
    executor.copy_out()
    sync()
    return time.perf_counter_ns() - start, times


def _middle_runs(totals: Sequence[float]) -> list[int]:
    """The runs between the 25th and 75th percentile of ``totals`` (at least the one nearest the median):
    typical runs, without the stalled ones nor the rare lucky one."""
    low, high = percentile(totals, 25), percentile(totals, 75)
    middle = [i for i, t in enumerate(totals) if low <= t <= high]
    if middle:
        return middle
    median = statistics.median(totals)
    return [min(range(len(totals)), key=lambda i: abs(totals[i] - median))]


def _gpu_figures(executor: Executor, inputs: Mapping[str, Any], runs: int) -> tuple[list[list[float]],
                                                                                   dict[int, float]]:
    """On a backend that records dispatches for the GPU (one with ``start_timing``): the host's encode time per
    dispatch (ns, per run) and, where the adapter has timestamp queries, GPU µs per dispatch (the median run's)."""
    backend = executor.device.backend
    if not hasattr(backend, "start_timing"):
        return [], {}
    encode: list[list[float]] = [[] for _ in executor.steps]

    def recorded(index: int, step: Step) -> None:
        run, ins, outs = step
        t0 = time.perf_counter_ns()
        run(ins, outs)
        encode[index].append(time.perf_counter_ns() - t0)

    for _ in range(runs):
        executor.copy_in(inputs)
        executor.run_steps(recorded)
    backend.synchronize()
    if not backend.can_timestamp:
        return encode, {}

    def tagged(index: int, step: Step) -> None:
        backend.tag = index
        step[0](step[1], step[2])

    passes = sum(len(getattr(kernel, "shaders", ())) for kernel in executor.kernels)
    samples: dict[int, list[float]] = {}
    for _ in range(runs):
        backend.start_timing(passes)
        executor.copy_in(inputs)
        executor.run_steps(tagged)
        for index, us in backend.stop_timing().items():
            samples.setdefault(index, []).append(us)
    return encode, {i: statistics.median(v) for i, v in samples.items()}


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _skip(index: int, step: Step) -> None:
    """A hook that runs no kernel: what is left of a run is the runtime's own work."""


def host_overhead(executor: Executor, inputs: Mapping[str, Any], *, runs: int = 50) -> tuple[float, float]:
    """Median µs of (the dispatch loop, a whole run) with every kernel skipped: what the runtime itself costs."""
    loops, whole = [], []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        executor.run_steps(_skip)
        loops.append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns()
        executor.copy_in(inputs)
        executor.run_steps(_skip)
        executor.copy_out()
        whole.append(time.perf_counter_ns() - t0)
    return statistics.median(loops) / 1e3, statistics.median(whole) / 1e3
