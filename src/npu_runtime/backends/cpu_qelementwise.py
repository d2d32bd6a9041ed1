"""Native quantized elementwise kernels of the CPU backend: QADD, bit-exact with its reference
(``torch_ir.ops.npu_quant.qadd``, the QDQ chain DEQUANTIZE, add, relu, QUANTIZE it replaces).

A QDQ ResNet's residual adds, as four reference dispatches with float32 intermediates, cost about as much as all its
convolutions on one thread; QADD is one pass over the codes. The C kernel (``qelementwise.c`` beside this file,
compiled on first use) does the reference's float32 steps per element in its order (dequantize each input, add,
relu, divide by y_scale or multiply by its float32 inverse, round half to even, + y_zp, clamp), vectorized by the
compiler for AVX-512, AVX2 or plain C, chosen at run time (``TORCH_IR_QADD_ISA``: ``c``, ``avx2``, ``avx512`` caps
it, for tests and comparisons).

It takes int8/uint8 codes, one scale and zero point per tensor (known at bind time: weights or constants), finite
scales and a nonzero y_scale, and a, b and y of one shape (``accepts``; any other QADD runs the reference, which
also broadcasts and raises where it must). Layouts: the arena may hand 4-D tensors as strided views (NHWC bytes
seen as NCHW); when the three are stored alike (same strides, dense) the kernel runs over their bytes in storage
order, else it reads contiguous copies and copies the result in. An output that partly overlaps an input is
written through a temporary. When the kernel cannot be had the reference runs and one warning says why.
"""

from __future__ import annotations

import math
import struct

import torch

from npu_program.program import Dispatch, TensorSpec, block_of
from torch_ir.quant.spec import QTYPES

from . import cpu_gemv_build
from .cpu_gemv_build import Library
from .cpu_kernels import Reference

Tensor = torch.Tensor

SOURCE_NAME = "qelementwise.c"
#: ``isa`` values: the kernel's codes (``qadd_isa`` in ``qelementwise.c``)
ISAS: dict[str, int] = {"c": 0, "avx2": 1, "avx512": 2}
_ISA_NAMES = {code: name for name, code in ISAS.items()}
#: the code types (``T_*`` of ``qelementwise.c``)
_CODES = {torch.uint8: 0, torch.int8: 1}
#: ``qadd_packed``'s argument block: 13 int64 then 7 doubles (``QAddArgs``)
_ARGS = struct.Struct("<13q7d")


def _build() -> Library:
    return cpu_gemv_build.load_packed(SOURCE_NAME, "qadd")


def _isa_cap() -> int:
    return cpu_gemv_build.isa_cap("TORCH_IR_QADD_ISA", ISAS)


_kernel = cpu_gemv_build.NativeKernel(
    "quantized add", _build, lambda library: _ISA_NAMES[min(library.isa, _isa_cap())],
    "QADD runs its reference implementation")


def native_status() -> str:
    """One line: which implementation the QADD kernel runs here, and why."""
    return _kernel.status()


def _numel(spec: TensorSpec) -> int:
    n = 1
    for d in spec.shape:
        n *= int(d)
    return n


def _f32(t: Tensor) -> float:
    """A one-element scale as the reference reads it: rounded to float32 (a float64 scale too)."""
    return float(t.reshape(()).to(torch.float32))


def _storage_order(t: Tensor) -> Tensor | None:
    """``t`` with its dims permuted into storage order when that view is contiguous (a dense tensor in any dim
    order: NHWC bytes seen as NCHW), else None."""
    if t.is_contiguous():
        return t
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), -d))
    v = t.permute(order)
    return v if v.is_contiguous() else None


class QAdd:
    """QADD: int8/uint8 codes, per-tensor scales and zero points, a, b and y of one shape (module docstring)."""

    kind = "QADD"

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        p, names = dispatch.params, dispatch.inputs
        if p.get("out_dtype", "int8") not in ("int8", "uint8") or p.get("activation") not in (None, "relu") \
                or p.get("method", "divide") not in ("divide", "multiply_inverse") or len(names) != 8:
            return False
        a, b, y = specs.get(names[0]), specs.get(names[3]), specs.get(dispatch.outputs[0])
        if a is None or b is None or y is None or any(block_of(t) is not None for t in (a, b)):
            return False
        if a.dtype not in ("int8", "uint8") or b.dtype not in ("int8", "uint8") or y.dtype != p.get("out_dtype",
                                                                                                    "int8"):
            return False
        if list(a.shape) != list(y.shape) or list(b.shape) != list(y.shape):
            return False  # a broadcast add: the reference
        scalars = [n for i, n in enumerate(names) if i not in (0, 3)]
        return all(n in weight_names and n in specs and _numel(specs[n]) == 1 for n in scalars)

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        p = dispatch.params
        self.names = dispatch.inputs
        self.out_dtype = p.get("out_dtype", "int8")
        self.relu = p.get("activation") == "relu"
        self.multiply = p.get("method", "divide") == "multiply_inverse"
        self.reference = Reference(dispatch, specs)
        self.native = False  # set by prepare when every condition of exactness holds
        self.steps: tuple = ()

    def prepare(self, weights: dict[str, Tensor]) -> None:
        a_scale, a_zp, b_scale, b_zp, y_scale, y_zp = (weights[self.names[i]] for i in (1, 2, 4, 5, 6, 7))
        scales = [_f32(a_scale), _f32(b_scale), _f32(y_scale)]
        # the reference's inverse: 1 / scale in float64, rounded to float32 (numerics.quantize)
        inv = float((1.0 / y_scale.reshape(()).to(torch.float64)).to(torch.float32))
        zps = [int(t.reshape(())) for t in (a_zp, b_zp, y_zp)]
        finite = all(math.isfinite(v) for v in [*scales, inv])
        lo, hi, _ = QTYPES[self.out_dtype]
        # a zero or non-finite scale can make NaN (0 / 0, inf - inf), which the reference turns into some code;
        # a zero point no code type has is the reference's to refuse
        self.native = finite and scales[2] != 0 and all(-255 <= z <= 255 for z in zps[:2]) \
            and lo <= zps[2] <= hi
        self.steps = (*zps[:2], int(self.relu), int(self.multiply), *scales, inv, float(zps[2]), float(lo),
                      float(hi))

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        library = _kernel.for_call() if self.native else None
        if library is None:
            self.reference.run(inputs, outputs)
            return
        a, b, out = inputs[0], inputs[3], outputs[0]
        flat = [_storage_order(t) for t in (a, b, out)]
        # one element order for all three: contiguous, or one dense permuted layout (equal strides, equal order)
        alike = all(t.is_contiguous() for t in (a, b, out)) or (
            a.stride() == b.stride() == out.stride() and all(v is not None for v in flat))
        if alike:
            va, vb, vy = flat
        else:  # stored differently: contiguous copies in, a contiguous result copied into the arena's view
            va, vb, vy = a.contiguous(), b.contiguous(), torch.empty(out.shape, dtype=out.dtype)
        self._call(library, va, vb, vy)
        if not alike:
            out.copy_(vy)

    def _call(self, library: Library, a: Tensor, b: Tensor, y: Tensor) -> None:
        n = y.numel()
        ap, at, an = cpu_gemv_build.tensor_arg(a, self.kind, "a", _CODES, tuple(y.shape))
        bp, bt, bn = cpu_gemv_build.tensor_arg(b, self.kind, "b", _CODES, tuple(y.shape))
        yp, yt, yn = cpu_gemv_build.tensor_arg(y, self.kind, "out", {getattr(torch, self.out_dtype): _CODES[
            getattr(torch, self.out_dtype)]}, tuple(y.shape))
        # an output over exactly an input's bytes is safe (each element read before it is written); a partial
        # overlap is not: through a temporary
        if any(cpu_gemv_build.overlaps(p, size, yp, yn) and p != yp for p, size in ((ap, an), (bp, bn))):
            tmp = torch.empty_like(y)
            self._call(library, a, b, tmp)
            y.copy_(tmp)
            return
        args = _ARGS.pack(ap, bp, yp, n, at, bt, yt, self.steps[0], self.steps[1], self.steps[2], self.steps[3],
                          torch.get_num_threads(), min(library.isa, _isa_cap()), *self.steps[4:])
        status = library.lib.qadd_packed(args)
        if status != 0:
            raise RuntimeError(f"{self.kind}: the native kernel refused its arguments (status {status})")


__all__ = ["ISAS", "QAdd", "native_status"]
