"""The kernel table: one record per kernel the compiler can emit, holding everything about it.

A :class:`KernelDef` (``kernel_record``) says what a kernel is (its kind and doc), what it runs (dtypes),
how it treats layouts (a *view* that is no dispatch at all, a *spatial* kernel whose 4-D activations are stored
NHWC on a channels-last target, a kernel that *keeps* the layout of a same-shaped input), its
parameters, its cost (FLOPs and bytes for given tensor specs), and its implementation per backend.
Everything else is derived from these records: the view and layout sets, node FLOPs, the cost model's
array mapping, lowering's bias arity, which dispatch may write a state slot, the CPU backend's kernel
choice, the compiler's support check and ``docs/kernels.md``. Adding a kernel means adding one record to
``npu_kernels`` (an NPU op) or ``aten_kernels`` (an ATen op run as it is), and, for a fast path, a class in a
backend; see ``docs/extending.md``. This module loads both and answers the queries over them.

Kernel names are target-neutral: an NPU op lowers to the kernel of the same name (``GEMM``), an ATen op
an NPU runs as it is lowers to a kernel named by its op type (``aten.add.Tensor``), and a fused kernel
(``GATE_UP``) replaces several nodes. A fusion that only adds an input and an epilogue is an attribute of the
kernel it extends, not a kernel of its own: a CONV's residual add is ``has_residual``, as a GEMM's is. This
module imports neither torch nor the compiler: a runtime, a docs generator or a cost model reads it as plain
data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# the rows, NPU ops first (the quantized ones after the others): each module declares its records into KERNELS
# as it is imported
from . import npu_kernels  # noqa: F401  # isort: skip
from . import quant_kernels  # noqa: F401  # isort: skip
from . import kv_kernels  # noqa: F401  # isort: skip
from . import aten_kernels  # noqa: F401  # isort: skip
from .cost_formulas import KernelCost, Spec, per_output
from .kernel_record import (
    ACTIVATIONS,
    FLOATS,
    KERNEL_ALIASES,
    KERNEL_DTYPES,
    KERNELS,
    REFERENCE,
    KernelDef,
    KernelTest,
    kernel,
    t,
)


def get_kernel(name: str) -> KernelDef:
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"no kernel named {name!r}; the kernel table (docs/kernels.md) lists them") from None


# -- derived sets (read at call time, so a kernel added later is in them) ----------------------------------------

def all_kernels() -> frozenset[str]:
    """Kernels a program may contain (not deferred, not host-only)."""
    return frozenset(name for name, k in KERNELS.items() if k.deferred is None and k.host is None)


def kernels_where(**facts: Any) -> frozenset[str]:
    """Kernels whose record has all these field values: ``kernels_where(view=True)``, ``(layout="spatial")``."""
    return frozenset(name for name, k in KERNELS.items() if all(getattr(k, f) == v for f, v in facts.items()))


def kernels_for(backend: str) -> frozenset[str]:
    """The kernels ``backend`` implements (its own fast kernel, or the reference)."""
    return frozenset(name for name in all_kernels() if backend in KERNELS[name].impls)


def node_flops(op_type: str, ins: Sequence[Spec], outs: Sequence[Spec], params: dict[str, Any]) -> int:
    """FLOPs of a node or dispatch: its kernel record's formula, or that of the kernel it normalizes into
    (``aten_sources``); one per output element for an op with neither."""
    record = KERNELS.get(op_type) or next((k for k in KERNELS.values() if op_type in k.aten_sources), None)
    return (record.flops if record is not None else per_output)(ins, outs, params)


__all__ = [
    "ACTIVATIONS", "FLOATS", "KERNEL_ALIASES", "KERNEL_DTYPES", "KERNELS", "REFERENCE", "KernelCost", "KernelDef",
    "KernelTest", "all_kernels", "get_kernel", "kernel", "kernels_for", "kernels_where", "node_flops", "t",
]
