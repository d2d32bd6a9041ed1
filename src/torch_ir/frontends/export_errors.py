"""Turn torch.export failures into messages that say what in the model is wrong and how to fix it."""

from __future__ import annotations

from ..errors import ExtractionError

_DATA_DEPENDENT = (
    "data-dependent", "GuardOnDataDependentSymNode", "Could not guard on data-dependent",
    "Tensor.item() cannot be called on meta tensors", "Could not extract specialized integer",
    "Cannot access data pointer", "meta tensors", "Pending unbacked",
)
_UNSUPPORTED_PYTHON = ("Unsupported", "torch._dynamo.exc", "Dynamo does not know how")


def explain_export_failure(error: Exception, model_name: str) -> ExtractionError:
    text = f"{type(error).__name__}: {error}"
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
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
            "Fix: move it out of forward(), or rewrite it with tensor ops; "
            "see https://pytorch.org/docs/stable/export.html for what export supports."
        )
    return ExtractionError(f"torch.export could not export model {model_name!r}: {text}")
