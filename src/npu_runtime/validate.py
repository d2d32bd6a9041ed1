"""``Executor(..., validate=True)``: every dispatch checked against the reference implementation.

After each dispatch runs, the op it came from runs again through its reference implementation (the
``torch_ir`` op registry, on the CPU) on the dispatch's actual inputs, and the outputs are compared
with the dtype's tolerance. The first dispatch that diverges stops the run with a
:class:`ValidationError` naming it, its kernel, the IR node it came from and the error, so a wrong
fast kernel, a wrong layout or a memory plan that overwrote a live tensor is found at the dispatch
where it happens, not at the model's output.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from torch_ir.errors import TorchIRError
from torch_ir.verify import default_tolerance

from .reference import bind_reference

if TYPE_CHECKING:
    from .executor import Executor, Step


class ValidationError(TorchIRError):
    """A dispatch's outputs differ from its op's reference implementation beyond the dtype's tolerance."""


class DispatchValidator:
    """The executor hook that runs each step, then compares it with the reference."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        program = executor.program
        self.references = [bind_reference(d, executor.specs, torch.device("cpu")) for d in program.dispatches]

    def __call__(self, index: int, step: Step) -> None:
        run, ins, outs = step
        backend = self.executor.device.backend
        dispatch = self.executor.program.dispatches[index]
        specs = self.executor.specs
        # the inputs as the kernel sees them: taken before it runs, since an in-place kernel (a CONV over
        # its residual) overwrites one
        backend.synchronize()
        host_ins = [_host(backend, t, specs[name]) for t, name in zip(ins, dispatch.inputs)]
        run(ins, outs)
        backend.synchronize()
        expected = self.references[index](host_ins, {})
        for name, got, want in zip(dispatch.outputs, outs, expected):
            actual = _host(backend, got, specs[name])
            problem = _compare(actual, want)
            if problem:
                raise ValidationError(
                    f"dispatch {index} ({dispatch.kernel}) of program {self.executor.program.model_name!r}, from IR "
                    f"node {dispatch.node!r}: output {name!r} differs from the reference implementation: {problem}")


def _host(backend: Any, handle: Any, spec: Any) -> torch.Tensor:
    """A device tensor as a logical-order CPU tensor of its own dtype (bfloat16 kept)."""
    if isinstance(handle, torch.Tensor):
        return handle.detach().clone()
    array = backend.download(handle, spec)
    return torch.from_numpy(np.ascontiguousarray(array))


def _compare(actual: torch.Tensor, expected: torch.Tensor) -> str | None:
    if list(actual.shape) != list(expected.shape):
        return f"shape {list(actual.shape)}, the reference gives {list(expected.shape)}"
    expected = expected.to(actual.dtype)
    rtol, atol = default_tolerance(expected.dtype)
    if not expected.is_floating_point():
        bad = actual != expected
    else:
        diff = (actual.float() - expected.float()).abs()
        nan_mismatch = torch.isnan(actual) != torch.isnan(expected)
        bad = (diff > atol + rtol * expected.float().abs()) & ~torch.isnan(expected) | nan_mismatch
    if not bool(bad.any()):
        return None
    count = int(bad.sum())
    if expected.is_floating_point():
        err = (actual.float() - expected.float()).abs().nan_to_num(float("inf")).max().item()
        return f"{count} of {bad.numel()} elements outside rtol={rtol}, atol={atol} (max abs error {err:.3g})"
    return f"{count} of {bad.numel()} elements differ"


__all__ = ["DispatchValidator", "ValidationError"]
