"""The accuracy report of a quantized model: per-layer SQNR and cosine against the float model (with the bisect's
fault-or-drift rule naming the first layer whose error jumps), next-token KL divergence and top-1 agreement for an
LLM, a mixed-precision search joined to the cost model (accuracy against latency, the Pareto front), and the report
files (``accuracy.csv``, ``pareto.csv``, a plot, ``report.html``).

    >>> report = compare_quantized(float_ir, weights, q_ir, q_weights, [[x1], [x2]])  # doctest: +SKIP
    >>> print(report.summary())  # doctest: +SKIP
"""

from __future__ import annotations

from .compare import AccuracyReport, LayerAccuracy, ReportError, compare_quantized, quant_noise_floor
from .files import ACCURACY_COLUMNS, REPORT_FILES, SVG_REPORT_FILES, write_report
from .mixed import PARETO_COLUMNS, Assignment, Cost, Target, cost_on, propose_mixed_precision, with_overrides
from .tokens import TokenAgreement, kl_and_top1, token_agreement

__all__ = ["ACCURACY_COLUMNS", "PARETO_COLUMNS", "REPORT_FILES", "SVG_REPORT_FILES", "AccuracyReport", "Assignment",
           "Cost", "LayerAccuracy", "ReportError", "Target", "TokenAgreement", "compare_quantized", "cost_on",
           "kl_and_top1", "propose_mixed_precision", "quant_noise_floor", "token_agreement", "with_overrides",
           "write_report"]
