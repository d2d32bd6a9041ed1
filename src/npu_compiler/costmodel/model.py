"""The NPU cost model: cycles, DRAM traffic and utilization of every dispatch of a compiled program.

``cost_program(program, hw)`` walks the dispatches once, in pure Python arithmetic on tensor shapes (no torch),
and returns a :class:`CostReport`. It is an analytical first-order model in the spirit of SCALE-Sim (array
mapping) and Arm Vela's performance estimate (per-layer cycles, DRAM traffic, bound); every assumption is here:

Work and dtype
  * MACs are counted from the mapping below (exact multiply-accumulates of the contractions); FLOPs come from
    the kernel table's formula (``npu_program.kernels``), which also counts epilogues and softmax.
  * The dtype of a dispatch is ``cost_program``'s ``dtype`` argument when given (every floating tensor is then
    resized to it: ``dtype="int8"`` costs a float program as if quantized), else its first output's dtype.
    float32/float16/bfloat16/int8/uint8 map to the rates fp32/fp16/bf16/int8. A dtype whose rate is 0 (or that
    has none, e.g. int64) is costed at the slowest supported rate and the row is flagged.

Contractions on the MAC array (rows R x cols C PEs, rate m MACs per PE per cycle)
  * Each kernel record names its mapping (``KernelDef.array``, ``npu_program.array_mapping``).
    GEMM: M = output rows (all leading dims), N = output features, K = reduction dim. CONV (with or without its
    residual add) is an implicit GEMM: M = N_batch * H_out * W_out, N = C_out / groups,
    K = C_in / groups * kh * kw, one GEMM per group. QKV_PROJ is one GEMM with N = the sum of the q, k and v
    widths; GATE_UP one with N = 2 * ffn width;
    matmul/mm/bmm/baddbmm batched GEMMs (a 2-D right operand is shared, so the batch folds into M);
    ATTN_SCORE is q·kᵀ (M = T, N = S, K = D per batch-head), ATTN_OUTPUT p·v (M = T, N = D, K = S);
    ATTENTION is both, and its score matrix stays on chip (flash-attention style: no DRAM traffic for it).
  * Dataflow (SCALE-Sim's mapping, cross-checked against it in ``bench/cost``): output-stationary pins an
    M x N tile on R x C and streams K: folds = ceil(M/R) * ceil(N/C), fold = K + R + C - 2 cycles (the
    stream plus the systolic fill and drain skew). Weight-stationary pins a K x N tile and streams M:
    folds = ceil(K/R) * ceil(N/C), fold = M + 2R + C - 2 (the R cycles of loading the weights into the
    array come first). Input-stationary pins a K x M tile and streams N: folds = ceil(K/R) * ceil(M/C),
    fold = N + 2R + C - 2 (loading the inputs likewise). Folds run one after another, never overlapped.
  * array cycles = ceil(batch * folds * fold cycles / m); utilization = MACs / (array cycles * R * C * m).
  * SRAM traffic of the array, in elements (words), as the array's edges read and write it: the operand
    that streams is re-read once per fold along the other pinned dimension, the pinned one read once per
    fold. Output-stationary: A reads M*K*ceil(N/C), W reads K*N*ceil(M/R), writes M*N. Weight-stationary:
    A reads M*K*ceil(N/C), W reads K*N, writes M*N*ceil(K/R) (every K fold writes its partial sums).
    Input-stationary: A reads M*K, W reads K*N*ceil(M/C), writes M*N*ceil(K/R). Counted in elements
    because partial sums are wider than operands (``sram_reads``, ``sram_writes``).
  * Epilogues (bias, folded batch norm, activation, residual add, the silu gate) are fused into the array's
    output path at no cycles. The softmax of ATTN_SCORE/ATTENTION runs on the vector unit after the array
    (added to its cycles). Contractions without a mapping (einsum, conv_transpose2d) are costed at the array's
    peak rate (utilization 1) and flagged.
  * Partial sums never spill: the K loop is innermost and the accumulators hold every live partial sum.

Vector unit (every other NPU kernel): cycles = ceil(elements / (lanes * ops_per_cycle[class])), with elements
  = the elements it writes (elementwise, resampling, movement: a KV_UPDATE moves only its new rows), or those it
  reads of its first input (normalization, reduction, pooling);
  SOFTMAX uses the softmax class; sorting (topk, sort) is n * ceil(log2 n) reduction-class operations per row.
  Vector rates do not depend on the dtype.

Memory and tiling
  * Every dispatch reads its inputs from DRAM and writes its outputs to DRAM (no on-chip residency of
    activations between dispatches: pessimistic for large-SRAM parts, as a layer-by-layer schedule is), as
    much of each as its kernel record's ``traffic`` formula says it touches (``npu_program.kernels``): every
    tensor whole by default; a gather or slice (EMBEDDING, index, index_select, gather, slice, select) the
    elements it copies out, not its whole source; KV_UPDATE the new rows only, read and written in place;
    copy not the tensor it overwrites; a convolution the input rows and columns its windows touch (a strided
    1 x 1 convolution skips three quarters of its input; the DMA fetches what the array uses, as SCALE-Sim
    counts it). A view of a contiguous tensor is no dispatch (an alias in the memory plan): no bytes.
  * A KV cache is read at its live length: with ``context`` (the positions live in the run costed, known only
    at run time from ``cache_position``), an attention kernel reading a cache's state slot (ATTENTION,
    ATTN_SCORE, ATTN_OUTPUT) is costed as if its k and v held only those rows and its mask and scores only
    those columns (bytes, MACs and softmax alike); a run's own tokens are always live. Without ``context``,
    the whole cache: the slowest run.
  * A contraction's operands are the weight role W (its weight-slot inputs, or its second operand when it has
    none: the k/v of attention, the right operand of matmul), the activation role A (its first activation
    input) and the rest (biases, batch-norm statistics, residuals: read once). If W and A both fit in SRAM
    (split: W in the weight buffer and A in the activation buffer; shared: W + A in the one buffer) each is
    read once ("resident"). Otherwise the cheaper of two loop orders is chosen: keep weights (W read once in
    blocks of the weight buffer, A re-read once per block: ceil(W / Sw) times) or keep activations (A read
    once in blocks, W re-read ceil(A / Sa) times). A shared SRAM gives each role half of itself for blocking.
  * SRAM bytes of a dispatch = its on-chip working set: min(W, Sw) + min(A, Sa) + min(output accumulators at
    4 bytes per element, Sacc) (shared: capped at the one size); a vector kernel's is min(inputs + outputs, Sa).
  * memory cycles = ceil(DRAM bytes / (bandwidth / clock)) + DRAM latency in cycles (once per dispatch).
  * total = max(compute, memory) when DMA overlaps compute, else compute + memory; bound = "compute" when
    compute >= memory, else "memory".

Program
  * Host dispatches (``Dispatch.host`` set) run on the CPU: listed apart (``CostReport.host``) with no NPU cycles.
  * Bind-time dispatches (``Dispatch.at_bind``) run once when the weights are bound: costed but listed apart
    (``CostReport.bind``), not in the per-inference totals.
  * Dispatches run one after another (no overlap between dispatches); latency = total cycles / clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from npu_program.array_mapping import ArrayMapping, Gemm
from npu_program.cost_formulas import whole
from npu_program.kernels import KERNELS, KernelDef, get_kernel
from npu_program.program import CompiledProgram, Dispatch, TensorSpec
from torch_ir.dtypes import nbytes as dtype_nbytes
from torch_ir.errors import TorchIRError
from torch_ir.report.cells import one_line

from .hardware import MAC_DTYPES, Hardware

#: IR dtype name -> MAC rate class of ``Hardware.macs_per_cycle``.
RATE_CLASS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int8": "int8", "uint8": "int8"}
#: MAC rate class -> the IR dtype whose size a ``dtype`` override gives floating tensors.
CLASS_DTYPE = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "int8"}
FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
ACC_BYTES = 4  # int32 / fp32 accumulators

#: Kernel kind -> vector op class (SOFTMAX is special-cased to "softmax").
VECTOR_CLASS = {"elementwise": "elementwise", "normalization": "normalization", "reduction": "reduction",
                "pooling": "reduction", "resampling": "elementwise", "sorting": "reduction",
                "movement": "movement", "fused": "elementwise", "attention": "softmax"}
#: Kinds whose vector work is counted over the first input's elements (else over the outputs').
INPUT_COUNTED = frozenset({"normalization", "reduction", "pooling"})

#: Columns of ``CostReport.to_csv_rows`` (after Arm Vela's per-layer performance report): ``cost.csv`` and the
#: per-dispatch table of ``report.html`` both show exactly these.
CSV_COLUMNS = ("index", "name", "kernel", "layer", "dtype", "macs", "flops", "cycles", "network_pct", "util_pct",
               "dram_bytes", "sram_bytes", "sram_reads", "sram_writes", "bound", "tiling", "mapping", "notes")


class CostModelError(TorchIRError, ValueError):
    """A cost-model argument or program cannot be costed; the message names it and the fix."""


@dataclass(frozen=True)
class DispatchCost:
    """The cost of one NPU dispatch (see the module docstring for how each number is modelled)."""

    index: int
    name: str
    kernel: str
    kind: str
    layer: str
    dtype: str  # MAC rate class used: int8, fp16, bf16 or fp32
    macs: int
    flops: int
    mapping: str  # e.g. "gemm 1x(M=8 N=8 K=16) output_stationary" or "vector elementwise"
    folds: int
    array_cycles: int
    vector_cycles: int
    compute_cycles: int
    memory_cycles: int
    cycles: int
    utilization: float
    tiling: str  # resident | keep weights | keep activations | stream (vector kernels)
    weight_reads: int
    activation_reads: int
    dram_bytes_read: int
    dram_bytes_written: int
    sram_bytes: int
    bound: str
    flags: tuple[str, ...] = ()
    #: Array-side SRAM accesses in elements (words): operand reads and output (partial-sum) writes.
    sram_reads: int = 0
    sram_writes: int = 0

    @property
    def dram_bytes(self) -> int:
        return self.dram_bytes_read + self.dram_bytes_written


@dataclass(frozen=True)
class HostDispatch:
    """A dispatch that runs on the host CPU: no NPU cycles."""

    index: int
    name: str
    kernel: str
    reason: str


@dataclass(frozen=True)
class LayerCost:
    """Dispatches of one module path, summed."""

    layer: str
    dispatches: int
    macs: int
    cycles: int
    dram_bytes: int
    sram_bytes: int


@dataclass
class CostReport:
    """Per-dispatch costs of one program on one NPU, with totals."""

    hardware: Hardware
    model_name: str
    rows: list[DispatchCost]
    host: list[HostDispatch] = field(default_factory=list)
    bind: list[DispatchCost] = field(default_factory=list)
    #: One line on the precision costed at and why, shown under the summary's first line (``torch-ir cost``
    #: sets it: "costed at int8, the hardware's native precision; --dtype to change").
    dtype_note: str = ""
    #: The positions of the program's KV cache (None without one) and the live ones costed (None: all of them).
    cache_length: int | None = None
    context: int | None = None

    @property
    def total_cycles(self) -> int:
        return sum(r.cycles for r in self.rows)

    @property
    def compute_cycles(self) -> int:
        return sum(r.compute_cycles for r in self.rows)

    @property
    def memory_cycles(self) -> int:
        return sum(r.memory_cycles for r in self.rows)

    @property
    def macs(self) -> int:
        return sum(r.macs for r in self.rows)

    @property
    def flops(self) -> int:
        return sum(r.flops for r in self.rows)

    @property
    def latency_ms(self) -> float:
        return self.total_cycles / (self.hardware.clock_mhz * 1e3)

    @property
    def fps(self) -> float:
        return 1000.0 / self.latency_ms if self.latency_ms > 0 else math.inf

    @property
    def utilization(self) -> float:
        """MACs done over MACs the array could have done in the program's total cycles (at each row's rate)."""
        hw = self.hardware
        peak = sum(r.cycles * hw.pes * _rate(hw, r.dtype)[0] for r in self.rows)
        return self.macs / peak if peak else 0.0

    @property
    def dram_bytes(self) -> int:
        return sum(r.dram_bytes for r in self.rows)

    @property
    def peak_sram_bytes(self) -> int:
        return max((r.sram_bytes for r in self.rows), default=0)

    def by_layer(self, depth: int | None = None) -> dict[str, LayerCost]:
        """Dispatches grouped by module path (``DispatchCost.layer``), in program order; ``depth`` keeps only the
        first ``depth`` dotted components (``depth=3``: ``encoder.stages.0``)."""
        groups: dict[str, list[DispatchCost]] = {}
        for r in self.rows:
            key = ".".join(r.layer.split(".")[:depth]) if depth else r.layer
            groups.setdefault(key, []).append(r)
        return {k: LayerCost(k, len(rs), sum(r.macs for r in rs), sum(r.cycles for r in rs),
                             sum(r.dram_bytes for r in rs), max(r.sram_bytes for r in rs)) for k, rs in groups.items()}

    @property
    def context_note(self) -> str:
        """For a program with a KV cache: how many of its positions attention was costed as reading."""
        if self.context is None:
            return f"KV cache: attention reads all {self.cache_length} positions (the whole cache: the slowest run)"
        return f"KV cache: attention reads the {self.context} live positions of {self.cache_length} (the context)"

    def to_csv_rows(self) -> list[dict[str, Any]]:
        """One dict per NPU dispatch with the ``CSV_COLUMNS`` (for ``csv.DictWriter``)."""
        total = self.total_cycles or 1
        return [{"index": r.index, "name": r.name, "kernel": r.kernel, "layer": r.layer, "dtype": r.dtype,
                 "macs": r.macs, "flops": r.flops, "cycles": r.cycles, "network_pct": round(100 * r.cycles / total, 2),
                 "util_pct": round(100 * r.utilization, 2), "dram_bytes": r.dram_bytes, "sram_bytes": r.sram_bytes,
                 "sram_reads": r.sram_reads, "sram_writes": r.sram_writes, "bound": r.bound, "tiling": r.tiling,
                 "mapping": r.mapping, "notes": "; ".join(r.flags)} for r in self.rows]

    def summary(self, top: int = 5) -> str:
        """A few readable lines: totals, the bound mix, the heaviest dispatches, host and bind-time work. Names
        come from the program (untrusted): each line is made one plain line (``plain_line``), so a name cannot
        forge a line or send escape sequences to a terminal."""
        hw = self.hardware
        lines = [
            f"{self.model_name} on {hw.name} ({hw.rows}x{hw.cols} {hw.dataflow}, {hw.clock_mhz:g} MHz, "
            f"{hw.dram_bandwidth_gbps:g} GB/s)",
            *([self.dtype_note] if self.dtype_note else []),
            *([self.context_note] if self.cache_length else []),
            f"dispatches: {len(self.rows)} on the NPU, {len(self.host)} on the host, {len(self.bind)} at bind time",
            f"cycles: {self.total_cycles:,} ({self.latency_ms:.3f} ms, {self.fps:.1f} fps)  "
            f"compute {self.compute_cycles:,}  memory {self.memory_cycles:,}",
            f"MACs: {self.macs:,}  utilization {self.utilization:.1%}  DRAM {self.dram_bytes:,} bytes  "
            f"peak SRAM {self.peak_sram_bytes:,} bytes",
            f"bound: {sum(r.bound == 'compute' for r in self.rows)} compute, "
            f"{sum(r.bound == 'memory' for r in self.rows)} memory",
        ]
        heavy = sorted(self.rows, key=lambda r: -r.cycles)[:top]
        if heavy:
            lines.append("heaviest dispatches:")
            total = self.total_cycles or 1
            lines += [f"  {r.name} ({r.kernel}): {r.cycles:,} cycles ({r.cycles / total:.1%}), {r.bound}-bound, "
                      f"util {r.utilization:.0%}" for r in heavy]
        flags = sorted({f for r in self.rows for f in r.flags})
        lines += [f"note: {f}" for f in flags]
        lines += [f"host: {h.name} ({h.kernel}): {h.reason}" for h in self.host]
        return "\n".join(plain_line(line) for line in lines)


# -- the model ----------------------------------------------------------------------------------------------------

def cost_program(program: CompiledProgram, hw: Hardware, dtype: str | None = None,
                 context: int | None = None) -> CostReport:
    """Cost every dispatch of ``program`` on ``hw``. ``dtype``: a rate class (int8, fp16, bf16, fp32) or an IR
    dtype name (int8, float16, ...) to cost every floating tensor as; None: each dispatch's own dtype.

    ``context``: for a program with a KV cache (an LLM phase from ``compile_lm``), the cache positions live in the
    run costed (its last token's position + 1). Attention reads only those; the program cannot say how many there
    are (``cache_position`` is a run-time input), so the cost is of one run at this context. None: the whole
    cache, the slowest run."""
    override = resolve_dtype(dtype)
    length = kv_cache_length(program)
    _check_context(program, context, length)
    caches = {d.outputs[0] for d in program.dispatches if _writes_state(d) and d.outputs}
    specs: dict[str, TensorSpec] = dict(program.tensors)
    for spec in [*program.input_specs, *program.output_specs, *program.weight_specs]:
        specs.setdefault(spec.name, spec)
    for state in program.state_specs:
        specs.setdefault(state.name, state.tensor_spec())
    weights = {s.name for s in program.weight_specs}
    keys = program.weight_keys
    report = CostReport(hw, program.model_name, [], cache_length=length, context=context)
    for index, d in enumerate(program.dispatches):
        if d.host is not None:
            report.host.append(HostDispatch(index, d.node, d.kernel, d.host))
            continue
        ins = [_spec(specs, n, d) for n in d.inputs]
        outs = [_spec(specs, n, d) for n in d.outputs]
        if context is not None:
            ins, outs = _at_live_length(d, ins, outs, caches, context)
        row = _cost_dispatch(index, d, ins, outs, hw, override, weights, _layer(d, weights, keys))
        (report.bind if d.at_bind else report.rows).append(row)
    return report


def plain_line(text: str) -> str:
    """``text`` as one line of plain text: line breaks become spaces and every other unprintable character
    (an ANSI escape, a bidirectional override, ...) is shown escaped, as ``\\x1b``."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in one_line(text))


def resolve_dtype(dtype: str | None) -> str | None:
    if dtype is None:
        return None
    if dtype in MAC_DTYPES:
        return dtype
    if dtype in RATE_CLASS:
        return RATE_CLASS[dtype]
    raise CostModelError(f"dtype {dtype!r} cannot be costed; fix: give one of {', '.join(MAC_DTYPES)} "
                         f"(or float32, float16, bfloat16, int8), or None for each dispatch's own dtype")


def _spec(specs: dict[str, TensorSpec], name: str, d: Dispatch) -> TensorSpec:
    try:
        return specs[name]
    except KeyError:
        raise CostModelError(f"dispatch {d.node!r} ({d.kernel}) names tensor {name!r}, which the program does not "
                             f"declare; fix: recompile the program") from None


def _layer(d: Dispatch, weights: set[str], keys: dict[str, str]) -> str:
    """The module path: the dispatch's provenance, a dotted node name, the module of its first weight's key, or
    else the node name."""
    if d.provenance is not None and d.provenance.module:
        return d.provenance.module
    if "." in d.node:
        return d.node
    for name in d.inputs:
        if name in weights:
            key = keys.get(name, name)
            return key.rsplit(".", 1)[0] if "." in key else key
    return d.node


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


# -- a KV cache read at its live length ---------------------------------------------------------------------------

#: Attention kernels, and for each tensor with an axis over the KV cache's positions when the kernel reads a cache:
#: (inputs or outputs, its index, that axis). Keys and values are [B, H, S, D]; masks and scores [..., T, S].
CACHE_AXES: dict[str, tuple[tuple[str, int, int], ...]] = {
    "ATTENTION": (("in", 1, -2), ("in", 2, -2), ("in", 3, -1)),  # k and v rows, the mask's columns
    "ATTN_SCORE": (("in", 1, -2), ("in", 2, -1), ("out", 0, -1)),  # k rows, the mask's and the scores' columns
    "ATTN_OUTPUT": (("in", 0, -1), ("in", 1, -2)),  # the scores' columns, v rows
}


def kv_cache_length(program: CompiledProgram) -> int | None:
    """The positions a program's KV cache holds: the length of the state slots KV_UPDATE writes, along the axis
    it writes (None for a program without a KV cache)."""
    slots = {s.name: s for s in program.state_specs}
    lengths = []
    for d in program.dispatches:
        if _writes_state(d) and d.outputs and d.outputs[0] in slots:
            shape = slots[d.outputs[0]].shape
            axis = d.params.get("dim", 2)
            if isinstance(axis, int) and -len(shape) <= axis < len(shape):
                lengths.append(int(shape[axis]))
    return max(lengths, default=None)


def _writes_state(d: Dispatch) -> bool:
    """A KV_UPDATE, or any kernel whose record says it writes a state slot in place."""
    record = KERNELS.get(d.kernel)
    return d.host is None and record is not None and record.writes_state


def _check_context(program: CompiledProgram, context: int | None, length: int | None) -> None:
    if context is None:
        return
    if isinstance(context, bool) or not isinstance(context, int):
        raise CostModelError(f"context {context!r} is not a whole number; fix: give the live KV-cache positions")
    if length is None:
        raise CostModelError(f"context {context}: program {program.model_name!r} has no KV cache; fix: give a "
                             "context only for an LLM (its prefill and decode programs)")
    if not 1 <= context <= length:
        raise CostModelError(f"context {context} is outside the KV cache of program {program.model_name!r}, which "
                             f"holds {length} positions; fix: give a context from 1 to {length}")


def _at_live_length(d: Dispatch, ins: list[TensorSpec], outs: list[TensorSpec], caches: set[str], context: int
                    ) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """``d``'s tensors as an attention kernel reading a KV cache at ``context`` live positions sees them: the rows
    past the live length hold nothing yet (the mask hides them), so a kernel that knows the length reads,
    multiplies and writes over the live ones only. A run's own tokens (q's rows) are always live."""
    axes = CACHE_AXES.get(d.kernel)
    cache = next((ins[i] for i, name in enumerate(d.inputs) if name in caches), None)
    if axes is None or cache is None or len(cache.shape) < 2 or len(ins[0].shape) < 2:
        return ins, outs
    length = int(cache.shape[-2])
    live = min(length, max(context, int(ins[0].shape[-2])))
    tensors = {"in": list(ins), "out": list(outs)}
    for side, i, axis in axes:
        if i < len(tensors[side]) and len(tensors[side][i].shape) >= -axis \
                and int(tensors[side][i].shape[axis]) == length:
            tensors[side][i] = _cut(tensors[side][i], axis, live)
    return tensors["in"], tensors["out"]


def _cut(t: TensorSpec, axis: int, size: int) -> TensorSpec:
    """``t`` with ``axis`` cut to ``size``."""
    shape = list(t.shape)
    shape[axis] = size
    return TensorSpec(t.name, shape, t.dtype, t.layout)


def _rate(hw: Hardware, cls: str | None) -> tuple[float, str | None]:
    """(MACs per PE per cycle, a flag when the dtype is unsupported and the slowest supported rate is used)."""
    rate = hw.macs_per_cycle.get(cls, 0.0) if cls else 0.0
    if rate > 0:
        return rate, None
    slowest = min(r for r in hw.macs_per_cycle.values() if r > 0)
    return slowest, f"{cls or 'this dtype'} is unsupported by {hw.name}: costed at the slowest supported rate"


def _numel(t: TensorSpec) -> int:
    return math.prod(int(d) for d in t.shape)


def _cost_dispatch(index: int, d: Dispatch, ins: Sequence[TensorSpec], outs: Sequence[TensorSpec], hw: Hardware,
                   override: str | None, weights: set[str], layer: str) -> DispatchCost:
    record = KERNELS.get(d.kernel) or get_kernel(d.kernel)
    first = outs[0] if outs else (ins[0] if ins else None)
    cls = override or (RATE_CLASS.get(first.dtype) if first is not None else None)
    size = _Sizer(CLASS_DTYPE[override] if override else None)
    flops = _flops(record, d, ins, outs)
    mapping = _mapping(record, d, ins, outs, weights)
    reads, writes = _traffic(record, d, ins, outs)
    written = sum(size(t, n) for t, n in zip(outs, writes))
    if mapping.gemms is not None or record.kind == "contraction":
        work = _on_array(hw, d, cls, flops, mapping, ins, reads, written, size)
    else:
        work = _on_vector(hw, d, record.kind, cls, ins, reads, writes, written, size)
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
        sram_reads=work.sram_reads, sram_writes=work.sram_writes)


@dataclass(frozen=True)
class _Sizer:
    """Bytes of some elements of a tensor; floating tensors resized to the ``dtype`` override when one is given."""

    dtype: str | None

    def __call__(self, t: TensorSpec, elements: int) -> int:
        return dtype_nbytes(elements, self.dtype if self.dtype is not None and t.dtype in FLOAT_DTYPES else t.dtype)


@dataclass
class _Work:
    """A dispatch's work on the array or the vector unit, and the DRAM bytes it reads (see the module docstring)."""

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
    flags: list[str] = field(default_factory=list)


def _flops(record: KernelDef, d: Dispatch, ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]) -> int:
    """The record's FLOP formula; one per output element when it cannot read the parameters."""
    try:
        return record.flops(ins, outs, d.params)
    except (IndexError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return sum(_numel(t) for t in outs)


def _on_array(hw: Hardware, d: Dispatch, cls: str | None, flops: int, mapping: ArrayMapping | _Unmapped,
              ins: Sequence[TensorSpec], reads: Sequence[int], written: int, size: _Sizer) -> _Work:
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
               reads: Sequence[int], writes: Sequence[int], written: int, size: _Sizer) -> _Work:
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


@dataclass(frozen=True)
class ArrayRun:
    """One M x N x K GEMM on an R x C array (see the module docstring): folds, cycles at one MAC per PE per
    cycle, and the array's SRAM accesses in elements."""

    folds: int
    cycles: int
    a_reads: int  # the activation operand (M x K; SCALE-Sim's IFMAP)
    w_reads: int  # the weight operand (K x N; SCALE-Sim's filter)
    writes: int  # outputs and partial sums (M x N per K fold where K is not pinned whole; SCALE-Sim's OFMAP)


def gemm_on_array(rows: int, cols: int, dataflow: str, m: int, n: int, k: int) -> ArrayRun:
    """The mapping of one M x N x K GEMM onto a ``rows`` x ``cols`` array under ``dataflow``.

    >>> gemm_on_array(4, 4, "output_stationary", 8, 8, 16)  # 4 folds of 16 + 4 + 4 - 2 cycles
    ArrayRun(folds=4, cycles=88, a_reads=256, w_reads=256, writes=64)
    """
    fm, fn, fk = -(-m // rows), -(-n // cols), -(-k // rows)
    if dataflow == "output_stationary":
        folds = fm * fn
        return ArrayRun(folds, folds * (k + rows + cols - 2), m * k * fn, k * n * fm, m * n)
    if dataflow == "weight_stationary":
        folds = fk * fn
        return ArrayRun(folds, folds * (m + 2 * rows + cols - 2), m * k * fn, k * n, m * n * fk)
    fmc = -(-m // cols)  # input_stationary: M lies along the columns
    folds = fk * fmc
    return ArrayRun(folds, folds * (n + 2 * rows + cols - 2), m * k, k * n * fmc, m * n * fk)


def _vector_cycles(hw: Hardware, vclass: str, elements: int) -> int:
    if not elements:
        return 0
    return math.ceil(elements / (hw.vector_lanes * hw.vector_ops_per_cycle[vclass]))


def _tile(hw: Hardware, w: int, a: int, acc: int) -> tuple[str, int, int, int]:
    """(tiling, weight reads, activation reads, SRAM working set) of a contraction (see the module docstring)."""
    if hw.sram_shared:
        size = hw.sram_weights_bytes
        fits = w + a <= size
        sw = sa = max(1, size // 2)
        sram = min(w + a + acc, size)
    else:
        sw, sa = hw.sram_weights_bytes, hw.sram_activations_bytes
        fits = w <= sw and a <= sa
        sram = min(w, sw) + min(a, sa) + min(acc, hw.sram_accumulators_bytes)
    if fits:
        return "resident", 1, 1, sram
    w_blocks, a_blocks = max(1, -(-w // sw)), max(1, -(-a // sa))
    if w + a * w_blocks <= a + w * a_blocks:
        return "keep weights", 1, w_blocks, sram
    return "keep activations", a_blocks, 1, sram


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


__all__ = ["CSV_COLUMNS", "ArrayRun", "CostModelError", "CostReport", "DispatchCost", "HostDispatch", "LayerCost",
           "cost_program", "gemm_on_array", "plain_line"]
