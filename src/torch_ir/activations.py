"""Every activation a contraction (GEMM, CONV) can apply to its result, in one table: its definition in torch,
the ATen ops it is fused from, its WGSL form, its oneDNN post-op and its NaN behaviour.

Why one table: the activation list was kept five times (the kernel table's names, the NPU ops' reference
functions and their prose, the fusion rule's ATen ops, the CPU backend's oneDNN post-ops and in-place forms,
the WebGPU backend's WGSL forms), and two of the copies disagreed on NaN: the fused WGSL relu was
``max(x, 0.0)``, which WGSL lets return 0 for NaN, while eager torch, the CPU backend and the standalone relu
kernel give NaN. A row here is the one place an activation is described; the NPU ops' reference
(``torch_ir.ops.npu``), the fusion rules (``npu_compiler.passes.fusion``), the kernel table
(``npu_program.kernels``) and both backends read it, so adding an activation is adding a row (plus a WGSL
helper in the WebGPU prelude when its form needs one; ``docs/extending.md``).

It lives in ``torch_ir``, the lowest layer, because the reference implementations of the NPU ops need it and
``torch_ir`` may import nothing above itself. The backend facts (WGSL text, oneDNN post-op names) are plain
strings here: nothing in this module runs a backend, and it imports no torch until a reference runs, so the
kernel table (``npu_program.kernels``) reads it as plain data.

NaN semantics are eager torch's for every row: NaN in gives NaN out (``relu(NaN) = NaN``, ``clamp`` keeps NaN).
A backend form must keep that: in WGSL, ``max``, ``min`` and ``clamp`` may return either operand for NaN, so
the clamping forms are written with ``select`` and ordered comparisons (false for NaN); oneDNN's clamping
post-ops map NaN to 0, so the clamps are not given to oneDNN (``onednn=None``: the CPU backend applies them with
``torch.clamp`` as it stores the result).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class AtenForm:
    """An ATen op that is the activation when its attributes hold these values (an absent attribute reads as
    None): ``hardtanh`` is relu6 only with ``min_val`` 0 and ``max_val`` 6."""

    op_type: str
    attrs: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def matches(self, op_type: str, attrs: Mapping[str, Any]) -> bool:
        return op_type == self.op_type and all(attrs.get(k) in allowed for k, allowed in self.attrs.items())


@dataclass(frozen=True)
class Activation:
    """One activation; see the module docstring."""

    name: str
    #: What it computes, in eager torch: the NPU ops' reference implementations apply it, and every backend must
    #: give the same numbers (NaN included).
    reference: Callable[[torch.Tensor], torch.Tensor]
    #: What it is in a PyTorch graph: the fusion rules fold these into the GEMM or CONV before them.
    aten: tuple[AtenForm, ...]
    #: Its WGSL applied to the f32 expression ``{x}``, which may be read more than once (pass a name). May call
    #: the WebGPU prelude's functions (``silu_``, ``gelu_``: ``npu_runtime.backends.webgpu.wgsl.HELPERS``).
    wgsl: str
    #: The oneDNN post-op a CPU convolution fuses, as ``(attr, scalars, algorithm)`` of
    #: ``torch.ops.mkldnn._convolution_pointwise``; None: the CPU backend applies it itself after oneDNN.
    onednn: tuple[str, tuple[float, ...], str] | None
    #: ``(min, max)`` when it is a clamp (max None: unbounded): a backend may apply it as a clamp while it stores
    #: the result, with no pass of its own; ``torch.clamp`` keeps NaN.
    clamp: tuple[float, float | None] | None = None

    @property
    def propagates_nan(self) -> bool:
        """NaN in gives NaN out: true of every row (eager torch's semantics); a test holds each backend to it."""
        import torch

        return bool(torch.isnan(self.reference(torch.tensor([float("nan")]))).all())


# The references: tensor methods, or torch.nn.functional imported when first called (see the module docstring).

def _relu(x: torch.Tensor) -> torch.Tensor:
    return x.relu()


def _relu6(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(0.0, 6.0)


def _silu(x: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F  # noqa: N812

    return F.silu(x)


def _gelu(x: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F  # noqa: N812

    return F.gelu(x)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F  # noqa: N812

    return F.gelu(x, approximate="tanh")


#: Activation name -> its row, in the order docs list them. A contraction's ``activation`` attribute is null
#: (none) or one of these names.
ACTIVATIONS: dict[str, Activation] = {a.name: a for a in [
    Activation("relu", _relu, (AtenForm("aten.relu.default"),),
               # the standalone relu kernel's form too (``0`` fits its integer dtypes as well as f32)
               wgsl="select({x}, 0, {x} < 0)", onednn=None, clamp=(0.0, None)),
    Activation("relu6", _relu6, (AtenForm("aten.hardtanh.default", {"min_val": (0,), "max_val": (6,)}),
                                 AtenForm("aten.clamp.default", {"min": (0,), "max": (6,)})),
               wgsl="select(select({x}, 6.0, {x} > 6.0), 0.0, {x} < 0.0)", onednn=None, clamp=(0.0, 6.0)),
    Activation("silu", _silu, (AtenForm("aten.silu.default"),), wgsl="silu_({x})", onednn=("swish", (), "")),
    Activation("gelu", _gelu, (AtenForm("aten.gelu.default", {"approximate": ("none", None)}),),
               wgsl="gelu_({x})", onednn=("gelu", (), "none")),
    Activation("gelu_tanh", _gelu_tanh, (AtenForm("aten.gelu.default", {"approximate": ("tanh",)}),),
               wgsl="gelu_tanh_({x})", onednn=("gelu", (), "tanh")),
]}

#: The ATen op types some activation is made from, in table order (the fusion rules' pattern).
ATEN_ACTIVATION_OPS: tuple[str, ...] = tuple(dict.fromkeys(f.op_type for a in ACTIVATIONS.values() for f in a.aten))


def get_activation(name: str) -> Activation:
    """The row of ``name``; a ``ValueError`` listing the names for any other (names come from files)."""
    try:
        return ACTIVATIONS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown activation {name!r}: expected null or one of {', '.join(ACTIVATIONS)}") from None


def apply_activation(name: str | None, x: torch.Tensor) -> torch.Tensor:
    """``x`` with activation ``name`` applied (None: ``x`` itself), as the reference computes it."""
    return x if name is None else get_activation(name).reference(x)


def activation_of(op_type: str, attrs: Mapping[str, Any]) -> str | None:
    """The activation an ATen node computes (``aten.gelu.default`` with ``approximate="tanh"``: ``gelu_tanh``), or
    None when it is none of them."""
    return next((a.name for a in ACTIVATIONS.values() if any(f.matches(op_type, attrs) for f in a.aten)), None)


def activations_doc() -> str:
    """The names as prose for attribute docs: ``none, relu, relu6, ...``."""
    return ", ".join(["none", *ACTIVATIONS])


def _shown(value: Any) -> str:
    return "absent" if value is None else str(value)


def activations_markdown() -> list[str]:
    """The table as markdown lines (``docs/npu_ops.md``)."""
    lines = ["| activation | ATen ops fused | WGSL | oneDNN post-op (CPU convolution) | NaN |", "|---|---|---|---|---|"]
    for a in ACTIVATIONS.values():
        aten = "; ".join(f"`{f.op_type}`" + "".join(f" {k}={'/'.join(_shown(x) for x in v)}"
                                                   for k, v in f.attrs.items()) for f in a.aten)
        onednn = f"`{a.onednn[0]}` {a.onednn[2]}".rstrip() if a.onednn else "none: a clamp as the result is stored"
        lines.append(f"| `{a.name}` | {aten} | `{a.wgsl.format(x='x')}` | {onednn} | "
                     f"{'propagates' if a.propagates_nan else 'not propagated'} |")
    return lines


__all__ = ["ACTIVATIONS", "ATEN_ACTIVATION_OPS", "Activation", "AtenForm", "activation_of", "activations_doc",
           "activations_markdown", "apply_activation", "get_activation"]
