"""Block-quantized weight GEMV on the WebGPU backend against the float GEMV, one decode row, the same shapes.

    .venv/bin/python bench/webgpu/blocks.py                       # N = K = 2048, q8_0, q4_0, q4_K, q6_K, f32, bf16
    .venv/bin/python bench/webgpu/blocks.py --n 4096 --k 1024 --runs 20

One GEMM dispatch per program (y = x · wᵀ, x one row), weights random (blocks: random codes, finite fp16
scales). Each layout's program runs alternately with the others, ``--runs`` rounds; the median wall time per run
(a run is one submission and its read-back) and the weight bytes it streams are printed, with GB/s. On Mesa's
lavapipe these say what the software adapter reads, not what a GPU would.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import npu_compiler
from npu_compiler import CompileOptions
from npu_runtime import Device, Executor, load_weights
from torch_ir.ir import NPU_IR, OpNode, TensorMeta
from torch_ir.quant.spec import BLOCK_BYTES, BLOCK_CODES, BLOCKS, QuantSpec

SCALES = {"q8_0": (0,), "q4_0": (0,), "q4_K": (0, 2), "q6_K": (208,)}


def program(layout: str, n: int, k: int) -> tuple[object, object]:
    """(program, weight value) of one GEMV with weights in ``layout`` (a block layout, float32 or bfloat16)."""
    rng = np.random.default_rng(0)
    block = layout in BLOCKS
    quant = QuantSpec(dtype=BLOCK_CODES[layout], block=layout) if block else None
    x = TensorMeta("x", [1, k], "float32", role="input")
    w = TensorMeta("w", [n, k], "float32" if block else layout, role="weight", quant=quant)
    y = TensorMeta("y", [1, n], "float32")
    ir = NPU_IR(model_name=f"gemv_{layout}", graph_inputs=[x], graph_outputs=[y], weights=[w],
                nodes=[OpNode("k0", "GEMM", [x, w], [y], {"trans_b": True, "has_bias": False})])
    prog = npu_compiler.compile(ir, target="webgpu", options=CompileOptions(normalize=False, fuse=False))
    if not block:
        value = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32))
        return prog, value.to(torch.bfloat16) if layout == "bfloat16" else value
    count = n * k // BLOCKS[layout]
    raw = rng.integers(0, 256, size=(count, BLOCK_BYTES[layout]), dtype=np.uint8)
    for off in SCALES[layout]:
        raw[:, off:off + 2] = (rng.standard_normal(count) * 1e-2).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return prog, raw.reshape(n, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--layouts", default="q8_0,q4_0,q4_K,q6_K,float32,bfloat16")
    args = parser.parse_args()
    device = Device("webgpu")
    x = np.random.default_rng(1).standard_normal((1, args.k)).astype(np.float32)
    runs = {}
    for layout in args.layouts.split(","):
        prog, value = program(layout, args.n, args.k)
        ex = Executor(prog, device)
        weights = load_weights({"w": value}, prog, device)
        next(iter(ex.run({"x": x}, weights=weights).values())).to_numpy()  # compile and warm
        runs[layout] = (ex, weights, prog.weight_bytes, [])
    for _ in range(args.runs):  # alternating: the machine's load falls on every layout alike
        for ex, weights, _, times in runs.values():
            start = time.perf_counter()
            next(iter(ex.run({"x": x}, weights=weights).values())).to_numpy()
            times.append(time.perf_counter() - start)
    print(f"GEMV 1 x {args.k} -> {args.n} on {device.backend!r}, median of {args.runs} runs")
    print(f"{'weights':10} {'bytes':>12} {'ms':>9} {'GB/s':>7}")
    for layout, (_, _, nbytes, times) in runs.items():
        ms = statistics.median(times) * 1e3
        print(f"{layout:10} {nbytes:12d} {ms:9.3f} {nbytes / ms / 1e6:7.2f}")


if __name__ == "__main__":
    main()
