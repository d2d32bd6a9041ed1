"""Native int8 QCONV / QGEMM on the CPU backend, bit-exact with the ops' reference (``torch_ir.ops.npu_quant``).

A quantized CNN (onnxruntime's ``quantize_static`` QDQ model, normalized into QCONV/QGEMM) spends its time in these
two ops; their reference runs the integer product in float64 through torch, several times slower than onnxruntime's
int8 kernels. This module runs them with a small C kernel (``qconv.c`` and its driver ``qconv_run.c`` beside this
file), compiled on first use:

* x uint8 or int8 with one zero point, weights int8 per output channel (or per tensor) with zero points 0, a bias
  (int32, or float: made int32 by the op's own ``int_bias``), y int8/uint8 (requantized, relu fused), int32 or
  float32 (``_finish``'s other outputs). Anything else (16-bit or 4-bit codes, weight zero points, groups, a
  scale or zero point computed at run time) is refused by ``accepts`` and keeps the reference;
* the products are summed exactly in int32: x as unsigned codes (int8 x: + 128, its sign bit flipped), the zero
  point's share ``x_zp · Σw`` and the bias folded into one int32 per output channel at prepare time. Prepare also
  bounds every sum (``255 · Σ|w| + |bias|``): a layer whose int32 accumulator could overflow (where the reference
  raises) or whose multiplier is not finite runs the reference instead, so no result differs;
* the requantize is the reference's float32 steps in order: ``float32(acc) · m`` with ``m`` computed by
  ``requant_multiplier`` itself, rint (ties to even), ``+ y_zp``, clamp (relu raises the floor to ``y_zp``);
* AVX-512 VNNI (``vpdpbusd``: unsigned x times signed w, 4 products a lane, no saturation), AVX2 (x and w widened
  to int16 and ``madd``: ``maddubs`` would saturate) or portable C, chosen at run time; ``TORCH_IR_QCONV_ISA``
  (``c``, ``avx2``, ``vnni``) caps it, for tests and comparisons;
* per image, x is copied once with a border of its zero point (a 1x1 convolution reads x itself, and so does a
  QGEMM, whose rows of K contiguous codes make each group of 4 k one 32-bit word: ``panel_rows``); torch's OpenMP
  threads then take panels of 64 output positions, each building the panel's im2col groups of 4 k (``[K/4][64][4]``
  bytes, in its own part of a scratch buffer kept per calling thread) just before running every tile of 8 output
  channels over it from L1/L2 (a small image's panels are split by channels too); the weights are prepacked once
  as lanes of 4 consecutive k per output channel; a tile keeps its sums in registers.

When the kernel cannot be had (no compiler, ``TORCH_IR_NATIVE_GEMV=0``) the reference runs and one warning says
why. Memory safety: every tensor the C code touches is checked by ``cpu_gemv_build.tensor_arg`` (dtype, shape,
contiguity, bytes in its storage), the output may not overlap x, and the scratch is sized by the C code's rule.
"""

from __future__ import annotations

import struct
import threading

import torch

from npu_program.program import Dispatch, TensorSpec, block_of
from torch_ir.ops.npu_quant import int_bias
from torch_ir.quant import numerics as qn
from torch_ir.quant.spec import QTYPES

from . import cpu_gemv_build
from .base import Kernel
from .cpu_gemv_build import Library
from .cpu_kernels import Reference, _pair

Tensor = torch.Tensor

#: the sources of the kernel, one translation unit in this order (the driver uses the kernels' static functions)
SOURCES = ("qconv.c", "qconv_run.c")
#: ``isa`` values: the kernel's codes (``qconv_isa`` in ``qconv.c``)
ISAS: dict[str, int] = {"c": 0, "avx2": 1, "vnni": 2}
_ISA_NAMES = {code: name for name, code in ISAS.items()}
#: output channels per tile (``QR``), positions per tile (``PANEL``) and per thread's im2col panel (``BLOCK``) of
#: ``qconv.c``
QR, PANEL, BLOCK = 8, 32, 64
#: the output types the kernel writes (``OUT_*`` of ``qconv.c``)
OUT_CODES = {"uint8": 0, "int8": 1, "int32": 2, "float32": 3}
_X_DTYPES = {torch.uint8: 0, torch.int8: 1}
#: ``qconv_packed``'s argument block: 38 int64 then 4 doubles (``QArgs``)
_ARGS = struct.Struct("<38q4d")
_INT32_MAX = 2 ** 31 - 1


def _build() -> Library:
    return cpu_gemv_build.load_packed(SOURCES, "qconv")


def _isa_cap() -> int:
    return cpu_gemv_build.isa_cap("TORCH_IR_QCONV_ISA", ISAS)


_kernel = cpu_gemv_build.NativeKernel(
    "int8 convolution", _build, lambda library: _ISA_NAMES[min(library.isa, _isa_cap())],
    "QCONV/QGEMM run their reference implementation")
_scratch = threading.local()


def native_status() -> str:
    """One line: which implementation the QCONV/QGEMM kernels run here, and why."""
    return _kernel.status()


def scratch_bytes(k4: int, channels: int, padded_h: int, padded_w: int, threads: int) -> int:
    """Scratch bytes of one call (``qconv_scratch_bytes`` of ``qconv.c``): one im2col panel per thread
    (``[K/4][64][4]``; ``threads`` below 1 counts as 1), then x's copy bordered by the zero point
    (``[C][H + 2 ph][W + 2 pw]``) and one row of the zero point."""
    return max(threads, 1) * k4 * BLOCK * 4 + channels * padded_h * padded_w + padded_w


def _scratch_for(nbytes: int) -> Tensor:
    """A byte buffer of at least ``nbytes``, kept per thread and grown as needed (kernels run one at a time)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < nbytes:
        buf = _scratch.buf = torch.empty(max(nbytes, 1 << 16), dtype=torch.uint8)
    return buf


# --------------------------------------------------------------------------------------------- the kernels


def _numel(spec: TensorSpec) -> int:
    n = 1
    for d in spec.shape:
        n *= int(d)
    return n


class _QContraction:
    """What QCONV and QGEMM share: the checks of ``accepts``, the prepacking and the call."""

    kind = ""

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        p, names = dispatch.params, dispatch.inputs
        if p.get("out_dtype", "int8") not in OUT_CODES or p.get("activation") not in (None, "relu"):
            return False
        if not all(n in weight_names for n in names[1:]):  # weights, scales, zero points and bias: known at bind
            return False
        x, w, out = specs.get(names[0]), specs.get(names[1]), specs.get(dispatch.outputs[0])
        if x is None or w is None or out is None or x.dtype not in ("uint8", "int8") or w.dtype != "int8" \
                or p.get("w_dtype", "int8") != "int8" or x.layout is not None or out.layout is not None:
            return False
        if any(block_of(specs[n]) is not None for n in names[:2]):  # GGUF blocks: not int8 codes
            return False
        quantized = p.get("out_dtype", "int8") in ("int8", "uint8")
        if len(names) != 6 + bool(p.get("has_bias")) + 2 * quantized:
            return False
        if any(_numel(specs[n]) != 1 for n in [*names[2:4], *(names[-2:] if quantized else [])]):
            return False  # one x scale and zero point, one y scale and zero point (the reference reads them so)
        return cls._shapes_ok(dispatch, specs)

    @classmethod
    def _shapes_ok(cls, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> bool:
        raise NotImplementedError

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        p = dispatch.params
        self.names = dispatch.inputs
        self.out_dtype = p.get("out_dtype", "int8")
        self.relu = p.get("activation") == "relu"
        self.has_bias = bool(p.get("has_bias"))
        self.reference = Reference(dispatch, specs)
        self.native = False  # set by prepare when every condition of exactness holds
        self.w: Tensor | None = None
        self.w2: Tensor | None = None
        self.off: Tensor | None = None
        self.m: Tensor | None = None

    # -- prepare

    def _weight_2d(self, w: Tensor) -> Tensor:
        """The weight as ``[N, K]`` int8, K in the order x's im2col rows take."""
        raise NotImplementedError

    def prepare(self, weights: dict[str, Tensor]) -> None:
        names = self.names
        w = self._weight_2d(weights[names[1]]).contiguous()
        x_scale, x_zp, w_scale, w_zp = (weights[n] for n in names[2:6])
        self.native = self._prepare(w, x_scale, x_zp, w_scale, w_zp, weights)

    def _prepare(self, w: Tensor, x_scale: Tensor, x_zp: Tensor, w_scale: Tensor, w_zp: Tensor,
                 weights: dict[str, Tensor]) -> bool:
        """Pack the weights and fold the per-channel terms; False when the kernel could not match the reference
        exactly (it then runs the reference, which also raises where it must)."""
        n, k = w.shape
        if w_scale.numel() not in (1, n) or w_zp.numel() not in (1, n) or bool((w_zp != 0).any()):
            return False
        zp = int(x_zp.reshape(()))
        self.flip = 0x80 if self.x_signed else 0
        self.zp_u = zp + 128 if self.x_signed else zp
        if not 0 <= self.zp_u <= 255:
            return False
        w64 = w.to(torch.int64)
        bias = torch.zeros(n, dtype=torch.int64)
        if self.has_bias:
            b = int_bias(weights[self.names[6]], x_scale, w_scale).reshape(-1)
            if b.numel() not in (1, n):
                return False
            bias = b.expand(n).to(torch.int64)
        # |Σ (x - zp) w| <= 255 Σ|w|: below 2**31 with the bias, no int32 sum (nor the reference's) overflows
        if int((255 * w64.abs().sum(1) + bias.abs()).max()) > _INT32_MAX:
            return False
        self.off = (bias - self.zp_u * w64.sum(1)).to(torch.int32)
        view = w_scale.reshape(-1) if w_scale.numel() > 1 else w_scale.reshape(())
        if self.out_dtype in ("int8", "uint8"):
            y_scale, y_zp = (weights[nm] for nm in self.names[-2:])
            m = qn.requant_multiplier(x_scale.reshape(()), view, y_scale.reshape(()))
            lo, hi, _ = QTYPES[self.out_dtype]
            self.zp = float(y_zp.reshape(-1)[0].to(torch.float32))
            self.lo, self.hi = (max(lo, self.zp) if self.relu else float(lo)), float(hi)
        else:
            m = x_scale.reshape(()).to(torch.float32) * view.to(torch.float32)
            self.zp = self.lo = self.hi = 0.0
        self.m = m.to(torch.float32).reshape(-1).expand(n).contiguous()
        if not bool(torch.isfinite(self.m).all()):
            return False
        self._pack(w)
        return True

    def _pack(self, w: Tensor) -> None:
        """``w [N, K]`` as ``[N/QR][K/4][QR]`` lanes of 4 int8 (VNNI, C) and the same lanes as 4 int16 (AVX2: one
        64-bit broadcast a row), zero-padded to whole tiles and groups."""
        n, k = w.shape
        self.n, self.k4 = n, -(-k // 4)
        nb = -(-n // QR)
        padded = torch.zeros(nb * QR, self.k4 * 4, dtype=torch.int8)
        padded[:n, :k] = w
        lanes = padded.reshape(nb, QR, self.k4, 4).permute(0, 2, 1, 3).contiguous()
        self.w = lanes
        self.w2 = lanes.to(torch.int16).contiguous()
        self._w_arg = cpu_gemv_build.tensor_arg(self.w, self.kind, "packed weight", {torch.int8: 0})
        self._w2_arg = cpu_gemv_build.tensor_arg(self.w2, self.kind, "packed weight", {torch.int16: 0})
        self._off_arg = cpu_gemv_build.tensor_arg(self.off, self.kind, "offsets", {torch.int32: 0}, (n,))
        self._m_arg = cpu_gemv_build.tensor_arg(self.m, self.kind, "multipliers", {torch.float32: 0}, (n,))

    # -- run

    @property
    def x_signed(self) -> bool:
        return self._x_dtype == "int8"

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        library = _kernel.or_reference(self.native, self.reference, inputs, outputs)
        if library is None:
            return
        x, out = inputs[0], outputs[0]
        if not x.is_contiguous():
            x = x.contiguous()
        geometry = self._geometry(x, out)
        xp, _, xn = cpu_gemv_build.tensor_arg(x, self.kind, "x", _X_DTYPES, tuple(x.shape))
        yp, _, yn = cpu_gemv_build.tensor_arg(out, self.kind, "out", {_OUT_DTYPE[self.out_dtype]: 0},
                                              tuple(out.shape))
        if cpu_gemv_build.overlaps(xp, xn, yp, yn):
            raise ValueError(f"{self.kind}: out overlaps x")
        g = geometry
        threads = torch.get_num_threads()
        need = scratch_bytes(self.k4, g["C"], g["H"] + 2 * g["padding"][0], g["W"] + 2 * g["padding"][1], threads)
        sp, _, sn = cpu_gemv_build.tensor_arg(_scratch_for(need), self.kind, "scratch", {torch.uint8: 0})
        args = _ARGS.pack(
            xp, g["batch"], g["C"], g["H"], g["W"], *g["xs"], self.flip, self.zp_u,
            *g["kernel"], *g["stride"], *g["padding"], *g["dilation"], g["OH"], g["OW"],
            self._w_arg[0], self._w2_arg[0], self.n, self.k4, self._off_arg[0], self._m_arg[0], 0,
            yp, *g["ys"], OUT_CODES[self.out_dtype],
            sp, sn, threads, min(library.isa, _isa_cap()), int(self.relu),
            self.zp, self.lo, self.hi, 0.0)
        status = library.lib.qconv_packed(args)
        if status != 0:
            raise RuntimeError(f"{self.kind}: the native kernel refused its arguments (status {status})")

    def _geometry(self, x: Tensor, out: Tensor) -> dict:
        raise NotImplementedError


_OUT_DTYPE = {name: getattr(torch, name) for name in OUT_CODES}


class QConv(_QContraction):
    """QCONV, 2-D, groups=1, NCHW x / OIHW weights (see the module docstring)."""

    kind = "QCONV"

    @classmethod
    def _shapes_ok(cls, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> bool:
        p = dispatch.params
        x, w = specs[dispatch.inputs[0]], specs[dispatch.inputs[1]]
        return len(x.shape) == 4 and len(w.shape) == 4 and int(p.get("groups", 1)) == 1 \
            and w.shape[1] == x.shape[1] and _numel(x) > 0

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        super().__init__(dispatch, specs)
        p = dispatch.params
        self._x_dtype = specs[dispatch.inputs[0]].dtype
        self.stride, self.padding = _pair(p.get("stride", 1)), _pair(p.get("padding", 0))
        self.dilation = _pair(p.get("dilation", 1))
        self.kernel_hw = [int(d) for d in specs[dispatch.inputs[1]].shape[2:]]

    def _weight_2d(self, w: Tensor) -> Tensor:
        return w.reshape(w.shape[0], -1)

    def _geometry(self, x: Tensor, out: Tensor) -> dict:
        b, c, h, w = x.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.kernel_hw, self.stride, self.padding, self.dilation
        oh, ow = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        if tuple(out.shape) != (b, self.n, oh, ow) or -(-c * kh * kw // 4) != self.k4 or min(sh, sw, dh, dw) < 1 \
                or min(ph, pw) < 0:
            raise ValueError(f"QCONV: x {tuple(x.shape)} and out {tuple(out.shape)} do not fit the weight "
                             f"{self.n}x{c}x{kh}x{kw}, stride {self.stride}, padding {self.padding}, dilation "
                             f"{self.dilation}")
        return {"batch": b, "C": c, "H": h, "W": w, "xs": (c * h * w, h * w, w, 1), "kernel": (kh, kw),
                "stride": (sh, sw), "padding": (ph, pw), "dilation": (dh, dw), "OH": oh, "OW": ow,
                "positions": oh * ow, "ys": (self.n * oh * ow, oh * ow, 1)}


class QGemm(_QContraction):
    """QGEMM with a constant 2-D weight (``[N, K]`` with ``trans_b``, else ``[K, N]``), x ``[..., K]``; a second
    operand that is an activation (attention's matmuls) is handed to ``cpu_qmatmul.QMatMul``, packed per call."""

    kind = "QGEMM"

    @classmethod
    def accepts(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], weight_names: set[str]) -> bool:
        if dispatch.inputs[1] not in weight_names:
            from .cpu_qmatmul import QMatMul  # it builds on this module

            return QMatMul.accepts(dispatch, specs, weight_names)
        return super().accepts(dispatch, specs, weight_names)

    def prepare(self, weights: dict[str, Tensor]) -> None:
        if self.names[1] in weights:
            super().prepare(weights)
            return
        from .cpu_qmatmul import QMatMul  # w is an activation: accepts chose QMatMul's checks

        self.activations = QMatMul(self.dispatch, self.specs, self.reference)
        self.activations.prepare(weights)
        self.native = self.activations.native

    def run(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        if self.activations is not None:
            self.activations.run(inputs, outputs)
        else:
            super().run(inputs, outputs)

    @classmethod
    def _shapes_ok(cls, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> bool:
        x, w = specs[dispatch.inputs[0]], specs[dispatch.inputs[1]]
        k = w.shape[1] if dispatch.params.get("trans_b", True) else w.shape[0] if len(w.shape) == 2 else -1
        return len(w.shape) == 2 and len(x.shape) >= 1 and x.shape[-1] == k and _numel(x) > 0

    def __init__(self, dispatch: Dispatch, specs: dict[str, TensorSpec]) -> None:
        super().__init__(dispatch, specs)
        self._x_dtype = specs[dispatch.inputs[0]].dtype
        self.trans_b = bool(dispatch.params.get("trans_b", True))
        self.dispatch, self.specs = dispatch, specs
        self.activations: Kernel | None = None  # the QMatMul that runs a product of two activations

    def _weight_2d(self, w: Tensor) -> Tensor:
        return w if self.trans_b else w.t()

    def _geometry(self, x: Tensor, out: Tensor) -> dict:
        k = x.shape[-1]
        rows = x.numel() // k
        if tuple(out.shape) != (*x.shape[:-1], self.n) or -(-k // 4) != self.k4:
            raise ValueError(f"QGEMM: x {tuple(x.shape)} and out {tuple(out.shape)} do not fit the weight "
                             f"[{self.n}, {k}]")
        # x [M, K] read as a 1 x M image of K channels: position m is row m, channel k its element k
        return {"batch": 1, "C": k, "H": 1, "W": rows, "xs": (0, 1, 0, k), "kernel": (1, 1), "stride": (1, 1),
                "padding": (0, 0), "dilation": (1, 1), "OH": 1, "OW": rows, "positions": rows,
                "ys": (0, 1, self.n)}


__all__ = ["ISAS", "QConv", "QGemm", "native_status", "scratch_bytes"]
