"""Exceptions users see. Each message names the object, the rule it broke and the fix."""

from __future__ import annotations

from .ir.validate import IRValidationError


class TorchIRError(Exception):
    """Base class for errors raised by torch_ir on bad input."""


class ExtractionError(TorchIRError):
    """The model could not be turned into IR (real weights, data-dependent control flow, ...)."""


class UnsupportedOpError(TorchIRError):
    """An op has no implementation in the registry; the message says how to register one."""


class WeightsMismatchError(TorchIRError):
    """Weights do not match the IR; lists every missing, unexpected, wrong-shape and wrong-dtype name."""


class InputMismatchError(TorchIRError):
    """Inputs given to an executor do not match the IR's graph inputs."""


class ExecutionError(TorchIRError):
    """A node failed while executing; the message names the node and shows it."""


__all__ = [
    "ExecutionError", "ExtractionError", "IRValidationError", "InputMismatchError", "TorchIRError",
    "UnsupportedOpError", "WeightsMismatchError",
]
