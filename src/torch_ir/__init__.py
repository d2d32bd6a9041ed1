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
from typing import Any

# Every name loads on first use (PEP 562). The layers above the IR import torch_ir's submodules for their own
# needs: the kernel table its dtype table (without torch, so that a program reader need not have it), the
# runtime its errors, file I/O and limits (without a model importer). ``import torch_ir`` itself loads nothing.
_LAZY = {
    **dict.fromkeys(["ExecutionError", "ExtractionError", "InputMismatchError", "IRValidationError", "TorchIRError",
                     "UnsupportedOpError", "WeightsMismatchError"], "errors"),
    "IRExecutor": "executor",
    **dict.fromkeys(["NPU_IR", "OpNode", "TensorMeta", "load_ir"], "ir"),
    "register_op": "ops",
    **dict.fromkeys(["ir_statistics", "markdown_report", "to_mermaid"], "report"),
    **dict.fromkeys(["exported_program_state", "load_state_dict", "match_weights", "save_weights"], "weights"),
    **dict.fromkeys(["build_on_meta", "extract_ir", "from_exported_program"], "frontends"),
    **dict.fromkeys(["verify_ir", "verify_ir_with_state_dict"], "verify"),
    "import_onnx": "frontends.onnx",  # onnx and tinygrad are optional: imported only when asked for
    "import_tinygrad": "frontends.tinygrad",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # once: later lookups do not come here
        return value
    raise AttributeError(f"module 'torch_ir' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
