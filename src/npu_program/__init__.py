"""The contract between the NPU compiler and the runtime: the kernel table and the program schema.

Plain data, importable without the compiler: ``npu_compiler`` emits dispatches of the kernels listed in
``kernels`` (``npu_runtime`` backends implement them, ``npu_compiler.passes`` reads the layout and view facts,
``docs/kernels.md`` is generated from the same records); ``params`` holds the types of the kernels' declared
parameters, their check and the IR's encoding of them (``aten_params``: the ATen kernels' declarations);
``array_mapping`` how a contraction runs on a MAC array; ``program`` holds the compiled program's dataclasses
(``CompiledProgram``, ``TensorSpec``, ``StateSpec``, ``Dispatch``, ``MemoryPlan``), written and read through
the one generic codec ``codec`` and the file format ``npubin``; ``check`` re-checks a loaded program
(``memory_check``: the memory-plan checker it shares with the compiler). The one dtype table is
``torch_ir.dtypes``, below this package. ``kernels``, ``params``, ``codec`` and ``program`` import neither
torch nor numpy. ``dynamic`` holds a program of several static variants (shape buckets) and how the runtime picks
one; ``template`` an upper-bound program's sizes as expressions of the symbols and its instance at given sizes;
``npubin_dynamic`` the file of either (format 3) and ``load_program``, which reads every kind.
"""

from .cost_formulas import KernelCost
from .kernels import KERNELS, KernelDef, get_kernel

__all__ = ["KERNELS", "KernelCost", "KernelDef", "get_kernel"]
