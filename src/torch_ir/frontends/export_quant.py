"""PT2E quantized programs: PyTorch's ``quantized_decomposed`` ops as the IR's ``QUANTIZE`` and ``DEQUANTIZE``.

``convert_pt2e`` (torchao) leaves a float graph with quantize/dequantize pairs around each quantized op and the
weights already quantized (int8 buffers read by ``dequantize_per_channel``). Extraction maps those ops to the NPU
ops, so the IR never names ``quantized_decomposed`` (a namespace an IR file may not run, see
``torch_ir.ops.registry``), and gives every quantized tensor (a QUANTIZE output, a DEQUANTIZE input, the int8
weight buffers) a :class:`~torch_ir.quant.QuantSpec`.

PyTorch's arithmetic is what the IR computes (``torch/ao/quantization/fx/_decomposed.py``):

* quantize: ``clamp(round(x * (1.0 / scale)) + zero_point, quant_min, quant_max)``: ``method="multiply_inverse"``,
  with ``qmin``/``qmax`` where quant_min/quant_max are narrower than the type (symmetric int8 weights are
  [-127, 127]). A Python-float scale is a double; it becomes a float64 constant so that QUANTIZE takes the same
  inverse (1/scale in double, rounded to float32 by the multiply), and the spec keeps it exactly.
* dequantize: ``(q - zero_point) * scale`` in float32; per-channel zero points stay int64 tensors (their values are
  small integers, exact in float32 and int32).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from ..errors import ExtractionError, IRValidationError
from ..ir import OpNode, Provenance, TensorMeta
from ..ops.values import dtype_name
from ..quant.spec import QTYPES, QuantSpec, check_spec
from .export_nodes import bind_args, module_path, op_type

if TYPE_CHECKING:
    from .export_convert import ProgramConverter

#: The ops mapped, by op type: matched by name, since ``torch.ops.quantized_decomposed`` only exists once
#: ``torch.ao.quantization`` (or torchao) has been imported, which a program holding these ops implies.
QUANTIZE_OPS = frozenset({"quantized_decomposed.quantize_per_tensor.default",
                          "quantized_decomposed.quantize_per_tensor.tensor",
                          "quantized_decomposed.quantize_per_channel.default"})
DEQUANTIZE_OPS = frozenset({"quantized_decomposed.dequantize_per_tensor.default",
                            "quantized_decomposed.dequantize_per_tensor.tensor",
                            "quantized_decomposed.dequantize_per_channel.default"})


_CHOOSE_QPARAMS = "quantized_decomposed.choose_qparams.tensor"


def is_quant_target(target: Any) -> bool:
    """Whether ``target`` is a ``quantized_decomposed`` op, which :func:`quant_node` maps (or refuses)."""
    return isinstance(target, torch._ops.OpOverload) and op_type(target).startswith("quantized_decomposed.")


def decompose_dynamic_qparams(ep: ExportedProgram) -> ExportedProgram:
    """``ep`` with ``choose_qparams.tensor`` (dynamic quantization: a per-tensor scale and zero point computed
    from the activation at run time) replaced by the ATen ops torch computes it with, so that the IR runs it."""
    targets = {n.target for n in ep.graph.nodes
               if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and op_type(n.target) == _CHOOSE_QPARAMS}
    return ep.run_decompositions(dict.fromkeys(targets, _choose_qparams)) if targets else ep


def _choose_qparams(x: torch.Tensor, qmin: int, qmax: int, eps: float,
                    dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ao.quantization.utils.determine_qparams`` for a per-tensor affine scheme, op for op, without its
    data-dependent checks (which cannot be traced; an empty input is the only case they change)."""
    min_val, max_val = torch.aminmax(x)
    min_neg = torch.min(min_val, torch.zeros_like(min_val))
    max_pos = torch.max(max_val, torch.zeros_like(max_val))
    scale = (max_pos - min_neg) / float(qmax - qmin)
    scale = torch.max(scale, torch.full([1], eps, dtype=torch.float32, device=x.device))  # torch.Tensor([eps])
    zero_point = torch.clamp(qmin - torch.round(min_neg / scale).to(torch.int), qmin, qmax)
    return scale.to(torch.double), zero_point.to(torch.int64)


def quant_node(conv: ProgramConverter, node: Node, target: torch._ops.OpOverload) -> OpNode:
    """The QUANTIZE or DEQUANTIZE node of one ``quantized_decomposed`` call, with the quantized tensor's spec."""
    where = f"node {node.name!r} ({op_type(target)})"
    if op_type(target) not in QUANTIZE_OPS | DEQUANTIZE_OPS:
        raise ExtractionError(
            f"{where}: extraction maps quantize_per_tensor, quantize_per_channel, their dequantize ops and "
            f"choose_qparams.tensor, not this one; an IR may not name quantized_decomposed ops (they are not "
            "reviewed to run from a file). Fix: quantize per tensor or per channel (static, or dynamic with "
            "choose_qparams.tensor)")
    args = bind_args(target, node)
    quantize = op_type(target) in QUANTIZE_OPS
    dtype = _qdtype(args["dtype"], where)
    x = conv.metas[conv._resolve(args["input"])]
    inputs = [x]
    scale = _param(conv, node, args.get("scale", args.get("scales")), "scale", "float64", inputs)
    zero_point = _param(conv, node, args.get("zero_point", args.get("zero_points")), "zero_point", "int64", inputs)
    axis = args.get("axis")
    if axis is not None and inputs[1].dtype != "float32":
        # torch computes with per-channel scales in their own type (float64: the product and its rounding in
        # float64); QUANTIZE/DEQUANTIZE compute in float32 as every quantizer's float32 scales do.
        raise ExtractionError(f"{where}: its per-channel scales {inputs[1].name!r} are {inputs[1].dtype}; the IR "
                              "computes with float32 scales (as PyTorch does for float32 ones), and would not be "
                              "bit-exact with these. Fix: store the scales as float32")
    spec = QuantSpec(dtype=dtype, scale=scale, zero_point=zero_point, axis=axis, method="multiply_inverse")
    try:
        check_spec(spec, where)
    except IRValidationError as e:
        raise ExtractionError(f"{e}; the quantizer produced parameters the IR cannot hold") from None
    attrs: dict[str, Any] = {"dtype": dtype}
    if axis is not None:
        attrs["axis"] = axis
    if quantize:
        attrs["method"] = "multiply_inverse"
        lo, hi, _ = QTYPES[dtype]
        if args["quant_min"] > lo:
            attrs["qmin"] = args["quant_min"]
        if args["quant_max"] < hi:
            attrs["qmax"] = args["quant_max"]
        out = conv._outputs_of(node, node.meta["val"])
        out[0].quant = spec
    else:
        attrs["out_dtype"] = dtype_name(args.get("out_dtype") or torch.float32)
        if x.quant is None:  # an int8 weight buffer; a QUANTIZE output has its spec already
            x.quant = spec
        out = conv._outputs_of(node, node.meta["val"])
    provenance = Provenance(nodes=[node.name], module=module_path(node), origin=f"torch.export:{op_type(target)}")
    return OpNode(name=node.name, op_type="QUANTIZE" if quantize else "DEQUANTIZE", inputs=inputs, outputs=out,
                  attrs=attrs, provenance=provenance)


#: The code types these ops map with PyTorch's arithmetic kept: an fp8 ``dtype`` would round to integers first
#: (``round(x / scale)`` then the cast), which QUANTIZE's fp8 path does not; int32 codes are clamped in float32.
_INT_CODES = ("int8", "uint8", "int16", "uint16")


def _qdtype(dtype: Any, where: str) -> str:
    name = dtype_name(dtype) if isinstance(dtype, torch.dtype) else str(dtype)
    if name not in _INT_CODES:
        raise ExtractionError(f"{where}: quantized dtype {name} is not one extraction maps bit-exactly "
                              f"({', '.join(_INT_CODES)}); quantize to one of them")
    return name


def _param(conv: ProgramConverter, node: Node, value: Any, what: str, dtype: str,
           inputs: list[TensorMeta]) -> str | float | int | None:
    """A scale or zero point as the spec names it, appending its tensor to ``inputs``: a tensor argument (a
    buffer, an IR weight) by its name; a Python number as a 0-d constant of the IR holding it exactly."""
    if value is None:
        return None
    if isinstance(value, Node):
        meta = conv.metas[conv._resolve(value)]
        inputs.append(meta)
        return meta.name
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ExtractionError(f"node {node.name!r}: its {what} is {value!r}, not a number or a tensor; a symbolic "
                              "quantization parameter cannot be extracted")
    meta = TensorMeta(name=f"{node.name}_{what}", shape=[], dtype=dtype, role="constant")
    conv.ir.constants.append(meta)
    conv.ir.constant_values[meta.name] = float(value) if dtype == "float64" else int(value)
    inputs.append(meta)
    return float(value) if dtype == "float64" else int(value)
