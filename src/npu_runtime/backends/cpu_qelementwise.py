"""The native quantized elementwise kernels of the CPU backend: QADD, QMUL, QUANTIZE, DEQUANTIZE and QLUT, bit-exact
with their references (``torch_ir.ops.npu_quant.qadd``, the QDQ chain DEQUANTIZE, add, relu, QUANTIZE it replaces;
``qmul``, the same with a product and no relu; ``torch_ir.quant.numerics.quantize`` and ``dequantize``).

A QDQ ResNet's residual adds, as four reference dispatches with float32 intermediates, cost about as much as all its
convolutions on one thread; QADD is one pass over the codes. The C kernel (``qelementwise.c`` beside this file,
compiled on first use) does the reference's float32 steps per element in its order (dequantize each input, add,
relu, divide by y_scale or multiply by its float32 inverse, round half to even, + y_zp, clamp), vectorized by the
compiler for AVX-512, AVX2 or plain C, chosen at run time (``TORCH_IR_QADD_ISA``: ``c``, ``avx2``, ``avx512`` caps
it, for tests and comparisons).

It takes int8/uint8 codes, one scale and zero point per tensor (known at bind time: weights or constants), finite
scales and a nonzero y_scale, and a, b and y of one shape or one operand repeated along y's trailing dims (a bias
``[N]`` against ``[..., N]``, passed to the kernel as b, since ``a + b`` is ``b + a`` bit for bit; contiguous or
copied) (``accepts``; any other QADD runs the reference, which also broadcasts and raises where it must). Layouts:
the arena may hand 4-D tensors as strided views (NHWC bytes seen as NCHW); when the three are stored alike (same
strides, dense) the kernel runs over their bytes in storage order, else it reads contiguous copies and copies the
result in. An output that partly overlaps an input is written through a temporary. When the kernel cannot be had the
reference runs and one warning says why.

QUANTIZE (float32, or bfloat16/float16 widened exactly, to int8/uint8 codes: either method, qmin/qmax) and
DEQUANTIZE (int8/uint8 codes or an int32 bias to float32 or bfloat16) take scales and zero points known at bind time,
per tensor or per channel (``axis``; not per group), finite nonzero scales (and a finite inverse for
multiply_inverse), x and y of one shape; the same layouts and overlaps as QADD (``TORCH_IR_QDQ_ISA`` caps their
ISA). A QDQ BERT-base runs ~690 of them: through the reference, with its float32 temporaries, they took ~40 % of
its time (issue 30); a pass over the bytes takes a few microseconds.

QLUT (a quantized elementwise chain as a table, ``torch_ir.quant.lut``) computes its 256-entry table when the weights
are bound, by the op's own numerics (``lut.table``), so the table is the reference's by construction; each run is
one lookup per element (``qlut_map``: 32 at a time on AVX2 by byte shuffles of the table's 16-byte rows, else one
byte load each; ``TORCH_IR_QDQ_ISA`` caps it). It takes int8/uint8 codes, per-tensor scales and zero points known at
bind time, and x and y of one shape (the same layouts and overlaps as QADD).
"""

from __future__ import annotations

import ctypes
import math
import struct

import torch

from npu_program.program import Dispatch, TensorSpec, block_of
from torch_ir.quant import lut
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
#: ``qadd_packed``'s argument block: 15 int64 then 7 doubles (``QAddArgs``)
_ARGS = struct.Struct("<15q7d")


def _build() -> Library:
    library = cpu_gemv_build.load_packed(SOURCE_NAME, "qadd")
    # QUANTIZE's and DEQUANTIZE's entry point, in the same library
    library.lib.qdq_packed.argtypes, library.lib.qdq_packed.restype = [ctypes.c_char_p], ctypes.c_int
    # QLUT's: x, y, n, table, threads, isa
    library.lib.qlut_map.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                     ctypes.c_int64, ctypes.c_int64]
    library.lib.qlut_map.restype = ctypes.c_int
    return library


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


def storage_dims(t: Tensor) -> list[int] | None:
    """The dims of ``t`` in storage order when ``t.permute`` of them is contiguous (a dense tensor in any dim
    order: NHWC bytes seen as NCHW), else None."""
    if t.is_contiguous():
        return list(range(t.dim()))
    order = sorted(range(t.dim()), key=lambda d: (-t.stride(d), -d))
    return order if t.permute(order).is_contiguous() else None


def _alike(*tensors: Tensor) -> list[int] | None:
    """The dims in storage order that every one of ``tensors`` shares (contiguous ones: 0, 1, ...; the arena's
    NHWC bytes seen as NCHW: 0, 2, 3, 1), so that the kernel can run over their bytes as they lie; None when they
    are stored differently or not densely (then the caller goes through contiguous copies)."""
    first = tensors[0]
    if all(t.is_contiguous() for t in tensors):  # strides of size-1 dims may differ: no matter
        return list(range(first.dim()))
    if any(t.stride() != first.stride() for t in tensors[1:]):
        return None
    return storage_dims(first)


def _repeats(shape: list, y_shape: list) -> int | None:
    """0 when an operand of ``shape`` has y's shape; P when it is P elements repeated along y (its dims past
    leading 1s are y's trailing dims: a bias ``[N]`` against ``[..., N]``); None for any other broadcast."""
    if list(shape) == list(y_shape):
        return 0
    dims = list(shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    if len(dims) > len(y_shape) or dims != list(y_shape)[len(y_shape) - len(dims):]:
        return None
    return math.prod(dims)


class QAdd:
    """QADD: int8/uint8 codes, per-tensor scales and zero points, a and b of y's shape or one of them repeated
    along y's trailing dims (module docstring)."""

    kind = "QADD"
    mul = 0  # the kernel's operation: 0 the sum, 1 the product (QMul)

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        p, names = dispatch.params, dispatch.inputs
        if p.get("out_dtype", "int8") not in ("int8", "uint8") or p.get("activation") not in (None, "relu") \
                or p.get("method", "divide") not in ("divide", "multiply_inverse") or len(names) != 8 \
                or (cls.mul and p.get("activation") is not None):
            return False
        a, b, y = specs.get(names[0]), specs.get(names[3]), specs.get(dispatch.outputs[0])
        if a is None or b is None or y is None or any(block_of(t) is not None for t in (a, b)):
            return False
        if a.dtype not in ("int8", "uint8") or b.dtype not in ("int8", "uint8") or y.dtype != p.get("out_dtype",
                                                                                                    "int8"):
            return False
        ra, rb = _repeats(a.shape, y.shape), _repeats(b.shape, y.shape)
        if not ((ra == 0 and rb is not None) or (rb == 0 and ra is not None)):
            return False  # another broadcast: the reference
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
        a, b, y = (list(specs[n].shape) for n in (self.names[0], self.names[3], dispatch.outputs[0]))
        # the repeated operand is passed as b: a + b is b + a in IEEE arithmetic (a · b is b · a), so the swap
        # changes no bit
        self.swap = _repeats(b, y) == 0 and _repeats(a, y) != 0
        self.period = _repeats(a if self.swap else b, y) or 0

    def prepare(self, weights: dict[str, Tensor]) -> None:
        order = (4, 5, 1, 2, 6, 7) if self.swap else (1, 2, 4, 5, 6, 7)
        a_scale, a_zp, b_scale, b_zp, y_scale, y_zp = (weights[self.names[i]] for i in order)
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
        library = _kernel.or_reference(self.native, self.reference, inputs, outputs)
        if library is None:
            return
        a, b, out = (inputs[3], inputs[0], outputs[0]) if self.swap else (inputs[0], inputs[3], outputs[0])
        if self.period:  # y's element order is row-major here: contiguous tensors (or copies)
            vy = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype)
            self._call(library, a.contiguous(), b.contiguous(), vy)
            if vy is not out:
                out.copy_(vy)
            return
        order = _alike(a, b, out)  # one element order for all three: their bytes as they lie
        if order is not None:
            self._call(library, a.permute(order), b.permute(order), out.permute(order))
            return
        # stored differently: contiguous copies in, a contiguous result copied into the arena's view
        vy = torch.empty(out.shape, dtype=out.dtype)
        self._call(library, a.contiguous(), b.contiguous(), vy)
        out.copy_(vy)

    def _call(self, library: Library, a: Tensor, b: Tensor, y: Tensor) -> None:
        n = y.numel()
        ap, at, an = cpu_gemv_build.tensor_arg(a, self.kind, "a", _CODES, tuple(y.shape))
        bp, bt, bn = cpu_gemv_build.tensor_arg(b, self.kind, "b", _CODES, tuple(b.shape if self.period else y.shape))
        yp, yt, yn = cpu_gemv_build.tensor_arg(y, self.kind, "out", {getattr(torch, self.out_dtype): _CODES[
            getattr(torch, self.out_dtype)]}, tuple(y.shape))
        # an output over exactly an input's bytes is safe (each element read before it is written); a partial
        # overlap is not: through a temporary
        if any(cpu_gemv_build.overlaps(p, size, yp, yn) and p != yp for p, size in ((ap, an), (bp, bn))):
            tmp = torch.empty_like(y)
            self._call(library, a, b, tmp)
            y.copy_(tmp)
            return
        if self.period and (b.numel() != self.period or n % self.period):
            raise RuntimeError(f"{self.kind}: {b.numel()} repeated codes do not tile {n} outputs")
        args = _ARGS.pack(ap, bp, yp, n, at, bt, yt, self.steps[0], self.steps[1], self.steps[2], self.steps[3],
                          torch.get_num_threads(), min(library.isa, _isa_cap()), self.period, self.mul,
                          *self.steps[4:])
        status = library.lib.qadd_packed(args)
        if status != 0:
            raise RuntimeError(f"{self.kind}: the native kernel refused its arguments (status {status})")


class QMul(QAdd):
    """QMUL: ``quantize(dequantize(a) · dequantize(b))``, on QADD's terms and kernel (its float32 product in place of
    the sum; no activation)."""

    kind = "QMUL"
    mul = 1


# ------------------------------------------------------------------------------------------ QUANTIZE, DEQUANTIZE

#: ``qdq_packed``'s argument block: 14 int64 then 2 doubles (``QdqArgs`` of ``qelementwise.c``)
_QDQ_ARGS = struct.Struct("<14q2d")
#: QUANTIZE's float inputs and DEQUANTIZE's outputs (``F_*``), DEQUANTIZE's codes (``T_*``)
_FLOATS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_OUT_FLOATS = {torch.float32: 0, torch.bfloat16: 1}
_DQ_CODES = {**_CODES, torch.int32: 2}


def _qdq_isa(library: Library) -> int:
    return min(library.isa, cpu_gemv_build.isa_cap("TORCH_IR_QDQ_ISA", ISAS))


class _QuantizeOrDequantize:
    """QUANTIZE or DEQUANTIZE of one tensor, scales and zero points per tensor or per channel (``axis``), known at
    bind time; x and y of one shape, stored alike or through copies (as QAdd)."""

    kind = ""
    x_dtypes: tuple[str, ...] = ()
    y_dtypes: tuple[str, ...] = ()

    @classmethod
    def _y_dtype(cls, params: dict) -> str:
        raise NotImplementedError

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        p, names = dispatch.params, dispatch.inputs
        if p.get("group_size") is not None or len(names) not in (2, 3) or len(dispatch.outputs) != 1:
            return False
        x, y = specs.get(names[0]), specs.get(dispatch.outputs[0])
        if x is None or y is None or block_of(x) is not None or x.dtype not in cls.x_dtypes \
                or y.dtype not in cls.y_dtypes or y.dtype != cls._y_dtype(p) or list(x.shape) != list(y.shape):
            return False
        if cls.kind == "DEQUANTIZE" and x.dtype != p.get("dtype"):
            return False
        if any(n not in weight_names or n not in specs for n in names[1:]):
            return False
        sizes = [_numel(specs[n]) for n in names[1:]]
        if all(k == 1 for k in sizes):
            return True
        axis, rank = p.get("axis"), len(x.shape)
        return axis is not None and -rank <= axis < rank and all(k in (1, x.shape[axis]) for k in sizes)

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        p, x = dispatch.params, specs[dispatch.inputs[0]]
        self.names = dispatch.inputs
        self.multiply = p.get("method", "divide") == "multiply_inverse"
        sizes = [_numel(specs[n]) for n in self.names[1:]]
        # the channel dim, None per tensor (numerics.expand: one element is per tensor whatever axis says)
        self.axis = None if all(k == 1 for k in sizes) else p["axis"] % len(x.shape)
        self.channels = 1 if self.axis is None else int(x.shape[self.axis])
        self.reference = Reference(dispatch, specs)
        self.native = False  # set by prepare when every condition of exactness holds
        self.params: tuple[Tensor, ...] = ()  # scale, inverse, zero point per channel (set by prepare)
        self.param_ptrs: list[int] = []
        self.bounds = (0, 0)
        # elements per channel run of a contiguous x (per tensor: all of them, one run)
        self.inner = _numel(x) if self.axis is None else math.prod(x.shape[self.axis + 1:])

    def _per_channel(self, t: Tensor, dtype: torch.dtype) -> Tensor:
        return t.reshape(-1).to(dtype).expand(self.channels).contiguous()

    def _scales(self, weights: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """The scales and inverses as the reference computes them: float32, and float64's 1 / scale in float32."""
        scale = weights[self.names[1]]
        s = self._per_channel(scale, torch.float32)
        inv = self._per_channel(1.0 / scale.to(torch.float64), torch.float32)
        # a zero or non-finite scale makes NaN and inf of finite values: the reference's to define
        self.native = bool(torch.isfinite(s).all() and (s != 0).all()
                           and (not self.multiply or torch.isfinite(inv).all()))
        return s, inv

    def _set_params(self, s: Tensor, inv: Tensor, zp: Tensor) -> None:
        """Kept for the kernel's life, each checked once: the C code reads ``channels`` values of each."""
        self.params = (s, inv, zp)
        self.param_ptrs = [cpu_gemv_build.tensor_arg(t, self.kind, what, {t.dtype: 0}, (self.channels,))[0]
                           for t, what in zip(self.params, ("scale", "inverse", "zero point"))]

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        library = _kernel.or_reference(self.native, self.reference, inputs, outputs)
        if library is None:
            return
        x, out = inputs[0], outputs[0]
        if out.numel() == 0:
            return
        order = _alike(x, out)
        if order is not None:
            self._call(library, x.permute(order), out.permute(order), order)
            return
        # stored differently: a contiguous copy in, a contiguous result copied into the arena's view
        y = torch.empty(out.shape, dtype=out.dtype)
        self._call(library, x.contiguous(), y, None)
        out.copy_(y)

    def _call(self, library: Library, x: Tensor, y: Tensor, order: list[int] | None) -> None:
        """The kernel over x and y, contiguous (``order``: the dims of the tensors they are permutations of, None
        when they are those tensors)."""
        shape = tuple(y.shape)
        xp, xt, xn = cpu_gemv_build.tensor_arg(x, self.kind, "x", self._x_codes, shape)
        yp, yt, yn = cpu_gemv_build.tensor_arg(y, self.kind, "out", self._y_codes, shape)
        # an output over exactly its input's bytes, element for element, is safe; any other overlap is not
        if cpu_gemv_build.overlaps(xp, xn, yp, yn) and (xp != yp or xn != yn):
            tmp = torch.empty_like(y)
            self._call(library, x, tmp, order)
            y.copy_(tmp)
            return
        inner = self.inner
        if order is not None and self.axis is not None:  # runs of the dims stored after the channel's
            inner = math.prod(shape[order.index(self.axis) + 1:])
        args = _QDQ_ARGS.pack(xp, yp, *self.param_ptrs, y.numel(), self.channels, max(inner, 1), xt, yt,
                              int(self.kind == "QUANTIZE"), int(self.multiply), torch.get_num_threads(),
                              _qdq_isa(library), *map(float, self.bounds))
        status = library.lib.qdq_packed(args)
        if status != 0:
            raise RuntimeError(f"{self.kind}: the native kernel refused its arguments (status {status})")


class Quantize(_QuantizeOrDequantize):
    """QUANTIZE of float32/bfloat16/float16 to int8/uint8 codes (``numerics.quantize``, either method, qmin/qmax)."""

    kind = "QUANTIZE"
    x_dtypes = ("float32", "bfloat16", "float16")
    y_dtypes = ("int8", "uint8")
    _x_codes = _FLOATS
    _y_codes = _CODES

    @classmethod
    def _y_dtype(cls, params: dict) -> str:
        return params.get("dtype", "")

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        super().__init__(dispatch, specs)
        p = dispatch.params
        lo, hi, _ = QTYPES[p["dtype"]]
        qmin, qmax = p.get("qmin"), p.get("qmax")
        # numerics.quantize's bounds; the kernel takes them inside the type's range (exact float32 values)
        self.bounds = (max(lo, qmin) if qmin is not None else lo, min(hi, qmax) if qmax is not None else hi)
        self.in_range = lo <= self.bounds[0] <= self.bounds[1] <= hi

    def prepare(self, weights: dict[str, Tensor]) -> None:
        s, inv = self._scales(weights)
        zp = weights[self.names[2]] if len(self.names) > 2 else torch.zeros(())  # + 0.0: the same codes as none
        self._set_params(s, inv, self._per_channel(zp, torch.float32))
        self.native = self.native and self.in_range


class Dequantize(_QuantizeOrDequantize):
    """DEQUANTIZE of int8/uint8 codes or int32 (a bias) to float32 or bfloat16 (``numerics.dequantize``)."""

    kind = "DEQUANTIZE"
    x_dtypes = ("int8", "uint8", "int32")
    y_dtypes = ("float32", "bfloat16")
    _x_codes = _DQ_CODES
    _y_codes = _OUT_FLOATS

    @classmethod
    def _y_dtype(cls, params: dict) -> str:
        return params.get("out_dtype", "float32")

    def prepare(self, weights: dict[str, Tensor]) -> None:
        s, inv = self._scales(weights)
        zp = weights[self.names[2]] if len(self.names) > 2 else torch.zeros((), dtype=torch.int32)
        self._set_params(s, inv, self._per_channel(zp, torch.int32))


# ------------------------------------------------------------------------------------------------------ QLUT

class QLut:
    """QLUT of int8/uint8 codes with per-tensor scales known at bind time (module docstring)."""

    kind = "QLUT"

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        p, names = dispatch.params, dispatch.inputs
        if len(names) != 5 or len(dispatch.outputs) != 1 or p.get("method", "divide") not in ("divide",
                                                                                            "multiply_inverse"):
            return False
        x, y = specs.get(names[0]), specs.get(dispatch.outputs[0])
        if x is None or y is None or block_of(x) is not None or x.dtype not in lut.CODES \
                or y.dtype != p.get("out_dtype", "int8") or list(x.shape) != list(y.shape):
            return False
        try:
            lut.check_steps(p.get("functions"), p.get("numbers") or [])
        except ValueError:
            return False  # the reference says what is wrong
        return all(n in weight_names and n in specs and _numel(specs[n]) == 1 for n in names[1:])

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        self.dispatch, self.names = dispatch, dispatch.inputs
        self.x_dtype = specs[self.names[0]].dtype
        self.reference = Reference(dispatch, specs)
        self.table = torch.zeros(256, dtype=torch.uint8)

    def prepare(self, weights: dict[str, Tensor]) -> None:
        codes = lut.table_of(self.x_dtype, [weights[n] for n in self.names[1:]], self.dispatch.params)
        self.table = codes.view(torch.uint8).contiguous()

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        library = _kernel.or_reference(True, self.reference, inputs, outputs)
        if library is None:
            return
        x, out = inputs[0], outputs[0]
        order = _alike(x, out)
        if order is not None:
            self._call(library, x.permute(order), out.permute(order))
            return
        y = torch.empty(out.shape, dtype=out.dtype)
        self._call(library, x.contiguous(), y)
        out.copy_(y)

    def _call(self, library: Library, x: Tensor, y: Tensor) -> None:
        codes = {torch.uint8: 0, torch.int8: 0}
        xp, _, xn = cpu_gemv_build.tensor_arg(x, self.kind, "x", codes, tuple(y.shape))
        yp, _, yn = cpu_gemv_build.tensor_arg(y, self.kind, "out", codes, tuple(y.shape))
        if cpu_gemv_build.overlaps(xp, xn, yp, yn) and (xp != yp or xn != yn):
            tmp = torch.empty_like(y)
            self._call(library, x, tmp)
            y.copy_(tmp)
            return
        status = library.lib.qlut_map(xp, yp, y.numel(), self.table.data_ptr(), torch.get_num_threads(),
                                      _qdq_isa(library))
        if status != 0:
            raise RuntimeError(f"{self.kind}: the native kernel refused its arguments (status {status})")


__all__ = ["ISAS", "Dequantize", "QAdd", "QLut", "QMul", "Quantize", "native_status"]
