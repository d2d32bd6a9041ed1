"""What every WGSL kernel generator shares: the call it is generated for, typed loads and stores of every
program dtype, layout-aware indexing, literals, activations and the one-thread-per-element entry point.

A kernel's generator (named by ``impls["webgpu"]`` in its record of ``npu_program.kernels``) is a function
``generate(call: Call) -> Shader | list[Shader]``. The shader binds, in order, the dispatch's inputs
(``in0``, ``in1``, ...), its outputs (``out0``, ...) and any scratch buffers it asks for (``tmp0``, ...),
all as ``var<storage, read_write>`` (one arena buffer holds many tensors; WebGPU forbids binding one buffer
read-only and writable in the same dispatch). Sizes, strides and parameters are baked into the source as
constants, so each distinct shape compiles once and a run passes nothing but bind groups.

Arithmetic is in ``f32`` for floating tensors and ``i32`` for integer and bool ones, whatever the storage:
``ld_in0(i)`` returns that type from storage element ``i``, ``st_out0(i, v)`` stores it. WGSL has no
bfloat16, int64 or 8-bit storage types, so those are read from ``u32`` words (bfloat16: the high half of an
f32; int64: the low word, which holds every index a program uses; 8-bit: one byte), and a store of a
sub-word element sets its bits with two atomics (its neighbours in the word belong to other invocations).
float16 uses ``array<f16>`` where the adapter has ``shader-f16``, else ``unpack2x16float`` on words.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from npu_program.kernels import KernelDef
from npu_program.program import Dispatch, TensorSpec
from torch_ir.activations import ACTIVATIONS

#: Invocations per workgroup of the one-thread-per-element kernels (WebGPU's portable maximum).
WORKGROUP = 256
#: Workgroups per grid dimension (WebGPU's portable maximum); larger grids wrap into y.
MAX_GROUPS = 65535
FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16"})


class UnsupportedCall(ValueError):  # noqa: N818 - read as "this call is unsupported"
    """The generator cannot run these parameters or dtypes; the executor reports it with the dispatch."""


@dataclass(frozen=True)
class Call:
    """One dispatch as its generator sees it."""

    dispatch: Dispatch
    record: KernelDef
    ins: tuple[TensorSpec, ...]
    outs: tuple[TensorSpec, ...]
    has_f16: bool
    #: whether WGSL's packed 4x8-bit dot products run here (``gpu.has_packed_dot4``)
    has_dot4: bool = False

    @property
    def params(self) -> dict[str, Any]:
        return self.dispatch.params

    def param(self, name: str, default: Any = None) -> Any:
        value = self.dispatch.params.get(name, default)
        return default if value is None else value

    @property
    def in_place(self) -> dict[int, int]:
        """Output index -> input index of the same tensor (a KV cache written in place)."""
        d = self.dispatch
        return {j: d.inputs.index(name) for j, name in enumerate(d.outputs) if name in d.inputs}

    def header(self, scratch: Sequence[str] = ()) -> str:
        """The bindings and their typed accessors (``scratch``: WGSL element types of the scratch buffers)."""
        parts = []
        written = {i for i in self.in_place.values()}
        uses_f16 = self.has_f16 and any(s.dtype == "float16" for s in (*self.ins, *self.outs))
        if uses_f16:
            parts.append("enable f16;")
        for i, spec in enumerate(self.ins):
            dtype = spec.storage[0] if spec.quant is not None and spec.quant.block else spec.dtype  # GGUF blocks: bytes
            parts.append(binding(i, f"in{i}", dtype, writable=i in written, f16=self.has_f16))
        for j, spec in enumerate(self.outs):
            parts.append(binding(len(self.ins) + j, f"out{j}", spec.dtype, writable=True, f16=self.has_f16))
        for k, elem in enumerate(scratch):
            parts.append(f"@group(0) @binding({len(self.ins) + len(self.outs) + k}) "
                         f"var<storage, read_write> tmp{k}: array<{elem}>;")
        parts.append(HELPERS)
        return "\n".join(parts)


@dataclass(frozen=True)
class Shader:
    """One compute pipeline's source and the workgroups of its dispatch (x, y, z)."""

    code: str
    workgroups: tuple[int, int, int]
    #: byte sizes of scratch buffers bound after the outputs (allocated once per kernel)
    scratch: tuple[int, ...] = field(default=())
    #: a check of the values bound before any run (weights, constants), given a reader of input ``i`` (None when
    #: that input is an activation); raises ValueError naming what the kernel cannot compute exactly
    bind_check: Callable[[Callable[[int], np.ndarray | None]], None] | None = field(default=None, compare=False)
    #: the bytes of its scratch buffers, in order, computed from the values bound before any run (a QLUT's table;
    #: same reader as ``bind_check``); raises ValueError when what it needs is not bound
    bind_data: Callable[[Callable[[int], np.ndarray | None]], list[bytes]] | None = field(default=None,
                                                                                          compare=False)


# -- types and accessors ----------------------------------------------------------------------------------

def compute_type(dtype: str) -> str:
    """The WGSL type arithmetic on a tensor of ``dtype`` uses."""
    return "f32" if dtype in FLOAT_DTYPES else "i32"


def binding(index: int, name: str, dtype: str, *, writable: bool, f16: bool) -> str:
    """The declaration of binding ``index`` and its ``ld_<name>``/``st_<name>`` accessors."""
    decl = f"@group(0) @binding({index}) var<storage, read_write> {name}"
    t = compute_type(dtype)
    if dtype == "float32" or dtype == "int32":
        return (f"{decl}: array<{t}>;\nfn ld_{name}(i: u32) -> {t} {{ return {name}[i]; }}\n"
                f"fn st_{name}(i: u32, v: {t}) {{ {name}[i] = v; }}")
    if dtype == "int64":  # little-endian pairs of words: the low word is the value, the high one its sign
        return (f"{decl}: array<i32>;\nfn ld_{name}(i: u32) -> i32 {{ return {name}[2u * i]; }}\n"
                f"fn st_{name}(i: u32, v: i32) {{ {name}[2u * i] = v; {name}[2u * i + 1u] = select(0, -1, v < 0); }}")
    if dtype == "float16" and f16:
        return (f"{decl}: array<f16>;\nfn ld_{name}(i: u32) -> f32 {{ return f32({name}[i]); }}\n"
                f"fn st_{name}(i: u32, v: f32) {{ {name}[i] = f16(v); }}")
    if dtype not in _SUBWORD:
        raise UnsupportedCall(f"no WGSL storage for dtype {dtype}")
    per_word, load, bits = _SUBWORD[dtype]
    shift = f"(i & {per_word - 1}u) * {32 // per_word}u"
    word = f"atomicLoad(&{name}[i / {per_word}u])" if writable else f"{name}[i / {per_word}u]"
    elem = "atomic<u32>" if writable else "u32"
    mask = "0xffffu" if per_word == 2 else "0xffu"
    text = (f"{decl}: array<{elem}>;\n"
            f"fn ld_{name}(i: u32) -> {t} {{ let w = {word}; let s = {shift}; return {load}; }}")
    if writable:
        text += (f"\nfn st_{name}(i: u32, v: {t}) {{ let s = {shift}; let b = ({bits}) & {mask}; "
                 f"atomicAnd(&{name}[i / {per_word}u], ~({mask} << s)); atomicOr(&{name}[i / {per_word}u], b << s); }}")
    return text


# per dtype: (elements per u32 word, load expression of word w at bit shift s, store bits of value v)
_SUBWORD = {
    "bfloat16": (2, "bitcast<f32>(((w >> s) & 0xffffu) << 16u)", "bf16_bits(v)"),
    "float16": (2, "unpack2x16float((w >> s) & 0xffffu).x", "pack2x16float(vec2<f32>(v, 0.0))"),
    "int8": (4, "extractBits(bitcast<i32>(w), s, 8u)", "bitcast<u32>(v)"),
    "uint8": (4, "i32(extractBits(w, s, 8u))", "bitcast<u32>(v)"),
    "bool": (4, "i32(extractBits(w, s, 8u) != 0u)", "select(0u, 1u, v != 0)"),
}

# Functions every shader may call (unused ones cost nothing: the compiler drops them).
HELPERS = """
fn bf16_bits(v: f32) -> u32 {
  let u = bitcast<u32>(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) { return 0x7fc0u; }  // NaN, by its bits: a compiler may fold v != v
  return (u + 0x7fffu + ((u >> 16u) & 1u)) >> 16u;
}
// erf by Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7): WGSL has no erf
fn erf_(x: f32) -> f32 {
  let a = abs(x);
  let t = 1.0 / (1.0 + 0.3275911 * a);
  let p = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t;
  let y = 1.0 - p * exp(-a * a);
  return select(-y, y, x >= 0.0);
}
// tanh saturates long before |x| = 15; clamping keeps drivers that compute it from exp() away from inf / inf
fn tanh_(x: f32) -> f32 { return tanh(clamp(x, -15.0, 15.0)); }
fn gelu_(x: f32) -> f32 { return 0.5 * x * (1.0 + erf_(x * 0.7071067811865476)); }
fn gelu_tanh_(x: f32) -> f32 { return 0.5 * x * (1.0 + tanh_(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
fn gelu_none_(x: f32) -> f32 { return gelu_(x); }
fn pow_(x: f32, y: f32) -> f32 {
  if (y == 0.0) { return 1.0; }
  if (x < 0.0 && y == round(y)) {  // WGSL's pow is undefined below zero; an integer power is not
    let r = pow(-x, y);
    return select(r, -r, (i32(y) & 1) == 1);
  }
  return pow(x, y);
}
fn silu_(x: f32) -> f32 { return x / (1.0 + exp(-x)); }
fn sigmoid_(x: f32) -> f32 { return 1.0 / (1.0 + exp(-x)); }
"""


def activation(name: str | None, x: str) -> str:
    """The WGSL of a fused activation applied to ``x`` (a name: the form may read it more than once), from the one
    activation table (``torch_ir.activations``), whose forms keep NaN as eager torch does."""
    if name is None:
        return x
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise UnsupportedCall(f"unknown activation {name!r}")
    return ACTIVATIONS[name].wgsl.format(x=x)


# -- literals ---------------------------------------------------------------------------------------------

def literal(value: Any, wgsl_type: str = "f32") -> str:
    """A Python number as a WGSL literal of ``wgsl_type`` (f32 infinities and NaN by their bits)."""
    if isinstance(value, bool):
        value = int(value)
    if wgsl_type == "i32":
        if isinstance(value, float) and not value.is_integer():
            raise UnsupportedCall(f"{value!r} is not an integer")
        return f"i32({int(value)})"
    if wgsl_type == "u32":
        return f"{int(value)}u"
    v = float(value)
    if math.isnan(v):
        return "bitcast<f32>(0x7fc00000u)"
    if math.isinf(v):
        return "bitcast<f32>(0x7f800000u)" if v > 0 else "bitcast<f32>(0xff800000u)"
    if abs(v) > 3.4028234663852886e38:  # beyond f32: what the CPU's cast gives
        return "bitcast<f32>(0x7f800000u)" if v > 0 else "bitcast<f32>(0xff800000u)"
    return f"f32({v!r})"


_PLACEHOLDER = re.compile(r"\{(\w+)(?:=([^}]*))?\}")


def substitute(template: str, values: dict[str, Any], wgsl_type: str) -> str:
    """``{name}`` / ``{name=default}`` in ``template`` replaced by literals of ``values`` (strings as they are)."""
    def one(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        value = values.get(name)
        if value is None:
            if default is None:
                raise UnsupportedCall(f"parameter {name!r} is missing")
            value = default if _WORD.fullmatch(default) else float(default)
        if isinstance(value, str):  # a program file is untrusted: a string may only select a known name
            if not _WORD.fullmatch(value):
                raise UnsupportedCall(f"parameter {name!r} = {value!r} is not one of the kernel's choices")
            return value
        return literal(value, wgsl_type)
    return _PLACEHOLDER.sub(one, template)


_WORD = re.compile(r"[a-z][a-z_]{0,15}")


# -- values: conversions and exact copies -----------------------------------------------------------------

def convert(expr: str, src: str, dst: str) -> str:
    """WGSL expression ``expr`` (the computation type of dtype ``src``) as the computation type of ``dst``."""
    if dst == "bool":
        return f"select(0, 1, ({expr}) != {'0.0' if src in FLOAT_DTYPES else '0'})"
    if compute_type(src) == compute_type(dst):
        return expr
    return f"{compute_type(dst)}({expr})"  # f32 -> i32 truncates toward zero, as torch's cast does


def move(call: Call, k: int, src_off: str, dst_off: str, j: int = 0) -> str:
    """A WGSL statement copying element ``src_off`` of input ``k`` to element ``dst_off`` of output ``j``."""
    src, dst = call.ins[k].dtype, call.outs[j].dtype
    if src == "int64":  # both words (ld sees only the low one): an int64 past 32 bits moves and converts right
        words = f"let src_w = 2u * ({src_off}); let lo = in{k}[src_w]; let hi = in{k}[src_w + 1u];"
        if dst == "int64":
            return f"{{ {words} let dst_w = 2u * ({dst_off}); out{j}[dst_w] = lo; out{j}[dst_w + 1u] = hi; }}"
        if dst in FLOAT_DTYPES:  # within an ulp of torch's rounding
            value = "f32(hi) * 4294967296.0 + f32(bitcast<u32>(lo))"
        else:  # narrower integers keep the low bits, as torch's cast wraps
            value = "select(0, 1, (lo | hi) != 0)" if dst == "bool" else "lo"
        return f"{{ {words} st_out{j}({dst_off}, {value}); }}"
    return f"st_out{j}({dst_off}, {convert(f'ld_in{k}({src_off})', src, dst)});"


# -- shapes, layouts and indexing -------------------------------------------------------------------------

def shape_of(spec: TensorSpec) -> list[int]:
    return [int(d) for d in spec.shape]


def storage_shape(spec: TensorSpec) -> list[int]:
    """The shape in storage order: NHWC stores logical [N, C, H, W] as [N, H, W, C]."""
    s = shape_of(spec)
    if spec.layout == "NHWC":
        return [s[0], s[2], s[3], s[1]]
    return s


def strides(shape: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def logical_strides(spec: TensorSpec) -> list[int]:
    """Storage strides per *logical* dim (NHWC's C dim has stride 1)."""
    if spec.layout == "NHWC":
        n, h, w, c = strides(storage_shape(spec))
        return [n, c, h, w]
    return strides(shape_of(spec))


def numel(spec: TensorSpec) -> int:
    return math.prod(shape_of(spec))


def unravel(index: str, shape: Sequence[int], prefix: str = "d") -> str:
    """WGSL lines splitting the row-major linear ``index`` (< the shape's size) over ``shape`` into
    ``let {prefix}0``, ``{prefix}1``, ... (u32)."""
    st = strides(shape)
    lines = []
    for k, (size, stride) in enumerate(zip(shape, st)):
        value = f"({index}) / {stride}u" if stride != 1 else f"({index})"
        lines.append(f"let {prefix}{k} = {value};" if k == 0 else f"let {prefix}{k} = {value} % {size}u;")
    return "\n  ".join(lines)


def offset(spec: TensorSpec, idx: Sequence[str], broadcast_from: Sequence[int] | None = None) -> str:
    """The storage element offset of ``spec`` at logical indices ``idx`` (WGSL u32 expressions).

    ``broadcast_from``: the shape ``idx`` ranges over, when ``spec`` broadcasts to it (numpy rules: trailing
    dims align, size-1 dims repeat)."""
    shape = shape_of(spec)
    st = logical_strides(spec)
    if broadcast_from is not None:
        idx = list(idx)[len(broadcast_from) - len(shape):] if shape else []
    terms = [f"({i}) * {s}u" for i, s, d in zip(idx, st, shape) if d != 1 and s != 0]
    return " + ".join(terms) if terms else "0u"


def groups(n_groups: int) -> tuple[int, int, int]:
    """A grid of ``n_groups`` workgroups (wrapped into y past 65535); read the flat index with ``GROUP_ID``."""
    n_groups = max(1, n_groups)
    if n_groups <= MAX_GROUPS:
        return (n_groups, 1, 1)
    return (MAX_GROUPS, math.ceil(n_groups / MAX_GROUPS), 1)


#: The entry point's builtins, and the flat workgroup index they give.
ENTRY_ARGS = ("@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, "
              "@builtin(local_invocation_index) lid: u32")
GROUP_ID = "(wid.y * nwg.x + wid.x)"


def per_element(call: Call, n: int, body: str, scratch: Sequence[str] = (), helpers: str = "") -> Shader:
    """A shader running ``body`` once per index ``i`` in [0, n) (one invocation each); ``helpers``: WGSL
    functions it calls."""
    code = f"""{call.header(scratch)}
{helpers}
@compute @workgroup_size({WORKGROUP})
fn main({ENTRY_ARGS}) {{
  let i = {GROUP_ID} * {WORKGROUP}u + lid;
  if (i >= {n}u) {{ return; }}
  {body}
}}
"""
    return Shader(code, groups(math.ceil(n / WORKGROUP)))


def per_group(call: Call, n_groups: int, size: int, body: str, scratch: Sequence[str] = (),
              shared: str = "") -> Shader:
    """A shader of ``n_groups`` workgroups of ``size`` invocations: ``g`` is the workgroup's index, ``lid``
    the invocation's; ``shared`` declares workgroup memory (a reduction's partial results)."""
    code = f"""{call.header(scratch)}
{shared}
@compute @workgroup_size({size})
fn main({ENTRY_ARGS}) {{
  let g = {GROUP_ID};
  if (g >= {n_groups}u) {{ return; }}
  {body}
}}
"""
    return Shader(code, groups(n_groups))
