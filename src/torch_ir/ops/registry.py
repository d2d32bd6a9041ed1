"""The op registry: one table keyed by op type, consulted by the executor and the docs.

Lookup order for an op type such as ``"aten.conv2d.default"``:

1. an implementation registered with :func:`register_op` (custom ops, overrides, NPU ops);
2. the generic path: the overload ``torch.ops.<ns>.<name>.<overload>``, called with the node's
   inputs and attributes bound by the op's schema. Every ATen op that torch.export emits, and every
   ``torch.library`` custom op that is loaded, runs this way.

An op found by neither is reported with the node and a ready-to-paste registration.

The op type comes from a file, so the generic path is not "call whatever the file names": an op is
refused (:class:`UnsafeInputError`) when its schema writes to any argument (in-place and ``out=``
variants: they would write outside the node's own outputs), when it returns nothing (it can only
act through side effects), when its namespace is one of torch's own non-ATen namespaces
(:data:`DENIED_NAMESPACES`: distributed collectives, the profiler, prepacked-weight backends, ...), and
for ``aten``/``prims`` whenever it is not on the reviewed allow-list (:mod:`torch_ir.ops.allowlist`), which
also wraps the few ops that need it in a check that makes them memory-safe (:mod:`torch_ir.ops.guards`).
A node's attributes must be arguments of the op's schema: a misspelled one is refused, not silently
replaced by the default. Before the first run, a node whose attributes are all static runs once on the
meta device, so an output larger than ``torch_ir.limits`` (``aten.full(size=[1e6, 1e6])``) is refused before allocating.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import IRValidationError, TorchIRError, UnsafeInputError, UnsupportedOpError
from ..ir import OpNode
from ..limits import check_alloc, get_limits
from . import allowlist
from .values import decode_value, dtype_from_name, has_symbols

Kernel = Callable[[Sequence[torch.Tensor], Mapping[str, int]], list[torch.Tensor]]
"""A node bound to its implementation: (input tensors, bound symbols) -> output tensors."""


@dataclass(frozen=True)
class OpDef:
    """A registered implementation: ``impl(*inputs, **attrs)`` returns a tensor or a tuple of them."""

    op_type: str
    impl: Callable[..., Any]
    doc: str


_REGISTRY: dict[str, OpDef] = {}

# Namespaces whose ops a module registers on first use, so that an IR loaded from a file runs without
# its frontend having been imported first. The module's ``provide(op_type) -> bool`` registers the op.
_PROVIDERS = {
    ns: "torch_ir.frontends.onnx.custom_ops"
    for ns in ("onnx", "onnx_ml", "onnx_preview", "onnx_preview_training")
}


def register_op(op_type: str, *, doc: str | None = None, override: bool = False) -> Callable:
    """Register the reference implementation of ``op_type``.

    Example::

        @register_op("my_ns.scaled_add.default")
        def scaled_add(x, y, *, alpha=1.0):
            return x + alpha * y

    The function receives the node's input tensors positionally and its attributes as keyword
    arguments, and returns a tensor or a tuple of tensors in the order of the node's outputs.
    Registering over an existing registration needs ``override=True``.
    """
    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        if op_type in _REGISTRY and not override:
            raise ValueError(f"op {op_type!r} is already registered; pass override=True to replace it")
        text = doc if doc is not None else (fn.__doc__ or "").strip().split("\n")[0]
        _REGISTRY[op_type] = OpDef(op_type, fn, text)
        return fn

    return decorator


def unregister_op(op_type: str) -> None:
    _REGISTRY.pop(op_type, None)


def registered_ops() -> dict[str, OpDef]:
    return dict(_REGISTRY)


def resolve_overload(op_type: str) -> torch._ops.OpOverload | None:
    """``"aten.add.Tensor"`` -> ``torch.ops.aten.add.Tensor``, or None when torch has no such op."""
    parts = op_type.split(".")
    if len(parts) != 3:
        return None
    ns, name, overload = parts
    if not all(p.isidentifier() for p in parts) or overload.startswith("__"):
        return None  # "aten.add.__call__": only an op's overloads, never a Python attribute of the packet
    try:
        packet = getattr(getattr(torch.ops, ns), name)
        result = getattr(packet, overload)
    except (AttributeError, RuntimeError):
        return None
    return result if isinstance(result, torch._ops.OpOverload) else None


def _provided(op_type: str) -> OpDef | None:
    module = _PROVIDERS.get(op_type.split(".", 1)[0])
    if module is None:
        return None
    try:
        provide = importlib.import_module(module).provide
    except ImportError:  # the frontend's optional dependency is not installed
        return None
    return _REGISTRY.get(op_type) if provide(op_type) else None


#: torch's own namespaces other than ``aten`` and ``prims``: collectives that open network connections,
#: the profiler, runtimes and prepacked-weight backends whose ops trust their inputs. A namespace that a
#: user's own ``torch.library`` code defines is not here, so loaded custom ops keep working.
DENIED_NAMESPACES = frozenset({
    "quantized", "_quantized", "symm_mem", "static_runtime", "c10d", "_c10d_functional",
    "_c10d_functional_autograd", "c10d_functional", "onednn", "mkldnn", "mkldnn_prepacked", "mkl", "sparse",
    "inductor", "inductor_prims", "profiler", "_test", "quantization", "debugprims", "rngprims", "_native",
    "debug_mode_ops", "export", "_dtensor", "higher_order", "fbgemm", "_inductor_test", "cuda", "xpu", "mps",
    "prim", "prims_internal",  # TorchScript's interpreter prims (device, dtype, ...): not tensor ops
    # Loaded on import of torch.ao.quantization / torchao, so absent from a fresh torch's list: PT2E's
    # (de)quantize ops (extraction maps them to QUANTIZE/DEQUANTIZE, whose arguments are checked) and torchao's
    # ops, prepacked CPU/CUDA kernels among them that trust their inputs.
    "quantized_decomposed", "torchao",
})


def unsafe_reason(op_type: str, overload: torch._ops.OpOverload) -> str | None:
    """Why the generic path must not run ``overload`` for an op type read from a file (None: it may)."""
    ns = op_type.split(".")[0]
    schema = overload._schema
    if ns in DENIED_NAMESPACES:
        return f"namespace {ns!r} is torch's own non-ATen namespace (collectives, profiler, backends), not a model op"
    if schema.is_mutable:
        return "its schema writes to an argument (an in-place or out= variant); use the functional overload"
    if not schema.returns:
        return "it returns nothing, so it can only act through side effects"
    return allowlist.refusal(op_type) if ns in allowlist.LISTED_NAMESPACES else None


def is_supported(op_type: str) -> bool:
    if op_type in _REGISTRY or _provided(op_type) is not None:
        return True
    overload = resolve_overload(op_type)
    return overload is not None and unsafe_reason(op_type, overload) is None


def bind_kernel(node: OpNode, device: torch.device) -> Kernel:
    """Bind ``node`` to its implementation once, so the executor's loop only calls it."""
    opdef = _REGISTRY.get(node.op_type)
    if opdef is not None:
        return _bind_registered(node, opdef, device)
    overload = resolve_overload(node.op_type)
    if overload is not None:
        reason = unsafe_reason(node.op_type, overload)
        if reason is not None:
            raise UnsafeInputError(
                f"node {node.name!r} names op {node.op_type}, which an IR file may not run: {reason}. "
                "See docs/security.md; a model that needs it can register a reference implementation with "
                "@torch_ir.register_op")
        return _bind_schema(node, overload, device)
    opdef = _provided(node.op_type)
    if opdef is not None:
        return _bind_registered(node, opdef, device)
    raise UnsupportedOpError(unsupported_message([node]))


def unsupported_message(nodes: Sequence[OpNode]) -> str:
    ops = sorted({n.op_type for n in nodes})
    lines = [f"{len(nodes)} node(s) use op(s) with no implementation: {', '.join(ops)}"]
    lines += [f"  node {n.name!r}: {n}" for n in nodes[:20]]
    if len(nodes) > 20:
        lines.append(f"  ... and {len(nodes) - 20} more")
    example = ops[0]
    lines.append(
        "Fix: load the library that defines the op (a torch.library custom op runs as it is), or register "
        f"a reference implementation:\n    @torch_ir.register_op({example!r})\n"
        "    def impl(*inputs, **attrs):\n        ...  # return a tensor or a tuple of tensors"
    )
    return "\n".join(lines)


def _as_list(result: Any) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    return [r for r in result if isinstance(r, torch.Tensor)]


def check_node_attrs(node: OpNode) -> None:
    """Refuse (``IRValidationError``) attributes ``node``'s op does not take, before anything reads them:
    a pass that reads ``attrs.get("padding", 0)`` would otherwise turn a misspelled ``paddin`` into 0."""
    opdef = _REGISTRY.get(node.op_type) or _provided(node.op_type)
    if opdef is not None:
        names = _keyword_names(opdef.impl)
        if names is not None:
            _unknown_attrs(node, names, f"({', '.join(names)})")
        return
    overload = resolve_overload(node.op_type)
    if overload is not None:
        _unknown_attrs(node, [arg.name for arg in overload._schema.arguments], str(overload._schema))
        _missing_inputs(node, overload._schema)


def _missing_inputs(node: OpNode, schema: torch.FunctionSchema) -> None:
    """Refuse a node with fewer inputs than its op's required tensor arguments (a file that lost one): the
    passes and the compiler read ``inputs[0]`` of a reduction or a GEMM without asking."""
    # a Tensor argument given as a number (``add.Tensor(x, 1e-6)`` from torch.export) is in ``attrs``
    required = sum(1 for arg in schema.arguments if isinstance(arg.type, torch.TensorType)
                   and not arg.has_default_value() and not arg.kwarg_only and arg.name not in node.attrs)
    if len(node.inputs) < required:
        raise IRValidationError(
            f"node {node.name!r} ({node.op_type}) has {len(node.inputs)} input(s) but the op takes {required} "
            f"tensor argument(s) ({schema}); the IR lost an input: extract or save the IR again")


def _keyword_names(impl: Callable[..., Any]) -> list[str] | None:
    """The keyword arguments ``impl`` takes, or None when it takes any (``**kwargs``) or cannot be inspected."""
    try:
        params = inspect.signature(impl).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (inspect.Parameter.KEYWORD_ONLY,
                                                 inspect.Parameter.POSITIONAL_OR_KEYWORD)]


def _unknown_attrs(node: OpNode, known: Sequence[str], signature: str) -> None:
    unknown = sorted(set(node.attrs) - set(known))
    if unknown:
        raise IRValidationError(
            f"node {node.name!r} ({node.op_type}) has attribute(s) {unknown} that the op does not take; "
            f"it takes {signature}. A misspelled attribute would silently fall back to its default: "
            "fix the name in the IR")


def _bind_registered(node: OpNode, opdef: OpDef, device: torch.device) -> Kernel:
    impl, attrs = opdef.impl, node.attrs
    names = _keyword_names(impl)
    if names is not None:
        _unknown_attrs(node, names, f"({', '.join(names)})")
    if has_symbols(attrs):
        return lambda inputs, syms: _as_list(impl(*inputs, **decode_value(attrs, syms, device)))
    static = {k: decode_value(v, None, device) for k, v in attrs.items()}
    return lambda inputs, syms: _as_list(impl(*inputs, **static))


def _bind_schema(node: OpNode, overload: torch._ops.OpOverload, device: torch.device) -> Kernel:
    """Plan how each schema argument is filled: from an input, a list of inputs, or an attribute."""
    plan: list[tuple[str, str, Any]] = []  # (arg name, kind, payload)
    cursor = 0
    _unknown_attrs(node, [arg.name for arg in overload._schema.arguments], str(overload._schema))
    for arg in overload._schema.arguments:
        is_list = isinstance(arg.type, torch.ListType) and _holds_tensors(arg.type.getElementType())
        if arg.name in node.attrs:
            value = node.attrs[arg.name]
            if is_list and value is not None:
                if not isinstance(value, list) or not all(
                        i is None or (type(i) is int and 0 <= i < len(node.inputs)) for i in value):
                    raise IRValidationError(
                        f"node {node.name!r} ({node.op_type}): attribute {arg.name!r} must list input positions "
                        f"(0 to {len(node.inputs) - 1}, or null), got {str(value)[:80]}")
                plan.append((arg.name, "list", value))
                cursor = max([cursor] + [i + 1 for i in value if i is not None])
            elif has_symbols(value):
                plan.append((arg.name, "sym", value))
            else:
                plan.append((arg.name, "const", _enum_checked(node, arg, decode_value(value, None, device))))
        elif _holds_tensors(arg.type):
            plan.append((arg.name, "input", cursor))
            cursor += 1
    if cursor != len(node.inputs):
        raise UnsupportedOpError(
            f"node {node.name!r} ({node.op_type}) has {len(node.inputs)} inputs but its schema "
            f"{overload._schema} places {cursor}; the IR was not written for this op's schema"
        )

    def arguments(inputs: Sequence[torch.Tensor], syms: Mapping[str, int]) -> dict[str, Any]:
        kwargs = {}
        for name, kind, payload in plan:
            if kind == "input":
                kwargs[name] = inputs[payload]
            elif kind == "list":
                kwargs[name] = [None if i is None else inputs[i] for i in payload]
            elif kind == "sym":
                kwargs[name] = decode_value(payload, syms, device)
            else:
                kwargs[name] = payload
        return kwargs

    call = guarded(node.op_type, overload)
    if not any(kind == "sym" for _, kind, _ in plan):
        _check_output_sizes(node, overload, arguments)
        return lambda inputs, syms: _as_list(call(arguments(inputs, syms)))
    what = f"node {node.name!r} ({node.op_type})"

    def run_symbolic(inputs: Sequence[torch.Tensor], syms: Mapping[str, int]) -> list[torch.Tensor]:
        kwargs = arguments(inputs, syms)  # sizes from symbols: checked at each run, as static ones at bind
        check_sizes_on_meta(node.op_type, overload, kwargs, what)
        return _as_list(call(kwargs))

    return run_symbolic


def guarded(op_type: str, overload: torch._ops.OpOverload) -> Callable[[dict[str, Any]], Any]:
    """``kwargs -> overload(**kwargs)``, behind the allow-list's guard for ``op_type`` when it has one, its
    outputs checked to have real shapes (``im2col`` with a huge dilation returns a tensor of negative size)."""
    guard = allowlist.guard_of(op_type)

    def call(kwargs: dict[str, Any]) -> Any:
        result = overload(**kwargs)
        for out in _as_list(result):
            if any(d < 0 for d in out.shape):
                raise UnsafeInputError(f"{op_type} made an output of impossible shape {list(out.shape)} from its "
                                       "arguments")
        return result

    return call if guard is None else lambda kwargs: guard(call, kwargs)


#: Schema types torch passes to C++ as an enum: a plain integer there is an unchecked enum value (``view.dtype``
#: with ``dtype=-1`` crashes the process), so a file must give them tagged (``{"dtype": "float32"}``).
_ENUM_TYPES = {"ScalarType": torch.dtype, "Layout": torch.layout, "MemoryFormat": torch.memory_format}


def _enum_checked(node: OpNode, arg: Any, value: Any) -> Any:
    kind = str(arg.real_type).removeprefix("Optional[").rstrip("]")
    expected = _ENUM_TYPES.get(kind)
    if expected is not None and value is not None and not isinstance(value, expected):
        raise IRValidationError(
            f"node {node.name!r} ({node.op_type}): attribute {arg.name!r} must be a {kind} written as a tagged "
            f"value (e.g. {{\"dtype\": \"float32\"}}), got {str(value)[:40]!r}; extract or save the IR again")
    return value


def _check_output_sizes(node: OpNode, overload: torch._ops.OpOverload, arguments: Callable[..., dict]) -> None:
    """Run the op once on the meta device (shapes only, no memory) and refuse it if an output would be over
    ``torch_ir.limits``: attributes from a file (``aten.full(size=[1e6, 1e6])``, an ``expand`` then a copy)
    must not allocate terabytes. Ops that meta cannot run (data-dependent shapes) are left to run."""
    # A factory op (no tensor inputs) makes its output on its ``device`` argument, the default CPU when the
    # attribute is absent: set it to meta explicitly, and leave an op with no such argument to run.
    device_args = [a.name for a in overload._schema.arguments if "Device" in str(a.type)]
    if not all(t.is_static for t in node.inputs) or (not node.inputs and not device_args):
        return
    # a model repeats its layers: a node like one already checked (same op, input types, attributes, limit) is
    # not run on meta again, which keeps binding a 10^5-node IR to seconds
    key = (node.op_type, tuple((tuple(t.shape), t.dtype) for t in node.inputs),
           json.dumps(node.attrs, sort_keys=True, default=str), get_limits().max_alloc_bytes)
    if key in _SIZES_CHECKED:
        return
    metas = [torch.empty([int(d) for d in t.shape], dtype=_dtype_or_none(t.dtype) or torch.float32, device="meta")
             for t in node.inputs]
    check_sizes_on_meta(node.op_type, overload, arguments(metas, {}), f"node {node.name!r} ({node.op_type})")
    if len(_SIZES_CHECKED) > 50_000:
        _SIZES_CHECKED.clear()
    _SIZES_CHECKED.add(key)


_SIZES_CHECKED: set[tuple[Any, ...]] = set()


def check_sizes_on_meta(op_type: str, overload: torch._ops.OpOverload, kwargs: Mapping[str, Any],
                        what: str) -> None:
    """Run the op (behind its guard) on meta copies of ``kwargs`` (shapes only) and refuse it when an output
    would be over ``torch_ir.limits``. An op that meta cannot run (no meta kernel, a data-dependent shape) is
    left to run; a guard's refusal is raised."""
    device_args = [a.name for a in overload._schema.arguments if "Device" in str(a.type)]
    if not device_args and not any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        return  # a factory op that would allocate on the CPU: nothing to run it on meta with
    metas = {k: _on_meta(v) for k, v in kwargs.items()}
    try:
        outputs = _as_list(guarded(op_type, overload)(metas | {name: torch.device("meta") for name in device_args}))
    except TorchIRError:
        raise
    except Exception:  # noqa: BLE001 - no meta kernel, or data-dependent: the real run decides
        return
    for i, out in enumerate(outputs):
        check_alloc(out.numel() * out.element_size(), f"{what} output {i} of shape {list(out.shape)}")


def _on_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value if value.device.type == "meta" else torch.empty_like(value, device="meta")
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return [_on_meta(v) for v in value]
    return value


def _dtype_or_none(name: str) -> torch.dtype | None:
    try:
        return dtype_from_name(name)
    except ValueError:
        return None


def _holds_tensors(t: Any) -> bool:
    if isinstance(t, torch.OptionalType):
        t = t.getElementType()
    return isinstance(t, torch.TensorType)
