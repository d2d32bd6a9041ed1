"""Native QGEMM of two activations on the CPU backend (attention's Q·Kᵀ and P·V in a QDQ transformer), bit-exact
with the op's reference (``torch_ir.ops.npu_quant.qgemm``).

``cpu_qconv.QGemm`` is the one CPU implementation of QGEMM; when its second operand is not known at bind time it
hands the dispatch to :class:`QMatMul` here. The C kernel (``qmatmul.c``) is compiled as one translation unit with
``qconv.c``, whose panels, micro-kernels and requantize it reuses:

* x and w uint8 or int8 (each its own), one scale and zero point each, known at bind time, as are the bias (int32, or
  float: made int32 by ``int_bias``) and y's scale and zero point; x ``[..., M, K]``, w ``[..., K, N]`` (or
  ``[..., N, K]`` with ``trans_b``) with the same leading dims (a broadcast is refused: the reference runs); y as
  ``_finish`` makes it (int8/uint8 requantized, relu fused; int32; float32);
* per call and batch, x is packed as the signed operand (uint8 codes with their sign bit flipped: x - 128) and w's
  columns become the unsigned panels (int8: w + 128); the zero points' shares are one int32 per row and one per
  column (``qmatmul.c`` says how), so the sums are exact in int32. Prepare bounds every sum
  (``K · max|x - x_zp| · max|w - w_zp| + max|bias|``): where an int32 accumulator could overflow (the reference
  raises) or the multiplier is not finite, the reference runs, so no result differs;
* AVX-512 VNNI, AVX2 or portable C, as ``qconv.c`` (``TORCH_IR_QCONV_ISA`` caps both); torch's OpenMP threads take
  the batches' packing, then items of (batch, block of 64 columns, group of row tiles).
"""

from __future__ import annotations

import ctypes
import math
import struct

import torch

from npu_program.program import Dispatch, TensorSpec, block_of
from torch_ir.ops.npu_quant import int_bias
from torch_ir.quant import numerics as qn
from torch_ir.quant.spec import QTYPES

from . import cpu_gemv_build, cpu_qconv
from .cpu_gemv_build import Library
from .cpu_kernels import Reference
from .cpu_qconv import _ISA_NAMES, _OUT_DTYPE, OUT_CODES, _isa_cap, _numel, _scratch_for

Tensor = torch.Tensor

#: the sources of one translation unit, in order (``qmatmul.c`` uses ``qconv.c``'s static functions)
SOURCES = (*cpu_qconv.SOURCES, "qmatmul.c")
#: ``qmatmul_packed``'s argument block: 19 int64 then 4 doubles (``MArgs``)
_ARGS = struct.Struct("<19q4d")
_INT32_MAX = 2 ** 31 - 1


def _build() -> Library:
    library = cpu_gemv_build.load_packed(SOURCES, "qmatmul")
    size = library.lib.qmatmul_scratch_bytes
    size.argtypes, size.restype = [ctypes.c_int64] * 6, ctypes.c_int64
    return library


_kernel = cpu_gemv_build.NativeKernel(
    "int8 matmul of activations", _build, lambda library: _ISA_NAMES[min(library.isa, _isa_cap())],
    "QGEMM of two activations runs its reference implementation")


def native_status() -> str:
    """One line: which implementation QGEMM of two activations runs here, and why."""
    return _kernel.status()


def _span(dtype: str, zero_point: int) -> int:
    """The largest ``|code - zero_point|`` of ``dtype``'s codes."""
    lo, hi, _ = QTYPES[dtype]
    return int(max(zero_point - lo, hi - zero_point))


class QMatMul:
    """QGEMM whose second operand is an activation (see the module docstring)."""

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        p, names = dispatch.params, dispatch.inputs
        out_dtype = p.get("out_dtype", "int8")
        if out_dtype not in OUT_CODES or p.get("activation") not in (None, "relu") or names[1] in weight_names:
            return False
        if not all(n in weight_names for n in names[2:]):  # scales, zero points, bias: known at bind
            return False
        x, w, out = specs.get(names[0]), specs.get(names[1]), specs.get(dispatch.outputs[0])
        if x is None or w is None or out is None or x.dtype not in ("uint8", "int8") \
                or w.dtype not in ("uint8", "int8") or p.get("w_dtype", "int8") != w.dtype \
                or any(t.layout is not None or block_of(t) is not None for t in (x, w, out)):
            return False
        quantized = out_dtype in ("int8", "uint8")
        if len(names) != 6 + bool(p.get("has_bias")) + 2 * quantized:
            return False
        if any(_numel(specs[n]) != 1 for n in [*names[2:6], *(names[-2:] if quantized else [])]):
            return False  # per-tensor scales and zero points only
        return cls._shapes_ok(x.shape, w.shape, out.shape, bool(p.get("trans_b", True)))

    @staticmethod
    def _shapes_ok(x: list[int], w: list[int], out: list[int], trans_b: bool) -> bool:
        if len(x) < 2 or len(w) < 2 or math.prod(x) == 0:
            return False
        k, n = (w[-1], w[-2]) if trans_b else (w[-2], w[-1])
        lead_x, lead_w = list(x[:-2]), list(w[:-2])
        while lead_x and lead_x[0] == 1:
            lead_x.pop(0)
        while lead_w and lead_w[0] == 1:
            lead_w.pop(0)
        # the same batch dims (leading 1s aside): a broadcast of either operand keeps the reference
        return x[-1] == k and lead_x == lead_w and list(out) == [*x[:-1], n] and n > 0

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec], reference: Reference | None = None) -> None:
        p = dispatch.params
        self.names = dispatch.inputs
        self.out_dtype = p.get("out_dtype", "int8")
        self.relu = p.get("activation") == "relu"
        self.has_bias = bool(p.get("has_bias"))
        self.trans_b = bool(p.get("trans_b", True))
        x, w = specs[self.names[0]], specs[self.names[1]]
        self.x_dtype, self.w_dtype = x.dtype, w.dtype
        self.k = int(x.shape[-1])
        self.n = int(w.shape[-2] if self.trans_b else w.shape[-1])
        self.reference = reference or Reference(dispatch, specs)  # QGemm passes its own
        self.native = False  # set by prepare when every condition of exactness holds
        self.bias: Tensor | None = None
        self._sizes: dict[tuple, tuple[int, int, int]] = {}

    def prepare(self, weights: dict[str, Tensor]) -> None:
        self.native = self._prepare(*(weights[n] for n in self.names[2:6]), weights)

    def _prepare(self, x_scale: Tensor, x_zp: Tensor, w_scale: Tensor, w_zp: Tensor,
                 weights: dict[str, Tensor]) -> bool:
        """Fold the zero points and the bias; False when the kernel could not match the reference exactly (it then
        runs the reference, which also raises where it must)."""
        xz, wz = int(x_zp.reshape(())), int(w_zp.reshape(()))
        (xlo, xhi, _), (wlo, whi, _) = QTYPES[self.x_dtype], QTYPES[self.w_dtype]
        if not (xlo <= xz <= xhi and wlo <= wz <= whi):
            return False
        # x is the signed operand (uint8: x - 128), w the unsigned one (int8: w + 128); their zero points alike
        self.a_flip, self.az_s = (0x80, xz - 128) if self.x_dtype == "uint8" else (0, xz)
        self.b_flip, self.bz_u = (0x80, wz + 128) if self.w_dtype == "int8" else (0, wz)
        bias = torch.zeros(self.n, dtype=torch.int64)
        if self.has_bias:
            b = int_bias(weights[self.names[6]], x_scale, w_scale).reshape(-1)
            if b.numel() not in (1, self.n):
                return False
            bias = b.expand(self.n).to(torch.int64)
        # |Σ (x - x_zp)(w - w_zp)| <= K · span_x · span_w: below 2**31 with the bias, no int32 sum overflows
        if self.k * _span(self.x_dtype, xz) * _span(self.w_dtype, wz) + int(bias.abs().max()) > _INT32_MAX:
            return False
        self.bias = bias.to(torch.int32) if self.has_bias else None
        if self.bias is not None:
            self._bias_arg = cpu_gemv_build.tensor_arg(self.bias, "QGEMM", "bias", {torch.int32: 0}, (self.n,))
        if self.out_dtype in ("int8", "uint8"):
            y_scale, y_zp = (weights[nm] for nm in self.names[-2:])
            m = qn.requant_multiplier(x_scale.reshape(()), w_scale.reshape(()), y_scale.reshape(()))
            lo, hi, _ = QTYPES[self.out_dtype]
            self.zp = float(y_zp.reshape(-1)[0].to(torch.float32))
            self.lo, self.hi = (max(lo, self.zp) if self.relu else float(lo)), float(hi)
        else:
            m = x_scale.reshape(()).to(torch.float32) * w_scale.reshape(()).to(torch.float32)
            self.zp = self.lo = self.hi = 0.0
        self.m = float(m.to(torch.float32))  # a float32, exact as a double
        return bool(torch.isfinite(m.to(torch.float32)))

    def _check(self, key: tuple, library: Library) -> tuple[int, int, int]:
        """``(batch, M, scratch bytes)`` of a call whose shapes, threads and ISA are ``key``, after checking that
        the shapes fit the bound product; kept, so a program's repeated calls check once."""
        xs, ws, outs, threads, isa = key
        if len(xs) < 2 or xs[-1] != self.k or not self._shapes_ok(list(xs), list(ws), list(outs), self.trans_b):
            raise ValueError(f"QGEMM: x {tuple(xs)}, w {tuple(ws)} and out {tuple(outs)} do not fit a product over "
                             f"K={self.k} into N={self.n} columns (trans_b={self.trans_b})")
        m_rows = xs[-2]
        batch = math.prod(xs) // (m_rows * self.k)
        need = int(library.lib.qmatmul_scratch_bytes(batch, m_rows, self.n, self.k, threads, isa))
        if need < 0:
            raise ValueError(f"QGEMM: a product of {batch} x [{m_rows}, {self.k}] x [{self.k}, {self.n}] is past "
                             "the native kernel's sizes")
        if len(self._sizes) > 64:  # shapes that vary from call to call: keep the cache small
            self._sizes.clear()
        self._sizes[key] = batch, m_rows, need
        return batch, m_rows, need

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        library = _kernel.or_reference(self.native, self.reference, inputs, outputs)
        if library is None:
            return
        x, w, out = inputs[0].contiguous(), inputs[1].contiguous(), outputs[0]
        threads, isa = torch.get_num_threads(), min(library.isa, _isa_cap())
        key = (x.shape, w.shape, out.shape, threads, isa)
        batch, m_rows, need = self._sizes.get(key) or self._check(key, library)
        n, k = self.n, self.k
        wshape = (*w.shape[:-2], n, k) if self.trans_b else (*w.shape[:-2], k, n)
        xp, _, xn = cpu_gemv_build.tensor_arg(x, "QGEMM", "x", {getattr(torch, self.x_dtype): 0}, tuple(x.shape))
        wp, _, wn = cpu_gemv_build.tensor_arg(w, "QGEMM", "w", {getattr(torch, self.w_dtype): 0}, wshape)
        yp, _, yn = cpu_gemv_build.tensor_arg(out, "QGEMM", "out", {_OUT_DTYPE[self.out_dtype]: 0},
                                              tuple(out.shape))
        if cpu_gemv_build.overlaps(xp, xn, yp, yn) or cpu_gemv_build.overlaps(wp, wn, yp, yn):
            raise ValueError("QGEMM: out overlaps x or w")
        bp = self._bias_arg[0] if self.bias is not None else 0
        sp, _, sn = cpu_gemv_build.tensor_arg(_scratch_for(need), "QGEMM", "scratch", {torch.uint8: 0})
        args = _ARGS.pack(xp, wp, batch, m_rows, n, k, int(self.trans_b), self.a_flip, self.b_flip, self.az_s,
                          self.bz_u, bp, yp, OUT_CODES[self.out_dtype], sp, sn, threads, isa, int(self.relu),
                          self.m, self.zp, self.lo, self.hi)
        status = library.lib.qmatmul_packed(args)
        if status != 0:
            raise RuntimeError(f"QGEMM: the native kernel refused its arguments (status {status})")


__all__ = ["SOURCES", "QMatMul", "native_status"]
