"""torch_ir: weight-free IR extraction from PyTorch, a reference executor and a verifier.

    >>> import torch, torch_ir
    >>> with torch.device("meta"):
    ...     model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    >>> ir = torch_ir.extract_ir(model, (torch.randn(2, 4),), model_name="mlp")
    >>> [n.op_type for n in ir.nodes]
    ['aten.linear.default', 'aten.relu.default']
"""

__version__ = "0.1.0"

import importlib

from .errors import (  # noqa: E402
    ExecutionError,
    ExtractionError,
    InputMismatchError,
    IRValidationError,
    TorchIRError,
    UnsupportedOpError,
    WeightsMismatchError,
)
from .executor import IRExecutor  # noqa: E402
from .ir import NPU_IR, OpNode, TensorMeta, load_ir  # noqa: E402
from .ops import register_op  # noqa: E402
from .report import ir_statistics, markdown_report, to_mermaid  # noqa: E402
from .weights import exported_program_state, load_state_dict, match_weights, save_weights  # noqa: E402

__all__ = [
    "NPU_IR", "ExecutionError", "ExtractionError", "IRExecutor", "IRValidationError", "InputMismatchError",
    "OpNode", "TensorMeta", "TorchIRError", "UnsupportedOpError", "WeightsMismatchError", "__version__",
    "build_on_meta", "exported_program_state", "extract_ir", "from_exported_program", "import_onnx",
    "import_tinygrad", "ir_statistics", "load_ir", "load_state_dict", "markdown_report", "match_weights",
    "register_op", "save_weights", "to_mermaid", "verify_ir", "verify_ir_with_state_dict",
]


# The frontends load on first use (PEP 562): the layers above the IR (the program reader, the runtime) import
# torch_ir for its errors, file I/O and limits, and must not load a model importer with them.
_LAZY = {"build_on_meta": "frontends", "extract_ir": "frontends", "from_exported_program": "frontends",
         "verify_ir": "verify", "verify_ir_with_state_dict": "verify"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    if name == "import_tinygrad":
        from .frontends.tinygrad import import_tinygrad

        return import_tinygrad
    if name == "import_onnx":
        from .frontends.onnx import import_onnx

        return import_onnx
    raise AttributeError(f"module 'torch_ir' has no attribute {name!r}")
