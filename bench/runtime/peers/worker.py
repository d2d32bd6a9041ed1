"""One peer engine on one ONNX file, driven over stdin/stdout by ``bench/runtime/precision.py``.

    bench/runtime/peers/.venv/bin/python bench/runtime/peers/worker.py --engine openvino --precision bf16 \\
        --model resnet50.onnx --threads 2 --workdir /tmp/x

Run by the peers' own interpreter (``setup.sh``), so it imports only numpy and the engine: never torch or this
project's packages, which live in another environment. It loads the model, prints one JSON line (``ready``: the
engine's version and the precision it actually executes, or ``error``), then answers one JSON line per command:

* ``run <path>``: the inputs, a ``.npy`` (the model's one input) or ``.npz`` (by input name), are set and run once;
  the first output is written to an ``.npy`` under ``--workdir`` whose path is answered (``output``);
* ``time <n>``: n runs of the inputs of the last ``run``, each timed here (no pipe in the figure): ``ms``;
* ``quit``.

A failing command answers ``{"error": ...}`` and the worker goes on. Anything the engines print goes to stderr:
stdout carries the protocol only.

Engines and precisions: ``ort`` (onnxruntime ``CPUExecutionProvider``, all graph optimizations, sequential,
``intra_op_num_threads``) runs ``fp32`` and ``int8`` (a QDQ file: onnxruntime fuses the QDQ pairs into its
integer kernels); ``openvino`` (CPU plugin, ``PERFORMANCE_HINT`` LATENCY, ``INFERENCE_NUM_THREADS``) runs
``fp32`` (``INFERENCE_PRECISION_HINT`` f32), ``bf16`` (the hint bf16: the plugin falls back to f32, silently, on
a CPU without bf16 instructions; ``executed`` says what it chose) and ``int8`` (a QDQ file, which its low-precision
transformations run in int8; precision hint f32 so that no op left in float is moved to bf16 behind our back).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ENGINES = {"ort": ("fp32", "int8"), "openvino": ("fp32", "bf16", "int8")}
MAX_TIMED_RUNS = 100_000
# the ops whose runtime precision says what the heavy work ran in (OpenVINO's runtime model names)
HEAVY_OPS = ("Convolution", "FullyConnected", "MatMul", "GroupConvolution")


def protocol_stdout() -> Any:
    """A private copy of stdout for the JSON lines; fd 1 then goes to stderr, where engine chatter belongs."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


class Ort:
    def __init__(self, path: str, precision: str, threads: int):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]
        self.version = ort.__version__
        self.executed = {"asked": precision, "note": "CPUExecutionProvider" + (
            ", QDQ fused into its integer kernels" if precision == "int8" else "")}
        self.feeds: dict[str, np.ndarray] = {}

    def set_inputs(self, feeds: dict[str, np.ndarray]) -> None:
        self.feeds = feeds

    def run(self) -> np.ndarray:
        return self.session.run(None, self.feeds)[0]


class OpenVino:
    def __init__(self, path: str, precision: str, threads: int):
        import openvino as ov

        self.ov = ov
        core = ov.Core()
        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
                  "INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32"}
        self.compiled = core.compile_model(core.read_model(path), "CPU", config)
        self.request = self.compiled.create_infer_request()
        self.names = [p.get_any_name() for p in self.compiled.inputs]
        self.version = ov.get_version()
        self.executed = self._executed(precision)

    def _executed(self, precision: str) -> dict[str, Any]:
        """What the plugin settled on: its precision property and the runtime precision of the heavy ops
        (``main``: the most common one, ``kernels``: their implementations, e.g. ``brgconv_avx512_bf16``)."""
        hint = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        heavy: Counter[str] = Counter()
        kernels: Counter[str] = Counter()
        for op in self.compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            text = lambda key: info[key].astype(str) if key in info else ""  # noqa: B023 - used at once
            if text("layerType") in HEAVY_OPS:
                heavy[text("runtimePrecision")] += 1
                kernels[text("primitiveType")] += 1
        main = heavy.most_common(1)[0][0] if heavy else "unknown"
        return {"asked": precision, "hint": getattr(hint, "get_type_name", lambda: str(hint))(),
                "heavy_ops": dict(heavy), "kernels": dict(kernels), "main": main}

    def set_inputs(self, feeds: dict[str, np.ndarray]) -> None:
        for name, value in feeds.items():
            self.request.set_tensor(name, self.ov.Tensor(np.ascontiguousarray(value)))

    def run(self) -> np.ndarray:
        self.request.infer()
        return self.request.get_output_tensor(0).data


def read_inputs(path: str, names: list[str]) -> dict[str, np.ndarray]:
    """The inputs in ``path`` by the model's input names (never pickles: a file is data)."""
    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as data:
            missing = [n for n in names if n not in data.files]
            if missing:
                raise ValueError(f"{path}: no array for input(s) {missing}; it holds {data.files}")
            return {n: data[n] for n in names}
    if len(names) != 1:
        raise ValueError(f"{path}: one array for a model with inputs {names}; give an .npz keyed by input name")
    return {names[0]: np.load(path, allow_pickle=False)}


def timed(run: Callable[[], Any], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        start = time.perf_counter_ns()
        run()
        samples.append((time.perf_counter_ns() - start) / 1e6)
    return samples


def answer(engine: Ort | OpenVino, line: str, workdir: Path, state: dict[str, Any]) -> dict[str, Any]:
    command, _, arg = line.strip().partition(" ")
    if command == "run":
        engine.set_inputs(read_inputs(arg, engine.names))
        state["ready"] = True
        state["runs"] += 1
        out = workdir / f"output_{state['runs']}.npy"
        np.save(out, np.array(engine.run()))
        return {"output": str(out)}
    if command == "time":
        if not state["ready"]:
            raise ValueError("'time' before any 'run': the inputs are set by 'run <path>'")
        n = int(arg)
        if not 1 <= n <= MAX_TIMED_RUNS:
            raise ValueError(f"time {n}: give 1 to {MAX_TIMED_RUNS} runs")
        return {"ms": timed(engine.run, n)}
    raise ValueError(f"unknown command {line.strip()[:80]!r}; the commands are: run <path>, time <n>, quit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=list(ENGINES), required=True)
    parser.add_argument("--precision", choices=("fp32", "bf16", "int8"), required=True)
    parser.add_argument("--model", required=True, help="the ONNX file")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--workdir", required=True, help="an existing folder for the outputs of 'run'")
    args = parser.parse_args()
    out = protocol_stdout()
    say = lambda data: print(json.dumps(data), file=out, flush=True)
    if args.precision not in ENGINES[args.engine]:
        say({"error": f"{args.engine} has no {args.precision} here; it runs {', '.join(ENGINES[args.engine])}"})
        return
    start = time.perf_counter()
    try:
        engine = (Ort if args.engine == "ort" else OpenVino)(args.model, args.precision, args.threads)
    except Exception as err:  # whatever the engine raises is the answer
        say({"error": f"{args.engine} could not load {args.model}: {type(err).__name__}: {err}",
             "short": f"{args.engine} could not load the model ({type(err).__name__})"})
        return
    say({"ready": True, "version": engine.version, "executed": engine.executed, "inputs": engine.names,
         "load_s": time.perf_counter() - start, "pid": os.getpid()})
    state = {"ready": False, "runs": 0}
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        try:
            say(answer(engine, line, Path(args.workdir), state))
        except Exception as err:  # one bad command does not end the worker
            say({"error": f"{type(err).__name__}: {err}"})


if __name__ == "__main__":
    main()
