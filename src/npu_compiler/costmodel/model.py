"""The NPU cost model: cycles, DRAM traffic and utilization of every dispatch of a compiled program.

``cost_program(program, hw)`` walks the dispatches once, in pure Python arithmetic on tensor shapes (no torch),
and returns a :class:`CostReport`. It is an analytical first-order model in the spirit of SCALE-Sim (array
mapping) and Arm Vela's performance estimate (per-layer cycles, DRAM traffic, bound); every assumption is here:

Work and dtype
  * MACs are counted from the mapping below (exact multiply-accumulates of the contractions); FLOPs come from
    the kernel table's formula (``npu_program.kernels``), which also counts epilogues and softmax.
  * The bits of a dispatch (the bytes of each tensor, the operand width it computes in) are the ``precision``
    module's: a quantized dispatch (QGEMM, DQGEMM, ...) as compiled, at the wider integer operand's rate (DQGEMM
    at its activations' float rate); else ``precision`` (``w8a8``, ``w4a16``, ...: weights and activations sized
    by role, scales counted); else the ``dtype`` argument (every floating tensor resized to it); else its first
    output's dtype. Rates are per operand width (``Hardware.mac_rate``: int4, int8, int16, fp8, fp16, bf16,
    fp32, a width the file leaves out derived by ``DERIVED_RATES``). Float work whose rate is 0 (or that has none,
    e.g. int64) is costed at the slowest supported rate and the row is flagged; quantized work is refused.

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

Code: ``cost_program`` (here) walks the dispatches; ``dispatch`` costs one (its kernel record's FLOPs, mapping and
traffic, its work on the array or the vector unit), ``array`` holds the array's and the vector unit's arithmetic
(``gemm_on_array``, rates, SRAM tiling), ``kvcache`` the KV cache read at its live length, and ``costs`` the
results (``DispatchCost``, ``CostReport``).
"""

from __future__ import annotations

from npu_program.program import CompiledProgram, Dispatch, TensorSpec, dtype_size

from .array import ArrayRun, gemm_on_array
from .costs import CSV_COLUMNS, CostModelError, CostReport, DispatchCost, HostDispatch, LayerCost, plain_line
from .dispatch import Bits, _cost_dispatch
from .hardware import MAC_DTYPES, Hardware
from .kvcache import _at_live_length, _check_context, _writes_state, kv_cache_length
from .precision import PRECISIONS, RATE_CLASS, resolve_precision


def cost_program(program: CompiledProgram, hw: Hardware, dtype: str | None = None,
                 context: int | None = None, precision: str | None = None) -> CostReport:
    """Cost every dispatch of ``program`` on ``hw``. ``dtype``: a rate class (int8, fp16, bf16, fp32, ...) or an
    IR dtype name (int8, float16, ...) to cost every floating tensor as; None: each dispatch's own dtype.
    ``precision``: a float program costed as if quantized by role (``precision.PRECISIONS``: ``w8a8``, ``w4a16``,
    ...); it replaces ``dtype``. Quantized dispatches (QGEMM, DQGEMM, ...) are costed as compiled whatever the two
    say (the ``precision`` module).

    ``context``: for a program with a KV cache (an LLM phase from ``compile_lm``), the cache positions live in the
    run costed (its last token's position + 1). Attention reads only those; the program cannot say how many there
    are (``cache_position`` is a run-time input), so the cost is of one run at this context. None: the whole
    cache, the slowest run."""
    try:
        how = resolve_precision(precision)
    except ValueError as err:
        raise CostModelError(str(err)) from None
    override = None if how is not None else resolve_dtype(dtype)
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
    bits = Bits(override, how, frozenset(weights) | frozenset(program.constants))
    report = CostReport(hw, program.model_name, [], cache_length=length, context=context, precision=precision)
    if length is not None:  # the cache's bytes as held (a quantized cache: int8 codes and float32 scales)
        report.cache_bytes = program.state_bytes
        report.cache_dtypes = " + ".join(sorted({s.dtype for s in program.state_specs}, key=_by_width))
    for index, d in enumerate(program.dispatches):
        if d.host is not None:
            report.host.append(HostDispatch(index, d.node, d.kernel, d.host))
            continue
        ins = [_spec(specs, n, d) for n in d.inputs]
        outs = [_spec(specs, n, d) for n in d.outputs]
        if context is not None:
            ins, outs = _at_live_length(d, ins, outs, caches, context)
        row = _cost_dispatch(index, d, ins, outs, hw, bits, weights, _layer(d, weights, keys))
        (report.bind if d.at_bind else report.rows).append(row)
    return report


def _by_width(dtype: str) -> tuple[int, str]:
    return dtype_size(dtype), dtype


def resolve_dtype(dtype: str | None) -> str | None:
    if dtype is None:
        return None
    if dtype in MAC_DTYPES:
        return dtype
    if dtype in RATE_CLASS:
        return RATE_CLASS[dtype]
    raise CostModelError(f"dtype {dtype!r} cannot be costed; fix: give one of {', '.join(MAC_DTYPES)} "
                         f"(or float32, float16, bfloat16, int8, ...), or None for each dispatch's own dtype; a "
                         f"quantized precision by role is precision= ({', '.join(PRECISIONS)})")


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


__all__ = ["CSV_COLUMNS", "PRECISIONS", "RATE_CLASS", "ArrayRun", "CostModelError", "CostReport", "DispatchCost",
           "HostDispatch", "LayerCost", "cost_program", "gemm_on_array", "kv_cache_length", "plain_line",
           "resolve_dtype"]
