"""Every allow-listed ATen op, run with hostile index, size, stride and shape arguments in child processes:
a clean error or a result, never a signal, a hang, a write outside its inputs or a read from outside them.

The children run ``tests/security/op_fuzz.py`` (its docstring says what is tried); the ops are split between two
of them, and a child that dies or stops answering is replaced by a fresh one that goes on after the op it was
running, so one run reports every bad op at once.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torch_ir.ops import allowlist
from torch_ir.ops.guards import GUARDS

ROOT = Path(__file__).resolve().parents[2]
OP_TIMEOUT = 120.0  # seconds one op's variants may take (each is tiny; a hang is a bug)


def _child(ops: list[str], flags: tuple[str, ...]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "tests.security.op_fuzz", *flags, *ops], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def fuzz(ops: list[str], flags: tuple[str, ...] = ()) -> dict[str, str]:
    """op -> what went wrong, for every op of ``ops`` that did not end cleanly."""
    problems: dict[str, str] = {}
    pending = list(ops)
    while pending:
        child, current = _child(pending, flags), None
        done: set[str] = set()
        while True:
            ready, _, _ = select.select([child.stdout], [], [], OP_TIMEOUT)
            line = child.stdout.readline() if ready else None
            if line is None:  # no word for OP_TIMEOUT seconds
                child.kill()
                child.wait()
                problems[current or pending[0]] = f"no answer within {OP_TIMEOUT:.0f} s (a hang)"
                break
            if not line:  # the child ended
                code = child.wait()
                if current is not None:
                    why = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
                    problems[current] = f"the process {why} while running it"
                break
            if line.startswith("@@ BEGIN "):
                current = line.split()[2]
            elif line.startswith("@@ END "):
                _, _, op, verdict = line.rstrip("\n").split(" ", 3)
                if json.loads(verdict) is not None:
                    problems[op] = json.loads(verdict)
                done.add(op)
                current = None
        pending = [op for op in pending if op not in done and op not in problems]
    return problems


@pytest.mark.slow
def test_every_allowed_op_survives_hostile_arguments():
    ops = allowlist.allowed_ops()
    start = time.monotonic()
    halves = [ops[0::2], ops[1::2]]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        problems = {k: v for part in pool.map(fuzz, halves) for k, v in part.items()}
    assert not problems, f"{len(problems)} of {len(ops)} allowed ops misbehaved ({time.monotonic() - start:.0f} s):\n" \
        + "\n".join(f"  {op}: {why}" for op, why in sorted(problems.items()))


def test_the_fuzzer_finds_what_a_guard_prevents():
    """Without its guard, segment_reduce(unsafe=True) is caught by the same fuzzing: the fuzzer can fail."""
    op = "aten.segment_reduce.default"
    assert op in fuzz([op], ("--without-guards",))


def test_guards_are_all_used_and_named():
    used = {r.guard for r in allowlist.reviews().values() if r.guard}
    assert used == set(GUARDS)
