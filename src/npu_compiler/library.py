"""The NPU kernel library and the targets that implement it.

The compiler lowers each node of a normalized IR to a *kernel* by name. The names are target-neutral:
an NPU op lowers to the kernel of the same name (``GEMM``, ``CONV``, ``LAYER_NORM``, ...), an ATen op
that an NPU runs as it is (elementwise arithmetic, reductions, data movement) lowers to a kernel named
by its op type (``aten.add.Tensor``), and a few fused kernels (``CONV_ADD``) replace several nodes.
A :class:`Target` lists which of these kernels it has and which dtypes it runs; a runtime backend
implements them. Adding a backend (WebGPU compute shaders, say) means registering a ``Target`` with
:func:`register_target` and writing its kernels: the compiler does not change.

``unsupported_reason(node, target)`` is the one support check: ``compile`` refuses a graph with any
unsupported node, and ``partition`` places those nodes on the CPU with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch_ir.ir import OpNode, TensorMeta
from torch_ir.ops.npu import NPU_OPS

# ATen ops an NPU runs as they are, by kind. Everything else an NPU lacks (sorting, scans, scatter,
# data-dependent shapes, ...) is left to the CPU by ``partition``.
_ELEMENTWISE = """
    add.Tensor add.Scalar sub.Tensor sub.Scalar rsub.Scalar mul.Tensor mul.Scalar div.Tensor div.Scalar
    pow.Tensor_Scalar pow.Tensor_Tensor maximum.default minimum.default
    where.self where.ScalarOther where.ScalarSelf masked_fill.Scalar
    eq.Tensor eq.Scalar ne.Tensor ne.Scalar lt.Tensor lt.Scalar le.Tensor le.Scalar gt.Tensor gt.Scalar
    ge.Tensor ge.Scalar __and__.Tensor __or__.Tensor bitwise_and.Tensor bitwise_or.Tensor bitwise_not.default
    logical_and.default logical_or.default logical_not.default
    relu.default gelu.default silu.default sigmoid.default tanh.default exp.default log.default neg.default
    sqrt.default rsqrt.default abs.default erf.default reciprocal.default sin.default cos.default
    clamp.default hardtanh.default hardswish.default hardsigmoid.default leaky_relu.default
    _to_copy.default
"""
_REDUCTION = "mean.dim sum.dim_IntList amax.default amin.default argmax.default"
_POOLING = "max_pool2d.default avg_pool2d.default adaptive_avg_pool2d.default"
_MOVEMENT = """
    reshape.default view.default unsqueeze.default squeeze.dim squeeze.dims flatten.using_ints
    permute.default expand.default slice.Tensor select.int cat.default index.Tensor gather.default
    index_select.default repeat.default clone.default contiguous.default
"""
_MATMUL = "matmul.default bmm.default mm.default"


def _aten(kind: str, names: str) -> dict[str, str]:
    return {f"aten.{name}": kind for name in names.split()}


#: ATen op type -> kind ("elementwise", "reduction", "pooling", "movement", "matmul").
ATEN_KERNELS: dict[str, str] = {
    **_aten("elementwise", _ELEMENTWISE), **_aten("reduction", _REDUCTION), **_aten("pooling", _POOLING),
    **_aten("movement", _MOVEMENT), **_aten("matmul", _MATMUL),
}

#: Movement ops that only relabel a contiguous tensor's shape: lowered to no dispatch at all (the output
#: is a view of the input's bytes) unless a layout forces a copy.
VIEW_OPS = frozenset(
    f"aten.{name}" for name in "reshape.default view.default unsqueeze.default squeeze.dim squeeze.dims "
    "flatten.using_ints".split()
)

#: Kernels that replace several IR nodes (made by the lowering's fusion step) -> what they compute.
FUSED_KERNELS: dict[str, str] = {
    "CONV_ADD": "CONV followed by a residual add (and relu): y = act(conv(x) + residual)",
}

#: NPU ops whose kernels need features the compiler does not have yet.
_DEFERRED = {"KV_UPDATE": "writes a KV cache in place; compiled programs do not carry buffer mutations yet"}

#: Every kernel name the compiler can emit.
ALL_KERNELS = frozenset(set(NPU_OPS) - set(_DEFERRED)) | frozenset(ATEN_KERNELS) | frozenset(FUSED_KERNELS)

_DTYPES = frozenset({"float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool"})


@dataclass(frozen=True)
class Target:
    """What one backend can run: its kernels, its dtypes, and its preferred activation layout."""

    name: str
    kernels: frozenset[str]
    dtypes: frozenset[str] = _DTYPES
    # Store 4-D activations of convolutions as NHWC (what oneDNN and most NPUs run fastest).
    channels_last: bool = False
    doc: str = ""
    options: dict[str, Any] = field(default_factory=dict)


TARGETS: dict[str, Target] = {}


def register_target(target: Target, *, override: bool = False) -> Target:
    """Make ``target`` available to ``compile(target=...)``; every kernel it names must be a known kernel."""
    unknown = sorted(target.kernels - ALL_KERNELS)
    if unknown:
        raise ValueError(f"target {target.name!r} names kernels the compiler never emits: {unknown}")
    if target.name in TARGETS and not override:
        raise ValueError(f"target {target.name!r} is already registered; pass override=True to replace it")
    TARGETS[target.name] = target
    return target


def get_target(target: str | Target) -> Target:
    """The registered target of that name (a ``Target`` passes through)."""
    if isinstance(target, Target):
        return target
    try:
        return TARGETS[target]
    except KeyError:
        raise ValueError(f"unknown target {target!r}; registered targets: {', '.join(sorted(TARGETS))}") from None


register_target(Target(
    "cpu", ALL_KERNELS, channels_last=True,
    doc="the CPU backend of npu_runtime: oneDNN convolutions and BLAS GEMMs through PyTorch's CPU kernels",
))


# -- the support check ------------------------------------------------------------------------------

def unsupported_reason(node: OpNode, target: str | Target = "cpu") -> str | None:
    """Why ``target`` cannot run ``node`` (None when it can): a missing kernel, a dtype, a dynamic shape."""
    target = get_target(target)
    op = node.op_type
    if op in _DEFERRED:
        return f"{op} {_DEFERRED[op]}"
    if op not in target.kernels:
        return _missing_kernel(op, target)
    for t in [*node.inputs, *node.outputs]:
        if not t.is_static:
            return (f"tensor {t.name!r} has the symbolic shape {t.shape}; programs are planned for static shapes "
                    "(export with fixed shapes, or run this part on the CPU)")
        if t.dtype not in target.dtypes:
            return f"tensor {t.name!r} is {t.dtype}; target {target.name!r} runs {', '.join(sorted(target.dtypes))}"
    return None


def _missing_kernel(op: str, target: Target) -> str:
    if op in NPU_OPS or op in ATEN_KERNELS:
        return f"target {target.name!r} has no kernel for {op}"
    return (f"{op} is not in the NPU kernel library (NPU ops, elementwise, reduction, pooling, movement and "
            "matmul ops); it runs on the CPU through npu_compiler.partition")


def is_op_supported(op: str | OpNode, target: str | Target = "cpu") -> bool:
    """Whether the target's kernel library runs ``op`` (an op type such as ``"GEMM"``, or a node).

    For a node, dtypes and static shapes are checked too; an op type alone answers for the op.
    """
    if isinstance(op, OpNode):
        return unsupported_reason(op, target) is None
    probe = OpNode(name=op, op_type=op, inputs=[], outputs=[TensorMeta(op, [], "float32")])
    return unsupported_reason(probe, target) is None
