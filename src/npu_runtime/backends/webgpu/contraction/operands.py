"""What every contraction kernel is made of: storage offsets of flat indices over runs of dims, the operand
loads (``Load``), the batched product with its epilogue (``Contraction``), and the parameter helpers the
generators share."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from npu_program.program import TensorSpec, block_of

from ..wgsl import FLOAT_DTYPES, Call, UnsupportedCall, activation, logical_strides, shape_of, strides
from .blocks import Blocks, block_operand, select_blocks

# -- offsets ------------------------------------------------------------------------------------------------

def _aligned_strides(spec: TensorSpec, full: Sequence[int]) -> list[int]:
    """``spec``'s storage stride per dim of the iteration shape ``full`` it broadcasts to (0 where it repeats)."""
    shape, st = shape_of(spec), logical_strides(spec)
    pad = len(full) - len(shape)
    if pad < 0:
        raise UnsupportedCall(f"a tensor of shape {shape} does not broadcast to {list(full)}")
    return [0] * pad + [0 if d == 1 else s for d, s in zip(shape, st)]


def _offset(spec: TensorSpec, parts: Sequence[tuple[str, Sequence[int]]]) -> str:
    """The storage offset of ``spec`` where each part ``(index, dims)`` is a row-major flat index over a run of
    consecutive iteration dims (the parts' dims concatenated are the iteration shape ``spec`` broadcasts to).

    A run whose strides are those of a contiguous block costs one multiply; others are unravelled."""
    full = [d for _, dims in parts for d in dims]
    st = _aligned_strides(spec, full)
    terms, at = [], 0
    for var, dims in parts:
        sts, at = st[at:at + len(dims)], at + len(dims)
        live = [(d, cs, s) for d, cs, s in zip(dims, strides(dims), sts) if d > 1]
        if not any(s for _, _, s in live):
            continue
        scale = live[-1][2] // live[-1][1]
        if all(s == cs * scale for _, cs, s in live):  # a broadcast dim (stride 0) among others breaks this
            terms.append(f"({var})" if scale == 1 else f"({var}) * {scale}u")
            continue
        total = math.prod(dims)
        for d, cs, s in (x for x in live if x[2]):
            q = f"({var})" if cs == 1 else f"({var}) / {cs}u"
            q = f"({q}) % {d}u" if cs * d < total else q
            terms.append(f"({q}) * {s}u")
    return " + ".join(terms) if terms else "0u"


def _even_strides(spec: TensorSpec, skip: int) -> bool:
    """Whether every stride of ``spec`` but that of logical dim ``skip`` is even (a pair at an even k is then
    one aligned u32 word)."""
    st = logical_strides(spec)
    return all(s % 2 == 0 or d == 1 for i, (d, s) in enumerate(zip(shape_of(spec), st)) if i != skip % len(st))


def _pair_loader(call: Call, i: int, t: str) -> str | None:
    """``fn ld2_in{i}(o) -> vec2<t>``: elements ``o`` and ``o + 1`` (``o`` even) of input ``i``, one u32 word for
    16-bit floats (halving the loads); None where the dtype or binding does not allow it."""
    dtype = call.ins[i].dtype
    if t != "f32" or dtype not in FLOAT_DTYPES or i in call.in_place.values():
        return None
    head = f"fn ld2_in{i}(o: u32) -> vec2<f32> {{"
    if dtype == "bfloat16":  # a word holds element o in its low half, o + 1 in its high half
        return f"{head} let w = in{i}[o / 2u]; return vec2<f32>(bitcast<f32>(w << 16u), " \
               f"bitcast<f32>(w & 0xffff0000u)); }}"
    if dtype == "float16" and not call.has_f16:
        return f"{head} return unpack2x16float(in{i}[o / 2u]); }}"
    return f"{head} return vec2<f32>(ld_in{i}(o), ld_in{i}(o + 1u)); }}"


# -- operands -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Load:
    """How a kernel reads one operand: ``fn NAME(b, r, k) -> T`` (``r`` is m for A, n for B; in-range indices),
    and ``fn NAME2(b, r, k) -> vec2<T>`` of k and k + 1 for even k where a pair is one load (else None)."""

    body: str  # the element function's body
    pair_body: str | None = None
    k_fast: bool = True  # k has storage stride 1: a tile is loaded k-fastest (coalesced)
    batched: bool = False  # depends on b
    deps: str = ""  # WGSL the bodies call
    blocks: Blocks | None = None  # a GGUF block-quantized weight's group reads (``blocks``)

    def code(self, name: str, t: str) -> str:
        text = f"{self.deps}\nfn {name}(b: u32, r: u32, k: u32) -> {t} {{ {self.body} }}"
        if self.blocks is not None:
            text += self.blocks.deps
        if self.pair_body is not None:
            text += f"\nfn {name}2(b: u32, r: u32, k: u32) -> vec2<{t}> {{ {self.pair_body} }}"
        return text


def _tensor_load(call: Call, i: int, t: str, parts: Sequence[tuple[str, Sequence[int]]], k_dim: int,
                 k_size: int) -> Load:
    """A load of input ``i`` whose logical dims are ``parts`` (flat indices over runs of dims, among them ``k``,
    which is logical dim ``k_dim`` of the input)."""
    spec = call.ins[i]
    if block_of(spec) is not None:  # never read GGUF block bytes as floats
        raise UnsupportedCall(f"input {i} ({spec.name!r}) is {block_of(spec)} blocks, read only as a weight [N, K]")
    off = _offset(spec, parts)
    k_stride = logical_strides(spec)[k_dim] if shape_of(spec) else 0
    pair = _pair_loader(call, i, t)
    pairs = pair is not None and k_stride == 1 and k_size % 2 == 0 and _even_strides(spec, k_dim)
    full = [d for _, dims in parts for d in dims]
    lead = len(parts[0][1]) if parts[0][0] == "b" else 0  # the batch dims come first
    batched = any(s for s in _aligned_strides(spec, full)[:lead])
    return Load(f"return {t}(ld_in{i}({off}));", f"return ld2_in{i}({off});" if pairs else None,
                k_fast=k_stride == 1, batched=batched, deps=pair if pairs else "")


def _select_load(loads: Sequence[Load], widths: Sequence[int], t: str, name: str) -> Load:
    """One B operand of several stacked along n (QKV_PROJ's three weights): row r of the ``j``-th
    when r is in its range."""
    deps, body, pair_body, start = [], [], [], 0
    for j, (load, width) in enumerate(zip(loads, widths)):
        deps.append(load.code(f"{name}_{j}", t))
        test = f"if (r < {start + width}u) " if j < len(loads) - 1 else ""
        body.append(f"{test}{{ return {name}_{j}(b, r - {start}u, k); }}")
        pair_body.append(f"{test}{{ return {name}_{j}2(b, r - {start}u, k); }}")
        start += width
    pairs = all(load.pair_body is not None for load in loads)
    return Load(" ".join(body), " ".join(pair_body) if pairs else None, k_fast=all(x.k_fast for x in loads),
                batched=any(x.batched for x in loads), deps="\n".join(deps),
                blocks=select_blocks([x.blocks for x in loads], widths, name))


@dataclass
class Contraction:
    """``C[b, m, n] = sum_k A(b, m, k) · B_j(b, n, k)`` for each B operand j, then ``epi(b, m, n, c_0, ...)``."""

    t: str  # the computation type: f32, or i32 for integer tensors
    batch: int
    m: int
    n: int
    k: int
    a: Load
    bs: list[Load]
    epilogue: str  # body of fn epi(b: u32, m: u32, n: u32, v0: T[, v1: T])

    def functions(self) -> str:
        """The WGSL of ``la``, ``lb0``, ... and ``epi``."""
        args = ", ".join(f"v{j}: {self.t}" for j in range(len(self.bs)))
        loads = [self.a.code("la", self.t), *(b.code(f"lb{j}", self.t) for j, b in enumerate(self.bs))]
        return "\n".join([*loads, f"fn epi(b: u32, m: u32, n: u32, {args}) {{\n  {self.epilogue}\n}}"])


# -- shared pieces ------------------------------------------------------------------------------------------

def _compute_type(call: Call) -> str:
    return "f32" if any(s.dtype in FLOAT_DTYPES for s in (*call.ins, *call.outs)) else "i32"


def _act(call: Call, t: str, x: str) -> str:
    name = call.param("activation")
    if name is not None and t != "f32":
        raise UnsupportedCall(f"activation {name!r} of an integer contraction")
    return activation(name, x)


def _flag(call: Call, name: str, default: bool) -> bool:
    return bool(call.param(name, default))


def _number(value: object, name: str, integer: bool = False) -> float:
    """A parameter that must be a number (an integer with ``integer``): a program file is untrusted."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
        raise UnsupportedCall(f"{name}={value!r} is not {'an integer' if integer else 'a number'}")
    return int(value) if integer else float(value)


def _weight_load(call: Call, i: int, t: str, trans_b: bool, n: int, k: int) -> Load:
    """A 2-D weight ``[N, K]`` (``trans_b``) or ``[K, N]`` as operand B."""
    w = shape_of(call.ins[i])
    if len(w) != 2 or (w != [n, k] if trans_b else w != [k, n]):
        raise UnsupportedCall(f"weight {i} has shape {w}, not {[n, k] if trans_b else [k, n]}")
    if block_of(call.ins[i]) is not None and trans_b:  # GGUF blocks along K: read them as they lie
        body, blocks = block_operand(call, i, n, k)
        return Load(body, blocks=blocks)
    if trans_b:
        return _tensor_load(call, i, t, [("r", [n]), ("k", [k])], 1, k)
    return _tensor_load(call, i, t, [("k", [k]), ("r", [n])], 0, k)


def _rows_load(call: Call, t: str, lead: Sequence[int], k: int) -> Load:
    """Input 0 ``[*lead, K]`` as operand A with m flat over ``lead`` (no batch)."""
    return _tensor_load(call, 0, t, [("r", lead), ("k", [k])], len(lead), k)
