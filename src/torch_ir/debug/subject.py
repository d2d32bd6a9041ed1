"""What ``bisect`` works on: a model's extracted IR, its weights and inputs, and the trusted source's values.

A :class:`Subject` is made by ``torch_ir.debug.sources.load_subject`` from a zoo name, a ``module:factory`` spec,
an ONNX file, a tinygrad factory or an IR with its weights. The trusted source is the framework the model came
from (eager PyTorch, onnxruntime, tinygrad); an IR alone has none, and its own reference execution is trusted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..ir import NPU_IR


@dataclass
class Subject:
    """One model to bisect.

    ``run_trusted()`` gives the trusted source's outputs, in ``ir.graph_outputs`` order. ``trusted_values()``
    gives every intermediate value the source can align with an IR tensor name (torch.export names, ONNX
    value names, tinygrad UOps), for finding the first diverging node of the extracted IR; None when the
    source cannot be aligned (then only the stage is named).
    """

    name: str
    ir: NPU_IR  # as extracted, with provenance
    weights: Mapping[str, Any]  # what IRExecutor takes: tensors by state-dict key
    inputs: list[torch.Tensor]  # one per ir.graph_inputs
    trusted: str  # "eager PyTorch", "onnxruntime", "tinygrad" or "the IR's reference execution"
    run_trusted: Callable[[], list[torch.Tensor]]
    trusted_values: Callable[[], dict[str, torch.Tensor]] | None = None
    # the converter/mapping family a frontend fault is named by: "torch.export", "onnx", "tinygrad", None
    frontend: str | None = None
