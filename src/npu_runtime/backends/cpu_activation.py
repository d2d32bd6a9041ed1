"""How the CPU backend's kernels apply a contraction's activation, from the one activation table
(``torch_ir.activations``): as a oneDNN post-op of the convolution, or as torch's NaN-propagating clamp while the
result is copied into the arena, or through the activation's reference.
"""

from __future__ import annotations

from typing import Any

import torch

from torch_ir.activations import ACTIVATIONS, get_activation

Tensor = torch.Tensor

# activation -> oneDNN post-op (attr, scalars, algorithm), from the one activation table. The clamps (relu, relu6)
# have none there: oneDNN's clamping post-ops turn NaN into 0 (a NaN weight would give finite logits, where eager
# gives NaN); they run as torch's NaN-propagating clamp in the copy into the arena instead (no extra pass).
NO_POST_OP = ("none", [], "")
MKLDNN_ACTIVATIONS: dict[str | None, tuple[str, list[Any], str]] = {
    None: NO_POST_OP,
    **{a.name: (a.onednn[0], list(a.onednn[1]), a.onednn[2]) if a.onednn else NO_POST_OP
       for a in ACTIVATIONS.values()},
}
FUSED_BY_ONEDNN = frozenset(a.name for a in ACTIVATIONS.values() if a.onednn is not None)
CLAMPS = {a.name: a.clamp for a in ACTIVATIONS.values() if a.clamp is not None}


def store(out: Tensor, y: Tensor, activation: str | None) -> None:
    """``out = activation(y)`` for an activation not yet applied: a clamp as it copies (no pass of its own), any
    other through its reference; None: a copy."""
    if activation is None:
        out.copy_(y)
    elif activation in CLAMPS and y.dtype == out.dtype:
        torch.clamp(y, *CLAMPS[activation], out=out)
    elif activation in CLAMPS:  # y widened (a float32 result for a half out): clamped, then rounded as copied
        out.copy_(y.clamp_(*CLAMPS[activation]))
    else:
        out.copy_(get_activation(activation).reference(y))


def apply_activation_(t: Tensor, name: str | None) -> None:
    """Apply an activation in place on ``t``: a clamp in place, any other through its reference (the reference
    is the definition, so the numbers are the reference's)."""
    if name is None:
        return
    if name in CLAMPS:
        t.clamp_(*CLAMPS[name])
    else:
        t.copy_(get_activation(name).reference(t))


__all__ = ["CLAMPS", "FUSED_BY_ONEDNN", "MKLDNN_ACTIVATIONS", "apply_activation_", "store"]
