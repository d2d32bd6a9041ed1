"""Verification: run the IR and the original model on the same inputs and compare.

    ok, report = verify_ir(ir, "model.safetensors", model, (x,))
    print(report)  # per-output errors; on failure, the first IR node that diverges
"""

from .compare import TensorDiff, compare_tensors
from .localize import Localization
from .result import VerificationReport
from .tolerance import DEFAULT_TOLERANCES, default_tolerance, tolerance_for
from .verifier import verify_ir, verify_ir_with_state_dict

__all__ = [
    "DEFAULT_TOLERANCES", "Localization", "TensorDiff", "VerificationReport", "compare_tensors",
    "default_tolerance", "tolerance_for", "verify_ir", "verify_ir_with_state_dict",
]
