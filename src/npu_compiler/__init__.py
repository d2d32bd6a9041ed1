"""npu_compiler: compile the IR into a program of kernel dispatches (``.npubin``).

    import npu_compiler
    program = npu_compiler.compile("model_ir.json")   # normalize -> check -> lower -> plan memory
    program.save("model.npubin")
    buckets = npu_compiler.compile(ir, dynamic={"seq": [128, 256, 512]})   # DynamicProgram: one file, 3 variants

    from npu_compiler import partition, is_op_supported
    plan = partition(ir_dict, is_op_supported)          # NPU and CPU parts, for npu_runtime.DAGExecutor
"""

from npu_program.dynamic import DynamicProgram
from npu_program.npubin import NpubinError
from npu_program.npubin_dynamic import load_program

from .compiled_program import CompiledProgram, Dispatch, MemoryPlan, TensorSpec
from .compiler import COMPILER_VERSION, Buckets, CompileError, CompileOptions, UnsupportedOpsError, UpperBound, compile
from .library import TARGETS, Target, get_target, is_op_supported, register_target, unsupported_reason
from .partition import Partition, PartitionPlan, Placement, partition
from .quantize import quantize as quantize  # QuantConfig, presets and the rest: npu_compiler.quantize

__all__ = [
    "COMPILER_VERSION", "TARGETS", "Buckets", "CompileError", "CompileOptions", "CompiledProgram", "Dispatch",
    "DynamicProgram", "MemoryPlan", "NpubinError", "Partition", "PartitionPlan", "Placement", "Target", "TensorSpec",
    "UnsupportedOpsError", "UpperBound", "compile", "get_target", "is_op_supported", "load_program", "partition",
    "register_target", "unsupported_reason",
]
