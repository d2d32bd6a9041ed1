"""Graph transformations: rule sets for the one rewrite engine in ``rewrite.py``.

``normalize`` runs them as a pipeline (clean-up, canonicalization, fusion into the NPU op set of
``torch_ir.ops.npu``) and ``annotate`` fills the tensor table (role, layout, bit-width).
"""

from torch_ir.rewrite import Fold, Match, Op, RewriteResult, Rule, Var, eliminate_dead_code, rewrite, select

from .annotate import QConfig, annotate, tensor_table
from .pipeline import ALL_RULES, FAMILIES, NormalizeOptions, normalize, npu_histogram, rename

__all__ = [
    "ALL_RULES", "FAMILIES", "Fold", "Match", "NormalizeOptions", "Op", "QConfig", "RewriteResult", "Rule", "Var",
    "annotate", "eliminate_dead_code", "normalize", "npu_histogram", "rename", "rewrite", "select", "tensor_table",
]
