"""An analytical NPU cost model of compiled programs: a hardware description (``hardware``) and the per-dispatch
model (``model``; its docstring states every assumption).

    >>> from npu_compiler.costmodel import cost_program, load_hardware
    >>> report = cost_program(program, load_hardware("edge_4tops"), dtype="int8")  # doctest: +SKIP
    >>> print(report.summary())  # doctest: +SKIP
"""

from __future__ import annotations

from .hardware import DATAFLOWS, Hardware, HardwareError, hardware_from_dict, load_hardware, presets
from .llm import LMCost, cost_lm
from .model import CSV_COLUMNS, CostModelError, CostReport, DispatchCost, HostDispatch, LayerCost, cost_program

__all__ = ["CSV_COLUMNS", "DATAFLOWS", "CostModelError", "CostReport", "DispatchCost", "Hardware", "HardwareError",
           "HostDispatch", "LMCost", "LayerCost", "cost_lm", "cost_program", "hardware_from_dict", "load_hardware",
           "presets"]
