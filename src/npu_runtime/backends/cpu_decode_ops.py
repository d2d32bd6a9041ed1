"""The small ops of a one-token decode step as one C call each: ``RMS_NORM``, ``ROPE_QK`` and ``ATTENTION`` over a
KV cache, fp32, bf16 and fp16.

Once the GEMVs run at memory bandwidth (:mod:`.cpu_gemv`), what is left of a decode step is about five small
dispatches per layer, each a few microseconds of arithmetic that PyTorch runs as several ops (an RMS norm is
five, attention over the cache about ten: matmul, scale, mask, softmax, NaN check, matmul, copy), each op
paying its dispatch cost, and, with more than one thread, a parallel region whose barrier waits for any
thread a neighbour process holds off its core. This module runs each of them as one call of a small C kernel
(``decode_ops.c`` beside this file), on one thread:

* ``rms_norm``: ``rnd(x · 1/sqrt(mean(x²) + eps)) · weight`` per row, rounded where ``torch_ir``'s reference
  rounds (``rnd``: to x's dtype);
* ``rope_qk``: ``x·cos + rotate_half(x)·sin`` of q and k with one cos/sin row, each product and the sum rounded
  to the dtype as the reference's ops do (fp32: bit-exact with it);
* ``attention``: one query token over the cache ``[B, Hkv, S, D]`` with grouped-query heads, a bool or additive
  mask broadcast over heads; scores, softmax and the weighted sum in fp32, the output rounded once. Hidden
  positions are skipped (their k and v rows are not read): exact, since each adds exp(-inf) = 0 to the softmax
  and 0·v to the sum, as long as the hidden cache rows hold numbers (PyTorch would turn a NaN there into a NaN
  output; the cache's unwritten rows are zeros).

The C code is built on first use like the GEMV (:mod:`.cpu_gemv_build`: cached per machine, AVX-512 / AVX2 /
portable C chosen at run time from the CPU, every variant the same operations in the same order). It trusts its
pointers, so every function here checks each tensor's dtype, shape, contiguity and bytes-in-storage and that no
output overlaps an input (except an output that *is* its input, which the kernels allow) before each call.

Each function returns False, having done nothing, when the kernel is not to be used: switched off
(``TORCH_IR_NATIVE_DECODE=0``, :func:`set_native_enabled`, or every native kernel with
``TORCH_IR_NATIVE_GEMV=0``) or not buildable here (one warning); the caller then runs its torch code.

Each op also has a ``*_call`` form: the same checks and argument block, returned as a
:class:`~npu_runtime.backends.cpu_gemv_build.NativeCall` instead of made (None where the function would return
False). With the glue a whole decode step needs (:func:`silu_mul_call`, GATE_UP's epilogue, which GATE_UP's kernel
runs unchained too; :func:`add_call`, :func:`copy_call`, :func:`kv_update_call`), they are what
:mod:`.cpu_chain` plans a step into, and :func:`chain` makes a list of such calls in one C call.
"""

from __future__ import annotations

import ctypes
import math
import os
import struct

import torch

from . import cpu_gemv_build
from .cpu_gemv_build import BuildError, Library, NativeCall, open_library, with_half

Tensor = torch.Tensor

SOURCE_NAME = "decode_ops.c"
#: dtype -> the kernel's dtype code (``DT_*`` in ``decode_ops.c``)
DTYPE_CODES: dict[torch.dtype, int] = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
#: mask dtype -> ``MASK_*`` in ``decode_ops.c`` (0: no mask)
MASK_CODES: dict[torch.dtype, int] = {torch.bool: 1, torch.float32: 2, torch.bfloat16: 3, torch.float16: 4}
#: query heads per key/value head the kernel takes (its stack array of per-row flags)
MAX_GROUP = 256
ISA_NAMES = {0: "portable C", 1: "AVX2", 2: "AVX-512"}

# argument blocks, field for field the structs of decode_ops.c
_RMS = struct.Struct("<6qdq")  # rows n x w y dt eps isa
_ROPE = struct.Struct("<11q")  # q_rows k_rows D q k cos sin q_out k_out dt isa
_ATTN = struct.Struct("<15qdq")  # B H Hkv S D q k v mask mask_kind mask_sb mask_sh out scratch dt scale isa
_SILU = struct.Struct("<6q")  # n g u y dt isa
_ADD = struct.Struct("<3q")  # n a y
_COPY = struct.Struct("<3q")  # bytes src dst
_KV = struct.Struct("<6q")  # rows S bytes index src cache


#: gcc leaves a loop of exp_poly scalar in AVX2 under its default trapping math (it moves the arithmetic into the
#: arms of the selects, where it may not be speculated); without FP traps every variant vectorizes it. The results
#: are the same: only the exception flags, which nothing reads, may differ.
EXTRA_FLAGS = ("-fno-trapping-math",)


def _build() -> Library:
    try:
        source = with_half(SOURCE_NAME)
    except OSError as exc:  # an install without its package data: the torch path still runs
        raise BuildError(f"cannot read {SOURCE_NAME} (and half.c): {exc}") from exc
    lib, path = open_library(source, "decode_ops", EXTRA_FLAGS)
    for name in ("dops_rms_norm", "dops_rope", "dops_attention", "dops_silu_mul", "dops_add", "dops_copy",
                 "dops_kv_update"):
        getattr(lib, name).argtypes = [ctypes.c_char_p]
        getattr(lib, name).restype = ctypes.c_int
    lib.dops_chain.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    lib.dops_chain.restype = ctypes.c_int64
    lib.dops_isa.restype = ctypes.c_int
    return Library(lib, path, int(lib.dops_isa()), False)


_kernel = cpu_gemv_build.NativeKernel("decode ops", _build, lambda library: ISA_NAMES.get(library.isa, "?"),
                                      "RMS_NORM, ROPE_QK and ATTENTION of decode run as PyTorch ops")
_enabled = os.environ.get("TORCH_IR_NATIVE_DECODE", "1").strip().lower() not in ("0", "false", "no", "off")
#: the ISA the calls ask for, None: the best the CPU has (a test lowers it to compare the variants)
_isa: int | None = None


def set_native_enabled(enabled: bool) -> bool:
    """Run the decode ops' C kernels (True, the default unless ``TORCH_IR_NATIVE_DECODE=0``) or PyTorch's ops
    (False: a comparison, a test of the fallback); returns the previous setting. ``TORCH_IR_NATIVE_GEMV=0``
    turns these off too."""
    global _enabled
    previous, _enabled = _enabled, bool(enabled)
    return previous


def set_isa(isa: int | None) -> int | None:
    """Ask for the variant ``isa`` (0 portable C, 1 AVX2, 2 AVX-512; at most what the CPU has) or, with None,
    the best one; returns the previous request."""
    global _isa
    previous, _isa = _isa, isa
    return previous


def native_status() -> str:
    """One line: which implementation the decode ops run here, and why."""
    if not _enabled:
        return "torch (native decode ops disabled by TORCH_IR_NATIVE_DECODE=0 or set_native_enabled(False))"
    return _kernel.status()


def _library() -> tuple[Library, int] | None:
    if not _enabled:
        return None
    library = _kernel.for_call()
    if library is None:
        return None
    return library, library.isa if _isa is None else max(0, min(_isa, library.isa))


# ------------------------------------------------------------------------------------------- checks


def _arg(t: Tensor, op: str, what: str, dtypes: dict[torch.dtype, int]) -> tuple[int, int, int]:
    """``(address, dtype code, bytes)`` of a tensor the C code touches, checked (``cpu_gemv_build.tensor_arg``; its
    shape is checked apart, by :func:`_shape`)."""
    return cpu_gemv_build.tensor_arg(t, op, what, dtypes)


def _shape(t: Tensor, op: str, what: str, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(f"{op}: {what} has shape {tuple(t.shape)}, expected {shape}")


class Held:
    """A tensor a kernel passes again on every call (a weight, the KV cache, its working memory): checked the first
    time, then trusted while the same object comes back for the same shape, as :class:`.cpu_gemv.Gemv` trusts its
    weight after one check. Resizing its storage in place meanwhile is not supported. Why: after the GEMVs have
    streamed the weights through the caches, each tensor accessor a check calls costs ~5-10 µs (measured), as
    much as the op's arithmetic; activations are still checked on every call."""

    __slots__ = ("arg", "shape", "tensor")

    def __init__(self) -> None:
        self.tensor: Tensor | None = None
        self.shape: tuple[int, ...] | None = None
        self.arg = (0, 0, 0)


def _held_arg(held: Held | None, t: Tensor, op: str, what: str, shape: tuple[int, ...],
              dtypes: dict[torch.dtype, int]) -> tuple[int, int, int]:
    """:func:`_arg` and the shape check of ``t``, unless ``held`` saw this tensor for this shape before."""
    if held is not None and t is held.tensor and shape == held.shape:
        return held.arg
    _shape(t, op, what, shape)
    arg = _arg(t, op, what, dtypes)
    if held is not None:
        held.tensor, held.shape, held.arg = t, shape, arg
    return arg


def _disjoint(op: str, out: tuple[int, int, int], out_name: str, others: dict[str, tuple[int, int, int]],
              same_ok: str | None = None) -> None:
    """Refuse an output that overlaps an input (the kernel would read what it already wrote), except the input
    ``same_ok`` when the output is exactly it (the kernel reads each element before writing it)."""
    for name, (p, _, size) in others.items():
        if out[0] < p + size and p < out[0] + out[2]:
            if name == same_ok and p == out[0] and size == out[2]:
                continue
            raise ValueError(f"{op}: {out_name} overlaps {name}")


# ---------------------------------------------------------------------------------------------- ops


def _made(call: NativeCall | None) -> bool:
    """Make ``call`` now; False when there is none (the caller runs its torch code)."""
    if call is None:
        return False
    call()
    return True


def rms_norm(x: Tensor, weight: Tensor | None, out: Tensor, eps: float, held: Held | None = None) -> bool:
    """``out = rnd(x · 1/sqrt(mean(x², -1) + eps)) · weight`` (``rnd``: rounded to x's dtype; without weight, not
    rounded twice); x, weight ``[n]`` and out of one dtype, out x's shape or x itself; ``held`` keeps the weight's
    check (:class:`Held`). False: not run (see the module's docstring)."""
    return _made(rms_norm_call(x, weight, out, eps, held))


def rms_norm_call(x: Tensor, weight: Tensor | None, out: Tensor, eps: float,
                  held: Held | None = None) -> NativeCall | None:
    """:func:`rms_norm` checked and packed, not made (each ``*_call`` here is its op's call for a chain,
    ``cpu_chain``); None: the kernel is not to be used."""
    found = _library()
    if found is None:
        return None
    op = "rms_norm"
    xp, dt, xn = _arg(x, op, "x", DTYPE_CODES)
    n = int(x.shape[-1]) if x.dim() else 1
    _shape(out, op, "out", tuple(x.shape))
    yp = _arg(out, op, "out", DTYPE_CODES)
    args = {"x": (xp, dt, xn)}
    wp = 0
    if weight is not None:
        args["weight"] = w = _held_arg(held, weight, op, "weight", (n,), DTYPE_CODES)
        wp = w[0]
    if any(code != dt for _, code, _ in (yp, *args.values())):
        raise TypeError(f"{op}: x, weight and out must have one dtype")
    _disjoint(op, yp, "out", args, same_ok="x")
    return NativeCall(found[0].lib.dops_rms_norm, _RMS.pack(x.numel() // n if xn else 0, n, xp, wp, yp[0], dt,
                                                            float(eps), found[1]), keep=(x, weight, out))


def rope_qk(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, q_out: Tensor, k_out: Tensor) -> bool:
    """``x·cos + rotate_half(x)·sin`` of q into q_out and of k into k_out (each its input's shape, or the input
    itself), the rows of D (the last dim, even) of both sharing one cos and one sin row: cos and sin hold D
    values (one token). One dtype for all. False: not run."""
    return _made(rope_qk_call(q, k, cos, sin, q_out, k_out))


def rope_qk_call(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, q_out: Tensor, k_out: Tensor) -> NativeCall | None:
    """:func:`rope_qk`, not made."""
    found = _library()
    if found is None:
        return None
    op = "rope_qk"
    d = int(q.shape[-1]) if q.dim() else 0
    if d % 2 or d == 0 or k.dim() == 0 or int(k.shape[-1]) != d:
        raise ValueError(f"{op}: q and k need one even last dim, got {tuple(q.shape)} and {tuple(k.shape)}")
    for t, what in ((cos, "cos"), (sin, "sin")):
        if t.numel() != d:
            raise ValueError(f"{op}: {what} must hold one row of {d} values (one token), has shape {tuple(t.shape)}")
    _shape(q_out, op, "q_out", tuple(q.shape))
    _shape(k_out, op, "k_out", tuple(k.shape))
    ins = {name: _arg(t, op, name, DTYPE_CODES) for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin))}
    qo, ko = _arg(q_out, op, "q_out", DTYPE_CODES), _arg(k_out, op, "k_out", DTYPE_CODES)
    dt = ins["q"][1]
    if any(code != dt for _, code, _ in (qo, ko, *ins.values())):
        raise TypeError(f"{op}: q, k, cos, sin and the outputs must have one dtype")
    _disjoint(op, qo, "q_out", {**ins, "k_out": ko}, same_ok="q")
    _disjoint(op, ko, "k_out", ins, same_ok="k")
    return NativeCall(found[0].lib.dops_rope, _ROPE.pack(q.numel() // d, k.numel() // d, d, ins["q"][0], ins["k"][0],
                                                        ins["cos"][0], ins["sin"][0], qo[0], ko[0], dt, found[1]),
                      keep=(q, k, cos, sin, q_out, k_out))


def attention_scratch(heads: int, kv_heads: int, positions: int, head_dim: int) -> Tensor:
    """The fp32 working memory :func:`attention` needs for these sizes (a kernel allocates it once)."""
    g = heads // max(kv_heads, 1)
    return torch.empty(g * positions + 2 * g * head_dim + head_dim + positions, dtype=torch.float32)


def _mask_arg(mask: Tensor | None, op: str, b: int, h: int, s: int) -> tuple[tuple[int, int, int], int, int]:
    """The mask's ``(address, kind, bytes)`` and its element strides over batch and heads once broadcast to
    ``[B, H, 1, S]`` (0 where it is broadcast); its last dim must be the S positions."""
    if mask is None:
        return (0, 0, 0), 0, 0
    p = _arg(mask, op, "mask", MASK_CODES)
    if mask.dim() > 4 or mask.dim() < 1 or int(mask.shape[-1]) != s:
        raise ValueError(f"{op}: mask {tuple(mask.shape)} must end in the cache's {s} positions")
    try:
        strides = mask.expand(b, h, 1, s).stride()
    except RuntimeError as exc:
        raise ValueError(f"{op}: mask {tuple(mask.shape)} does not broadcast to {(b, h, 1, s)}") from exc
    return p, int(strides[0]), int(strides[1])


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, out: Tensor, scale: float,
              scratch: Tensor | None = None, held: tuple[Held, Held, Held] | None = None) -> bool:
    """``out = softmax(q·kᵀ·scale + mask)·v`` for one query token: q ``[B, H, 1, D]``, the cache k and v
    ``[B, Hkv, S, D]`` (H a multiple of Hkv: grouped-query heads), mask None, bool (False hides a position) or
    additive fp32/bf16/fp16, broadcasting to ``[B, H, 1, S]``; out ``[B, 1, H·D]`` (heads merged) or ``[B, H, 1, D]``
    (the same memory for one token). q, k, v and out of one dtype; ``scratch`` from :func:`attention_scratch`
    (allocated here when None); ``held`` keeps the checks of k, v and scratch (:class:`Held`). False: not run."""
    return _made(attention_call(q, k, v, mask, out, scale, scratch, held))


def attention_call(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, out: Tensor, scale: float,
                   scratch: Tensor | None = None,
                   held: tuple[Held, Held, Held] | None = None) -> NativeCall | None:
    """:func:`attention`, not made."""
    found = _library()
    if found is None:
        return None
    op = "attention"
    if q.dim() != 4 or k.dim() != 4 or int(q.shape[2]) != 1:
        raise ValueError(f"{op}: q must be [B, H, 1, D] and k [B, Hkv, S, D], got {tuple(q.shape)}, {tuple(k.shape)}")
    b, h, _, d = (int(n) for n in q.shape)
    hkv, s = int(k.shape[1]), int(k.shape[2])
    if hkv < 1 or h % hkv or h // hkv > MAX_GROUP or s >= 2**31:
        raise ValueError(f"{op}: k {tuple(k.shape)} does not fit q {tuple(q.shape)} (heads a multiple of its heads, "
                         f"at most {MAX_GROUP} per key head; under 2³¹ positions)")
    if tuple(out.shape) not in ((b, 1, h * d), (b, h, 1, d)):
        raise ValueError(f"{op}: out has shape {tuple(out.shape)}, expected {(b, 1, h * d)} or {(b, h, 1, d)}")
    kv_held, scratch_held = (held[:2], held[2]) if held is not None else ((None, None), None)
    ins = {"q": _arg(q, op, "q", DTYPE_CODES), "k": _held_arg(kv_held[0], k, op, "k", (b, hkv, s, d), DTYPE_CODES),
           "v": _held_arg(kv_held[1], v, op, "v", (b, hkv, s, d), DTYPE_CODES)}
    yp = _arg(out, op, "out", DTYPE_CODES)
    dt = ins["q"][1]
    if any(code != dt for _, code, _ in (yp, *ins.values())):
        raise TypeError(f"{op}: q, k, v and out must have one dtype")
    (mp, kind, mn), msb, msh = _mask_arg(mask, op, b, h, s)
    scratch = attention_scratch(h, hkv, s, d) if scratch is None else scratch
    need = (h // hkv) * (s + 2 * d) + d + s
    if scratch_held is None or scratch is not scratch_held.tensor or scratch_held.shape != (need,):
        if scratch.numel() < need:
            raise ValueError(f"{op}: scratch holds {scratch.numel()} floats, needs {need}")
        scratch_held = scratch_held or Held()
        scratch_held.tensor, scratch_held.shape = scratch, (need,)
        scratch_held.arg = _arg(scratch, op, "scratch", {torch.float32: 0})
    sp = scratch_held.arg
    ins["mask"] = (mp, kind, mn)
    _disjoint(op, yp, "out", {**ins, "scratch": sp})
    _disjoint(op, sp, "scratch", ins)
    return NativeCall(found[0].lib.dops_attention, _ATTN.pack(b if h * d else 0, h, hkv, s, d, ins["q"][0],
                                                              ins["k"][0], ins["v"][0], mp, kind, msb, msh, yp[0],
                                                              sp[0], dt, float(scale), found[1]),
                      keep=(q, k, v, mask, out, scratch))


def silu_mul(both: Tensor, out: Tensor) -> bool:
    """GATE_UP's epilogue of one row: ``out = silu(gate) · up`` with ``both`` ``[1, 2n]`` (gate, then up) and out of
    n elements (any shape), fp32, bf16 or fp16, rounded where PyTorch's silu then mul round (the exponential a
    polynomial within ~2 ulp of expf: ``decode_ops.c``). False: not run."""
    return _made(silu_mul_call(both, out))


def silu_mul_call(both: Tensor, out: Tensor) -> NativeCall | None:
    """:func:`silu_mul`, not made; None also for a shape or dtype it does not take (the caller's torch code runs)."""
    found = _library()
    if found is None or both.dim() != 2 or int(both.shape[0]) != 1 or both.dtype not in DTYPE_CODES or \
            out.dtype != both.dtype or 2 * out.numel() != both.numel() or not out.is_contiguous():
        return None
    op, n = "silu_mul", out.numel()
    bp = _arg(both, op, "gate and up", DTYPE_CODES)
    yp = _arg(out, op, "out", DTYPE_CODES)
    _disjoint(op, yp, "out", {"gate and up": bp})
    return NativeCall(found[0].lib.dops_silu_mul, _SILU.pack(n, bp[0], bp[0] + both.element_size() * n, yp[0], bp[1],
                                                            found[1]), keep=(both, out))


def add_call(y: Tensor, a: Tensor) -> NativeCall | None:
    """``y += a`` (fp32, one shape, apart), not made: a residual added after a GEMV, as ``Tensor.add_`` adds it."""
    found = _library()
    if found is None or y.dtype != torch.float32 or a.dtype != torch.float32 or y.shape != a.shape or \
            not (y.is_contiguous() and a.is_contiguous()):
        return None
    yp, ap = _arg(y, "add", "y", {torch.float32: 0}), _arg(a, "add", "a", {torch.float32: 0})
    _disjoint("add", yp, "y", {"a": ap})
    return NativeCall(found[0].lib.dops_add, _ADD.pack(y.numel(), ap[0], yp[0]), keep=(y, a))


def copy_call(src: Tensor, dst: Tensor) -> NativeCall | None:
    """``dst`` gets ``src``'s bytes (one dtype and element count, both contiguous, apart), not made."""
    found = _library()
    if found is None or src.dtype != dst.dtype or src.numel() != dst.numel() or \
            not (src.is_contiguous() and dst.is_contiguous()):
        return None
    codes = {src.dtype: 0}
    sp, dp = _arg(src, "copy", "src", codes), _arg(dst, "copy", "dst", codes)
    _disjoint("copy", dp, "dst", {"src": sp})
    return NativeCall(found[0].lib.dops_copy, _COPY.pack(sp[2], sp[0], dp[0]), keep=(src, dst))


def kv_update_call(cache: Tensor, new: Tensor, index: Tensor, dim: int) -> NativeCall | None:
    """KV_UPDATE of one position, in place, not made: ``cache.index_copy_(dim, index, new)`` with one index (an int64
    read when the call runs: an index outside the cache makes the call fail, having written nothing) and ``new`` of
    cache's shape but 1 along ``dim``; None for any other case."""
    found = _library()
    if found is None or cache.dim() == 0 or new.dtype != cache.dtype or index.dtype != torch.int64 or \
            index.numel() != 1 or not (cache.is_contiguous() and new.is_contiguous()):
        return None
    d = dim % cache.dim()
    if tuple(new.shape) != (*cache.shape[:d], 1, *cache.shape[d + 1:]):
        return None
    codes, op = {cache.dtype: 0}, "kv_update"
    cp, np_ = _arg(cache, op, "cache", codes), _arg(new, op, "new", codes)
    ip = _arg(index, op, "index", {torch.int64: 0})
    _disjoint(op, cp, "cache", {"new": np_, "index": ip})
    rows, row_bytes = math.prod(cache.shape[:d]), math.prod(cache.shape[d + 1:]) * cache.element_size()
    return NativeCall(found[0].lib.dops_kv_update, _KV.pack(rows, int(cache.shape[d]), row_bytes, ip[0], np_[0],
                                                           cp[0]), keep=(cache, new, index))


def chain(calls: Tensor, n: int, ns: Tensor | None = None) -> int:
    """Make the ``n`` calls listed in ``calls`` (int64 ``[2n]``: each call's C function, then its argument block's
    address) in one C call: -1 when every one returned 0, else the index of the first that did not (the later
    ones not made). The caller keeps every block and everything its pointers reach alive. ``ns`` (int64 ``[n]``):
    each call's wall time in nanoseconds, written as it runs."""
    found = _library()
    if found is None:
        raise RuntimeError("chain: the native decode ops are off or cannot be built here")
    if calls.dtype != torch.int64 or not calls.is_contiguous() or calls.numel() < 2 * n:
        raise ValueError(f"chain: calls must be a contiguous int64 tensor of 2 entries for each of the {n} calls")
    if ns is not None and (ns.dtype != torch.int64 or not ns.is_contiguous() or ns.numel() < n):
        raise ValueError(f"chain: ns must be a contiguous int64 tensor of at least {n} entries")
    return int(found[0].lib.dops_chain(calls.data_ptr(), n, ns.data_ptr() if ns is not None else None))


__all__ = ["DTYPE_CODES", "MASK_CODES", "MAX_GROUP", "SOURCE_NAME", "Held", "add_call", "attention", "attention_call",
           "attention_scratch", "chain", "copy_call", "kv_update_call", "native_status", "rms_norm", "rms_norm_call",
           "rope_qk", "rope_qk_call", "set_isa", "set_native_enabled", "silu_mul", "silu_mul_call"]
