"""An onnxruntime QDQ ResNet-18 (int8, per-channel weights) on the WebGPU backend against its float32 model, and the
int8 program with WGSL's packed dot products against their emulation.

    .venv/bin/python bench/webgpu/int8.py               # 1x3x64x64, 9 rounds
    .venv/bin/python bench/webgpu/int8.py --size 224 --runs 5

A seeded ResNet-18 (transformers, random weights) is exported to ONNX and quantized with ``quantize_static`` (QDQ,
uint8 activations, int8 weights per channel, three calibration images), imported and normalized into
QUANTIZE/QCONV/QGEMM/DEQUANTIZE, compiled strictly for ``webgpu`` (every dispatch on the GPU). The three programs
(float32; int8 with ``dot4I8Packed``; int8 emulated) run alternately, ``--runs`` rounds after one warm-up each;
the median wall time of ``Executor.run`` (one submission and the output's read-back) is printed, and the two int8
outputs are checked equal. On Mesa's lavapipe these say what the software adapter does, not what a GPU would.
"""

from __future__ import annotations

import argparse
import io
import logging
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import npu_compiler
from npu_compiler.passes import normalize
from npu_runtime import Device, Executor, NPUBuffer, load_weights
from npu_runtime.backends.webgpu import gpu as webgpu_gpu
from torch_ir.frontends.onnx import import_onnx


def models(tmp: Path, size: int) -> tuple[Path, Path, np.ndarray]:
    """(float ONNX, QDQ ONNX, an input) of the seeded ResNet-18."""
    from onnxruntime import quantization
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    net = ResNetForImageClassification(ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512],
                                                    depths=[2, 2, 2, 2], layer_type="basic", num_labels=10)).eval()
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(1, 3, size, size, generator=g).numpy() for _ in range(4)]

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x).logits

    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Logits().eval(), (torch.from_numpy(xs[0]),), buffer, input_names=["x"], dynamo=False,
                          opset_version=17)
    (tmp / "float.onnx").write_bytes(buffer.getvalue())

    class Reader(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter([{"x": x} for x in xs[:3]])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    logging.getLogger().setLevel(logging.ERROR)
    quantization.quantize_static(tmp / "float.onnx", tmp / "qdq.onnx", Reader(),
                                 quant_format=quantization.QuantFormat.QDQ, per_channel=True,
                                 activation_type=quantization.QuantType.QUInt8,
                                 weight_type=quantization.QuantType.QInt8)
    return tmp / "float.onnx", tmp / "qdq.onnx", xs[3]


def runner(path: Path, x: np.ndarray, device: Device, packed: bool) -> tuple[Executor, dict, dict, str]:
    ir, weights = import_onnx(path)
    program = npu_compiler.compile(normalize(ir), target="webgpu")
    bound = load_weights({k: v.contiguous() for k, v in weights.items()}, program, device)
    feeds = {spec.name: NPUBuffer.from_numpy(x, device, spec=spec) for spec in program.input_specs}
    webgpu_gpu.USE_PACKED_DOT4 = packed  # read when the executor generates its kernels
    return Executor(program, device), feeds, bound, program.output_specs[0].name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=64, help="image height and width")
    parser.add_argument("--runs", type=int, default=9, help="rounds (each program once per round)")
    args = parser.parse_args()
    device = Device("webgpu")
    print(device.backend.adapter, "- packed dot products:", webgpu_gpu.has_packed_dot4(webgpu_gpu.get_gpu()))
    with tempfile.TemporaryDirectory() as tmp:
        float_path, qdq_path, x = models(Path(tmp), args.size)
        programs = {"float32": runner(float_path, x, device, True),
                    "int8 dot4I8Packed": runner(qdq_path, x, device, True),
                    "int8 emulated": runner(qdq_path, x, device, False)}
    webgpu_gpu.USE_PACKED_DOT4 = True
    times: dict[str, list[float]] = {name: [] for name in programs}
    outs = {}
    for round_ in range(args.runs + 1):  # round 0 warms up
        for name, (executor, feeds, bound, out) in programs.items():
            start = time.perf_counter()
            outs[name] = executor.run(feeds, weights=bound)[out].to_numpy()
            if round_:
                times[name].append(time.perf_counter() - start)
    assert np.array_equal(outs["int8 dot4I8Packed"], outs["int8 emulated"]), "the two int8 paths differ"
    for name, values in times.items():
        print(f"{name:20s} {statistics.median(values) * 1e3:8.1f} ms median of {len(values)}")


if __name__ == "__main__":
    main()
