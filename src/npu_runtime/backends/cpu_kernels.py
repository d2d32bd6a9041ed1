"""CPU kernels of the CPU backend, one per kernel name of the compiler's library.

Each kernel is a ``prepare``/``run`` pair made by :func:`make_kernel`::

    kernel = make_kernel(dispatch, specs, weight_names)
    kernel.prepare(weights)          # once per weight set: fold batch norm, prepack, transpose
    kernel.run(inputs, outputs)      # per inference: write the results INTO ``outputs``

``inputs`` are all the dispatch's inputs (activations, weights and constants) in order; ``outputs`` are
views of the arena. The hot kernels of CNNs and transformers have their own classes: ``CONV`` (oneDNN with a
prepacked weight, batch norm folded and the activation fused; with ``has_residual`` the residual add as a oneDNN
post-op, accumulated in place when the compiler marked ``inplace_residual``: the output *is* the residual's buffer),
``GEMM`` (``addmm`` into the arena), max pooling, add and relu; the transformer kernels' (RMS norm, RoPE, attention
over a KV cache, the cache update) are in :mod:`.cpu_transformer`. Every other kernel runs the op's reference
implementation from the ``torch_ir`` op registry and copies the result into the arena, so each op is declared once.

Layout: 4-D activations of convolutions are NHWC (``channels_last``) in the arena; oneDNN then reads and
writes them without conversion.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F  # noqa: N812

from npu_program.kernel_record import CPU_QCONV, CPU_QELEMENTWISE, CPU_QPOOL
from npu_program.kernels import REFERENCE, get_kernel
from npu_program.program import Dispatch, TensorSpec, block_of

from . import cpu_decode_ops
from .base import Kernel
from .cpu_activation import FUSED_BY_ONEDNN, MKLDNN_ACTIVATIONS, apply_activation_, store
from .cpu_blocks import BlockLinear, Dequantized, stacked

Tensor = torch.Tensor


# --------------------------------------------------------------------------------------------- helpers


def _pair(value: int | Sequence[int]) -> list[int]:
    """``3 -> [3, 3]``; lists pass through as ``list[int]``."""
    if isinstance(value, int):
        return [value, value]
    values = [int(v) for v in value]
    return values * 2 if len(values) == 1 else values


def _fold_batch_norm(w: Tensor, b: Tensor | None, bn: Sequence[Tensor], eps: float) -> tuple[Tensor, Tensor]:
    """Fold inference batch norm into conv weight/bias: ``w*g/sqrt(v+eps)``, ``(b-m)*g/sqrt(v+eps)+beta``."""
    gamma, beta, mean, var = (t.double() for t in bn)
    scale = gamma / torch.sqrt(var + eps)
    bias = b.double() if b is not None else torch.zeros_like(mean)
    w_folded = w.double() * scale.reshape(-1, *([1] * (w.dim() - 1)))
    return w_folded.to(w.dtype), ((bias - mean) * scale + beta).to(w.dtype)


# --------------------------------------------------------------------------------------------- conv


@functools.cache
def _conv_dtypes() -> frozenset[str]:
    """What oneDNN's convolution runs natively here: float32 always, bfloat16 / float16 where this CPU has the
    instructions (AVX512-BF16 or AMX; AVX512-FP16), as torch detects them at run time. Elsewhere a bfloat16 or
    float16 convolution is widened: float32 weights packed once, x widened (exactly) per call, oneDNN's float32
    convolution, rounded once as it is stored; torch's own half convolution without the instructions took 7-11x
    the float32 time (ResNet-18: 206-351 against 31 ms, 2-vCPU Zen 3)."""
    native = {"bfloat16": torch.ops.mkldnn._is_mkldnn_bf16_supported(),
              "float16": torch.ops.mkldnn._is_mkldnn_fp16_supported()}
    return frozenset({"float32", *(d for d, ok in native.items() if ok)})


class Conv2d:
    """2-D convolution (oneDNN, prepacked) with optional bias, folded batch norm and fused activation.

    Inputs: ``[x, w, (bias), (bn_weight, bn_bias, bn_mean, bn_var)]``; with ``has_residual`` a residual
    activation comes last and the kernel computes ``act(conv(x) + residual)``.
    """

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        x = specs[dispatch.inputs[0]]
        end = len(dispatch.inputs) - (1 if dispatch.params.get("has_residual") else 0)
        dtypes = {specs[n].dtype for n in [*dispatch.inputs, *dispatch.outputs] if n in specs}
        return (len(x.shape) == 4 and len(dtypes) == 1 and x.dtype in LINEAR_DTYPES
                and all(n in weight_names for n in dispatch.inputs[1:end])
                and dispatch.params.get("activation") in MKLDNN_ACTIVATIONS)

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        params = dispatch.params
        input_shape, residual = list(specs[dispatch.inputs[0]].shape), bool(params.get("has_residual"))
        self.names = dispatch.inputs
        self.params = params
        self.stride = _pair(params.get("stride", 1))
        self.padding = _pair(params.get("padding", 0))
        self.dilation = _pair(params.get("dilation", 1))
        self.groups = int(params.get("groups", 1))
        self.activation = params.get("activation")
        self.input_shape = input_shape
        self.residual = residual
        # with a residual only: the compiler placed the output on the residual's bytes (the residual dies here)
        self.widen = specs[dispatch.inputs[0]].dtype not in _conv_dtypes()  # float32 inside (``_conv_dtypes``)
        self.inplace = residual and bool(params.get("inplace_residual", False)) and not self.widen
        self.attr, self.scalars, self.algorithm = MKLDNN_ACTIVATIONS[self.activation]
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None
        # the packed weight per intra-op thread count: oneDNN chooses the blocked layout for the count at packing
        # time, and a run at another count reorders the weight at every call (ResNet-50 at one thread: 200 ms a
        # run with the two-thread layout, 120 ms with its own); npu_runtime.threads switches counts between runs
        self.packed: dict[int, Tensor] = {}

    def prepare(self, weights: dict[str, Tensor]) -> None:
        w, b = self._folded(weights)
        if self.widen:  # folded in the weights' dtype, as where oneDNN runs it, then widened exactly
            w, b = w.float(), None if b is None else b.float()
        self.weight = self._pack(w)
        self.packed = {torch.get_num_threads(): self.weight}
        self.bias = b

    def _pack(self, w: Tensor) -> Tensor:
        return torch.ops.mkldnn._reorder_convolution_weight(
            w, self.padding, self.stride, self.dilation, self.groups, self.input_shape)

    def _weight(self) -> Tensor:
        """The weight packed for the current thread count; packed (once) from another count's when first needed."""
        threads = torch.get_num_threads()
        weight = self.packed.get(threads)
        if weight is None:
            weight = self.packed[threads] = self._pack(self.weight.to_dense())
        return weight

    def _folded(self, weights: dict[str, Tensor]) -> tuple[Tensor, Tensor | None]:
        """Weight and bias with batch norm folded in (bias is ``None`` only without bias and batch norm)."""
        has_bias = bool(self.params.get("has_bias"))
        w = weights[self.names[1]]
        b = weights[self.names[2]] if has_bias else None
        eps = self.params.get("bn_eps")
        if eps is None:
            return w.contiguous(), b
        first = 3 if has_bias else 2
        bn = [weights[n] for n in self.names[first:first + 4]]
        return _fold_batch_norm(w, b, bn, float(eps))

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        out, x, residual = outputs[0], inputs[0], inputs[-1] if self.residual else None
        if self.widen:  # float32 inside, rounded once as it is stored (``_conv_dtypes``)
            x, residual = x.float(), None if residual is None else residual.float()
        args = (self._weight(), self.bias, self.padding, self.stride, self.dilation, self.groups)
        if self.inplace:  # out is the residual's buffer: accumulate into it, no allocation, no copy
            torch.ops.mkldnn._convolution_pointwise_.binary(out, x, *args, "add", 1.0, None, [], None)
            apply_activation_(out, self.activation)
            return
        if self.residual:  # oneDNN's binary post-op is the add, then no activation: it is applied as y is stored
            y = torch.ops.mkldnn._convolution_pointwise.binary(x, residual, *args, "add", None, None, [], None)
            pending = self.activation
        else:
            y = torch.ops.mkldnn._convolution_pointwise(x, *args, self.attr, self.scalars, self.algorithm)
            pending = None if self.activation in FUSED_BY_ONEDNN else self.activation
        store(out, y, pending)


# --------------------------------------------------------------------------------------------- gemm


@functools.cache
def _onednn_linear() -> bool:
    """Whether torch has oneDNN here (its CPU builds for x86 and Arm do), for the prefill-sized contractions."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


#: Rows of ``x`` up to which a contraction runs the GEMV kernel (``cpu_gemv``): it reads W once per 4 rows
#: of x (at the memory bandwidth), so more rows would read W again, where BLAS's blocked GEMM reads it once.
GEMV_ROWS = 4
#: Dtypes the contraction kernels run (x, weights and output of one dtype; fp32 accumulation).
LINEAR_DTYPES = frozenset({"float32", "bfloat16", "float16"})


class _Linear:
    """``x · Wᵀ (+ bias) (+ residual)`` into ``out``, for the contraction kernels (GEMM, GATE_UP, QKV_PROJ).

    Decode-sized ``x`` (at most ``GEMV_ROWS`` rows, e.g. one token) runs the GEMV kernel of :mod:`.cpu_gemv`
    (bound by memory bandwidth; PyTorch's bf16 GEMV moves half the bytes/s of its fp32 one, the kernel the same):
    fp32 sums, one rounding, PyTorch where it cannot be compiled. Prefill-sized ``x`` runs the native prefill GEMM
    where AVX2 is the CPU's best (``Gemv.tiled_mm``), else oneDNN's fp32 GEMM, or ``torch.mm``/``addmm`` (bf16 or fp16
    where the CPU has no dot products of it: fp32 tiles, ``Gemv.widened_mm``). ``weight`` is ``[N, K]``,
    kept as the transpose of a contiguous ``[N, K]``, which BLAS reads fastest and the GEMV kernel reads.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        from . import cpu_gemv  # here, not at the top: the other kernels do not need it

        self.weight = weight.contiguous().t()
        self.bias = bias.contiguous() if bias is not None else None
        self.gemv = cpu_gemv.Gemv(self.weight.t(), self.bias)
        cpu_gemv.native_available()  # build the kernel now (seconds, once per machine), not in the first run

    def __call__(self, x2: Tensor, out2: Tensor, residual: Tensor | None = None) -> None:
        if x2.shape[0] <= GEMV_ROWS and x2.is_contiguous():
            self.gemv(x2, out=out2, residual=residual)
            return
        if x2.is_contiguous() and out2.is_contiguous() and self.gemv.tiled_mm(x2, out2):
            pass  # AVX2 CPUs: the native prefill GEMM, up to 1.3x oneDNN's and MKL's fp32 GEMMs there
        elif x2.dtype == torch.float32 and _onednn_linear():
            # oneDNN's fp32 GEMM over the [N, K] weight as it lies (no second copy): 1.2-1.5x torch.mm's BLAS on
            # Zen 4 at BERT's and an LLM prefill's shapes
            out2.copy_(torch.ops.mkldnn._linear_pointwise(x2, self.weight.t(), self.bias, "none", [], ""))
        elif self.gemv.widened_mm(x2, out2):
            pass
        elif self.bias is None:
            torch.mm(x2, self.weight, out=out2)
        else:
            torch.addmm(self.bias, x2, self.weight, out=out2)
        if residual is not None:
            out2.add_(residual)


#: The ``x_int8_group`` the linear kernels run (over block-quantized weights: ``cpu_blocks.BlockLinear``).
X_INT8_GROUP = 32


def _blocks_ok(dispatch: Dispatch, specs: dict[str, TensorSpec], weights: list[str]) -> bool:
    """Block-quantized weights only as ``[N, K]`` (``trans_b``), the way their rows of blocks lie; int8-rounded x
    (``x_int8_group``) only over block-quantized weights, in groups of 32 (any other runs the op's reference)."""
    blocked = [block_of(specs.get(n)) is not None for n in weights]
    group = dispatch.params.get("x_int8_group")
    if group is not None and (group != X_INT8_GROUP or not any(blocked)):
        return False
    return bool(dispatch.params.get("trans_b", True)) or not any(blocked)


def linear_dtypes_ok(dispatch: Dispatch, specs: dict[str, TensorSpec]) -> bool:
    """x, weights, biases, residual and outputs of one dtype the kernels run (the reference refuses mixed ones)."""
    dtypes = {specs[n].dtype for n in [*dispatch.inputs, *dispatch.outputs] if n in specs}
    return len(dtypes) == 1 and dtypes <= LINEAR_DTYPES


class Gemm:
    """``y = act(x @ W (+ bias) (+ residual))`` straight into the arena (see :class:`_Linear`).

    Inputs ``[x, w, bias?, residual?]``: ``has_bias`` and ``has_residual`` say which follow (without
    ``has_bias``, a third input is the bias). ``trans_b=True``: W is ``[N, K]`` (nn.Linear), else ``[K, N]``.
    The residual is an activation (the transformer block's residual stream), added before the activation.
    """

    reads_blocks = True  # block-quantized weights run through cpu_blocks.BlockLinear

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        names, residual = dispatch.inputs, bool(dispatch.params.get("has_residual"))
        constant = names[1:-1] if residual else names[1:]  # the weight and the bias, bound before any run
        return not dispatch.params.get("trans_a") and all(n in weight_names for n in constant) \
            and linear_dtypes_ok(dispatch, specs) and _blocks_ok(dispatch, specs, names[1:2])

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        p = dispatch.params
        self.names = dispatch.inputs
        self.block = block_of(specs.get(self.names[1]))
        self.int8 = p.get("x_int8_group") is not None
        self.trans_b = bool(p.get("trans_b", True))
        self.activation = p.get("activation")
        self.has_residual = bool(p.get("has_residual"))
        bias = p.get("has_bias")
        self.has_bias = bool(bias) if bias is not None else len(self.names) == 3 + self.has_residual
        self.linear: _Linear | None = None

    def prepare(self, weights: dict[str, Tensor]) -> None:
        w, bias = weights[self.names[1]], weights[self.names[2]] if self.has_bias else None
        self.linear = BlockLinear([(w, self.block)], bias, self.int8) if self.block else \
            _Linear(w if self.trans_b else w.t(), bias)

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        x, out = inputs[0], outputs[0]
        residual = inputs[-1].reshape(-1, out.shape[-1]) if self.has_residual else None
        out2 = out.view(-1, out.shape[-1])
        self.linear(x.reshape(-1, x.shape[-1]), out2, residual)
        apply_activation_(out2, self.activation)


class GateUp:
    """``GATE_UP``: ``silu(x @ W_gateᵀ + b_gate) * (x @ W_upᵀ + b_up)`` as ONE contraction over both weights.

    ``prepare`` concatenates the gate and up weights (and biases) once per weight set; the weights file keeps
    them as two tensors. ``run`` makes the one contraction into a ``[rows, 2N]`` scratch and writes
    ``silu(gate) * up`` into the arena.
    """

    reads_blocks = True  # block-quantized weights run through cpu_blocks.BlockLinear

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        return all(n in weight_names for n in dispatch.inputs[1:]) and linear_dtypes_ok(dispatch, specs) \
            and _blocks_ok(dispatch, specs, dispatch.inputs[1:3])

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        self.names = dispatch.inputs
        self.trans_b = bool(dispatch.params.get("trans_b", True))
        self.has_bias = bool(dispatch.params.get("has_bias", False))
        self.n = int(specs[dispatch.outputs[0]].shape[-1])
        self.blocks = [block_of(specs.get(n)) for n in self.names[1:3]]
        self.int8 = dispatch.params.get("x_int8_group") is not None
        self.linear: _Linear | BlockLinear | None = None

    def prepare(self, weights: dict[str, Tensor]) -> None:
        bias = torch.cat([weights[self.names[3]], weights[self.names[4]]]) if self.has_bias else None
        if any(self.blocks):
            self.linear = BlockLinear([(weights[n], b) for n, b in zip(self.names[1:3], self.blocks)], bias, self.int8)
            return
        gate, up = (weights[n] if self.trans_b else weights[n].t() for n in self.names[1:3])
        self.linear = _Linear(stacked([gate, up]), bias)

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        x, out = inputs[0], outputs[0]
        x2 = x.reshape(-1, x.shape[-1])
        both = torch.empty(x2.shape[0], 2 * self.n, dtype=out.dtype)
        self.linear(x2, both)
        if not cpu_decode_ops.silu_mul(both, out):  # one row: in C, as a chained decode step has it (cpu_chain)
            torch.mul(F.silu(both[:, :self.n], inplace=True), both[:, self.n:], out=out.view(-1, self.n))


class QkvProj:
    """``QKV_PROJ``: the q, k and v projections as ONE contraction over the three weights (concatenated once, at
    bind time), its result split into the three outputs, head-major when ``heads_first``."""

    reads_blocks = True  # block-quantized weights run through cpu_blocks.BlockLinear

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        return dispatch.params.get("trans_b", True) and not dispatch.params.get("packed") \
            and all(n in weight_names for n in dispatch.inputs[1:]) and linear_dtypes_ok(dispatch, specs) \
            and _blocks_ok(dispatch, specs, dispatch.inputs[1:4])

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        p = dispatch.params
        self.names = dispatch.inputs
        self.blocks = [block_of(specs.get(n)) for n in self.names[1:4]]
        self.int8 = p.get("x_int8_group") is not None
        self.splits = [int(n) for n in p["splits"]]
        flags = p.get("has_bias", False)
        self.bias_flags = list(flags) if isinstance(flags, list) else [bool(flags)] * 3
        self.heads_first = bool(p.get("heads_first"))
        self.head_dim = p.get("head_dim")
        self.linear: _Linear | BlockLinear | None = None

    def prepare(self, weights: dict[str, Tensor]) -> None:
        ws = [weights[n] for n in self.names[1:4]]
        given = iter(self.names[4:])
        biases = [weights[next(given)] if flag else torch.zeros(w.shape[0], dtype=self._dtype(w))
                  for flag, w in zip(self.bias_flags, ws)]
        bias = torch.cat(biases) if any(self.bias_flags) else None
        self.linear = BlockLinear(list(zip(ws, self.blocks)), bias, self.int8) if any(self.blocks) else \
            _Linear(stacked(ws), bias)

    def _dtype(self, w: Tensor) -> torch.dtype:
        return torch.float32 if w.dtype == torch.uint8 else w.dtype  # blocks: their biases are fp32

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        x = inputs[0]
        x2 = x.reshape(-1, x.shape[-1])
        both = torch.empty(x2.shape[0], sum(self.splits), dtype=outputs[0].dtype)
        self.linear(x2, both)
        for part, out in zip(torch.split(both, self.splits, dim=1), outputs):
            if self.heads_first:  # [B·T, H·D] -> [B, H, T, D]
                b, h, t, d = out.shape
                out.copy_(part.view(b, t, h, d).transpose(1, 2))
            else:
                out.view(-1, part.shape[1]).copy_(part)


# --------------------------------------------------------------------------------------------- others


class MaxPool2d:
    """Max pooling with the ``aten.max_pool2d`` attributes."""

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        return True

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        p = dispatch.params
        self.kernel_size = _pair(p["kernel_size"])
        self.stride = _pair(p.get("stride") or p["kernel_size"])
        self.padding = _pair(p.get("padding", 0))
        self.dilation = _pair(p.get("dilation", 1))
        self.ceil_mode = bool(p.get("ceil_mode", False))

    def prepare(self, weights: dict[str, Tensor]) -> None:
        pass

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        outputs[0].copy_(F.max_pool2d(inputs[0], self.kernel_size, self.stride, self.padding, self.dilation,
                                      self.ceil_mode))


class Binary:
    """A broadcasting elementwise op written with ``out=`` (no temporary)."""

    FUNCTIONS: dict[str, Callable[..., Tensor]] = {
        "aten.add.Tensor": torch.add, "aten.mul.Tensor": torch.mul, "aten.sub.Tensor": torch.sub}

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        dtypes = {specs[n].dtype for n in [*dispatch.inputs, *dispatch.outputs] if n in specs}
        return dispatch.params.get("alpha", 1) == 1 and len(dispatch.inputs) == 2 and len(dtypes) == 1

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        self.fn = self.FUNCTIONS[dispatch.kernel]

    def prepare(self, weights: dict[str, Tensor]) -> None:
        pass

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        self.fn(*inputs, out=outputs[0])


class Relu(Binary):
    """relu with ``out=``: torch's clamp, which keeps NaN (``relu_`` semantics)."""

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        return True

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        self.fn = lambda x, out: torch.clamp_min(x, 0.0, out=out)


class Reference:
    """Any kernel of the library: the op's reference implementation, its results copied into the arena."""

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        from ..reference import bind_reference  # the reference module imports the device, which imports backends

        self.fn = bind_reference(dispatch, specs, torch.device("cpu"))

    def prepare(self, weights: dict[str, Tensor]) -> None:
        pass

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        for out, value in zip(outputs, self.fn(inputs, {})):
            out.copy_(value)


# --------------------------------------------------------------------------------------------- choice

#: The modules whose classes the kernel table may name as CPU implementations (``impls["cpu"]``).
KERNEL_MODULES = (__name__, "npu_runtime.backends.cpu_transformer", "npu_runtime.backends.cpu_blocks",
                  "npu_runtime.backends.cpu_kvcache", CPU_QCONV, CPU_QELEMENTWISE, CPU_QPOOL)



def make_kernel(dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> Kernel:
    """The kernel table's CPU implementation of ``dispatch`` when it accepts it, else the reference one.

    ``weight_names`` are the inputs bound before the first run (weights and constants): fast paths that
    prepack a weight need it to be one.
    """
    impl = get_kernel(dispatch.kernel).impls.get("cpu", REFERENCE)
    cls: type = Reference
    if impl != REFERENCE:
        module, _, name = impl.partition(":")
        # the table names classes of the CPU backend's own modules only: nothing else is imported from it
        found = getattr(importlib.import_module(module), name, None) if module in KERNEL_MODULES else None
        if found is not None and found.accepts(dispatch, specs, weight_names):
            cls = found
    # a kernel reading block-quantized weights says so (``reads_blocks``); any other is given them dequantized
    if not getattr(cls, "reads_blocks", False) and any(block_of(specs.get(n)) for n in dispatch.inputs):
        return Dequantized(dispatch, specs, cls)
    return cls(dispatch, specs)


__all__ = ["make_kernel"]
