"""Verification: run the IR and the original model on the same inputs and compare.

    ok, report = verify_ir(ir, "model.safetensors", model, (x,))
    print(report)  # per-output errors; on failure, the first IR node that diverges
"""

from .compare import TensorDiff, compare_tensors
from .localize import Localization
from .result import VerificationReport
from .tolerance import DEFAULT_TOLERANCES, default_tolerance, tolerance_for

__all__ = [
    "DEFAULT_TOLERANCES", "Localization", "TensorDiff", "VerificationReport", "compare_tensors",
    "default_tolerance", "tolerance_for", "verify_ir", "verify_ir_with_state_dict",
]


def __getattr__(name: str):
    # the verifier exports the model (torch.export, a frontend): loaded on first use, so that the runtime's
    # validation, which needs only the comparisons and tolerances here, does not load a frontend
    if name in ("verify_ir", "verify_ir_with_state_dict"):
        from . import verifier

        return getattr(verifier, name)
    raise AttributeError(f"module 'torch_ir.verify' has no attribute {name!r}")
