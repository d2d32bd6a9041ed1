"""Turn torch.export failures into messages that say what in the model is wrong and how to fix it."""

from __future__ import annotations

import re

from ..errors import ExtractionError

_DATA_DEPENDENT = (
    "data-dependent", "GuardOnDataDependentSymNode", "Could not guard on data-dependent",
    "Tensor.item() cannot be called on meta tensors", "Could not extract specialized integer",
    "Cannot access data pointer", "meta tensors", "Pending unbacked",
)
_SHAPE_MISMATCH = ("Attempting to broadcast a dimension", "must match the size of tensor", "shape mismatch")
_UNSUPPORTED_PYTHON = ("Unsupported", "torch._dynamo.exc", "Dynamo does not know how", ".numpy()", "is not supported")


def _user_frame(text: str) -> str:
    """The model's own source line that torch.export blames, when it names one."""
    found = re.findall(r'File "([^"]+)", line (\d+), in (\w+)\n\s*(.+)', text)
    if not found:
        return ""
    path, line, func, code = found[-1]
    return f" at {path}:{line} in {func}: `{code.strip()}`"


def explain_export_failure(error: Exception, model_name: str) -> ExtractionError:
    text = f"{type(error).__name__}: {error}"
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    first += _user_frame(text)
    if any(k in text for k in _DATA_DEPENDENT):
        return ExtractionError(
            f"model {model_name!r} has data-dependent control flow or reads tensor values in Python "
            f"(torch.export failed with: {first}). Extraction traces shapes only, so a branch on a tensor's "
            "value cannot be followed. Fix: branch on shapes instead, express the branch with torch.cond, "
            "or compute both sides and select with torch.where."
        )
    if any(k in text for k in _UNSUPPORTED_PYTHON):
        return ExtractionError(
            f"model {model_name!r} uses a Python construct torch.export cannot trace ({first}). "
            "Fix: move it out of forward() (precompute it in __init__), or rewrite it with tensor ops "
            "(no .numpy(), .tolist() or Python-side math on tensor values); "
            "see the torch.export documentation for what export supports."
        )
    if any(k in text for k in _SHAPE_MISMATCH):
        return ExtractionError(
            f"torch.export could not export model {model_name!r}: {text}\n"
            "If the model caches tensors computed from the input's shape on its first call (detection anchors, "
            "masks) and was run or exported before, build it again: torch.export puts a module's tensor "
            "attributes back after a trace but not the plain attributes that guard them (Ultralytics' "
            "Detect.shape), so the cache is stale. extract_ir itself leaves the model as it found it."
        )
    return ExtractionError(f"torch.export could not export model {model_name!r}: {text}")
