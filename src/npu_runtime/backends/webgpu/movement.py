"""WGSL generators of the data-movement kernels: views (when dispatched), permute, expand, slicing and
selecting, concatenation and splitting, gathers by index tensors, repeat, padding, roll, flip, fills and
scatters of static positions.

Every kernel is one invocation per output element (split and unbind: per input element, which is one per
element of all their outputs): it unravels its element's logical multi-index, maps it to the source
element and copies it, each tensor addressed through ``offset`` in its own layout (an NHWC input reads
right). Values go through the typed accessors, so one generator serves every dtype, except that an int64
is read as both its words, so movement never truncates one to its low word. A value changing dtype
(``copy``, ``cat`` of mixed dtypes) converts as torch does (float to int truncates, int to a narrower int
wraps, anything to bool is ``!= 0``).

Index tensors (``index``, ``gather``, ``index_select``) are int64 or int32; a negative index wraps once as
torch's does and the result is clamped into the dim, so an index torch would reject can never read outside
the tensor (torch raises; a GPU kernel cannot, and must not touch other tensors' memory).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from npu_program.program import TensorSpec

from .wgsl import (
    FLOAT_DTYPES,
    Call,
    Shader,
    UnsupportedCall,
    literal,
    move,
    numel,
    offset,
    per_element,
    shape_of,
    unravel,
)

#: Index tensor dtypes (bool and uint8 indices are masks, whose result size depends on the data).
INDEX_DTYPES = frozenset({"int64", "int32"})


# -- parameters -------------------------------------------------------------------------------------------

def int_param(call: Call, name: str, default: int | None = None) -> int:
    """Parameter ``name`` as an int (a program file is untrusted: anything else is refused)."""
    value = call.param(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UnsupportedCall(f"parameter {name!r} = {value!r} is not an integer")
    return value


def ints_param(call: Call, name: str, default: Sequence[int] = ()) -> list[int]:
    """Parameter ``name`` as a list of ints (a single int is a list of one)."""
    value = call.param(name, list(default))
    values = [value] if isinstance(value, int) else value
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise UnsupportedCall(f"parameter {name!r} = {value!r} is not a list of integers")
    return list(values)


def number(value: Any, name: str) -> float | int:
    """A scalar parameter's value: a number (inf and nan are floats in a loaded program: ``npu_program.params``)."""
    if isinstance(value, (bool, int, float)):
        return value
    raise UnsupportedCall(f"parameter {name!r} = {value!r} is not a number")


def norm_dim(dim: int, rank: int) -> int:
    """A dim in [0, rank) from one in [-rank, rank) (a 0-d tensor takes 0 and -1, as torch's wrap does)."""
    size = max(rank, 1)
    if not -size <= dim < size:
        raise UnsupportedCall(f"dim {dim} is out of range for a tensor of rank {rank}")
    return dim + size if dim < 0 else dim


def indices(n: int, prefix: str = "d") -> list[str]:
    """The names ``unravel`` gives a multi-index of ``n`` dims."""
    return [f"{prefix}{k}" for k in range(n)]


def load_index(call: Call, k: int, off: str, size: int, name: str) -> str:
    """WGSL lines making ``name`` (u32) the index at element ``off`` of input ``k`` along a dim of ``size``:
    a negative index wraps once (torch's rule); what is still outside [0, size) is clamped, so it never reads
    outside the tensor (torch would raise)."""
    spec = call.ins[k]
    if spec.dtype not in INDEX_DTYPES:
        raise UnsupportedCall(f"index input {k} is {spec.dtype}: only int64 and int32 indices are supported "
                              "(a bool mask's result size depends on the data)")
    if spec.dtype == "int32":
        lines = [f"let {name}_raw = ld_in{k}({off});"]
    else:  # int64: an index beyond i32 (its high word not the low one's sign) saturates, then clamps
        lines = [f"let {name}_w = 2u * ({off});",
                 f"let {name}_lo = in{k}[{name}_w];",
                 f"let {name}_hi = in{k}[{name}_w + 1u];",
                 f"let {name}_raw = select({name}_lo, select(i32(2147483647), i32(-2147483647), {name}_hi < 0), "
                 f"{name}_hi != ({name}_lo >> 31u));"]
    lines.append(f"let {name} = u32(clamp(select({name}_raw, {name}_raw + {size}, {name}_raw < 0), 0, "
                 f"{max(size - 1, 0)}));")
    return "\n  ".join(lines)


def per_output(call: Call, lines: Sequence[str]) -> Shader:
    """One invocation per output element: its logical index ``d0``, ``d1``, ... then ``lines``."""
    out = call.outs[0]
    return per_element(call, numel(out), "\n  ".join([unravel("i", shape_of(out)), *lines]))


def copy_from(call: Call, src_idx: Sequence[str], lines: Sequence[str] = ()) -> Shader:
    """Every output element from input 0 at logical indices ``src_idx`` (WGSL u32 expressions of the output's
    ``d0``, ``d1``, ... and of what ``lines`` define)."""
    out = call.outs[0]
    dst = offset(out, indices(len(shape_of(out))))
    return per_output(call, [*lines, move(call, 0, offset(call.ins[0], src_idx), dst)])


def check_shape(spec: TensorSpec, shape: Sequence[int], what: str) -> None:
    """Refuse a tensor whose shape is not what the kernel's other shapes and parameters give (a program file
    is untrusted: every index a kernel computes must stay inside the dims of the tensor it reads)."""
    if shape_of(spec) != list(shape):
        raise UnsupportedCall(f"{what}: {spec.name} is {shape_of(spec)}, the kernel's shapes and parameters give "
                              f"{list(shape)}")


def check_broadcast(spec: TensorSpec, shape: Sequence[int], what: str) -> None:
    """Refuse a tensor that does not broadcast to ``shape`` (numpy rules)."""
    own = shape_of(spec)
    if len(own) > len(shape) or any(d not in (1, s) for d, s in zip(own, shape[len(shape) - len(own):])):
        raise UnsupportedCall(f"{what}: {spec.name} of {own} does not broadcast to {list(shape)}")


# -- views and copies -------------------------------------------------------------------------------------

def reshape(call: Call) -> Shader:
    """Every view kernel and clone / contiguous: element i of the output in row-major order is element i of
    the input in row-major order (each read and written in its own layout)."""
    src, out = call.ins[0], call.outs[0]
    if numel(src) != numel(out):
        raise UnsupportedCall(f"a view of {numel(src)} elements as {shape_of(out)}")
    dst = offset(out, indices(len(shape_of(out))))
    return per_output(call, [unravel("i", shape_of(src), "s"),
                             move(call, 0, offset(src, indices(len(shape_of(src)), "s")), dst)])


def permute(call: Call) -> Shader:
    rank = len(shape_of(call.ins[0]))
    dims = [norm_dim(d, rank) for d in ints_param(call, "dims")]
    if sorted(dims) != list(range(rank)):
        raise UnsupportedCall(f"dims {dims} are not a permutation of {rank} dims")
    check_shape(call.outs[0], [shape_of(call.ins[0])[d] for d in dims], "permute")
    src = [""] * rank
    for k, d in enumerate(dims):  # output dim k is input dim dims[k]
        src[d] = f"d{k}"
    return copy_from(call, src)


def expand(call: Call) -> Shader:
    """The input broadcast to the output's shape (size-1 and missing leading dims repeat)."""
    out_shape = shape_of(call.outs[0])
    check_broadcast(call.ins[0], out_shape, "expand")
    k = len(shape_of(call.ins[0]))
    return copy_from(call, indices(len(out_shape))[len(out_shape) - k:] if k else [])


def copy(call: Call) -> Shader:
    """copy.default: src (input 1) broadcast into self's shape and converted to self's dtype."""
    out_shape = shape_of(call.outs[0])
    src = call.ins[1]
    dst = offset(call.outs[0], indices(len(out_shape)))
    check_shape(call.outs[0], shape_of(call.ins[0]), "copy")
    check_broadcast(src, out_shape, "copy")
    return per_output(call, [move(call, 1, offset(src, indices(len(out_shape)), out_shape), dst)])


def full(call: Call) -> Shader:
    """A fill of ``fill_value`` in the output's dtype (an int64 fill writes both words: any int64 value)."""
    out = call.outs[0]
    value = number(call.params.get("fill_value"), "fill_value")
    if out.dtype in FLOAT_DTYPES:
        return per_element(call, numel(out), f"st_out0(i, {literal(value)});")
    if isinstance(value, float) and not math.isfinite(value):
        raise UnsupportedCall(f"fill_value {value} in an integer dtype")
    if out.dtype == "bool":
        return per_element(call, numel(out), f"st_out0(i, {int(value != 0)});")
    v = int(value)  # torch truncates a float fill of an integer tensor toward zero
    if out.dtype == "int64":
        v &= (1 << 64) - 1
        lo, hi = v & 0xFFFFFFFF, v >> 32
        return per_element(call, numel(out),
                           f"out0[2u * i] = bitcast<i32>({lo}u); out0[2u * i + 1u] = bitcast<i32>({hi}u);")
    bits = {"int32": 32, "int8": 8, "uint8": 8}.get(out.dtype, 32)
    v &= (1 << bits) - 1  # wrapped to the dtype as torch's cast wraps, then as the i32 st_ takes it
    if out.dtype != "uint8" and v >= 1 << (bits - 1):
        v -= 1 << bits
    return per_element(call, numel(out), f"st_out0(i, {literal(v, 'i32')});")


# -- slicing and selecting --------------------------------------------------------------------------------

def _bound(value: int | None, default: int, size: int) -> int:
    """torch's clamping of a slice bound: None is the default, a negative one counts from the end, then the
    result is clamped into [0, size]."""
    if value is None:
        return default
    if value < 0:
        value += size
    return min(max(value, 0), size)


def _slice_params(call: Call, shape: Sequence[int]) -> tuple[int, int, int, int]:
    """(dim, start, step, length) of a slice or slice_scatter of a tensor of ``shape``, as torch clamps them."""
    dim = norm_dim(int_param(call, "dim", 0), len(shape))
    bounds = [call.params.get("start"), call.params.get("end")]
    if any(v is not None and (isinstance(v, bool) or not isinstance(v, int)) for v in bounds):
        raise UnsupportedCall(f"slice bounds {bounds} are not integers")
    step = int_param(call, "step", 1)
    if step < 1:
        raise UnsupportedCall(f"slice step {step}: torch takes only positive steps")
    size = shape[dim]
    start = _bound(bounds[0], 0, size)
    end = max(_bound(bounds[1], size, size), start)
    return dim, start, step, -(-(end - start) // step)


def _without(shape: Sequence[int], dim: int) -> list[int]:
    return [*shape[:dim], *shape[dim + 1:]]


def _with(shape: Sequence[int], dim: int, size: int) -> list[int]:
    return [*shape[:dim], size, *shape[dim + 1:]]


def slice(call: Call) -> Shader:
    """slice.Tensor: output index j along dim reads start + j * step."""
    shape = shape_of(call.ins[0])
    dim, start, step, length = _slice_params(call, shape)
    check_shape(call.outs[0], _with(shape, dim, length), "slice")
    src = indices(len(shape))
    src[dim] = f"({start}u + d{dim} * {step}u)"
    return copy_from(call, src)


def _wrap(index: int, size: int) -> int:
    """A static index: negative counts from the end; clamped into [0, size) (torch would raise)."""
    if index < 0:
        index += size
    return min(max(index, 0), max(size - 1, 0))


def select(call: Call) -> Shader:
    """select.int: the input at one index along dim (a negative index counts from the end; clamped)."""
    shape = shape_of(call.ins[0])
    dim = norm_dim(int_param(call, "dim"), len(shape))
    check_shape(call.outs[0], _without(shape, dim), "select")
    src = indices(len(shape) - 1)
    src.insert(dim, f"{_wrap(int_param(call, 'index'), shape[dim])}u")
    return copy_from(call, src)


def slice_scatter(call: Call) -> Shader:
    """self (input 0) with positions start, start + step, ... along dim replaced by src (input 1)."""
    out = call.outs[0]
    shape = shape_of(call.ins[0])
    dim, start, step, length = _slice_params(call, shape)
    check_shape(out, shape, "slice_scatter")
    check_shape(call.ins[1], _with(shape, dim, length), "slice_scatter")
    idx = indices(len(shape))
    from_src = list(idx)
    from_src[dim] = f"((d{dim} - {start}u) / {step}u)"
    dst = offset(out, idx)
    return per_output(call, [
        f"let hit = d{dim} >= {start}u && (d{dim} - {start}u) % {step}u == 0u "
        f"&& (d{dim} - {start}u) / {step}u < {length}u;",
        f"if (hit) {{ {move(call, 1, offset(call.ins[1], from_src), dst)} }} "
        f"else {{ {move(call, 0, offset(call.ins[0], idx), dst)} }}"])


def select_scatter(call: Call) -> Shader:
    """self (input 0) with one index along dim replaced by src (input 1)."""
    out = call.outs[0]
    shape = shape_of(call.ins[0])
    dim = norm_dim(int_param(call, "dim"), len(shape))
    check_shape(out, shape, "select_scatter")
    check_shape(call.ins[1], _without(shape, dim), "select_scatter")
    index = _wrap(int_param(call, "index"), shape[dim])
    idx = indices(len(shape))
    dst = offset(out, idx)
    return per_output(call, [
        f"if (d{dim} == {index}u) {{ {move(call, 1, offset(call.ins[1], _without(idx, dim)), dst)} }} "
        f"else {{ {move(call, 0, offset(call.ins[0], idx), dst)} }}"])


# -- joining and splitting --------------------------------------------------------------------------------

def _positions(call: Call, name: str) -> list[int]:
    """A tensor-list parameter: input positions (checked: the program file is untrusted)."""
    positions = ints_param(call, name)
    if not all(0 <= p < len(call.ins) for p in positions):
        raise UnsupportedCall(f"parameter {name!r} = {positions} names inputs beyond the {len(call.ins)} given")
    return positions


def cat(call: Call) -> Shader:
    """The inputs named by ``tensors`` joined along dim: each output element reads the input whose range
    along dim holds it (an if-chain over the inputs' start offsets)."""
    out = call.outs[0]
    shape = shape_of(out)
    dim = norm_dim(int_param(call, "dim", 0), len(shape))
    # torch's legacy rule: a 1-D empty tensor joins anything and adds nothing
    parts = [p for p in _positions(call, "tensors") if shape_of(call.ins[p]) != [0]]
    branches, start = [], 0
    for p in parts:
        size = shape_of(call.ins[p])[dim] if len(shape_of(call.ins[p])) == len(shape) else -1
        check_shape(call.ins[p], _with(shape, dim, size), "cat")
        if size == 0:
            continue
        src = indices(len(shape))
        src[dim] = f"(d{dim} - {start}u)"
        branches.append((start + size, move(call, p, offset(call.ins[p], src), offset(out, indices(len(shape))))))
        start += size
    if start != shape[dim]:
        raise UnsupportedCall(f"cat: the inputs add up to {start} along dim {dim}, the output has {shape[dim]}")
    chain = " else ".join(f"if (d{dim} < {end}u) {{ {stmt} }}" for end, stmt in branches)
    return per_output(call, [chain] if chain else [])


def _scatter_along(call: Call, dim: int, pieces: list[tuple[int, int, int]], drop: bool) -> Shader:
    """One invocation per input element, written to the output piece that holds it along dim: ``pieces`` are
    (output, start, size); ``drop``: the outputs lack that dim (unbind)."""
    src = call.ins[0]
    shape = shape_of(src)
    idx = indices(len(shape))
    branches = []
    for j, start, size in pieces:
        dst = list(idx)
        if drop:
            del dst[dim]
        else:
            dst[dim] = f"(d{dim} - {start}u)"
        stmt = move(call, 0, offset(src, idx), offset(call.outs[j], dst), j)
        branches.append(f"if (d{dim} < {start + size}u) {{ {stmt} }}")
    return per_element(call, numel(src), "\n  ".join([unravel("i", shape), " else ".join(branches)]))


def split(call: Call) -> Shader:
    """split_with_sizes: consecutive pieces of ``split_sizes`` along dim, one output each."""
    shape = shape_of(call.ins[0])
    dim = norm_dim(int_param(call, "dim", 0), len(shape))
    sizes = ints_param(call, "split_sizes")
    if len(sizes) != len(call.outs) or sum(sizes) != shape[dim] or min(sizes, default=0) < 0:
        raise UnsupportedCall(f"split sizes {sizes} do not split {shape[dim]} into {len(call.outs)} outputs")
    pieces, start = [], 0
    for j, size in enumerate(sizes):
        check_shape(call.outs[j], _with(shape, dim, size), "split")
        if size:
            pieces.append((j, start, size))
        start += size
    return _scatter_along(call, dim, pieces, drop=False)


def unbind(call: Call) -> Shader:
    """Every index along dim as its own output (that dim removed)."""
    shape = shape_of(call.ins[0])
    dim = norm_dim(int_param(call, "dim", 0), len(shape))
    if len(call.outs) != shape[dim]:
        raise UnsupportedCall(f"unbind of {shape[dim]} into {len(call.outs)} outputs")
    for j in range(len(call.outs)):
        check_shape(call.outs[j], _without(shape, dim), "unbind")
    return _scatter_along(call, dim, [(j, j, 1) for j in range(len(call.outs))], drop=True)


# -- gathers by index tensors -----------------------------------------------------------------------------

def _broadcast(shapes: Sequence[Sequence[int]]) -> list[int]:
    """numpy's broadcast shape (an index tensors' common shape)."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for k, d in enumerate(s, rank - len(s)):
            if d != 1 and out[k] not in (1, d):
                raise UnsupportedCall(f"index shapes {list(shapes)} do not broadcast")
            out[k] = d if d != 1 else out[k]
    return out


def index(call: Call) -> Shader:
    """index.Tensor (advanced indexing): ``indices`` lists, per leading dim of self, the input position of its
    index tensor or None for a dim taken whole. The index tensors broadcast to one shape B; when the indexed
    dims are adjacent B replaces them in place, else B comes first (numpy's rule)."""
    src = call.ins[0]
    shape = shape_of(src)
    entries = call.param("indices", [])
    if not isinstance(entries, list) or len(entries) > len(shape):
        raise UnsupportedCall(f"indices {entries!r} for a tensor of rank {len(shape)}")
    entries = entries + [None] * (len(shape) - len(entries))
    indexed = [p for p, e in enumerate(entries) if e is not None]
    for e in entries:
        if e is not None and (isinstance(e, bool) or not isinstance(e, int) or not 1 <= e < len(call.ins)):
            raise UnsupportedCall(f"indices {entries!r}: entries must be input positions past self, or null")
    if not indexed:
        check_shape(call.outs[0], shape, "index")
        return copy_from(call, indices(len(shape)))
    b = _broadcast([shape_of(call.ins[entries[p]]) for p in indexed])
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    first = indexed[0] if adjacent else 0
    rest = [d for d in range(len(shape)) if d not in indexed]
    out_shape = shape[:first] + b + shape[indexed[-1] + 1:] if adjacent else b + [shape[d] for d in rest]
    check_shape(call.outs[0], out_shape, "index")
    out_idx = indices(len(out_shape))
    b_idx = out_idx[first:first + len(b)]
    rest_idx = out_idx[:first] + out_idx[first + len(b):]
    lines, src_idx = [], [""] * len(shape)
    for p in indexed:
        k = entries[p]
        lines.append(load_index(call, k, offset(call.ins[k], b_idx, b), shape[p], f"x{p}"))
        src_idx[p] = f"x{p}"
    for d, name in zip(rest, rest_idx):
        src_idx[d] = name
    return copy_from(call, src_idx, lines=lines)


def gather(call: Call) -> Shader:
    """out[..., j, ...] = self[..., index[..., j, ...], ...] along dim (the output has the index's shape)."""
    shape, index_shape = shape_of(call.ins[0]), shape_of(call.ins[1])
    dim = norm_dim(int_param(call, "dim"), len(shape))
    check_shape(call.outs[0], index_shape, "gather")
    if len(index_shape) != len(shape) or any(i > s for d, (i, s) in enumerate(zip(index_shape, shape)) if d != dim):
        raise UnsupportedCall(f"gather: an index of {index_shape} does not fit self of {shape} off dim {dim}")
    idx = indices(len(index_shape))
    lines = [load_index(call, 1, offset(call.ins[1], idx), shape[dim] if shape else 1, "x")]
    src = list(idx)
    if src:
        src[dim] = "x"
    return copy_from(call, src, lines=lines)


def index_select(call: Call) -> Shader:
    """The input at the indices of a 1-D (or 0-d) index tensor along dim."""
    shape = shape_of(call.ins[0])
    if not shape or len(shape_of(call.ins[1])) > 1:
        raise UnsupportedCall(f"index_select of {shape} by an index of {shape_of(call.ins[1])}: expected a 1-D index "
                              "into a tensor of at least one dim")
    dim = norm_dim(int_param(call, "dim"), len(shape))
    check_shape(call.outs[0], _with(shape, dim, numel(call.ins[1])), "index_select")
    idx = indices(len(shape))
    lines = [load_index(call, 1, offset(call.ins[1], idx[dim:dim + 1]), shape[dim], "x")]
    src = list(idx)
    src[dim] = "x"
    return copy_from(call, src, lines=lines)


# -- repeats, padding, rolls and flips --------------------------------------------------------------------

def repeat(call: Call) -> Shader:
    """The input tiled ``repeats`` times per dim (repeats may add leading dims)."""
    shape = shape_of(call.ins[0])
    repeats = ints_param(call, "repeats")
    if len(repeats) < len(shape):
        raise UnsupportedCall(f"repeats {repeats} has fewer dims than the input's {len(shape)}")
    lead = len(repeats) - len(shape)
    check_shape(call.outs[0], repeats[:lead] + [r * s for r, s in zip(repeats[lead:], shape)], "repeat")
    return copy_from(call, [f"(d{lead + k} % {s}u)" for k, s in enumerate(shape)])


def repeat_interleave(call: Call) -> Shader:
    """repeat_interleave.self_int: each index along dim repeated ``repeats`` times (dim None: of the
    flattened input)."""
    shape = shape_of(call.ins[0])
    repeats = int_param(call, "repeats")
    if repeats < 1:
        if numel(call.outs[0]) == 0:
            return per_output(call, [])
        raise UnsupportedCall(f"repeats {repeats}")
    if call.params.get("dim") is None:
        check_shape(call.outs[0], [numel(call.ins[0]) * repeats], "repeat_interleave")
        return copy_from(call, indices(len(shape), "s"), lines=[unravel(f"i / {repeats}u", shape, "s")])
    dim = norm_dim(int_param(call, "dim"), len(shape))
    check_shape(call.outs[0], _with(shape, dim, shape[dim] * repeats) if shape else [repeats], "repeat_interleave")
    src = indices(len(shape))
    if src:
        src[dim] = f"(d{dim} / {repeats}u)"
    return copy_from(call, src)


def pad(call: Call) -> Shader:
    """pad.default: ``pad`` is (before, after) pairs from the last dim backwards (negative crops); ``mode``
    constant (``value``, None is 0), reflect, replicate or circular."""
    shape = shape_of(call.ins[0])
    amounts = ints_param(call, "pad")
    mode = call.param("mode", "constant")
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise UnsupportedCall(f"pad mode {mode!r}")
    if len(amounts) % 2 or len(amounts) > 2 * len(shape):
        raise UnsupportedCall(f"pad {amounts} for a tensor of rank {len(shape)}")
    before = [0] * len(shape)
    for k in range(len(amounts) // 2):
        before[len(shape) - 1 - k] = amounts[2 * k]
    out_shape = list(shape)
    for k in range(len(amounts) // 2):
        out_shape[len(shape) - 1 - k] += amounts[2 * k] + amounts[2 * k + 1]
    check_shape(call.outs[0], out_shape, "pad")
    lines, src, inside = [], [], []
    for d, (size, b) in enumerate(zip(shape, before)):
        p = f"p{d}"
        lines.append(f"let {p} = i32(d{d}) - {b};")
        if mode == "reflect":
            lines.append(f"let r{d} = select({p}, -{p}, {p} < 0);")
            lines.append(f"let q{d} = select(r{d}, {2 * (size - 1)} - r{d}, r{d} >= {size});")
        elif mode == "replicate":
            lines.append(f"let q{d} = {p};")
        elif mode == "circular":
            # shifted non-negative first: % of a negative i32 is not the same on every backend (GLSL leaves it
            # undefined), of a u32 it is
            n = max(size, 1)
            lines.append(f"let q{d} = i32(u32({p} + {n * (b // n + 1)}) % {n}u);")
        else:
            lines.append(f"let q{d} = {p};")
            inside.append(f"({p} >= 0 && {p} < {size})")
        # clamped in every mode: a pad wider than the dim (which torch refuses for reflect) stays in bounds
        src.append(f"u32(clamp(q{d}, 0, {max(size - 1, 0)}))")
    out = call.outs[0]
    dst = offset(out, indices(len(shape)))
    copy_in = move(call, 0, offset(call.ins[0], src), dst)
    if mode != "constant" or not inside:
        return per_output(call, [*lines, copy_in])
    value = number(call.param("value", 0), "value")
    if out.dtype not in FLOAT_DTYPES and not math.isfinite(value):
        raise UnsupportedCall(f"pad value {value} in an integer dtype")
    if out.dtype in FLOAT_DTYPES:
        fill = literal(value)
    else:
        fill = literal(int(value != 0) if out.dtype == "bool" else int(value), "i32")
    return per_output(call, [*lines, f"if ({' && '.join(inside)}) {{ {copy_in} }} else {{ st_out0({dst}, {fill}); }}"])


def roll(call: Call) -> Shader:
    """A circular shift: output index j along a rolled dim reads (j - shift) mod size; no dims rolls the
    flattened tensor."""
    shape = shape_of(call.ins[0])
    check_shape(call.outs[0], shape, "roll")
    shifts, dims = ints_param(call, "shifts"), ints_param(call, "dims")
    if not dims:
        if len(shifts) != 1:
            raise UnsupportedCall(f"roll of the flattened tensor takes one shift, got {shifts}")
        n = max(numel(call.ins[0]), 1)
        back = (-shifts[0]) % n
        return copy_from(call, indices(len(shape), "s"), lines=[unravel(f"(i + {back}u) % {n}u", shape, "s")])
    if len(shifts) != len(dims):
        raise UnsupportedCall(f"roll shifts {shifts} and dims {dims} differ in length")
    total = [0] * len(shape)
    for s, d in zip(shifts, dims):
        total[norm_dim(d, len(shape))] += s
    src = [f"((d{d} + {(-t) % size}u) % {size}u)" if t % max(size, 1) else f"d{d}"
           for d, (t, size) in enumerate(zip(total, shape))]
    return copy_from(call, src)


def flip(call: Call) -> Shader:
    shape = shape_of(call.ins[0])
    check_shape(call.outs[0], shape, "flip")
    dims = {norm_dim(d, len(shape)) for d in ints_param(call, "dims")}
    return copy_from(call, [f"({max(size - 1, 0)}u - d{d})" if d in dims else f"d{d}"
                            for d, size in enumerate(shape)])
