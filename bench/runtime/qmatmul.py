"""int8 matmuls of two activations on the CPU (attention's Q·Kᵀ and P·V in onnxruntime's QDQ BERT-base, seq 128): our
native QGEMM (``cpu_qmatmul.QMatMul``, through ``cpu_qconv.QGemm``) against the op's reference (what ran before it)
and onnxruntime's QLinearMatMul on the same codes.

    .venv/bin/python bench/runtime/qmatmul.py                  # torch's threads
    .venv/bin/python bench/runtime/qmatmul.py --threads 2 --runs 40 --json out.json

uint8 x and w with per-tensor scales and zero points (nonzero), uint8 y, ``trans_b=False`` (the shapes BERT's
normalized program dispatches). Timed in alternating blocks (``run.time_in_blocks``): ours at the best ISA of this
CPU and capped to AVX2, the reference, onnxruntime; medians and p10-p90 in µs. The codes of ours, the reference's
and onnxruntime's are compared (they must be equal). The machine may be shared: rerun before trusting a ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))  # the tests' helpers

from run import time_in_blocks  # noqa: E402 - bench/runtime/run.py
from tests.runtime.test_cpu_qmatmul import _operands, _params, _run, ort_session  # noqa: E402

from npu_runtime.backends import cpu_qmatmul  # noqa: E402
from torch_ir.ops.npu_quant import qgemm  # noqa: E402

SHAPES = {"QK^T": ((1, 12, 128, 64), (1, 12, 64, 128)), "PV": ((1, 12, 128, 128), (1, 12, 128, 64))}


def _with_isa(isa: str | None, fn):
    def run() -> None:
        previous = os.environ.get("TORCH_IR_QCONV_ISA")
        if isa is not None:
            os.environ["TORCH_IR_QCONV_ISA"] = isa
        try:
            fn()
        finally:
            if previous is None:
                os.environ.pop("TORCH_IR_QCONV_ISA", None)
            else:
                os.environ["TORCH_IR_QCONV_ISA"] = previous
    return run


def one_shape(xs: tuple, ws: tuple, runs: int, threads: int) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, xs, generator=g).to(torch.uint8)
    w = torch.randint(0, 256, ws, generator=g).to(torch.uint8)
    ins = _operands(x, w, ws[-1], 131, 120, g, bias=None, out="uint8")
    params = _params(False, w, None, "uint8", False)
    expected = qgemm(*ins, **params)
    kernel, y = _run(ins, params, expected)
    if not kernel.native:
        raise SystemExit(f"the native kernel refused {xs} x {ws}: {cpu_qmatmul.native_status()}")
    reference = kernel.activations.reference  # what QGEMM of two activations ran before the native kernel
    session = ort_session("QLinearMatMul", x, w, ins, threads)
    feeds = {"x": x.numpy(), "w": w.numpy()}
    theirs = torch.from_numpy(session.run(None, feeds)[0])
    out = torch.empty_like(expected)
    runners = {"ours": lambda: kernel.run(ins, [out]), "ours_avx2": _with_isa("avx2", lambda: kernel.run(ins, [out])),
               "reference": lambda: reference.run(ins, [out]), "onnxruntime": lambda: session.run(None, feeds)}
    times = time_in_blocks(runners, runs, warmup=3)
    result = {"equal_reference": torch.equal(y, expected), "equal_onnxruntime": torch.equal(y, theirs)}
    for name, ms in times.items():
        us = sorted(t * 1e3 for t in ms)
        result[name] = {"median_us": statistics.median(us), "p10_us": us[len(us) // 10],
                        "p90_us": us[(9 * len(us)) // 10]}
    macs = xs[-2] * xs[-1] * ws[-1] * (x.numel() // (xs[-2] * xs[-1]))
    result["ours"]["gops"] = 2 * macs / result["ours"]["median_us"] / 1e3
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, help="torch's and onnxruntime's intra-op threads (default: torch's)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results: dict = {"threads": torch.get_num_threads(), "kernel": cpu_qmatmul.native_status()}
    print(f"threads {results['threads']}; {results['kernel']}")
    for label, (xs, ws) in SHAPES.items():
        r = results[label] = one_shape(xs, ws, args.runs, results["threads"])
        cells = "  ".join(f"{n} {r[n]['median_us']:.0f} ({r[n]['p10_us']:.0f}-{r[n]['p90_us']:.0f})"
                          for n in ("ours", "ours_avx2", "reference", "onnxruntime"))
        print(f"{label} {xs} x {ws}: µs median (p10-p90): {cells}; ours {r['ours']['gops']:.0f} GOPS; equal to the "
              f"reference {r['equal_reference']}, to onnxruntime {r['equal_onnxruntime']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
