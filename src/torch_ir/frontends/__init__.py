"""Frontends: each turns a framework's model into the one IR."""

from .torch_export import build_on_meta, extract_ir, from_exported_program

__all__ = ["build_on_meta", "extract_ir", "from_exported_program"]
