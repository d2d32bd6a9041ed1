"""The compiler's errors, in a module of their own so that every compiler module can raise them."""

from __future__ import annotations

from torch_ir.errors import TorchIRError


class CompileError(TorchIRError, ValueError):
    """The IR cannot be compiled for the target; the message names the nodes and the way forward."""


class UnsupportedOpsError(CompileError):
    """Some nodes have no kernel on the target. ``unsupported`` lists ``(node name, op type, reason)``."""

    def __init__(self, message: str, unsupported: list[tuple[str, str, str]]):
        super().__init__(message)
        self.unsupported = unsupported


__all__ = ["CompileError", "UnsupportedOpsError"]
