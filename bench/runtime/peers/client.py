"""The harness's side of ``worker.py``: start a peer worker, give it inputs, time it in blocks, stop it.

Which interpreter runs a worker: the peers' venv (``setup.sh``) when it exists; without it, onnxruntime may run
from the harness's own interpreter (it is a test dependency there), said in the results; OpenVINO then has none.
"""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"
VENV_PYTHON = HERE / ".venv" / "bin" / "python"
SETUP = "bash bench/runtime/peers/setup.sh"
# a worker that says nothing for this long is taken as hung (a BERT-base load and compile takes seconds)
ANSWER_TIMEOUT_S = 900.0


class PeerError(RuntimeError):
    """A worker that could not start, answered an error, or died; the message says which and why, ``short`` in a
    few words (for a table cell)."""

    def __init__(self, message: str, short: str = ""):
        super().__init__(message)
        self.short = short


def peer_python(engine: str) -> tuple[str | None, str]:
    """``(interpreter, where)`` for ``engine``'s worker, or ``(None, why not)``."""
    if VENV_PYTHON.exists():
        return str(VENV_PYTHON), "peers venv"
    if engine == "ort":
        try:
            import onnxruntime  # noqa: F401 - only whether it is there
        except ImportError:
            return None, f"no onnxruntime here and no peers venv ({SETUP})"
        return sys.executable, "the harness's own environment"
    return None, f"no peers venv ({SETUP})"


class Peer:
    """One live worker: ``engine`` (ort, openvino) at ``precision`` (fp32, bf16, int8) on one ONNX file."""

    def __init__(self, engine: str, precision: str, model: Path, threads: int, python: str):
        self.engine, self.precision = engine, precision
        self._dir = tempfile.TemporaryDirectory(prefix=f"peer-{engine}-{precision}-")
        self._proc = subprocess.Popen(
            [python, str(WORKER), "--engine", engine, "--precision", precision, "--model", str(model),
             "--threads", str(threads), "--workdir", self._dir.name],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.info = self._answer()  # version, executed precision, inputs, load time
        if "error" in self.info:
            self.close()
            raise PeerError(self.info["error"], self.info.get("short", ""))

    @property
    def label(self) -> str:
        return f"{self.engine} {self.precision}"

    def _answer(self) -> dict[str, Any]:
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            if not selector.select(ANSWER_TIMEOUT_S):
                self.close()
                raise PeerError(f"{self.label}: no answer within {ANSWER_TIMEOUT_S:g} s; stopped it")
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait()
            raise PeerError(f"{self.label}: the worker exited (status {code}) without an answer; its stderr is above")
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            raise PeerError(f"{self.label}: not a JSON line from the worker: {line[:200]!r}") from None
        if not isinstance(data, dict):
            raise PeerError(f"{self.label}: a JSON object per line expected, got {line[:200]!r}")
        return data

    def _ask(self, command: str) -> dict[str, Any]:
        self._proc.stdin.write(command + "\n")
        self._proc.stdin.flush()
        data = self._answer()
        if "error" in data:
            raise PeerError(f"{self.label}: {command.split()[0]}: {data['error']}", data.get("short", ""))
        return data

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Sets the inputs (by name) for this run and the timed ones, runs once, and returns the first output."""
        path = Path(self._dir.name) / "inputs.npz"
        np.savez(path, **feeds)
        out = Path(self._ask(f"run {path}")["output"])
        return np.load(out, allow_pickle=False)

    def block(self, n: int) -> list[float]:
        """A block timer (``blocks.BlockTimer``): one discarded run, then ``n`` timed in the worker."""
        samples = self._ask(f"time {n + 1}")["ms"]
        if not (isinstance(samples, list) and len(samples) == n + 1):
            raise PeerError(f"{self.label}: asked for {n + 1} times, got {str(samples)[:100]}")
        return [float(s) for s in samples[1:]]

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write("quit\n")
                self._proc.stdin.flush()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._dir.cleanup()
