"""ONNX files for the benchmarks and the QDQ tests: a float export onnxruntime's quantizer accepts, and its QDQ model.

``export_for_quantization`` exports with the TorchScript exporter (opset 17) and gives every Identity of an
initializer an initializer of its own (the quantizer quantizes a bias only when it is an initializer);
``quantize_qdq`` makes the per-channel QDQ model of ``onnxruntime.quantization.quantize_static`` from calibration
feeds. ``tests/onnx/test_quant_models.py`` and ``bench/runtime/precision.py`` make their int8 models this way.
"""

from __future__ import annotations

import io
import logging
import platform
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch


def initializers_for_identities(model: onnx.ModelProto) -> onnx.ModelProto:
    """The exporter shares equal constants through Identity nodes; the quantizer quantizes a bias only when it is
    an initializer, so each Identity of an initializer becomes an initializer of its own."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    for node in [n for n in graph.node if n.op_type == "Identity" and n.input[0] in inits]:
        copy = onnx.TensorProto()
        copy.CopyFrom(inits[node.input[0]])
        copy.name = node.output[0]
        graph.initializer.append(copy)
        graph.node.remove(node)
    return model


def export_for_quantization(model: torch.nn.Module, args: tuple, names: list[str]) -> onnx.ModelProto:
    """``model`` exported (TorchScript exporter, opset 17, inputs named ``names``), ready for the quantizer."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on every traced branch
        torch.onnx.export(model, args, buffer, input_names=names, dynamo=False, opset_version=17)
    return initializers_for_identities(onnx.load_from_string(buffer.getvalue()))


def calibration_reader(feeds: Sequence[dict[str, np.ndarray]]) -> Any:
    """An ``onnxruntime.quantization.CalibrationDataReader`` that hands out ``feeds`` once each."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    return Reader()


def quantize_qdq(float_path: Path, path: Path, calibration: Sequence[dict[str, np.ndarray]],
                 activation: str = "uint8", weights: str = "int8") -> Path:
    """The QDQ model of ``quantize_static``: per-channel weights (``weights``: int8 or int4), ``activation``
    (uint8 or int8) activations calibrated on ``calibration`` (MinMax), written to ``path``."""
    from onnxruntime import quantization

    types = {"uint8": quantization.QuantType.QUInt8, "int8": quantization.QuantType.QInt8,
             "int4": quantization.QuantType.QInt4}
    logging.getLogger().setLevel(logging.ERROR)  # the quantizer's advice on pre-processing
    quantization.quantize_static(float_path, path, calibration_reader(calibration),
                                 quant_format=quantization.QuantFormat.QDQ, per_channel=True,
                                 activation_type=types[activation], weight_type=types[weights])
    return path


def output_scale(model: onnx.ModelProto, name: str) -> float | None:
    """The scale of the DequantizeLinear that makes graph output ``name`` (None: a float op makes it): one
    quantization step of that output, the unit two integer implementations of the model may differ by."""
    node = next(n for n in model.graph.node if name in n.output)
    if node.op_type != "DequantizeLinear":
        return None
    init = next(t for t in model.graph.initializer if t.name == node.input[1])
    return float(onnx.numpy_helper.to_array(init).reshape(-1)[0])


def output_step(path: Path) -> float | None:
    """``output_scale`` of the first output of the ONNX file at ``path``."""
    model = onnx.load(str(path), load_external_data=False)
    return output_scale(model, model.graph.output[0].name)


def ort_int8_saturates() -> bool:
    """Whether onnxruntime's fused QDQ kernels here are its x86 u8s8 ones without VNNI, which sum pairs of u8·s8
    products in int16 with saturation (``vpmaddubsw``): then its int8 result drifts from the QDQ file's arithmetic
    (the quick BERT on a Zen 3: cos 0.985 against fp32 where ours, and onnxruntime with its graph optimizations off,
    give 0.99967, equal to each other within 5e-8). From ``/proc/cpuinfo``; False where it cannot tell."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        flags = set(Path("/proc/cpuinfo").read_text(encoding="utf-8").split())
    except OSError:
        return False
    return "avx2" in flags and not flags & {"avx512_vnni", "avx_vnni", "amx_int8"}
