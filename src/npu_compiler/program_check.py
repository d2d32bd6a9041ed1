"""The untrusted-program checker, re-exported from ``npu_program.check`` (where it lives, so that the
runtime runs it without importing the compiler). See that module for every rule it enforces."""

from __future__ import annotations

from npu_program.check import check_program

__all__ = ["check_program"]
