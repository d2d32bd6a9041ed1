"""The compiled program, re-exported from its own package, ``npu_program.program``.

The schema (``CompiledProgram``, ``TensorSpec``, ``StateSpec``, ``Dispatch``, ``Provenance``, ``MemoryPlan``) lives in
``npu_program`` so that the runtime reads programs without importing the compiler; this module keeps the
seeds' import path (``from npu_compiler.compiled_program import CompiledProgram``) working.
"""

from __future__ import annotations

from npu_program.program import (
    STATE_INITS,
    CompiledProgram,
    Dispatch,
    MemoryPlan,
    Provenance,
    StateSpec,
    TensorSpec,
    dtype_size,
)

__all__ = ["STATE_INITS", "CompiledProgram", "Dispatch", "MemoryPlan", "Provenance", "StateSpec", "TensorSpec",
           "dtype_size"]
