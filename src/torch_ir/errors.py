"""Exceptions users see. Each message names the object, the rule it broke and the fix.

Every error the toolkit raises on bad input (a file, an argument, a model) is a :class:`TorchIRError`,
so one ``except TorchIRError`` catches them all; the CLI turns each into one line and exit code 2.
The hierarchy (``npu_compiler`` and ``npu_runtime`` derive their errors from the same base)::

    TorchIRError
    ├── IRValidationError        an IR file or object breaks a rule of the format        (also ValueError)
    ├── UnsafeInputError         a file names something it must not: an op that touches files, processes
    │                            or global state, an expression that is not a size, a path outside
    ├── LimitExceededError       a file asks for more memory than the limits allow (torch_ir.limits)
    ├── ExtractionError          the model could not be turned into IR
    ├── UnsupportedOpError       an op has no implementation in the registry
    ├── WeightsMismatchError     weights do not match the IR, or cannot be read
    ├── InputMismatchError       inputs given to an executor do not match the IR
    ├── ExecutionError           a node failed while executing
    ├── OutputWriteError         an output file cannot be written (directory missing, read-only, ...)
    ├── InputReadError           an input file cannot be read (InputNotFoundError: it does not exist)
    ├── npu_compiler: CompileError (UnsupportedOpsError), NpubinError, MemoryPlanError
    └── npu_runtime:  RuntimeInputError, DispatchError
"""

from __future__ import annotations


class TorchIRError(Exception):
    """Base class for errors raised by torch_ir, npu_compiler and npu_runtime on bad input.

    ``cli`` (optional) is the same message in the command line's words (flags, not Python arguments): the CLI
    prints it instead of the message, whose fix may name Python calls (``strict=False``, ``weights=``)."""

    def __init__(self, *args: object, cli: str | None = None) -> None:
        super().__init__(*args)
        self.cli = cli


class IRValidationError(TorchIRError, ValueError):
    """An IR file or object breaks a rule of the format; the message names where and which."""


class UnsafeInputError(TorchIRError, ValueError):
    """A file asks for something an untrusted file must never get: running code, an op with side effects
    outside its own tensors, a path outside the output directory."""


class LimitExceededError(TorchIRError, ValueError):
    """A file asks for more memory than ``torch_ir.limits`` allows; the message says how to raise the limit."""


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


class OutputWriteError(TorchIRError, OSError):
    """An output file could not be written; nothing half-written is left behind."""


class InputReadError(TorchIRError, OSError):
    """An input file cannot be read: a directory, unreadable, larger than the limits."""


class InputNotFoundError(InputReadError, FileNotFoundError):
    """An input file does not exist (also a ``FileNotFoundError``)."""


__all__ = [
    "ExecutionError", "ExtractionError", "IRValidationError", "InputMismatchError", "InputNotFoundError",
    "InputReadError", "LimitExceededError",
    "OutputWriteError", "TorchIRError", "UnsafeInputError", "UnsupportedOpError", "WeightsMismatchError",
]
