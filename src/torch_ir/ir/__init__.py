"""The IR data classes, their JSON codec and their checker."""

from .core import NPU_IR, ROLES, OpNode, Provenance, TensorMeta, merged_provenance, provenance_of
from .serialize import IR_VERSION, ir_from_dict, ir_to_dict, load_ir, save_ir
from .specialize import specialize
from .subgraph import subgraph
from .validate import IRValidationError, check_document, check_integrity

__all__ = [
    "IR_VERSION", "NPU_IR", "ROLES", "IRValidationError", "OpNode", "Provenance", "TensorMeta",
    "check_document", "check_integrity", "ir_from_dict", "ir_to_dict", "load_ir", "merged_provenance",
    "provenance_of", "save_ir", "specialize", "subgraph",
]
