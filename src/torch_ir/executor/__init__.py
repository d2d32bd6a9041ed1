"""The reference executor."""

from .executor import IRExecutor

__all__ = ["IRExecutor"]
