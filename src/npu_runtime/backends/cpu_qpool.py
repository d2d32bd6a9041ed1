"""QMAXPOOL on the CPU backend: a max pool of int8/uint8 codes, bit-exact with its reference
(``torch_ir.ops.npu_quant.qmaxpool``, the QDQ chain DEQUANTIZE, max_pool2d, QUANTIZE it replaces).

For a finite x_scale, ``(q - zp) · s`` rounded to float32 is monotone in the code ``q``, so each window's float
maximum is the dequantized value of its largest code (its smallest when ``s < 0``), and y's code depends on that one
code only. So the C kernel (``qpool.c`` beside this file, compiled on first use) pools the codes and maps each
window's code through a 256-entry table that :meth:`QMaxPool.prepare` computes by running the reference on every
code, when the weights are bound: the table is the reference's by construction. A table that gives each code back
(one scale and zero point: what a QDQ model's pool has) is skipped. A stem pool of ResNet (64 x 112 x 112 codes)
takes 0.07-0.15 ms on two threads (NHWC, NCHW), where DEQUANTIZE, the float pool and QUANTIZE took ~1.4 ms.

It runs when the scales and zero points are per tensor and known at bind time, x_scale is finite (an infinite one
makes NaN, which the reference's pool propagates), x is 4-D, and every window holds an element of x (padding is
-inf in torch; a window of padding only, possible with dilation, pools -inf: the reference's to compute). Layouts:
x's rows contiguous (NCHW) or its channels (the arena's NHWC bytes seen as NCHW), else a contiguous copy; y in any
dense layout, else a temporary. ``TORCH_IR_QPOOL_ISA`` (``c``, ``avx2``, ``avx512``) caps the ISA, for tests.
"""

from __future__ import annotations

import math
import struct

import torch

from npu_program.program import Dispatch, TensorSpec, block_of

from . import cpu_gemv_build
from .cpu_gemv_build import Library
from .cpu_kernels import Reference
from .cpu_qelementwise import storage_dims

Tensor = torch.Tensor

SOURCE_NAME = "qpool.c"
ISAS: dict[str, int] = {"c": 0, "avx2": 1, "avx512": 2}
_ISA_NAMES = {code: name for name, code in ISAS.items()}
_CODES = ("int8", "uint8")
#: ``qpool_packed``'s argument block (``QPoolArgs`` of ``qpool.c``)
_ARGS = struct.Struct("<29q")


def _isa_cap() -> int:
    return cpu_gemv_build.isa_cap("TORCH_IR_QPOOL_ISA", ISAS)


_kernel = cpu_gemv_build.NativeKernel(
    "quantized max pool", lambda: cpu_gemv_build.load_packed(SOURCE_NAME, "qpool"),
    lambda library: _ISA_NAMES[min(library.isa, _isa_cap())], "QMAXPOOL runs its reference implementation")


def native_status() -> str:
    """One line: which implementation the QMAXPOOL kernel runs here, and why."""
    return _kernel.status()


def _window(params: dict) -> tuple[list[int], ...] | None:
    """(kernel, stride, padding, dilation) as [h, w] lists of ints, None when any is not."""
    pairs = tuple(params.get(k) for k in ("kernel_size", "stride", "padding", "dilation"))
    ok = all(isinstance(v, list) and len(v) == 2 and all(isinstance(d, int) and not isinstance(d, bool) for d in v)
             for v in pairs)
    return pairs if ok else None  # type: ignore[return-value]


def _covers(size: int, out: int, k: int, s: int, p: int, d: int) -> bool:
    """Whether every window of ``out`` along a dim of ``size`` holds at least one element (not padding only)."""
    return all(any(0 <= o * s - p + i * d < size for i in range(k)) for o in range(out))


class QMaxPool:
    """QMAXPOOL of 8-bit codes with per-tensor scales (module docstring)."""

    kind = "QMAXPOOL"

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        p, names = dispatch.params, dispatch.inputs
        window = _window(p)
        if window is None or len(names) != 5 or len(dispatch.outputs) != 1:
            return False
        x, y = specs.get(names[0]), specs.get(dispatch.outputs[0])
        if x is None or y is None or block_of(x) is not None or x.dtype not in _CODES \
                or y.dtype != p.get("out_dtype", "int8") or len(x.shape) != 4 or len(y.shape) != 4:
            return False
        if p.get("method", "divide") not in ("divide", "multiply_inverse") or any(
                n not in weight_names or n not in specs or math.prod(specs[n].shape) != 1 for n in names[1:]):
            return False
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = window
        if min(kh, kw, sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
            return False
        (_, _, h, w), (_, _, oh, ow) = x.shape, y.shape
        return _covers(int(h), int(oh), kh, sh, ph, dh) and _covers(int(w), int(ow), kw, sw, pw, dw)

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        self.dispatch, self.names = dispatch, dispatch.inputs
        self.window = _window(dispatch.params)
        self.signed = specs[self.names[0]].dtype == "int8"
        self.reference = Reference(dispatch, specs)
        # the shapes accepts checked every window against
        self.shapes = (tuple(specs[self.names[0]].shape), tuple(specs[dispatch.outputs[0]].shape))
        self.native = False  # set by prepare: a finite x_scale
        self.table = torch.zeros(256, dtype=torch.uint8)
        self.flip = 0
        self.identity = False

    def prepare(self, weights: dict[str, Tensor]) -> None:
        from torch_ir.ops.npu_quant import qmaxpool

        x_scale = float(weights[self.names[1]].reshape(()).to(torch.float32))
        self.native = math.isfinite(x_scale)
        if not self.native:
            return
        # every code, in byte order, through the reference itself (a 1 x 1 pool): y's code for each x code
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        codes = codes.view(torch.int8) if self.signed else codes
        p = self.dispatch.params
        y = qmaxpool(codes.reshape(1, 1, 1, 256), *(weights[n] for n in self.names[1:]), kernel_size=[1, 1],
                     stride=[1, 1], padding=[0, 0], dilation=[1, 1], out_dtype=p.get("out_dtype", "int8"),
                     method=p.get("method", "divide"))
        by_byte = y.reshape(256).view(torch.uint8)
        # the byte an unsigned max compares: the code's order (int8: sign bit flipped), reversed for s < 0
        self.flip = (0x80 if self.signed else 0) ^ (0xFF if x_scale < 0 else 0)
        self.table = by_byte[torch.arange(256) ^ self.flip].contiguous()
        self.identity = bool(torch.equal(by_byte, torch.arange(256, dtype=torch.int32).to(torch.uint8)))

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        library = _kernel.or_reference(self.native, self.reference, inputs, outputs)
        if library is None:
            return
        x, out = inputs[0], outputs[0]
        if out.numel() == 0:
            return
        if not (x.stride(3) == 1 or x.stride(1) == 1) or storage_dims(x) is None:
            x = x.contiguous()
        y = out if storage_dims(out) is not None else torch.empty(out.shape, dtype=out.dtype)
        xp, _, xn = cpu_gemv_build.tensor_arg(x.permute(storage_dims(x)), self.kind, "x", {x.dtype: 0})
        yp, _, yn = cpu_gemv_build.tensor_arg(y.permute(storage_dims(y)), self.kind, "out", {y.dtype: 0})
        if cpu_gemv_build.overlaps(xp, xn, yp, yn):
            y = torch.empty(out.shape, dtype=out.dtype)
            yp = y.data_ptr()
        self._call(library, x, xp, y, yp)
        if y is not out:
            out.copy_(y)

    def _call(self, library: Library, x: Tensor, xp: int, y: Tensor, yp: int) -> None:
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.window
        if (tuple(x.shape), tuple(y.shape)) != self.shapes:
            raise ValueError(f"{self.kind}: x {tuple(x.shape)} and out {tuple(y.shape)} are not the program's "
                             f"{self.shapes[0]} and {self.shapes[1]}")
        n, c, h, w = x.shape
        args = _ARGS.pack(xp, yp, self.table.data_ptr(), self.flip, int(self.identity), n, c, h, w, y.shape[2],
                          y.shape[3], kh, kw, sh, sw, ph, pw, dh, dw, *x.stride(), *y.stride(),
                          torch.get_num_threads(), min(library.isa, _isa_cap()))
        status = library.lib.qpool_packed(args)
        if status != 0:
            raise RuntimeError(f"{self.kind}: the native kernel failed (status {status}: out of memory)")

