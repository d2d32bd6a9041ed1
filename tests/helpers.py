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


class Fn(torch.nn.Module):
    """A module whose forward is ``fn(self, *args)``, with the given submodules and parameters."""

    def __init__(self, fn: Callable, **parts: Any):
        super().__init__()
        self.fn = fn
        for key, value in parts.items():
            setattr(self, key, value)

    def forward(self, *args: Any) -> Any:
        return self.fn(self, *args)


def build_pair(factory: Callable[[], torch.nn.Module], seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same model twice: on the meta device (for extraction) and with seeded real weights."""
    with torch.device("meta"):
        meta = factory().eval()
    torch.manual_seed(seed)
    real = factory().eval()
    return meta, real


def assert_topk_match(ours: torch.Tensor, ref: torch.Tensor, k: int = 5, *, atol: float) -> None:
    """Our top-``k`` classes (per row of the last dim) are the reference's, in order.

    Two classes may trade places only when the reference itself cannot tell them apart: at every rank
    ``i``, the reference's value at our ``i``-th index must be within ``atol`` of the reference's
    ``i``-th largest value. A class that is clearly outside the reference's top ``k`` fails.
    """
    ours, ref = ours.detach().float(), ref.detach().float()
    assert ours.shape == ref.shape, f"shape {tuple(ours.shape)}, reference {tuple(ref.shape)}"
    ours2, ref2 = ours.reshape(-1, ours.shape[-1]), ref.reshape(-1, ref.shape[-1])
    ref_values, ref_idx = ref2.topk(k, dim=-1)
    our_idx = ours2.topk(k, dim=-1).indices
    for row in range(ref2.shape[0]):
        for i in range(k):
            got, want = int(our_idx[row, i]), int(ref_idx[row, i])
            if got == want:
                continue
            gap = float(ref_values[row, i] - ref2[row, got])
            assert abs(gap) < atol, (
                f"row {row}, rank {i}: class {got} instead of {want}; the reference separates them by "
                f"{gap:.3g} (>= atol {atol:.3g}); our top-{k} {our_idx[row].tolist()}, "
                f"reference {ref_idx[row].tolist()}")


def randomize_batch_norm(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give every BatchNorm non-trivial running stats and affine parameters, so folding them matters."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=gen) * 0.5 + 0.75)
                    m.bias.copy_(torch.randn(n, generator=gen) * 0.1)
    return model
