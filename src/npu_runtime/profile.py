"""Profiling a run: time per dispatch, per kernel kind, and the runtime's own overhead.

On a GPU backend (WebGPU) two more figures come per dispatch: the host's *encode* time (recording the
dispatch into the run's command encoder: what the runtime costs per dispatch when the GPU is busy) and,
when the adapter has timestamp queries, the *GPU* time between the start and end of the dispatch's pass.

Host dispatches (``compile(fallback="cpu")``: ops run on the host CPU by their reference implementation) are
marked: ``DispatchTime.host``, and ``[host]`` after the op in the tables, so the time the fallback costs shows
(not to be confused with the *host overhead*, the runtime's own time per dispatch and per run).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .executor import Executor, Step


HOST_TAG = "[host]"


@dataclass
class DispatchTime:
    index: int
    kernel: str
    node: str
    median_us: float
    # a host dispatch (the op's reference on the host CPU), not a kernel of the target
    host: bool = False
    # GPU backends: host time to record the dispatch, and GPU time from timestamp queries (None: not measured)
    encode_us: float | None = None
    gpu_us: float | None = None

    @property
    def label(self) -> str:
        """The kernel as the tables show it: ``[host]`` after a host dispatch's op."""
        return f"{self.kernel} {HOST_TAG}" if self.host else self.kernel


@dataclass
class Profile:
    """Medians over ``runs`` runs. ``dispatches`` are timed one by one (the backend synchronized after each)."""

    model_name: str
    runs: int
    dispatches: list[DispatchTime]
    # a whole run (copy in, dispatch loop, copy out) without per-dispatch timers
    run_ms: float
    # the dispatch loop with every kernel replaced by a no-op, per dispatch: the runtime's own cost
    host_us_per_dispatch: float
    # a run with no-op kernels minus the loop: input checks, copy in, output copies
    host_us_per_run: float
    # the backend, and on a GPU backend its adapter
    device: str = "cpu"

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
            totals.setdefault(d.label, []).append(d.median_us)
        all_us = sum(d.median_us for d in self.dispatches) or 1.0
        rows = [(k, len(v), sum(v), sum(v) / all_us) for k, v in totals.items()]
        return sorted(rows, key=lambda r: (-r[2], r[0]))

    def table(self, top: int = 10) -> str:
        """A text report: per kernel kind, then the slowest dispatches."""
        host = sum(d.host for d in self.dispatches)
        on_host = f" ({host} {HOST_TAG}: on the host CPU)" if host else ""
        lines = [f"profile of {self.model_name} on {self.device}: {self.dispatch_count} dispatches{on_host}, "
                 f"median of {self.runs} runs",
                 f"run: {self.run_ms:.3f} ms; host overhead {self.host_us_per_dispatch:.2f} µs/dispatch "
                 f"+ {self.host_us_per_run:.1f} µs/run (input copy, output copies)"]
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
        slowest = sorted(self.dispatches, key=lambda d: -d.median_us)[:top]
        lines += [f"{d.index:>4} {d.label:<32} {d.node[:32]:<32} {d.median_us:>9.1f} {_us(d.encode_us):>10} "
                  f"{_us(d.gpu_us):>9}" for d in slowest]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name, "runs": self.runs, "run_ms": self.run_ms,
            "host_us_per_dispatch": self.host_us_per_dispatch, "host_us_per_run": self.host_us_per_run,
            "device": self.device, "encode_us_per_dispatch": self.encode_us_per_dispatch, "gpu_ms": self.gpu_ms,
            "dispatches": [vars(d) for d in self.dispatches],
            "by_kernel": [dict(zip(("kernel", "count", "total_us", "share"), r)) for r in self.by_kernel()],
        }


def profile_executor(executor: Executor, inputs: Mapping[str, Any], weights: Any = None, *, runs: int = 10,
                     warmup: int = 2) -> Profile:
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    executor.ensure_bound(weights)
    for _ in range(warmup):
        executor.run(inputs)
    sync = executor.device.backend.synchronize
    per_dispatch: list[list[float]] = [[] for _ in executor.steps]

    def timed(index: int, step: Step) -> None:
        run, ins, outs = step
        t0 = time.perf_counter_ns()
        run(ins, outs)
        sync()
        per_dispatch[index].append(time.perf_counter_ns() - t0)

    totals = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        executor.run(inputs)
        sync()
        totals.append(time.perf_counter_ns() - start)
        executor.copy_in(inputs)
        executor.run_steps(timed)
    encode, gpu = _gpu_figures(executor, inputs, runs)
    loop_us, run_us = host_overhead(executor, inputs, runs=max(runs, 20))
    program = executor.program
    return Profile(
        model_name=program.model_name, runs=runs,
        dispatches=[DispatchTime(i, d.kernel, d.node, statistics.median(ts) / 1e3, d.host is not None,
                                 statistics.median(encode[i]) / 1e3 if encode and d.host is None else None,
                                 gpu.get(i))
                    for i, (d, ts) in enumerate(zip(program.dispatches, per_dispatch))],
        run_ms=statistics.median(totals) / 1e6,
        host_us_per_dispatch=loop_us / max(len(executor.steps), 1),
        host_us_per_run=max(run_us - loop_us, 0.0),
        device=repr(executor.device.backend),
    )


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
