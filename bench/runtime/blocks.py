"""Timing runners in alternating blocks: what ``run.py`` and ``precision.py`` both time with.

A runner is timed through a *block timer*: ``timer(n)`` makes one discarded call, then n timed calls, and returns
their milliseconds. A Python callable becomes one with ``timed_calls``; a runner in another process (a peer worker,
``peers/client.py``) times its own calls and answers the list, so no pipe is in its figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

BlockTimer = Callable[[int], list[float]]
# between two runners' blocks: the previous runner's spinning threads go to sleep (see time_blocks)
BLOCK_PAUSE_S = 0.2


def timed_calls(run: Callable[[], Any]) -> BlockTimer:
    """The block timer of an in-process runner: one discarded call, then ``n`` timed ones."""
    def block(n: int) -> list[float]:
        run()
        samples = []
        for _ in range(n):
            start = time.perf_counter_ns()
            run()
            samples.append((time.perf_counter_ns() - start) / 1e6)
        return samples

    return block


def time_blocks(timers: dict[str, BlockTimer], runs: int, warmup: int, rounds: int = 5) -> dict[str, list[float]]:
    """Milliseconds per call, in alternating blocks: ``rounds`` rounds, each runner a block of runs per round.

    Blocks rather than call-by-call round-robin: onnxruntime's pool keeps spinning for a while after a
    run (its default, which gives its best latency), and whichever runner came right after it lost a
    core: measured on ResNet-18, our runtime took 61 ms right after onnxruntime and 21 ms on its own.
    Rounds still spread slow drifts of the machine's load over all of them. Each block starts after a
    pause of ``BLOCK_PAUSE_S`` and one discarded call, so that no runner pays for the previous runner's
    threads winding down: one discarded call was not enough (the two ResNet-18 runs after an onnxruntime
    block took 40-48 ms instead of 19-21, which put the runner placed after onnxruntime at a disadvantage).
    """
    if warmup:
        for timer in timers.values():
            timer(warmup)
    samples: dict[str, list[float]] = {name: [] for name in timers}
    per_block = max(1, -(-runs // rounds))
    for _ in range(rounds):
        for name, timer in timers.items():
            time.sleep(BLOCK_PAUSE_S)
            samples[name] += timer(per_block)
    return samples
