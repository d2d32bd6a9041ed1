"""One dispatch costed (see ``model``'s docstring): its FLOPs, array mapping and traffic from its kernel
record, its work on the MAC array or the vector unit, DRAM bytes and cycles."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from npu_program.array_mapping import ArrayMapping, Gemm
from npu_program.cost_formulas import whole
from npu_program.kernels import KERNELS, KernelDef, get_kernel
from npu_program.program import Dispatch, TensorSpec

from .array import _rate, _tile, _vector_cycles, gemm_on_array
from .costs import CostModelError, DispatchCost
from .hardware import MAC_DTYPES, Hardware
from .precision import (
    AS_COMPILED,
    CLASS_DTYPE,
    QUANT_KERNELS,
    RATE_CLASS,
    Precision,
    Sizer,
    quantized_width,
    weight_sizer,
)

ACC_BYTES = 4  # int32 / fp32 accumulators

#: Kernel kind -> vector op class (SOFTMAX is special-cased to "softmax").
VECTOR_CLASS = {"elementwise": "elementwise", "normalization": "normalization", "reduction": "reduction",
                "pooling": "reduction", "resampling": "elementwise", "sorting": "reduction",
                "movement": "movement", "fused": "elementwise", "attention": "softmax"}
#: Kinds whose vector work is counted over the first input's elements (else over the outputs').
INPUT_COUNTED = frozenset({"normalization", "reduction", "pooling"})


def _numel(t: TensorSpec) -> int:
    return math.prod(int(d) for d in t.shape)


@dataclass(frozen=True)
class Bits:
    """How a program is costed (``precision`` module): a ``precision``, else a ``dtype`` override (a rate class),
    else as compiled; ``params``: the weight and constant tensors (the weight bytes of the reports)."""

    override: str | None
    precision: Precision | None
    params: frozenset[str]


def _cost_dispatch(index: int, d: Dispatch, ins: Sequence[TensorSpec], outs: Sequence[TensorSpec], hw: Hardware,
                   bits: Bits, weights: set[str], layer: str) -> DispatchCost:
    record = KERNELS.get(d.kernel) or get_kernel(d.kernel)
    flops = _flops(record, d, ins, outs)
    mapping = _mapping(record, d, ins, outs, weights)
    on_array = mapping.gemms is not None or record.kind == "contraction"
    cls, operands, size, strict = _bits(d, ins, outs, bits, mapping if on_array else None, weights)
    reads, writes = _traffic(record, d, ins, outs)
    written = sum(size(t, n) for t, n in zip(outs, writes))
    if on_array:
        work = _on_array(hw, d, _checked(hw, d, cls, strict), flops, mapping, ins, reads, written, size)
    else:
        work = _on_vector(hw, d, record.kind, cls, ins, reads, writes, written, size)
    slots = [(i, t) for i, t in enumerate(ins) if t.name in bits.params]
    work.weight_read = sum(size(t, reads[i]) * (_times(i, mapping, work) if on_array else 1) for i, t in slots)
    compute = work.array_cycles + work.vector_cycles
    dram = work.read + written
    memory = math.ceil(dram / hw.dram_bytes_per_cycle) + hw.dram_latency_cycles if dram else 0
    total = max(compute, memory) if hw.dma_overlaps_compute else compute + memory
    return DispatchCost(
        index=index, name=d.node, kernel=d.kernel, kind=record.kind, layer=layer, dtype=work.cls or "int8",
        macs=work.macs, flops=flops, mapping=work.mapping, folds=work.folds, array_cycles=work.array_cycles,
        vector_cycles=work.vector_cycles, compute_cycles=compute, memory_cycles=memory, cycles=total,
        utilization=work.util, tiling=work.tiling, weight_reads=work.w_reads, activation_reads=work.a_reads,
        dram_bytes_read=work.read, dram_bytes_written=written, sram_bytes=work.sram,
        bound="compute" if compute >= memory else "memory", flags=tuple(work.flags),
        sram_reads=work.sram_reads, sram_writes=work.sram_writes, operands=operands,
        weight_bytes=work.weight_read, weight_sizes=tuple((t.name, size(t, _numel(t))) for _, t in slots))


_FLOAT_CLASSES = frozenset({"fp32", "fp16", "bf16"})


def _bits(d: Dispatch, ins: Sequence[TensorSpec], outs: Sequence[TensorSpec], bits: Bits,
          mapping: ArrayMapping | _Unmapped | None, weights: set[str]) -> tuple[str | None, str, Sizer, bool]:
    """(the rate class ``d`` computes in, its operands for the reports, the sizes of its tensors, whether a width
    without a rate is refused rather than flagged): see the ``precision`` module."""
    if d.kernel in QUANT_KERNELS:
        cls, operands = quantized_width(d, ins, outs)
        # integer (and fp8) work is refused where the part lacks its rate; a DQGEMM's float compute is float work,
        # flagged and costed at the slowest rate the part has, as every float dispatch is
        return cls, operands, AS_COMPILED, cls not in _FLOAT_CLASSES
    p = bits.precision
    if p is not None:
        if mapping is None:  # vector work: the activations' width
            return RATE_CLASS[p.activations], p.activations, Sizer(p.activations), False
        k = mapping.gemms[0][3] if mapping.gemms else None
        # a float precision (fp32, fp16, bf16) is float work: flagged, not refused, where the part lacks its rate
        return p.compute, p.operands, weight_sizer(p, ins, mapping.weight_inputs, k, weights), p.weights is not None
    if bits.override is not None:
        return bits.override, CLASS_DTYPE[bits.override], Sizer(CLASS_DTYPE[bits.override]), False
    first = outs[0] if outs else (ins[0] if ins else None)
    if first is None:
        return None, "", AS_COMPILED, False
    if (d.params or {}).get("x_int8_group") is not None:  # int8 activations x block weights' codes
        return "int8", f"int8 x {first.dtype} blocks", AS_COMPILED, True
    return RATE_CLASS.get(first.dtype), first.dtype, AS_COMPILED, False


def _checked(hw: Hardware, d: Dispatch, cls: str | None, strict: bool) -> str | None:
    """``cls``, refused when ``strict`` (quantized work) and ``hw`` has no rate for it."""
    if strict and not hw.mac_rate(cls or ""):
        raise CostModelError(
            f"{hw.described_in}: dispatch {d.node!r} ({d.kernel}) computes in {cls}, but {hw.rate_origin(cls or '?')}"
            f" is 0 (unsupported); fix: give macs_per_cycle.{cls} a rate above 0 in the hardware file, or cost the "
            "program at a precision the hardware runs")
    return cls


def _times(i: int, mapping: ArrayMapping | _Unmapped, work: _Work) -> int:
    """How often a contraction reads its input ``i`` from DRAM under its tiling."""
    return work.w_reads if i in mapping.weight_inputs else work.a_reads if i in mapping.activation_inputs else 1


@dataclass
class _Work:
    """A dispatch's work on the array or the vector unit, and the DRAM bytes it reads (see ``model``'s docstring)."""

    cls: str | None
    mapping: str
    read: int
    sram: int
    tiling: str = "stream"
    w_reads: int = 0
    a_reads: int = 1
    macs: int = 0
    folds: int = 0
    array_cycles: int = 0
    vector_cycles: int = 0
    util: float = 0.0
    sram_reads: int = 0
    sram_writes: int = 0
    weight_read: int = 0
    flags: list[str] = field(default_factory=list)


def _flops(record: KernelDef, d: Dispatch, ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]) -> int:
    """The record's FLOP formula; one per output element when it cannot read the parameters."""
    try:
        return record.flops(ins, outs, d.params)
    except (IndexError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return sum(_numel(t) for t in outs)


def _on_array(hw: Hardware, d: Dispatch, cls: str | None, flops: int, mapping: ArrayMapping | _Unmapped,
              ins: Sequence[TensorSpec], reads: Sequence[int], written: int, size: Sizer) -> _Work:
    """A contraction on the MAC array: its GEMMs (or the peak rate without a mapping), the softmax its vector unit
    adds, and the DRAM reads of its tiling."""
    rate, flag = _rate(hw, cls)
    flags = [flag] if flag else []
    gemms = mapping.gemms
    if gemms is None:  # a contraction without a mapping: the array's peak rate
        macs = flops // 2
        array_cycles = math.ceil(macs / (hw.pes * rate)) if macs else 0
        work = _Work(cls, "unmapped contraction at peak rate", 0, 0, macs=macs, array_cycles=array_cycles)
        flags.append(f"{d.kernel} has no array mapping: costed at the array's peak rate")
    else:
        work = _gemms_on_array(hw, cls, gemms, rate)
    work.flags = flags
    work.util = work.macs / (work.array_cycles * hw.pes * rate) if work.array_cycles else 0.0
    work.vector_cycles = _vector_cycles(hw, "softmax", mapping.softmax)
    w_idx, a_idx = mapping.weight_inputs, mapping.activation_inputs
    w_bytes = sum(size(ins[i], reads[i]) for i in w_idx)
    a_bytes = sum(size(ins[i], reads[i]) for i in a_idx)
    other = sum(size(t, reads[i]) for i, t in enumerate(ins) if i not in w_idx and i not in a_idx)
    acc = sum(b * m * n for b, m, n, k in gemms or []) * ACC_BYTES or written
    work.tiling, work.w_reads, work.a_reads, work.sram = _tile(hw, w_bytes, a_bytes, acc)
    work.read = w_bytes * work.w_reads + a_bytes * work.a_reads + other
    return work


def _gemms_on_array(hw: Hardware, cls: str | None, gemms: Sequence[Gemm], rate: float) -> _Work:
    """The folds, cycles and SRAM accesses of a mapping's GEMMs under the array's dataflow."""
    runs = [(b, gemm_on_array(hw.rows, hw.cols, hw.dataflow, m, n, k)) for b, m, n, k in gemms]
    text = "gemm " + " + ".join(f"{b}x(M={m} N={n} K={k})" for b, m, n, k in gemms) + f" {hw.dataflow}"
    return _Work(cls, text, 0, 0, macs=sum(b * m * n * k for b, m, n, k in gemms),
                 folds=sum(b * g.folds for b, g in runs),
                 array_cycles=math.ceil(sum(b * g.cycles for b, g in runs) / rate),
                 sram_reads=sum(b * (g.a_reads + g.w_reads) for b, g in runs),
                 sram_writes=sum(b * g.writes for b, g in runs))


def _on_vector(hw: Hardware, d: Dispatch, kind: str, cls: str | None, ins: Sequence[TensorSpec],
               reads: Sequence[int], writes: Sequence[int], written: int, size: Sizer) -> _Work:
    """Any other kernel on the vector unit, streaming its tensors."""
    vclass = "softmax" if d.kernel == "SOFTMAX" else VECTOR_CLASS.get(kind, "elementwise")
    # the elements the unit processes: those it reads of its first input, or those it writes
    elements = reads[0] if kind in INPUT_COUNTED and ins else sum(writes)
    if kind == "sorting" and ins and ins[0].shape:
        n = int(ins[0].shape[-1])
        elements = _numel(ins[0]) * max(1, math.ceil(math.log2(n))) if n > 1 else _numel(ins[0])
    read = sum(size(t, n) for t, n in zip(ins, reads))
    return _Work(cls if cls in MAC_DTYPES else "int8", f"vector {vclass}", read,
                 min(read + written, hw.sram_activations_bytes), vector_cycles=_vector_cycles(hw, vclass, elements))


def _traffic(record: KernelDef, d: Dispatch, ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]
             ) -> tuple[list[int], list[int]]:
    """The elements ``d`` reads of each input and writes of each output, as its kernel record's ``traffic`` formula
    says; a parameter form the formula cannot read costs every tensor whole, as for any other kernel."""
    try:
        reads, writes = record.traffic(ins, outs, d.params)
    except (IndexError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return whole(ins, outs, d.params)
    if len(reads) != len(ins) or len(writes) != len(outs):
        return whole(ins, outs, d.params)
    return reads, writes


@dataclass(frozen=True)
class _Unmapped:
    """A kernel the array does not run as GEMMs: the roles of its inputs only (the weight slots, or else its second
    activation input; its first activation input)."""

    weight_inputs: list[int]
    activation_inputs: list[int]
    gemms: None = None
    softmax: int = 0


def _mapping(record: KernelDef, d: Dispatch, ins: Sequence[TensorSpec], outs: Sequence[TensorSpec],
             weights: set[str]) -> ArrayMapping | _Unmapped:
    """The kernel record's array mapping of ``d`` (``KernelDef.array``), or its input roles alone for a kernel
    without one or shapes its mapping cannot read."""
    w_idx = [i for i, n in enumerate(d.inputs) if n in weights]
    act = [i for i in range(len(ins)) if i not in w_idx]
    unmapped = _Unmapped(w_idx or act[1:2], act[:1])
    if record.array is None:
        return unmapped
    try:
        return record.array(ins, outs, d.params, w_idx)
    except (IndexError, ZeroDivisionError):
        return unmapped
