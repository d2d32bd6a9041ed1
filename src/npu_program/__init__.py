"""The contract between the NPU compiler and the runtime: the kernel table and the program schema.

Plain data, importable without the compiler: ``npu_compiler`` emits dispatches of the kernels listed in
``kernels`` (``npu_runtime`` backends implement them, ``npu_compiler.passes`` reads the layout and view facts,
``docs/kernels.md`` is generated from the same records); ``params`` holds the types of the kernels' declared
parameters, their check and the IR's encoding of them (``aten_params``: the ATen kernels' declarations);
``program`` holds the compiled program's dataclasses (``CompiledProgram``, ``TensorSpec``, ``StateSpec``,
``Dispatch``, ``MemoryPlan``), written and read through the one generic codec ``codec`` and the file format
``npubin``; ``check`` re-checks a loaded program (``memory_check``: the memory-plan checker it shares with the
compiler); ``dtypes`` is the one dtype table. ``kernels``, ``params``, ``dtypes``, ``codec`` and ``program``
import neither torch nor numpy themselves (the ``torch_ir`` package's own import still loads torch).
"""

from .cost_formulas import KernelCost
from .kernels import KERNELS, KernelDef, get_kernel

__all__ = ["KERNELS", "KernelCost", "KernelDef", "get_kernel"]
