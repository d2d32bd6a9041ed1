"""The bits of a dispatch: the bytes each of its tensors is costed at and the operand width it computes in.

A dispatch's tensors are sized by one of these, the first that applies:

* a quantized dispatch (``QUANT_KERNELS``: QUANTIZE, DEQUANTIZE, QCONV, QGEMM, DQGEMM, QADD, QMUL, QMAXPOOL, QLUT)
  as compiled: a program's quantized tensor holds its quantization spec's type (``TensorMeta.quant``; the IR checks the
  two agree on load), so its dtype gives its bytes, 4-bit codes packed two per byte (``torch_ir.dtypes.nbytes``), and
  its scales and zero points are tensors of their own among the dispatch's inputs (weights or constants), counted as
  they are.
  Neither ``precision`` nor ``dtype`` changes such a dispatch;
* ``precision`` (``PRECISIONS``: ``w8a8``, ``w4a16``, ...): a float program costed as if quantized, by role. The
  weight operand of a contraction (its weight-slot W inputs: a GEMM's or CONV's weight) takes the weight width plus
  its scales (one per output channel, or one per ``group_size`` elements of K per output channel, a partial last
  group counted whole, at ``scale_dtype``; symmetric: no zero points); under integer compute a contraction's other
  weight-slot inputs (bias, folded batch-norm statistics) are int32 or int64 accumulator-type values; every other
  floating tensor (activations, norm weights, embedding tables) takes the activation width. An activation's scale
  is a constant of its spec, not a tensor: no bytes;
* ``dtype``: every floating tensor resized to that one type (the older override);
* else each tensor's own dtype.

A weight held in GGUF blocks (``QuantSpec.block``: an LLM from a GGUF file) is always its blocks' bytes, 32 weights
in 34 bytes for q8_0 and so on, under any of these. A contraction whose ``x_int8_group`` rounds its activations to
int8 (llama.cpp's dot products over blocks) computes at the int8 rate, as compiled.

The width a dispatch computes in (``DispatchCost.dtype``, the rate of ``Hardware.mac_rate``): QCONV and QGEMM
multiply their operands' integer codes, at the wider operand's rate (int8 x int8: int8; int16 activations x int8 or
int4 weights: int16; int8 x int4: int8); DQGEMM dequantizes its weights inside and multiplies in its activations'
float type (fp16 for float16 activations), reading the packed codes; a contraction under ``precision`` computes
at the precision's width; any other dispatch at its first output's dtype (or ``dtype``'s). Quantized work (a
quantized dispatch, a contraction under a quantized precision) at a width the hardware has no rate for is refused
(``CostModelError`` naming the hardware file and the width); float work (``fp32``, ``fp16``, ``bf16``, ``dtype``,
as compiled) is costed at the slowest supported rate and flagged, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from npu_program.program import Dispatch, TensorSpec, block_of
from torch_ir.dtypes import nbytes as dtype_nbytes
from torch_ir.quant.spec import BLOCK_BYTES, BLOCKS

#: The quantized NPU ops (``torch_ir.ops.npu_quant``): costed from their tensors' own types, always.
QUANT_KERNELS = frozenset({"QUANTIZE", "DEQUANTIZE", "QCONV", "QGEMM", "DQGEMM", "QADD", "QMUL", "QMAXPOOL",
                           "QLUT"})
#: Those that multiply integer codes (the others: DQGEMM computes in float, (DE)QUANTIZE, QADD, QMUL, QMAXPOOL and
#: QLUT on the vector unit).
INTEGER_KERNELS = frozenset({"QCONV", "QGEMM"})
#: IR dtype name -> MAC rate class of ``Hardware.mac_rate``.
RATE_CLASS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int8": "int8", "uint8": "int8",
              "int16": "int16", "uint16": "int16", "int4": "int4", "uint4": "int4", "float8_e4m3fn": "fp8",
              "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8"}
#: MAC rate class -> the IR dtype whose size a ``dtype`` override gives floating tensors.
CLASS_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "int8", "int4": "int4",
               "int16": "int16", "fp8": "float8_e4m3fn"}
FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
_INT_BITS = {"int4": 4, "uint4": 4, "int8": 8, "uint8": 8, "int16": 16, "uint16": 16}


@dataclass(frozen=True)
class Precision:
    """A float program costed as if quantized (module docstring): the widths by role."""

    name: str
    activations: str  # the IR dtype every floating activation is costed as
    compute: str  # the rate class contractions run at
    weights: str | None = None  # a contraction's weight operand (None: as the activations)
    group_size: int | None = None  # one weight scale per group of K (None: one per output channel)
    scale_dtype: str = "float32"
    params: str | None = None  # a contraction's other weight-slot inputs under integer compute (None: activations)
    doc: str = ""

    @property
    def operands(self) -> str:
        """The operand types of a contraction, for the reports: ``int8 x int4 g128``."""
        if self.weights is None:
            return f"{self.activations} x {self.activations}"
        group = f" g{self.group_size}" if self.group_size else " per-channel"
        return f"{self.activations} x {self.weights}{group}"


def _p(name: str, acts: str, compute: str, weights: str | None = None, group: int | None = None,
       scale: str = "float32", params: str | None = None, doc: str = "") -> Precision:
    return Precision(name, acts, compute, weights, group, scale, params, doc)


#: The precisions ``cost_program(precision=...)`` knows.
PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    _p("fp32", "float32", "fp32", doc="every tensor float32"),
    _p("fp16", "float16", "fp16", doc="every tensor float16"),
    _p("bf16", "bfloat16", "bf16", doc="every tensor bfloat16"),
    _p("w8a8", "int8", "int8", "int8", params="int32",
       doc="int8 weights (per-channel float32 scales) x int8 activations, int32 bias: QCONV/QGEMM at the int8 rate"),
    _p("w4a8", "int8", "int8", "int4", params="int32",
       doc="int4 weights (per-channel float32 scales) x int8 activations: QGEMM at the int8 rate (the wider)"),
    _p("w8a16", "float16", "fp16", "int8", scale="float16",
       doc="weight-only int8 (per-channel float16 scales), float16 activations: DQGEMM at the fp16 rate"),
    _p("w4a16", "float16", "fp16", "int4", 128, "float16",
       doc="weight-only int4, groups of 128 along K with float16 scales, float16 activations: DQGEMM at fp16"),
    _p("w8a16_int", "int16", "int16", "int8", params="int64",
       doc="int8 weights x int16 activations (TFLite's 16x8), int64 bias: QCONV/QGEMM at the int16 rate"),
)}


@dataclass(frozen=True)
class _WeightCodes:
    """A weight tensor costed as quantized codes: their dtype, the reduction length K of one output channel and the
    group size (None: one scale per channel), and the bytes of one scale."""

    dtype: str
    k: int
    group_size: int | None
    scale_bytes: int

    def nbytes(self, elements: int) -> int:
        channels = -(-elements // self.k)
        groups = 1 if self.group_size is None else -(-self.k // self.group_size)
        return dtype_nbytes(elements, self.dtype) + channels * groups * self.scale_bytes


@dataclass(frozen=True)
class Sizer:
    """Bytes of some elements of a tensor of one dispatch (module docstring): ``floats`` resizes every floating
    tensor (None: each keeps its own type), ``codes`` sizes the named weights as quantized codes and ``retyped``
    gives the named tensors another dtype."""

    floats: str | None = None
    codes: dict[str, _WeightCodes] = field(default_factory=dict)
    retyped: dict[str, str] = field(default_factory=dict)

    def __call__(self, t: TensorSpec, elements: int) -> int:
        if block_of(t) is not None:  # GGUF blocks: already quantized, always their stored bytes
            return -(-elements // BLOCKS[t.quant.block]) * BLOCK_BYTES[t.quant.block]
        if t.dtype in FLOAT_DTYPES:
            if t.name in self.codes:
                return self.codes[t.name].nbytes(elements)
            if t.name in self.retyped:
                return dtype_nbytes(elements, self.retyped[t.name])
            if self.floats is not None:
                return dtype_nbytes(elements, self.floats)
        return dtype_nbytes(elements, t.dtype)


AS_COMPILED = Sizer()


def weight_sizer(precision: Precision, ins: Sequence[TensorSpec], w_idx: Sequence[int], k: int | None,
                 weights: set[str]) -> Sizer:
    """The sizes of a contraction's tensors under ``precision``: its weight-slot W inputs (``w_idx``) as codes over
    a reduction of ``k`` (None: each weight's last dim), its other weight-slot inputs as ``precision.params``."""
    codes: dict[str, _WeightCodes] = {}
    if precision.weights is not None:
        scale = dtype_nbytes(1, precision.scale_dtype)
        for i in w_idx:
            t = ins[i]
            if t.name in weights and t.dtype in FLOAT_DTYPES and t.shape:
                codes[t.name] = _WeightCodes(precision.weights, max(1, k or int(t.shape[-1])), precision.group_size,
                                             scale)
    retyped = {}
    if precision.params is not None:
        retyped = {t.name: precision.params for t in ins if t.name in weights and t.name not in codes}
    return Sizer(precision.activations, codes, retyped)


def quantized_width(d: Dispatch, ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]) -> tuple[str | None, str]:
    """(the rate class a quantized dispatch computes in, its operands for the reports): QCONV/QGEMM at the wider
    integer operand, DQGEMM at its activations' float type, (DE)QUANTIZE, QADD, QMUL, QMAXPOOL and QLUT at their
    codes' type (vector work)."""
    params: dict[str, Any] = d.params or {}
    x = ins[0].dtype if ins else ""
    if d.kernel in INTEGER_KERNELS:
        w = str(params.get("w_dtype") or (ins[1].dtype if len(ins) > 1 else x))
        bits = max(_INT_BITS.get(x, 8), _INT_BITS.get(w, 8))
        return f"int{bits}", f"{x} x {w}"
    if d.kernel == "DQGEMM":
        w = str(params.get("w_dtype") or (ins[1].dtype if len(ins) > 1 else "int8"))
        group = params.get("group_size")
        return RATE_CLASS.get(x), f"{x} x {w}" + (f" g{group}" if group else "") + f" (dequantized to {x})"
    codes = str(params.get("dtype") or (outs[0].dtype if d.kernel == "QUANTIZE" and outs else x))
    return RATE_CLASS.get(codes, "int8"), codes


def resolve_precision(precision: str | None) -> Precision | None:
    """The ``Precision`` named ``precision`` (None: none); a ValueError listing the known ones for another."""
    if precision is None:
        return None
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one the cost model knows; fix: give one of "
                         f"{', '.join(PRECISIONS)} (or None to cost each tensor at its own dtype)")
    return PRECISIONS[precision]


__all__ = ["AS_COMPILED", "CLASS_DTYPE", "FLOAT_DTYPES", "INTEGER_KERNELS", "PRECISIONS", "QUANT_KERNELS",
           "RATE_CLASS", "Precision", "Sizer", "quantized_width", "resolve_precision", "weight_sizer"]
