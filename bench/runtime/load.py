"""Neighbours for a benchmark: background processes that keep starting short-lived, allocating children.

    with Load(workers=2):           # two neighbours until the block ends
        ...time something...

    with Load(workers=2, kind="shell"):  # two shell loops starting processes, the load issue 26 measured
        ...

    .venv/bin/python bench/runtime/load.py --workers 2 --seconds 30   # the same load on its own, for a look

What a shared machine does to a latency benchmark is not a steady "other process at 100 %": it is a
stream of short processes (a test suite's subprocesses, a shell loop, a compiler) that start, fault in
memory, compute for a few to a few hundred milliseconds and exit, taking a core at moments nobody
chooses. That is what stalls a thread pool whose threads spin at a barrier: one of them loses its core
for a scheduler tick and every other waits. So each worker here loops: fork a child that allocates and
writes ``32 MiB`` to ``max_mb`` (page faults, and the kernel's work to map and free them), computes for
5-100 ms and exits; the worker pauses 0-20 ms and forks the next. Sizes and times are drawn from a
seeded generator, so two runs of a benchmark see the same pattern.

The ``shell`` kind is the lighter load that issue 26 measured first ("two shell loops starting
processes"): each worker is ``sh -c 'while :; do /bin/true; done'``, process starts without the
allocations.

Bounded, on this machine only: every worker exits by itself after ``seconds`` (and when its parent is
gone), and ``Load`` kills them (their whole process group) when the block ends, even on an exception.
Workers import nothing but the standard library, so they start in tens of milliseconds.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from types import TracebackType

# Each child's allocation, MiB: from this up to ``max_mb``.
MIN_MB = 32
# A child computes for this long, seconds (uniform), then exits.
CHILD_SECONDS = (0.005, 0.1)
# The worker waits this long between children, seconds (uniform): the gaps in which the cores are free.
PAUSE_SECONDS = (0.0, 0.02)
KINDS = ("alloc", "shell")
# a ``shell`` worker: a loop that starts a process after another, ended by Load or by ``timeout``
SHELL_LOOP = "while :; do /bin/true; done"


class Load:
    """``workers`` background processes of short-lived children (see the module's docstring), from ``__enter__``
    to ``__exit__``; none outlives ``seconds``."""

    def __init__(self, workers: int = 2, *, max_mb: int = 512, seconds: float = 600.0, seed: int = 0,
                 kind: str = "alloc") -> None:
        if workers < 0 or max_mb < MIN_MB or seconds <= 0 or kind not in KINDS:
            raise ValueError(f"workers >= 0, max_mb >= {MIN_MB}, seconds > 0 and kind in {KINDS}, "
                             f"got {workers}, {max_mb}, {seconds}, {kind!r}")
        self.workers, self.max_mb, self.seconds, self.seed, self.kind = workers, max_mb, seconds, seed, kind
        self.processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Load:
        for i in range(self.workers):
            command = [sys.executable, __file__, "--worker", "--max-mb", str(self.max_mb),
                       "--seconds", str(self.seconds), "--seed", str(self.seed + i)]
            if self.kind == "shell":
                command = ["timeout", "-s", "KILL", str(self.seconds), "sh", "-c", SHELL_LOOP]
            # a session of its own: stop() ends the worker and any child it has at that moment, together
            self.processes.append(subprocess.Popen(command, start_new_session=True))
        time.sleep(0.2)  # the workers' start (an interpreter each) is not part of what is measured
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        """End every worker and the child it has at that moment (a process group each): SIGKILL, since
        neither holds anything to clean up, and a child busy in one long C call would not see SIGTERM."""
        for process in self.processes:
            _signal_group(process.pid, signal.SIGKILL)
        for process in self.processes:
            process.wait()
        self.processes.clear()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:  # already gone: its deadline passed
        pass


def _child(rng: random.Random, max_mb: int) -> None:
    """Allocate and write a block (every page faulted in), compute a while, exit without cleanup."""
    block = b"\x01" * (rng.randint(MIN_MB, max_mb) << 20)
    end = time.perf_counter() + rng.uniform(*CHILD_SECONDS)
    total = 0
    while time.perf_counter() < end:
        total += sum(range(1000))
    os._exit(0 if block and total >= 0 else 1)


def worker(max_mb: int, seconds: float, seed: int) -> None:
    """Fork children one after another until ``seconds`` pass or the process that started us is gone."""
    rng, parent = random.Random(seed), os.getppid()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and os.getppid() == parent:
        child_seed = rng.getrandbits(32)
        pid = os.fork()
        if pid == 0:
            _child(random.Random(child_seed), max_mb)
        os.waitpid(pid, 0)
        time.sleep(rng.uniform(*PAUSE_SECONDS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="background processes (default 2)")
    parser.add_argument("--max-mb", type=int, default=512, help="largest allocation of a child, MiB (default 512)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the load lasts (default 30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kind", choices=KINDS, default="alloc",
                        help="alloc: allocating children (default); shell: shell loops starting processes")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one worker, started by Load
    args = parser.parse_args()
    if args.worker:
        worker(args.max_mb, args.seconds, args.seed)
        return
    with Load(args.workers, max_mb=args.max_mb, seconds=args.seconds, seed=args.seed, kind=args.kind):
        time.sleep(args.seconds)


if __name__ == "__main__":
    main()
