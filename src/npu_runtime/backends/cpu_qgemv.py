"""Weight-only quantized GEMV on GGUF blocks: ``y = x · dequant(W)ᵀ (+ bias)``, W as Q8_0, Q4_0, Q5_0, Q4_K or Q6_K.

A decode step reads every weight once, so its time is the weights' bytes over the memory bandwidth: Q8_0
(34 bytes per 32 weights) reads 0.27x the bytes of fp32 and 0.53x of bf16, Q4_0 (18 bytes) 0.14x / 0.28x,
Q5_0 (22 bytes) 0.17x / 0.34x, Q4_K (144 bytes per 256) 0.14x / 0.28x, Q6_K (210 bytes per 256) 0.21x / 0.41x.
This module multiplies with the packed blocks as a GGUF file holds them (``W``: a ``uint8`` tensor
``[N, K / block · block bytes]``, row ``n`` being the blocks of output ``n``), never widening W in
memory, with a small C kernel (``gemv_q.c`` beside this file) compiled on first use:

* layouts as GGML defines them (``gguf.quants`` is the reference the tests use): Q8_0 = fp16 ``d`` then
  32 int8 codes, value ``d·q``; Q4_0 = fp16 ``d`` then 16 bytes, element ``j`` in the low nibble of byte
  ``j`` and ``j + 16`` in its high nibble, value ``d·(nibble − 8)``; Q5_0 = fp16 ``d``, a little-endian u32 ``qh``
  of fifth bits (bit ``j`` for element ``j``), then Q4_0's 16 bytes of nibbles, value ``d·((nibble | bit << 4) −
  16)`` (``gemv_q5.c``: the codes; the kernels are Q4_0's); the k-quants Q4_K and Q6_K are
  super-blocks of 256 (so ``K`` must be a multiple of 256: GGUF files hold rows of other lengths, such as
  Qwen2.5's K = 896, in other types), with a scale per 32 (Q4_K, and a min: ``d·sc·q − dmin·m``) or per 16
  weights (Q6_K: ``d·sc·(q − 32)``), their weights made as ggml's dequantize makes them (``d·sc`` and
  ``dmin·m`` exact products, one rounding in Q4_K's subtraction);
* ``x`` stays fp32 (this is not llama.cpp's x-quantized-to-int8 dot product): per block the codes, exact
  small integers, are multiplied with ``x`` in fp32 lanes, and the lanes' sum is scaled by ``d`` into an
  fp32 accumulator. ``d·q`` is exact in fp32, so the result is an fp32 dot product of the exactly
  dequantized weights with ``x``: within fp32 accumulation error of a float64 reference (the default,
  ``activations="float32"``); ``activations="int8"`` is llama.cpp's faster contract instead (below);
* AVX-512 F/BW, AVX2/FMA/F16C or portable C, chosen at run time (``__builtin_cpu_supports``); the rows
  read as 8 (one row of ``x``) far-apart sequential streams with a software prefetch, up to 8 rows of
  ``x`` per pass over a chunk of weights, chunks handed to torch's OpenMP threads, one thread or all
  chosen per call by :class:`cpu_gemv._ThreadPolicy <npu_runtime.backends.cpu_gemv._ThreadPolicy>`
  (the same design and reasons as :mod:`.cpu_gemv`).

Prefill (many rows of x, float x): the GEMV decodes every weight once per 8 rows of x, so from ~16 rows it is
bound by that arithmetic. From :data:`PREFILL_ROWS` rows ``QGemv`` may instead go tile by tile: :data:`TILE_ROWS`
rows of W dequantized by C (:func:`dequantize_rows`, ``gemv_q_deq.c``, bit-exact with ggml's values) into a per-thread
scratch, then the prefill GEMM of ``gemm_tiles.c`` (where AVX2 is the best kernel: ``cpu_gemv.tiles_library``), else
``torch.mm``, into those columns of ``out``: an fp32 product of the exact weights in another order of sums. Which
path runs is measured per shape
(:class:`cpu_gemv._PathPolicy <npu_runtime.backends.cpu_gemv._PathPolicy>`: one thread favours the tiles, two
threads on a loaded machine often the GEMV); ``path=`` forces one (``bench/gemv/qprefill.py`` times them).

``activations="int8"`` (``QGemv.__call__``, :func:`qgemv`; every layout: Q4_0, Q5_0 and Q4_K in ``gemv_q_i8.c``, Q8_0
and Q6_K in ``gemv_q_i8k.c``) is llama.cpp's dot product, faster than unpacking codes to fp32 but different numerics (up
to 8 rows of x per pass over the weights, each block's codes decoded once for them; a row's result does not depend on
how many rows a call has): ``x`` is quantized once per call, per group of 32, to ``q = round(x / dx)`` (fp32 division,
ties to even), ``dx = max|x| / 127`` (fp32); each group's sum of codes times ``q`` is an exact integer (AVX-512 VNNI
``vpdpbusd`` where the CPU has it, else AVX2 ``maddubs``/``madd``, else C; Q8_0's signed codes as ``|code|`` times
``sign(code)·q``, Q6_K's two sub-blocks of 16 each times its int8 scale inside the integer), and ``y = Σ_g
(D_g·dx_g)·isum_g − M_g·(dx_g·Σq)`` in fp32 (``D``, ``M``: the group's scale, Q6_K's ``d``, and Q4_K's min). Its error
against the float path is that of quantizing ``x`` to 8 bits (~1e-3 relative on random data).

On a CPU with AVX2 the int8 path reads a 16-row interleaved copy of the weight instead (:func:`interleaved`,
:meth:`QGemv.interleave`, ``gemv_q_x16.c``; every layout): in GGUF's layouts a vector holds one row's codes, so every
block of every row pays its own dot product, scale and lane sum, which kept the 4-bit layouts compute-bound at ~10-20
GB/s a thread; in the copy one 64-byte load is 4 codes of 16 rows, ``vpdpbusd`` multiplies them with 4 bytes of x
broadcast, and one FMA scales 16 rows' block sums (VNNI: 2.4-4.5x the GGUF kernels' rate a thread out of L2; AVX2,
two halves of 8 rows and ``maddubs``/``madd``: 1.3-2.6x). The same contract and integer sums, and per row one FMA
per block in block order on both kernels: equal results, bit for bit. AVX2 takes one row of x at a time and decodes
the records again for each; from 4 rows (a prefill) it decodes each group of 16 rows once per call into a scratch
and takes 4 rows of x per pass (``gemv_q_x16t.c``: the same steps, so the same bits; ~2x the rate at 128 rows). The
copy costs the weight's bytes again (the GGUF tensor stays for the float path, the tiles, an ``isa`` cap of ``c``);
``TORCH_IR_QGEMV_X16=0`` leaves it out. Q8_0 and Q6_K keep none on AVX2; a prefill still runs the copy's kernel on
them, the GGUF layout decoded 16 rows at a time (:meth:`QGemv.groups`): its results bit for bit, without its memory.

``TORCH_IR_QGEMV_ISA`` (``c``, ``avx2``, ``avx512``) caps the kernel the CPU would run (a test of the other paths,
or a comparison); ``isa=`` does so per call. When the kernel cannot be had (no compiler, a failed build,
``TORCH_IR_NATIVE_GEMV=0``, :func:`set_native_enabled(False) <set_native_enabled>`), calls run :func:`torch_qgemv`
(W dequantized with torch, then ``torch.mm``), and one warning says why.

Memory safety: the C code trusts its pointers and sizes, so every tensor's device, dtype, contiguity, shape and
bytes inside its storage are checked first; ``K`` must be a multiple of the block (32 or 256), W must hold exactly
``N · K / block · block bytes`` bytes, and ``out`` may not overlap an input.
"""

from __future__ import annotations

import os
import struct
import time
import weakref
from dataclasses import dataclass

import torch

from torch_ir.quant import blocks
from torch_ir.quant.numerics import int8_groups

from . import cpu_gemv, cpu_gemv_build
from .cpu_gemv_build import Library, NativeCall

Tensor = torch.Tensor


@dataclass(frozen=True)
class QType:
    """A GGUF block layout: GGML's type id (the kernel's code too), weights and bytes per block."""

    name: str
    code: int
    block: int
    nbytes: int


#: the layouts the kernel reads, by the names of ``torch_ir.quant.spec.BLOCKS``; ids and sizes from GGML's type
#: table (``torch_ir.quant.blocks``)
QTYPES: dict[str, QType] = {name: QType(name, t.id, t.block, t.nbytes) for name, t in
                            ((n, blocks.ggml_type(n.upper())) for n in ("q8_0", "q4_0", "q5_0", "q4_K", "q6_K"))}
#: ``isa`` values: the kernel's codes (``qgemv_isa`` in ``gemv_q.c``)
ISAS: dict[str, int] = cpu_gemv_build.ISAS
_ISA_NAMES = {code: name for name, code in ISAS.items()}

#: ``activations`` values: fp32 x (exact weights, the default), or x quantized to int8 groups (gemv_q_i8.c)
ACTIVATIONS: dict[str, int] = {"float32": 0, "int8": 1}
_ACT_GROUPS = 2  # qgemv_packed's activations code of the int8 path's path="groups" (QGemv.groups)
#: the layouts the int8 path takes (every one: gemv_q_i8.c, gemv_q_i8k.c)
INT8_QTYPES = ("q8_0", "q4_0", "q5_0", "q4_K", "q6_K")

#: the layouts the int8 path also reads as 16-row interleaved copies (:func:`interleaved`, ``gemv_q_x16.c``), with
#: each record's bytes (16 rows' blocks: the GGUF layout's bytes per weight; Q4_K's 2.8 % more: scales unpacked)
X16_QTYPES: dict[str, int] = {"q4_0": 288, "q5_0": 352, "q8_0": 544, "q4_K": 2368, "q6_K": 3360}
X16_ROWS = 16
#: the layouts the runtime copies (:meth:`QGemv.interleave`) on AVX2 without VNNI (which copies all). A Zen 3, 28
#: 1.5B-shaped layers cold on 2 threads, copy / GGUF layout: Q4_K 0.65, Q5_0 0.69, Q4_0 0.90; Q6_K 1.02, Q8_0 1.18
X16_AVX2_QTYPES = ("q4_0", "q5_0", "q4_K")
#: the layouts whose int8 calls may read the GGUF layout 16 rows at a time instead (:meth:`QGemv.groups`)
X16_GROUP_QTYPES = ("q8_0", "q6_K")

#: ``qgemv_packed``'s argument block: M N K x w type bias y threads isa activations w16
_ARGS = struct.Struct("<12q")
#: ``qpack16_packed``'s (``gemv_q_x16.c``): w N K type out threads
_PACK_ARGS = struct.Struct("<6q")
#: ``qdeq_rows_packed``'s (``gemv_q_deq.c``): w type K n0 n1 out threads isa
_DEQ_ARGS = struct.Struct("<8q")

#: rows of x from which a float-x call may multiply tile by tile (:meth:`QGemv.__call__`); below, the GEMV, which
#: decodes every weight once per 8 rows of x (a tile once whatever M). One thread, bench/gemv/qprefill.py: the tiles
#: are faster from 12-16 rows where K >= 1536, ~32 where K = 896; with two threads on a shared machine the GEMV often
#: stays faster, so from here on :class:`cpu_gemv._PathPolicy` times both per shape and runs the faster
PREFILL_ROWS = int(os.environ.get("TORCH_IR_QGEMV_PREFILL_ROWS", "16"))
#: rows of W per tile of the prefill path (None: 256 while the fp32 tile is at most TILE_BYTES, else 128): a GEMM is
#: efficient from ~64 columns of output, and a tile has fixed costs (bench/gemv/qprefill.py, one thread, torch.mm:
#: 256 rows best for K = 896, 128 for K = 4864 and 8960, whose 256-row tiles leave L2; 32-64 clearly slower)
TILE_ROWS: int | None = None
TILE_BYTES = 3 << 19
_INTERLEAVED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

_kernel = cpu_gemv_build.NativeKernel(
    "quantized GEMV", cpu_gemv_build.load_q, lambda library: _ISA_NAMES[min(library.isa, _isa_cap())],
    "W is dequantized for every call")
_policy = cpu_gemv._ThreadPolicy()


def qtype_of(qtype: str | int | QType) -> QType:
    """A layout from its name (``"q8_0"``, case-insensitive), GGML's type id (``gguf.GGMLQuantizationType``
    is an ``int``) or a :class:`QType`; ``ValueError`` for any other."""
    if isinstance(qtype, QType):
        return qtype
    for q in QTYPES.values():
        if (isinstance(qtype, str) and qtype.lower() == q.name.lower()) or (isinstance(qtype, int)
                                                                             and qtype == q.code):
            return q
    ids = ", ".join(str(q.code) for q in QTYPES.values())
    raise ValueError(f"qgemv: weight type {qtype!r} is not one of {', '.join(QTYPES)} (GGML ids {ids})")


def set_native_enabled(enabled: bool) -> bool:
    """Use the compiled kernels (True, the default) or always the torch paths: one switch with
    ``cpu_gemv.set_native_enabled``. Returns the previous setting."""
    return cpu_gemv_build.set_enabled(enabled)


def _isa_cap() -> int:
    return cpu_gemv_build.isa_cap("TORCH_IR_QGEMV_ISA", ISAS)


def native_status() -> str:
    """One line: which implementation :func:`qgemv` runs here, and why."""
    return _kernel.status()


def native_available() -> bool:
    """Whether calls run the compiled kernel (building it now if it is not built yet)."""
    return cpu_gemv_build.NativeKernel.enabled and _kernel.load() is not None


def _load() -> Library | None:
    return _kernel.load()


# ------------------------------------------------------------------------------------------- checks


def _arg(t: Tensor, what: str, dtype: torch.dtype, shape: tuple[int, ...]) -> tuple[int, int]:
    """``(address, bytes)`` of a tensor of ``dtype`` and ``shape`` the kernel touches, checked
    (``cpu_gemv_build.tensor_arg``)."""
    address, _, size = cpu_gemv_build.tensor_arg(t, "qgemv", what, {dtype: 0}, tuple(shape))
    return address, size


_overlap = cpu_gemv_build.overlaps


# -------------------------------------------------------------------------------------------- torch


def dequantize(weight: Tensor, qtype: str | int | QType) -> Tensor:
    """``weight`` (``uint8 [N, K / block · bytes]``) as fp32 ``[N, K]`` with torch (``torch_ir.quant.blocks``, bit-exact
    with ggml's): the fallback's weights."""
    q = qtype_of(qtype)
    n = weight.shape[0]
    return blocks.dequantize(weight, q.code, (n, weight.shape[1] // q.nbytes * q.block))


def torch_qgemv(x: Tensor, weight: Tensor, qtype: str | int | QType, bias: Tensor | None = None,
                out: Tensor | None = None) -> Tensor:
    """``x · dequant(weight)ᵀ + bias`` with PyTorch (fp32): the fallback, and a comparison of the bench."""
    y = torch.mm(x, dequantize(weight, qtype).t())
    if bias is not None:
        y += bias
    return y if out is None else out.copy_(y)


def quantize_x(x: Tensor) -> Tensor:
    """``x`` (fp32 ``[M, K]``, K a multiple of 32) as the int8 path sees it: per group of 32, ``dx·round(x / dx)``
    with ``dx = max|x| / 127`` (``torch_ir.quant.numerics.int8_groups``, the ops' reference too)."""
    return int8_groups(x, 32)


def torch_qgemv_int8(x: Tensor, weight: Tensor, qtype: str | int | QType, bias: Tensor | None = None,
                     out: Tensor | None = None) -> Tensor:
    """The int8 path's fallback: :func:`quantize_x` times the dequantized weights in fp32, which is its contract's
    value to within fp32 rounding (the integer sums, scaled, are the same products)."""
    return torch_qgemv(quantize_x(x), weight, qtype, bias, out)


# ------------------------------------------------------------------------------------- rows to fp32


def dequantize_rows(weight: Tensor, qtype: str | int | QType, n0: int = 0, n1: int | None = None,
                    out: Tensor | None = None, threads: int | None = None, isa: str | None = None) -> Tensor:
    """Rows ``[n0, n1)`` of ``weight`` (``uint8 [N, K / block · bytes]``) as fp32 ``[n1 - n0, K]``, bit-exact with
    :func:`dequantize` (ggml's values), by the native kernel (``gemv_q_deq.c``: AVX-512, AVX2 or C; ``threads``
    of torch's pool, all by default), or torch when it cannot be had. ``0 <= n0 <= n1 <= N``."""
    q = qtype_of(qtype)
    if not isinstance(weight, Tensor) or weight.dim() != 2 or weight.shape[1] % q.nbytes:
        raise ValueError(f"qgemv: weight must be a 2-D uint8 tensor of whole {q.name} blocks ({q.nbytes} bytes)")
    n, k = int(weight.shape[0]), int(weight.shape[1]) // q.nbytes * q.block
    n1 = n if n1 is None else n1
    if not (isinstance(n0, int) and isinstance(n1, int) and 0 <= n0 <= n1 <= n):
        raise ValueError(f"qgemv: rows [{n0}, {n1}) are not a range of the weight's {n} rows")
    wp, _ = _arg(weight, "weight", torch.uint8, tuple(weight.shape))
    if out is None:
        out = torch.empty(n1 - n0, k, dtype=torch.float32)
    yp, yn = _arg(out, "out", torch.float32, (n1 - n0, k))
    if _overlap(yp, yn, wp, weight.nbytes):
        raise ValueError("qgemv: out overlaps weight")
    cap = _isa_cap() if isa is None else ISAS.get(isa, -1)
    if cap < 0:
        raise ValueError(f"qgemv: isa {isa!r} is not one of {', '.join(ISAS)}")
    library = _kernel.for_call()
    if library is None:
        return out.copy_(dequantize(weight[n0:n1], q))
    threads = max(1, torch.get_num_threads() if threads is None else threads)
    status = library.lib.qdeq_rows_packed(_DEQ_ARGS.pack(wp, q.code, k, n0, n1, yp, threads, min(library.isa, cap)))
    if status != 0:
        raise RuntimeError(f"qgemv: the kernel refused type {q.name} (status {status})")
    return out


# ---------------------------------------------------------------------------------- interleaved copies


def interleaved(weight: Tensor, qtype: str | int | QType) -> Tensor | None:
    """``weight`` (``uint8 [N, K / block · block bytes]``, a layout of :data:`X16_QTYPES`) as the int8 path's 16-row
    interleaved copy (``gemv_q_x16.c``: block ``b`` of 16 rows side by side, codes in 4-byte steps, so that one
    AVX-512 VNNI instruction (two AVX2 ``maddubs``/``madd`` pairs) multiplies 4 codes of each of 16 rows with 4
    bytes of x, and one FMA (two) scales 16 rows' block sums), ``uint8 [ceil(N / 16) · blocks per row · record
    bytes]``. Made once per weight while any holder keeps it (the prefill and the decode programs bind the same
    weights), on all of torch's threads. None where no kernel here reads it: another layout, a CPU without AVX2,
    ``TORCH_IR_QGEMV_ISA=c``, ``TORCH_IR_QGEMV_X16=0`` (the GGUF layout's kernels instead: a comparison), no native
    kernel."""
    q = qtype_of(qtype)
    record = X16_QTYPES.get(q.name)
    if record is None or _isa_cap() < ISAS["avx2"] or os.environ.get("TORCH_IR_QGEMV_X16", "1") == "0":
        return None
    if not isinstance(weight, Tensor) or weight.dim() != 2 or weight.shape[0] < 1 or weight.shape[1] % q.nbytes:
        raise ValueError(f"qgemv: weight must be a 2-D uint8 tensor of whole {q.name} blocks ({q.nbytes} bytes)")
    n = int(weight.shape[0])
    wp, nbytes = _arg(weight, "weight", torch.uint8, tuple(weight.shape))
    library = _kernel.for_call()
    if library is None or library.isa < ISAS["avx2"]:
        return None
    key = (wp, nbytes, q.code)
    found = _INTERLEAVED.get(key)
    if found is None:
        blocks_per_row = nbytes // (n * q.nbytes)
        found = torch.empty(-(-n // X16_ROWS) * blocks_per_row * record, dtype=torch.uint8)
        status = library.lib.qpack16_packed(_PACK_ARGS.pack(wp, n, blocks_per_row * q.block, q.code, found.data_ptr(),
                                                            max(1, torch.get_num_threads())))
        if status != 0:
            raise RuntimeError(f"qgemv: the kernel refused to interleave type {q.name} (status {status})")
        found._source = weight  # its address cannot be reused by another weight while this copy lives
        _INTERLEAVED[key] = found
    return found


# ------------------------------------------------------------------------------------------- qgemv


_paths = cpu_gemv._PathPolicy()


class QGemv:
    """``y = x · dequant(W)ᵀ (+ bias)`` for a packed weight checked once (decode: the same weight every token),
    then each call checks ``x`` and ``out``. ``weight``: ``uint8 [N, K / block · block bytes]``, contiguous;
    ``bias``: fp32 ``[N]``. Both are kept (referenced, not copied); resizing their storage afterwards is not
    supported."""

    def __init__(self, weight: Tensor, qtype: str | int | QType, bias: Tensor | None = None) -> None:
        self.qtype = qtype_of(qtype)
        if not isinstance(weight, Tensor) or weight.dim() != 2:
            raise ValueError("qgemv: weight must be a 2-D uint8 tensor [N, K / block * block bytes]")
        n, row = int(weight.shape[0]), int(weight.shape[1])
        if n < 1 or row < 1 or row % self.qtype.nbytes:
            raise ValueError(f"qgemv: a {self.qtype.name} weight row is whole blocks of {self.qtype.nbytes} bytes; "
                             f"got {row} bytes per row ({n} rows)")
        self.n, self.k = n, row // self.qtype.nbytes * self.qtype.block
        self.weight, self.bias = weight, bias
        self._w = _arg(weight, "weight", torch.uint8, (n, row))
        self._b = _arg(bias, "bias", torch.float32, (n,)) if bias is not None else (0, 0)
        self._w16: Tensor | None = None

    def interleave(self, always: bool = False) -> bool:
        """Let the int8 path's calls read an interleaved copy of the weight (:func:`interleaved`) where this machine's
        kernel reads it faster (AVX-512 VNNI: every int8 layout, 1.5-4.5x the GGUF layout's speed per thread, which
        is compute-bound there; AVX2: :data:`X16_AVX2_QTYPES`), or with ``always`` wherever a kernel here reads it
        (tests, benchmarks): True when they will. The copy costs the weight's bytes again: the original stays, for
        the float path, the prefill's tiles and a call capped at ``c``."""
        lib = _load()
        pays = always or self.qtype.name in X16_AVX2_QTYPES or (
            lib is not None and _isa_cap() >= ISAS["avx512"] and bool(lib.lib.qgemv_vnni()))
        self._w16 = interleaved(self.weight, self.qtype) if pays else None
        return self._w16 is not None

    def __call__(self, x: Tensor, out: Tensor | None = None, threads: int | None = None,
                 isa: str | None = None, activations: str = "float32", path: str | None = None) -> Tensor:
        """``x`` fp32 ``[M, K]`` -> ``out`` fp32 ``[M, N]`` (new when None). ``threads``: one or all, whichever ran
        faster lately (see :mod:`.cpu_gemv`), unless given; ``isa``: at most this kernel (``c``, ``avx2``,
        ``avx512``), below ``TORCH_IR_QGEMV_ISA`` and what the CPU has; ``activations``: ``"float32"`` (exact
        weights) or ``"int8"`` (x quantized per group of 32, integer dot products; see the module's docstring).
        ``path``: ``"gemv"`` or ``"tiled"`` (the prefill path, float x only) forced, or ``"groups"`` (int8 x, where
        :meth:`groups` says it runs); None: the GEMV below :data:`PREFILL_ROWS` rows, from there whichever
        :class:`cpu_gemv._PathPolicy` measured faster for this shape."""
        act = self._activations(activations)
        out, cap = self._checked(x, out, isa)
        m = int(x.shape[0])
        if path not in (None, "gemv", "tiled", "groups"):
            raise ValueError(f"qgemv: path {path!r} is not one of gemv, tiled, groups")
        library = _kernel.for_call()
        if library is None:  # the same contracts in torch (a forced path included)
            if act:
                return torch_qgemv_int8(x, self.weight, self.qtype, self.bias, out)
            return torch_qgemv(x, self.weight, self.qtype, self.bias, out)
        if path == "groups":
            if not (act and self.groups(isa)):
                raise ValueError(f"qgemv: path 'groups' takes activations='int8' on a {'/'.join(X16_GROUP_QTYPES)} "
                                 f"weight without an interleaved copy, and an isa of at least avx2; got "
                                 f"{self.qtype.name}, activations={activations!r} (see QGemv.groups)")
            return self._gemv(library, x, out, threads, min(library.isa, cap), _ACT_GROUPS)
        tiled = self.tiled(m, activations) if path is None else path == "tiled" and not act
        if tiled and path is None:
            key = (self.qtype.code, self.n, self.k, m.bit_length(), torch.get_num_threads())
            tiled, start = _paths.pick(key), time.perf_counter_ns()
            if tiled:
                self._tiled(library, x, out, threads, min(library.isa, cap))
            else:
                self._gemv(library, x, out, threads, min(library.isa, cap), act)
            _paths.record(key, tiled, (time.perf_counter_ns() - start) / m)
            return out
        if tiled:
            return self._tiled(library, x, out, threads, min(library.isa, cap))
        return self._gemv(library, x, out, threads, min(library.isa, cap), act)

    def _checked(self, x: Tensor, out: Tensor | None, isa: str | None) -> tuple[Tensor, int]:
        """``out`` (made when None) and the ISA cap of a call, after checking x, out and ``isa``."""
        if not isinstance(x, Tensor) or x.dim() != 2:
            raise ValueError("qgemv: x must be a 2-D float32 tensor [M, K]")
        m = int(x.shape[0])
        if x.shape[1] % self.qtype.block:
            raise ValueError(f"qgemv: K = {x.shape[1]} is not a multiple of {self.qtype.name}'s block of "
                             f"{self.qtype.block} (GGUF files store such rows in another type)")
        if x.shape[1] != self.k:
            raise ValueError(f"qgemv: x has K = {x.shape[1]}, the {self.qtype.name} weight holds K = {self.k} "
                             f"({self.k // self.qtype.block} blocks of {self.qtype.block} per row)")
        xp, xn = _arg(x, "x", torch.float32, (m, self.k))
        if out is None:
            out = torch.empty(m, self.n, dtype=torch.float32)
        yp, yn = _arg(out, "out", torch.float32, (m, self.n))
        for (p, size), what in ((self._w, "weight"), (self._b, "bias"), ((xp, xn), "x")):
            if _overlap(yp, yn, p, size):
                raise ValueError(f"qgemv: out overlaps {what}")
        cap = _isa_cap() if isa is None else ISAS.get(isa, -1)
        if cap < 0:
            raise ValueError(f"qgemv: isa {isa!r} is not one of {', '.join(ISAS)}")
        return out, cap

    def native_call(self, x: Tensor, out: Tensor, threads: int, activations: str = "float32") -> NativeCall | None:
        """The GEMV of ``x`` into ``out`` on ``threads`` threads, checked and packed but not made (a link of a chain
        of native calls, ``cpu_chain``); None where it would not run the GEMV kernel (the kernel not to be had, or a
        prefill's rows, which may take the tiles)."""
        act = self._activations(activations)
        out, cap = self._checked(x, out, None)
        library = _kernel.for_call()
        if library is None or self.tiled(int(x.shape[0]), activations):
            return None
        return NativeCall(library.lib.qgemv_packed, self._pack(x, out, threads, min(library.isa, cap), act),
                          keep=(x, out, self.weight, self.bias, self._w16))

    def groups(self, isa: str | None = None) -> bool:
        """Whether an int8 call may decode this weight's GGUF layout 16 rows at a time into the copy's AVX2 prefill
        kernel (``path="groups"``, ``gemv_q_x16t.c``: its bits, ~1.5x the GGUF layout's kernel at 128 rows of x): a
        :data:`X16_GROUP_QTYPES` weight without a copy, AVX2 (below ``isa``), not ``TORCH_IR_QGEMV_X16=0``."""
        cap = _isa_cap() if isa is None else ISAS.get(isa, -1)
        library = _kernel.for_call() if cap >= ISAS["avx2"] else None
        return (self._w16 is None and self.qtype.name in X16_GROUP_QTYPES and library is not None
                and library.isa >= ISAS["avx2"] and os.environ.get("TORCH_IR_QGEMV_X16", "1") != "0")

    def _pack(self, x: Tensor, out: Tensor, threads: int, isa: int, act: int) -> bytes:
        """``qgemv_packed``'s argument block (the interleaved copy where the int8 path reads it)."""
        w16 = self._w16.data_ptr() if act == 1 and self._w16 is not None and isa >= ISAS["avx2"] else 0
        return _ARGS.pack(int(x.shape[0]), self.n, self.k, x.data_ptr(), self._w[0], self.qtype.code, self._b[0],
                          out.data_ptr(), max(1, threads), isa, act, w16)

    def _gemv(self, library: Library, x: Tensor, out: Tensor, threads: int | None, isa: int, act: int) -> Tensor:
        policy = None
        if threads is None:
            policy = _policy if self._w[1] >= cpu_gemv.SINGLE_THREAD_BYTES and torch.get_num_threads() > 1 else None
            threads = policy.pick(self._w[1], torch.get_num_threads()) if policy is not None else 1
        args = self._pack(x, out, threads, isa, act)
        start = time.perf_counter_ns()
        status = library.lib.qgemv_packed(args)
        if policy is not None:
            policy.record(self._w[1], threads, time.perf_counter_ns() - start)
        if status == -3:
            raise MemoryError("qgemv: no memory for x's int8 groups or a group's scratch")
        if status == -4:
            raise RuntimeError(f"qgemv: this CPU's kernel cannot read the {self.qtype.name} weight as asked (an "
                               f"interleaved copy, or 16-row groups)")
        if status != 0:
            raise RuntimeError(f"qgemv: the kernel refused type {self.qtype.name} (status {status})")
        return out

    def tiled(self, m: int, activations: str = "float32") -> bool:
        """Whether a call with ``m`` rows of x may take the prefill path (when the kernel is built): float x and at
        least :data:`PREFILL_ROWS` rows. The int8 path keeps the GEMV: its integer dot products are its contract."""
        return activations == "float32" and m >= PREFILL_ROWS

    def _tiled(self, library: Library, x: Tensor, out: Tensor, threads: int | None, isa: int) -> Tensor:
        """The prefill path: tile by tile, rows of W dequantized (exactly) into a scratch buffer kept in cache, then
        ``x · tileᵀ (+ bias)`` into the tile's columns of ``out`` (a column slice of a row-major matrix: no copy)."""
        rows = TILE_ROWS or (256 if 256 * 4 * self.k <= TILE_BYTES else 128)
        mm, m, panel = cpu_gemv.tiles_library() if isa >= 1 else None, x.shape[0], cpu_gemv.TILES_PANEL  # its panels
        rows = max(1, min(self.n, rows - rows % panel if mm is not None and rows >= 2 * panel else rows))  # whole ones
        buf = cpu_gemv.scratch("tile", rows * self.k)
        yp, yn = out.data_ptr(), out.nbytes
        if _overlap(buf.data_ptr(), buf.nbytes, yp, yn) or _overlap(buf.data_ptr(), buf.nbytes, x.data_ptr(), x.nbytes):
            raise ValueError("qgemv: out or x overlaps the prefill's scratch buffer")
        threads = max(1, torch.get_num_threads() if threads is None else threads)
        for n0 in range(0, self.n, rows):
            n1 = min(self.n, n0 + rows)
            tile = buf[:(n1 - n0) * self.k].view(n1 - n0, self.k)
            status = library.lib.qdeq_rows_packed(_DEQ_ARGS.pack(self._w[0], self.qtype.code, self.k, n0, n1,
                                                                 buf.data_ptr(), threads, isa))
            if status != 0:
                raise RuntimeError(f"qgemv: the kernel refused type {self.qtype.name} (status {status})")
            bias = None if self.bias is None else self.bias.data_ptr() + 4 * n0  # x, out, bias: checked by the call
            if mm is not None and mm.lib.gemm_tiles(m, n1 - n0, self.k, x.data_ptr(), tile.data_ptr(), 0, bias,
                                                    yp + 4 * n0, self.n, 0, threads) == 0:
                continue
            if self.bias is None:
                torch.mm(x, tile.t(), out=out[:, n0:n1])
            else:
                torch.addmm(self.bias[n0:n1], x, tile.t(), out=out[:, n0:n1])
        return out

    def _activations(self, activations: str) -> int:
        if activations not in ACTIVATIONS:
            raise ValueError(f"qgemv: activations {activations!r} is not one of {', '.join(ACTIVATIONS)}")
        if activations == "int8" and self.qtype.name not in INT8_QTYPES:
            raise ValueError(f"qgemv: activations='int8' takes {', '.join(INT8_QTYPES)} weights, not "
                             f"{self.qtype.name}")
        return ACTIVATIONS[activations]


def qgemv(x: Tensor, weight: Tensor, qtype: str | int | QType, bias: Tensor | None = None,
          out: Tensor | None = None, activations: str = "float32") -> Tensor:
    """``x [M, K] · dequant(weight)ᵀ (+ bias [N])`` into ``out`` (see :class:`QGemv`)."""
    return QGemv(weight, qtype, bias)(x, out=out, activations=activations)


__all__ = ["ACTIVATIONS", "INT8_QTYPES", "ISAS", "PREFILL_ROWS", "QTYPES", "X16_GROUP_QTYPES", "X16_QTYPES", "QGemv",
           "QType", "dequantize", "dequantize_rows", "interleaved", "native_available", "native_status", "qgemv",
           "qtype_of", "quantize_x", "set_native_enabled", "torch_qgemv", "torch_qgemv_int8"]
