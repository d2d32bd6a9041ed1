"""QUANTIZE and DEQUANTIZE on the CPU backend: the native kernel (``cpu_qelementwise``) against the op's reference, per
dispatch, at the shapes a QDQ BERT-base (seq 128) and an int8 ResNet run.

    PYTHONPATH=src .venv/bin/python bench/runtime/qdq_ops.py [--threads 2] [--rounds 7] [--calls 200]

Both kernels are built as the runtime builds them (``make_kernel``; the reference as ``Reference``) and called on
the same tensors, in alternating blocks of ``--calls`` calls (one block each per round): prints the per-call
median over rounds, the p10-p90 spread of the block medians and the speed-up.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from npu_program.program import Dispatch, TensorSpec
from npu_runtime.backends import cpu_qelementwise
from npu_runtime.backends.cpu_kernels import Reference, make_kernel

# (op, shape, x dtype, y dtype, per-channel axis or None)
CASES = [("QUANTIZE", (1, 128, 3072), torch.float32, torch.uint8, None),
         ("QUANTIZE", (1, 128, 768), torch.float32, torch.uint8, None),
         ("QUANTIZE", (1, 12, 128, 128), torch.float32, torch.uint8, None),
         ("DEQUANTIZE", (1, 128, 768), torch.uint8, torch.float32, None),
         ("DEQUANTIZE", (1, 128, 3072), torch.uint8, torch.float32, None),
         ("QUANTIZE", (1, 64, 112, 112), torch.float32, torch.uint8, None),
         ("DEQUANTIZE", (1, 64, 56, 56), torch.uint8, torch.float32, 1)]


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _kernels(op: str, shape: tuple, x_dtype: torch.dtype, y_dtype: torch.dtype, axis: int | None) -> tuple:
    channels = 1 if axis is None else shape[axis]
    scale = torch.rand(channels) * 0.05 + 0.01
    zp = torch.randint(0, 256, (channels,)).to(torch.uint8)
    if axis is None:
        scale, zp = scale.reshape(()), zp.reshape(())
    x = torch.randn(shape) * 3 if op == "QUANTIZE" else torch.randint(0, 256, shape).to(x_dtype)
    specs = {"x": TensorSpec("x", list(shape), _name(x_dtype)), "s": TensorSpec("s", list(scale.shape), "float32"),
             "z": TensorSpec("z", list(zp.shape), "uint8"), "y": TensorSpec("y", list(shape), _name(y_dtype))}
    params = {"dtype": "uint8", "axis": axis}
    dispatch = Dispatch(kernel=op, node="n", inputs=["x", "s", "z"], outputs=["y"], params=params)
    native, reference = make_kernel(dispatch, specs, {"s", "z"}), Reference(dispatch, specs)
    for k in (native, reference):
        k.prepare({"s": scale, "z": zp})
    assert getattr(native, "native", False), f"{op} {shape}: the native kernel does not take it"
    return native, reference, [x, scale, zp], [torch.empty(shape, dtype=y_dtype)]


def _block(kernel: object, inputs: list, outputs: list, calls: int) -> float:
    """The median of ``calls`` timed calls, in microseconds."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        kernel.run(inputs, outputs)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1000


def _spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=10) if len(values) > 1 else values * 9
    return f"{q[0]:.1f}-{q[-1]:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# {cpu_qelementwise.native_status()}; {args.threads} threads, {args.rounds} rounds of {args.calls} calls")
    print(f"{'op':<11}{'shape':<18}{'axis':<6}{'reference us (p10-p90)':<26}{'native us (p10-p90)':<24}speed-up")
    for op, shape, x_dtype, y_dtype, axis in CASES:
        native, reference, inputs, outputs = _kernels(op, shape, x_dtype, y_dtype, axis)
        got = {"reference": [], "native": []}
        for k in (reference, native):
            _block(k, inputs, outputs, 10)  # warm-up
        for _ in range(args.rounds):  # alternating blocks: a neighbour's load falls on both
            got["reference"].append(_block(reference, inputs, outputs, args.calls))
            got["native"].append(_block(native, inputs, outputs, args.calls))
        ref, nat = statistics.median(got["reference"]), statistics.median(got["native"])
        ref_col, nat_col = f"{ref:.1f} ({_spread(got['reference'])})", f"{nat:.1f} ({_spread(got['native'])})"
        print(f"{op:<11}{'x'.join(map(str, shape)):<18}{axis if axis is not None else '-':<6}{ref_col:<26}"
              f"{nat_col:<24}{ref / nat:.1f}x")


if __name__ == "__main__":
    main()
