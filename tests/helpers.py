"""The one place tests compare numbers: against the trusted implementation, dtype-aware."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from torch_ir.verify import default_tolerance


def assert_outputs_close(actual: list[torch.Tensor], expected: Any, *, scale: float = 1.0) -> None:
    """Compare IR outputs with the reference's (flattened in pytree order, as export flattens them)."""
    expected = [t for t in pytree.tree_leaves(expected) if isinstance(t, torch.Tensor)]
    assert len(actual) == len(expected), f"{len(actual)} outputs, reference has {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        rtol, atol = default_tolerance(e.dtype)
        torch.testing.assert_close(a, e.detach(), rtol=rtol * scale, atol=atol * scale,
                                   msg=lambda m, i=i: f"output {i}: {m}")


def build_pair(factory: Callable[[], torch.nn.Module], seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same model twice: on the meta device (for extraction) and with seeded real weights."""
    with torch.device("meta"):
        meta = factory().eval()
    torch.manual_seed(seed)
    real = factory().eval()
    return meta, real
