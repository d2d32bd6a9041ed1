"""Frontends: each turns a framework's model into the one IR."""

from .torch_export import extract_ir, from_exported_program

__all__ = ["extract_ir", "from_exported_program"]
