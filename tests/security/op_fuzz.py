"""Hostile arguments for every allow-listed ATen op, through the registry's own binding (the child side).

``python -m tests.security.op_fuzz OP [OP ...]`` runs, for each op, its seeds (the nodes torch.export made of
PyTorch's OpInfo samples, ``op_seeds.json``; an op without one gets arguments built from its schema) and many
hostile variants of each: index tensors out of range (past the end, negative, 2^62), floats that are NaN,
infinite or huge, inputs that are empty, 0-d, of another rank or non-contiguous, integer attributes that are
negative or 2^62, size lists that are empty, negative or of 2^40, and so on. Each variant is an IR node bound
by ``bind_kernel`` and run twice, as the reference executor and a host dispatch run it; a clean exception is
fine, as is a result, but the two runs of a deterministic op must agree bit for bit (memory read from outside a
tensor differs between runs). The parent (``test_op_fuzz.py``) watches for signals and hangs: the child prints
``@@ BEGIN op`` before and ``@@ END op`` after each op, so the op that crashed or hung is known.
``--without-guards`` first runs the ops without the allow-list's guards (to show the fuzzer finds what they stop).
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

SEEDS = Path(__file__).with_name("op_seeds.json")
HOSTILE_INTS = (-1, -(2**31), 2**31, 2**62, -(2**62), 10**9, 0)
HOSTILE_INDEX_VALUES = (10**9, -(10**9), 2**62, -1, 3, 7, 64, -7)
HOSTILE_FLOATS = (float("nan"), float("inf"), float("-inf"), 1e38, -1e38, 5e-324)
MAX_VARIANTS = 150  # per op: enough to try every argument hostile; a few seconds at most


def seeds() -> dict[str, list[dict[str, Any]]]:
    return json.loads(SEEDS.read_text()) if SEEDS.exists() else {}


def _dtype(name: str) -> torch.dtype:
    from torch_ir.ops.values import dtype_from_name

    return dtype_from_name(name)


def make_tensor(shape: list[int], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """A valid-looking tensor: small non-negative values for integers (index-like), normal floats otherwise."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if not dtype.is_floating_point and not dtype.is_complex:
        return torch.randint(0, 2, shape, generator=gen).to(dtype)
    return torch.randn(shape, generator=gen).to(dtype)


def tensor_variants(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """``t`` made hostile: out-of-range values for integer tensors, non-finite for floats, other shapes."""
    if t.dtype in (torch.int64, torch.int32, torch.int16, torch.int8):
        info = torch.iinfo(t.dtype)
        for v in HOSTILE_INDEX_VALUES:
            yield torch.full_like(t, max(info.min, min(info.max, v)))
    elif t.dtype.is_floating_point:
        for v in HOSTILE_FLOATS[:4]:
            yield torch.full_like(t, v)
    yield t.new_empty([0] * max(t.dim(), 1)).zero_() if t.numel() else t.new_zeros([5])
    yield t.reshape(-1)[:1].reshape(()).clone() if t.numel() else t.new_zeros(())
    yield t.unsqueeze(0).expand(3, *t.shape)  # another rank, and stride 0
    if t.dim() >= 2:
        yield t.transpose(0, -1)  # non-contiguous
    yield t.new_zeros([*t.shape[:-1], 1] if t.dim() else [1])


def attr_variants(value: Any) -> Iterator[Any]:
    """An attribute's JSON value made hostile (ints, int lists, floats, bools); others are left alone."""
    if isinstance(value, bool):
        yield not value
    elif isinstance(value, int):
        yield from HOSTILE_INTS
    elif isinstance(value, float):
        yield from ({"float": "nan"}, {"float": "inf"}, {"float": "-inf"}, 1e308, -1e308)
    elif isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        yield []
        yield [-1] * len(value)
        yield [2**40] * len(value)
        yield [2**62] * len(value)
        yield value + value + [1]
        yield [0] * len(value)


_STRINGS = {"reduce": "sum", "rounding_mode": "floor", "ord": "fro", "p": "fro", "indexing": "ij",
            "approximate": "none", "padding": "same", "side": "left", "interpolation": "linear"}


def schema_seed(overload: torch._ops.OpOverload) -> dict[str, Any] | None:
    """Arguments built from the schema for an op with no OpInfo seed: [2, 3] floats (int64 for an index, bool
    for a mask), 1s and [1]s, 0.5 for scalars. None for an op that needs a Generator (no file can give one)."""
    attrs: dict[str, Any] = {}
    inputs: list[list[Any]] = []
    for arg in overload._schema.arguments:
        kind = str(arg.real_type)
        if arg.has_default_value() and (kind.startswith("Optional[") or "Generator" in kind):
            continue
        if "Generator" in kind:
            return None
        if kind == "Tensor":
            inputs.append([[2, 3], _seed_dtype(arg.name)])
        elif kind == "List[Tensor]":
            attrs[arg.name] = [len(inputs), len(inputs) + 1]
            inputs += [[[2, 3], "float32"], [[2, 3], "float32"]]
        elif arg.has_default_value():
            continue
        else:
            attrs[arg.name] = _seed_value(kind, arg)
    return {"attrs": attrs, "inputs": inputs}


def _seed_dtype(name: str) -> str:
    if "ind" in name or "target" in name or name in ("boundaries", "lengths"):
        return "int64"
    return "bool" if name in ("mask", "condition") else "float32"


def _seed_value(kind: str, arg: Any) -> Any:
    if kind in ("int", "SymInt"):
        return 1
    if kind.startswith(("List[int]", "List[SymInt]")):
        return [1] * (arg.N or 1)
    if kind in ("float", "Scalar", "number"):
        return 0.5
    if kind.startswith("List[float]"):
        return [0.5]
    if kind == "bool":
        return False
    if kind == "str":
        return _STRINGS.get(arg.name, "sum")
    if kind == "ScalarType":
        return {"dtype": "float32"}
    if kind == "Device":
        return "cpu"
    return None


def default_variants(overload: torch._ops.OpOverload, attrs: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Hostile values for the scalar arguments a seed leaves at their defaults (``unsafe=True``, a huge
    ``output_size``, ...): they reach code the seed never took."""
    for arg in overload._schema.arguments:
        kind = str(arg.type).rstrip("?")
        if arg.name in attrs or "Tensor" in kind:
            continue
        if kind == "bool":
            yield arg.name, True
        elif kind in ("int", "SymInt"):
            yield from ((arg.name, v) for v in (2**62, -(2**31)))
        elif kind in ("float", "Scalar"):
            yield arg.name, {"float": "nan"}
        elif kind.startswith(("int[", "SymInt[")):
            yield arg.name, [2**40]


def variants(op_type: str, overload: torch._ops.OpOverload, entries: list[dict[str, Any]]
             ) -> Iterator[tuple[dict[str, Any], list[torch.Tensor]]]:
    gen = torch.Generator().manual_seed(0)
    for entry in entries:
        attrs = entry["attrs"]
        base = [make_tensor(shape, _dtype(dtype), gen) for shape, dtype in entry["inputs"]]
        yield attrs, base
        for key, value in default_variants(overload, attrs):
            yield {**attrs, key: value}, base
            for i, t in enumerate(base):  # with every hostile input too: unsafe=True and lengths past the end
                for hostile in itertools.islice(tensor_variants(t), 4):
                    yield {**attrs, key: value}, [*base[:i], hostile, *base[i + 1:]]
        for i, t in enumerate(base):
            for hostile in tensor_variants(t):
                yield attrs, [*base[:i], hostile, *base[i + 1:]]
        for key, value in attrs.items():
            for hostile in attr_variants(value):
                yield {**attrs, key: hostile}, base


def run_variant(op_type: str, attrs: dict[str, Any], inputs: list[torch.Tensor], deterministic: bool) -> None:
    """Bind and run the node twice, its inputs each time inside a larger buffer padded with another value: a
    read past an input changes the result (for a deterministic op, compared), a write past it changes the
    padding (always checked)."""
    from torch_ir.ir import OpNode, TensorMeta
    from torch_ir.ops.registry import bind_kernel
    from torch_ir.ops.values import dtype_name

    metas = [TensorMeta(f"in{i}", list(t.shape), dtype_name(t.dtype)) for i, t in enumerate(inputs)]
    results = []
    for fill in (7, -3):
        padded = [_padded(t, fill) if "as_strided" not in op_type else (t, None) for t in inputs]
        try:
            kernel = bind_kernel(OpNode("fuzz", op_type, metas, [], attrs), torch.device("cpu"))
            torch.manual_seed(0)
            results.append(kernel([view for view, _ in padded], {}))
        except Exception:  # noqa: BLE001 - refusing hostile arguments cleanly is a pass
            return
        for view, storage in padded:
            if storage is not None and not _pads_intact(storage, view, fill):
                raise AssertionError(f"{op_type} with attrs {str(attrs)[:200]} wrote outside its input of shape "
                                     f"{list(view.shape)}")
    if deterministic:
        for a, b in zip(*results):
            if a.shape != b.shape or not _same_bits(a, b):
                raise AssertionError(f"{op_type} with attrs {str(attrs)[:200]} gave different results for the same "
                                     "inputs placed among different memory: it read outside its inputs")


PAD = 512  # elements of padding on each side of a fuzzed input
# (``as_strided*`` index their input's *storage*, padding included, by definition: they run unpadded, and their
# storage bounds are ATen's own check)


def _padded(t: torch.Tensor, fill: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``t``'s values as a view into the middle of a buffer filled with ``fill`` (a non-contiguous or
    broadcast ``t`` is kept as it is: its layout is the point of the variant)."""
    if not t.is_contiguous() or t.dtype == torch.bool:
        return t, None
    storage = torch.full([t.numel() + 2 * PAD], fill, dtype=t.dtype)
    view = storage[PAD:PAD + t.numel()].view(t.shape)
    view.copy_(t)
    return view, storage


def _pads_intact(storage: torch.Tensor, view: torch.Tensor, fill: int) -> bool:
    pads = torch.cat([storage[:PAD], storage[PAD + view.numel():]])
    return bool((pads == fill).all())


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype:
        return False
    a, b = a.resolve_conj().resolve_neg(), b.resolve_conj().resolve_neg()
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.dtype.is_floating_point:
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return bool((a == b).all())


def fuzz_op(op_type: str, table: dict[str, list[dict[str, Any]]]) -> str | None:
    """Every variant of ``op_type``; the problem found, or None (an op no variant can be made for is a problem:
    it would pass untried)."""
    from torch_ir.ops.registry import resolve_overload

    overload = resolve_overload(op_type)
    if overload is None:
        return "not an op of this torch"
    entries = table.get(op_type) or [s for s in [schema_seed(overload)] if s is not None]
    if not entries:
        return "no arguments could be made for it from its seeds or its schema: it would pass untried"
    deterministic = torch.Tag.nondeterministic_seeded not in overload.tags and "empty" not in op_type
    for attrs, inputs in itertools.islice(variants(op_type, overload, entries), MAX_VARIANTS):
        torch.manual_seed(0)
        try:
            run_variant(op_type, attrs, inputs, deterministic)
        except AssertionError as e:
            return str(e)
    return None


def main(ops: list[str]) -> int:
    from torch_ir.limits import set_limits

    if ops[:1] == ["--without-guards"]:  # the test that shows the fuzzer finds what each guard prevents
        from torch_ir.ops import allowlist

        allowlist.guard_of = lambda op_type: None
        ops = ops[1:]
    set_limits(max_alloc_bytes=64 << 20)  # a file's sizes are checked against this before allocating
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (16 << 30, 16 << 30))  # an unchecked allocation fails, not the machine
    torch.set_num_threads(1)
    table = seeds()
    out = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol; ops may print to stdout themselves
    for op in ops:
        out.write(f"@@ BEGIN {op}\n")
        problem = fuzz_op(op, table)
        out.write(f"@@ END {op} {json.dumps(problem)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
