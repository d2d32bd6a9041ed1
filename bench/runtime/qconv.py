"""int8 convolutions on the CPU: our native QCONV kernel against its reference and onnxruntime's int8 execution.

    .venv/bin/python bench/runtime/qconv.py                       # ResNet-50's convolutions, then both models
    .venv/bin/python bench/runtime/qconv.py --skip-models --runs 20
    .venv/bin/python bench/runtime/qconv.py --models resnet18 --threads 1 --json out.json
    .venv/bin/python bench/runtime/qconv.py --skip-convs --threads 1 --profile   # + per-kernel profiles

Part 1, per convolution shape of ResNet-50 (batch 1, 224x224, found by hooks on the model, with how often each
occurs): uint8 x, per-channel int8 weights, an int32 bias, uint8 y. Timed: our kernel (``cpu_qconv.QConv``, the
best ISA of this CPU, and its AVX2 path), the op's reference (``torch_ir.ops.npu_quant.qconv``, fewer runs: it is
slow) and onnxruntime running a one-convolution QDQ model of the same codes (DQ -> Conv -> Q, which its optimizer
fuses into QLinearConv), medians of alternating blocks; the codes of ours and onnxruntime's are compared (``diff``:
codes that differ; onnxruntime rounds its own way at most one step apart). GOPS count a multiply-add as two. The
sums over the network weigh each shape by its count.

Part 2, the whole models: onnxruntime's ``quantize_static`` (QDQ, per channel, uint8 activations; the helpers of
tests/onnx/test_quant_models.py) of the seeded ResNet-18 / ResNet-50 of ``run.py``, imported, normalized into
QCONV/QGEMM/QADD and compiled for the CPU backend, the same without the QADD rules (its residual adds as
DEQUANTIZE/add/QUANTIZE reference dispatches), and onnxruntime on the same file, in alternating blocks
(``run.time_in_blocks``). The machine is shared: medians and p10-p90 are printed; rerun before trusting a ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))  # the tests' quantization helpers

from run import build_models, ort_session, time_in_blocks  # noqa: E402 - bench/runtime/run.py

from npu_program.program import Dispatch, TensorSpec  # noqa: E402
from npu_runtime.backends import cpu_qconv, cpu_qelementwise  # noqa: E402
from torch_ir.ops.npu_quant import qconv  # noqa: E402

Shape = tuple[int, int, int, int, int, int, int]  # C, H, W, N, k, stride, padding


def conv_shapes(name: str) -> Counter[Shape]:
    """Every convolution of the model at batch 1, 224x224, with its count."""
    _, model = build_models(name)
    seen: Counter[Shape] = Counter()

    def hook(module: torch.nn.Conv2d, args: tuple, _out: torch.Tensor) -> None:
        _, c, h, w = args[0].shape
        seen[(c, h, w, module.out_channels, module.kernel_size[0], module.stride[0], module.padding[0])] += 1

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        model(pixel_values=torch.zeros(1, 3, 224, 224))
    for h in handles:
        h.remove()
    return seen


def operands(shape: Shape, g: torch.Generator) -> tuple[list[torch.Tensor], dict]:
    c, h, w, n, k, s, p = shape
    ins = [torch.randint(0, 256, (1, c, h, w), generator=g).to(torch.uint8),
           torch.randint(-127, 128, (n, c, k, k), generator=g).to(torch.int8), torch.tensor(0.02),
           torch.tensor(118, dtype=torch.uint8), torch.rand(n, generator=g) * 4e-3 / (c * k * k) ** 0.5 + 1e-5,
           torch.zeros(n, dtype=torch.int8), torch.randint(-3000, 3000, (n,), generator=g).to(torch.int32),
           torch.tensor(0.03), torch.tensor(5, dtype=torch.uint8)]
    params = {"stride": [s, s], "padding": [p, p], "dilation": [1, 1], "groups": 1, "w_dtype": "int8",
              "has_bias": True, "out_dtype": "uint8", "activation": None}
    return ins, params


def our_kernel(ins: list[torch.Tensor], params: dict, out: torch.Tensor) -> cpu_qconv.QConv:
    names = [f"in{i}" for i in range(len(ins))]
    specs = {nm: TensorSpec(nm, list(t.shape), str(t.dtype).removeprefix("torch.")) for nm, t in zip(names, ins)}
    specs["y"] = TensorSpec("y", list(out.shape), "uint8")
    kernel = cpu_qconv.QConv(Dispatch(kernel="QCONV", node="bench", inputs=names, outputs=["y"], params=params),
                             specs)
    kernel.prepare(dict(zip(names[1:], ins[1:])))
    if not kernel.native:
        raise SystemExit(f"the native kernel refused {params}: {cpu_qconv.native_status()}")
    return kernel


def ort_conv(ins: list[torch.Tensor], params: dict, threads: int):
    """A one-convolution QDQ model of these codes, as quantize_static writes one, and its session."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x, w, xs, xzp, ws, wzp, b, ys, yzp = (t.numpy() for t in ins)
    inits = [numpy_helper.from_array(a, nm) for a, nm in (
        (xs, "xs"), (xzp, "xzp"), (w, "w"), (ws.astype(np.float32), "ws"), (wzp, "wzp"), (b, "b"),
        ((np.float32(xs) * ws).astype(np.float32), "bs"), (np.zeros(len(b), np.int32), "bzp"), (ys, "ys"),
        (yzp, "yzp"))]
    s, p = params["stride"], params["padding"]
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xzp"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wzp"], ["wf"], axis=0),
             helper.make_node("DequantizeLinear", ["b", "bs", "bzp"], ["bf"], axis=0),
             helper.make_node("Conv", ["xf", "wf", "bf"], ["yf"], strides=s, pads=p + p),
             helper.make_node("QuantizeLinear", ["yf", "ys", "yzp"], ["y"])]
    graph = helper.make_graph(nodes, "qconv", [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = Path(tempfile.mkdtemp()) / "qconv.onnx"
    onnx.save(model, path)
    session = ort_session(str(path), threads)
    return lambda: session.run(None, {"x": x})[0]


def _bind(kernel: cpu_qconv.QConv | None, ins: list[torch.Tensor], arg, isa: str | None = None):
    """One call of our kernel (capped at ``isa``) into ``arg``, or of the reference (``kernel`` None) with params
    ``arg``."""
    if kernel is None:
        return lambda: qconv(*ins, **arg)

    def run() -> None:
        if isa is not None:
            os.environ["TORCH_IR_QCONV_ISA"] = isa
        try:
            kernel.run(ins, [arg])
        finally:
            os.environ.pop("TORCH_IR_QCONV_ISA", None)

    return run


def best_ms(fn, runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(times)


def per_conv(runs: int, threads: int) -> dict:
    shapes = conv_shapes("resnet50")
    g = torch.Generator().manual_seed(0)
    rows, totals = [], Counter()
    print(f"ResNet-50 convolutions, batch 1, 224x224, {threads} threads; medians in ms; kernel "
          f"{cpu_qconv.native_status()}")
    print(f"{'C':>5} {'HxW':>8} {'N':>5} {'k':>2} {'s':>2} {'x':>2} | {'ours':>7} {'GOPS':>6} {'avx2':>7} "
          f"{'ort':>7} {'GOPS':>6} {'ref':>8} | {'ours/ort':>8} {'diff':>5}")
    for shape, count in sorted(shapes.items(), key=lambda kv: (-kv[0][1], kv[0][0], kv[0][3])):
        ins, params = operands(shape, g)
        expected = qconv(*ins, **params)
        out = torch.empty_like(expected)
        kernel = our_kernel(ins, params, out)
        ort = ort_conv(ins, params, threads)
        ort_y = torch.from_numpy(ort())
        kernel.run(ins, [out])
        assert torch.equal(out, expected), shape
        samples = time_in_blocks({"ours": _bind(kernel, ins, out), "avx2": _bind(kernel, ins, out, "avx2"),
                                  "ort": ort}, runs, warmup=2, rounds=3)
        times = {name: statistics.median(ms) for name, ms in samples.items()}
        best = {name: min(ms) for name, ms in samples.items()}
        times["ref"] = best_ms(_bind(None, ins, params), max(1, runs // 10))
        c, h, w, n, k, s, _ = shape
        ops = 2 * n * c * k * k * expected.shape[2] * expected.shape[3]
        diff = int((ort_y.to(torch.int16) - out.to(torch.int16)).ne(0).sum())
        print(f"{c:5d} {f'{h}x{w}':>8} {n:5d} {k:2d} {s:2d} {count:2d} | {times['ours']:7.3f} "
              f"{ops / times['ours'] / 1e6:6.1f} {times['avx2']:7.3f} {times['ort']:7.3f} "
              f"{ops / times['ort'] / 1e6:6.1f} {times['ref']:8.2f} | {times['ours'] / times['ort']:8.2f} {diff:5d}")
        rows.append({"shape": shape, "count": count, "ms": times, "best_ms": best, "gops": ops / times["ours"] / 1e6,
                     "differing_codes_vs_ort": diff})
        for key, value in times.items():
            totals[key] += count * value
        for key, value in best.items():
            totals[f"best {key}"] += count * value
    print("sum over the network (ms; medians, then the best of each shape's runs): "
          + ", ".join(f"{k} {v:.2f}" for k, v in totals.items())
          + f"; ours/ort {totals['ours'] / totals['ort']:.2f} (best {totals['best ours'] / totals['best ort']:.2f}), "
          f"ref/ours {totals['ref'] / totals['ours']:.1f}")
    return {"rows": rows, "totals_ms": dict(totals)}


def _program(ir, weights: dict, x: torch.Tensor, disabled: set[str]):
    """``ir`` normalized (``disabled`` rules off), compiled for the CPU and bound: (executor, run, feeds, bound)."""
    import npu_compiler
    from npu_compiler.passes import NormalizeOptions
    from npu_runtime import Device, Executor, NPUBuffer, load_weights

    options = npu_compiler.CompileOptions(normalize_options=NormalizeOptions(disabled_rules=disabled))
    program = npu_compiler.compile(ir, target="cpu", fallback="cpu", options=options)
    device = Device()
    executor = Executor(program, device)
    bound = load_weights({k: v.contiguous() for k, v in weights.items()}, program, device)
    spec, out_name = program.input_specs[0], program.output_specs[0].name
    feeds = {spec.name: NPUBuffer.from_numpy(x.numpy(), device, spec=spec)}
    return executor, lambda: executor.run(feeds, weights=bound)[out_name].to_numpy(), feeds, bound


def whole_model(name: str, runs: int, threads: int, profile: bool = False) -> dict:
    """Ours with QADD (the residual adds fused), ours without (``qdq_add`` rules off: DEQUANTIZE, add, QUANTIZE as
    reference dispatches) and onnxruntime, alternating; with ``profile``, each of ours per kernel."""
    from tests.onnx import test_quant_models as qm

    from torch_ir.frontends.onnx import import_onnx

    _, model = build_models(name)
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(1, 3, 224, 224, generator=g) for _ in range(3)]
    proto = qm.export_for_quantization(qm._Wrap(model, "logits"), (xs[0],), ["x"])
    path = qm._quantize(Path(tempfile.mkdtemp()), proto, [{"x": x.numpy()} for x in xs[:2]], "static", "uint8")
    ir, weights = import_onnx(path)
    executor, ours, feeds, bound = _program(ir, weights, xs[2], set())
    executor_before, before, feeds_before, bound_before = _program(ir, weights, xs[2], {"qdq_add", "qdq_add_relu"})
    session = ort_session(str(path), threads)
    runners = {"onnxruntime": lambda: session.run(None, {"x": xs[2].numpy()})[0], "ours": ours,
               "ours_without_qadd": before}
    out, theirs = ours(), runners["onnxruntime"]()
    top5 = lambda a: np.argsort(-a[0], kind="stable")[:5].tolist()  # noqa: E731
    native = sum(isinstance(k, (cpu_qconv.QConv, cpu_qconv.QGemm)) and k.native for k in executor.kernels)
    qadds = sum(isinstance(k, cpu_qelementwise.QAdd) and k.native for k in executor.kernels)
    samples = time_in_blocks(runners, runs, warmup=3)
    result = {"native_kernels": native, "native_qadd": qadds, "max_abs_logit_diff": float(np.abs(out - theirs).max()),
              "top5_equal": top5(out) == top5(theirs), "same_as_without_qadd": bool(np.array_equal(out, before()))}
    for runner, ms in samples.items():
        q = statistics.quantiles(ms, n=10)
        result[runner] = {"median_ms": statistics.median(ms), "p10": q[0], "p90": q[-1]}
    ours_ms, pre_ms, ort_ms = result["ours"], result["ours_without_qadd"], result["onnxruntime"]
    print(f"{name} QDQ ({native} native QCONV/QGEMM, {qadds} native QADD): ours {ours_ms['median_ms']:.2f} ms (p10-p90 "
          f"{ours_ms['p10']:.2f}-{ours_ms['p90']:.2f}), without QADD {pre_ms['median_ms']:.2f} ms ({pre_ms['p10']:.2f}-"
          f"{pre_ms['p90']:.2f}), onnxruntime {ort_ms['median_ms']:.2f} ms ({ort_ms['p10']:.2f}-{ort_ms['p90']:.2f}); "
          f"ratio {ours_ms['median_ms'] / ort_ms['median_ms']:.2f}; logits max |diff| "
          f"{result['max_abs_logit_diff']:.3g}, top-5 {'equal' if result['top5_equal'] else 'differ'}, "
          f"{'the same' if result['same_as_without_qadd'] else 'NOT the same'} as without QADD")
    if profile:
        for label, ex, f, b in (("with QADD", executor, feeds, bound),
                                ("without QADD", executor_before, feeds_before, bound_before)):
            prof = ex.profile(f, b, runs=max(5, runs // 3), threads=threads)
            result[f"profile {label}"] = prof.by_kernel()
            print(f"-- {name}, {label}, per kernel\n{prof.table(top=5)}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--models", nargs="*", default=["resnet18", "resnet50"])
    parser.add_argument("--skip-convs", action="store_true")
    parser.add_argument("--skip-models", action="store_true")
    parser.add_argument("--threads", type=int, help="torch's and onnxruntime's intra-op threads (default: torch's)")
    parser.add_argument("--profile", action="store_true", help="also time each model's dispatches, per kernel")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    results: dict = {"threads": threads, "kernel": cpu_qconv.native_status()}
    if not args.skip_convs:
        results["convs"] = per_conv(args.runs, threads)
    if not args.skip_models:
        results["models"] = {name: whole_model(name, args.runs, threads, args.profile) for name in args.models}
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
