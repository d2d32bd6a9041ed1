"""A small stand-in for the toolkit's quantizer, for the report's tests: it makes a quantized IR in QDQ form at the
NPU level from a normalized float IR, as ``npu_compiler.quantize.quantize`` does (weights become int codes read
through DEQUANTIZE; each CONV/GEMM's activation input goes through QUANTIZE -> DEQUANTIZE; the float ops keep their
output names).

Per-tensor symmetric scales of activations from the min/max of a calibration run, per-output-channel symmetric
weight scales from the weights. ``config`` is a dict: ``{"w": 8, "a": 8, "overrides": {pattern: (w, a) | None}}``
(a node-name fnmatch pattern; None keeps the node float). ``broken`` multiplies one QUANTIZE's scale (a deliberate
fault for the jump test).
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torch_ir.executor import IRExecutor
from torch_ir.ir import NPU_IR, OpNode, TensorMeta
from torch_ir.quant import numerics as qn
from torch_ir.quant.spec import QuantSpec

QUANTIZABLE = ("CONV", "GEMM")


def container(bits: int) -> tuple[str, int, int]:
    """The code type holding ``bits``-bit codes and their range: 4-bit codes travel in int8 (a conv kernel's odd
    last dim cannot be packed two per byte), limited to [-8, 7] by QUANTIZE's qmin/qmax."""
    return ("int16" if bits > 8 else "int8"), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def layer_bits(config: Mapping[str, Any], name: str) -> tuple[int, int] | None:
    """(weight bits, activation bits) of node ``name``; None: the node stays float."""
    for pattern, bits in (config.get("overrides") or {}).items():
        if fnmatch.fnmatchcase(name, pattern):
            return None if bits is None else tuple(bits)
    return config.get("w", 8), config.get("a", 8)


def activation_ranges(ir: NPU_IR, weights: Any, calibration: Sequence[Sequence[torch.Tensor]]) -> dict[str, float]:
    """max |x| of every node output and graph input over the calibration inputs."""
    seen: dict[str, float] = {}

    def note(name: str, value: torch.Tensor) -> None:
        if value.is_floating_point():
            seen[name] = max(seen.get(name, 0.0), float(value.detach().abs().max()))

    executor = IRExecutor(ir, weights)
    for inputs in calibration:
        for meta, value in zip(ir.graph_inputs, inputs):
            note(meta.name, value)
        executor.run_traced(list(inputs), lambda node, outs: [note(m.name, o) for m, o in zip(node.outputs, outs)])
    return seen


def _scale_const(ir: NPU_IR, name: str, value: torch.Tensor) -> TensorMeta:
    meta = TensorMeta(name, list(value.shape), "float32", role="constant")
    ir.constants.append(meta)
    ir.constant_values[name] = value.tolist()
    return meta


def _qdq(ir: NPU_IR, nodes: list[OpNode], x: TensorMeta, scale: TensorMeta, bits: int, *, axis: int | None = None,
         codes_name: str) -> TensorMeta:
    """QUANTIZE x -> codes -> DEQUANTIZE; returns the float tensor the consumer reads."""
    dtype, lo, hi = container(bits)
    spec = QuantSpec(dtype, scale=scale.name, axis=axis)
    codes = TensorMeta(codes_name, list(x.shape), dtype, role="activation", quant=spec)
    nodes.append(OpNode(f"{codes_name}.quantize", "QUANTIZE", [x, scale], [codes],
                        {"dtype": dtype, "qmin": lo, "qmax": hi}))
    out = TensorMeta(f"{codes_name}.dq", list(x.shape), "float32", role="activation")
    nodes.append(OpNode(f"{codes_name}.dequantize", "DEQUANTIZE", [codes, scale], [out], {"dtype": dtype}))
    return out


def _weight(ir: NPU_IR, state: dict[str, torch.Tensor], nodes: list[OpNode], w: TensorMeta, bits: int) -> TensorMeta:
    """The weight's codes in the weights file (per output channel), read through a DEQUANTIZE."""
    value = state[w.name].float()
    qmax = 2 ** (bits - 1) - 1
    amax = value.reshape(value.shape[0], -1).abs().amax(dim=1).clamp_min(1e-12)
    scale = _scale_const(ir, f"{w.name}.scale", amax / qmax)
    dtype, lo, hi = container(bits)
    codes = qn.quantize(value, torch.tensor(ir.constant_values[scale.name]), None, dtype=dtype, axis=0, qmin=lo,
                        qmax=hi)
    qmeta = TensorMeta(f"{w.name}.q", list(w.shape), dtype, role="weight",
                       quant=QuantSpec(dtype, scale=scale.name, axis=0))
    ir.weights.append(qmeta)
    state[qmeta.name] = codes
    out = TensorMeta(f"{w.name}.dq", list(w.shape), "float32", role="activation")
    nodes.append(OpNode(f"{w.name}.dequantize", "DEQUANTIZE", [qmeta, scale], [out], {"dtype": dtype, "axis": 0}))
    return out


def qdq_quantize(ir: NPU_IR, weights: Mapping[str, torch.Tensor], config: Mapping[str, Any],
                 calibration: Sequence[Sequence[torch.Tensor]], *, broken: tuple[str, float] | None = None
                 ) -> tuple[NPU_IR, dict[str, torch.Tensor]]:
    """The quantized IR and its weights (keyed by IR weight name); see the module docstring."""
    ranges = activation_ranges(ir, weights, calibration)
    q = copy.deepcopy(ir)
    state = {name: torch.as_tensor(v) for name, v in _by_ir_name(ir, weights).items()}
    # the new weights file is keyed by IR name; a buffer it lacks (rotary inv_freq) keeps its key: rebuilt on load
    q.weight_name_mapping = {n: k for n, k in ir.weight_name_mapping.items() if n not in state}
    nodes: list[OpNode] = []
    for node in q.nodes:
        bits = layer_bits(config, node.name) if node.op_type in QUANTIZABLE else None
        if bits is None:
            nodes.append(node)
            continue
        w_bits, a_bits = bits
        x = node.inputs[0]
        qmax = 2 ** (a_bits - 1) - 1
        factor = broken[1] if broken and broken[0] == node.name else 1.0
        scale = _scale_const(q, f"{x.name}.{node.name}.scale",
                             torch.tensor(max(ranges.get(x.name, 1.0), 1e-12) / qmax * factor))
        node.inputs[0] = _qdq(q, nodes, x, scale, a_bits, codes_name=f"{x.name}.{node.name}.q")
        node.inputs[1] = _weight(q, state, nodes, node.inputs[1], w_bits)
        nodes.append(node)
    q.nodes = nodes
    used = {t.name for n in q.nodes for t in n.inputs}
    q.weights = [w for w in q.weights if w.name in used]
    return q, {w.name: state[w.name] for w in q.weights if w.name in state}


def _by_ir_name(ir: NPU_IR, weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weights keyed by IR name (a state dict is keyed by the model's names)."""
    out = {}
    for w in ir.weights:
        key = ir.weight_name_mapping.get(w.name, w.name)
        if key in weights or w.name in weights:
            out[w.name] = weights[key] if key in weights else weights[w.name]
    return out
