"""A hang is a failure: ``with no_hang(seconds, what):`` fails the test when the block has not finished by then.

For the hostile-input tests, whose point is that a bomb (a 37 GiB tensor, 10,000 nested subgraphs, a
half-million-character line, a FIFO for a file) is refused or passed over rather than left to run. The
bound is a hang detector, set far above what the code takes (milliseconds), not a claim about speed: how
fast something is belongs in a benchmark (bench/), and no test asserts a measured time.

SIGALRM, so on POSIX in the main thread; elsewhere the block just runs. A blocking system call (``open``
of a FIFO) is interrupted; a long C call is not, and then the alarm fails the test as soon as it returns.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class HangError(AssertionError):
    pass


@contextmanager
def no_hang(seconds: float, what: str) -> Iterator[None]:
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum: int, frame: FrameType | None) -> None:
        raise HangError(f"{what}: not finished within {seconds:g} s (a hang)")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
