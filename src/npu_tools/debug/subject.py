"""What ``bisect`` works on: a model's extracted IR, its weights and inputs, and the trusted source's values.

A :class:`Subject` is made by ``npu_tools.debug.sources.load_subject`` from a zoo name, a ``module:factory`` spec,
an ONNX file, a tinygrad factory or an IR with its weights. The trusted source is the framework the model came
from (eager PyTorch, onnxruntime, tinygrad); an IR alone has none, and its own reference execution is trusted.
``given_inputs`` and ``given_weights`` take what the caller gave in place of the source's own, for every form.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torch_ir.errors import InputMismatchError
from torch_ir.ir import NPU_IR


@dataclass(frozen=True)
class WeightsUsed:
    """Which weights a subject's trusted source and IR run on, as every report says it.

    ``text`` is what a person reads: the weights file's path, "the factory's own weights" (whatever the model's
    builder made or loaded itself, ``from_pretrained`` included), "seeded random weights (seed N)", ...
    """

    # "file", "seeded", "own" (the source's own weights), "given" (a state dict passed in Python) or "none"
    kind: str
    text: str
    path: str | None = None  # the weights file ("file"), absolute
    seed: int | None = None  # the seed of the random weights ("seeded")

    @classmethod
    def file(cls, path: str | os.PathLike) -> WeightsUsed:
        where = os.path.abspath(os.fspath(path))
        return cls("file", where, path=where)

    @classmethod
    def seeded(cls, seed: int) -> WeightsUsed:
        return cls("seeded", f"seeded random weights (seed {seed})", seed=seed)

    @classmethod
    def own(cls, text: str) -> WeightsUsed:
        """The source's own weights, as ``text`` says them: "the factory's own weights", ..."""
        return cls("own", text)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "path": self.path, "seed": self.seed}


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
    weights_used: WeightsUsed = WeightsUsed.own("the subject's own weights")


def given_weights(weights: Any) -> WeightsUsed:
    """The :class:`WeightsUsed` of weights the caller gave: a file, or what was passed in Python."""
    if isinstance(weights, (str, os.PathLike)):
        return WeightsUsed.file(weights)
    return WeightsUsed("given", f"the weights given to bisect (a {type(weights).__name__})")


def given_inputs(ir: NPU_IR, inputs: Sequence[Any] | Mapping[str, Any], name: str) -> list[torch.Tensor]:
    """The caller's inputs as torch tensors, one per graph input (a mapping: by graph input name)."""
    from torch_ir.weights import as_tensor

    if isinstance(inputs, Mapping):
        names = [t.name for t in ir.graph_inputs]
        stray, missing = sorted(set(inputs) - set(names)), [n for n in names if n not in inputs]
        if stray or missing:
            raise InputMismatchError(f"{name!r} takes the inputs {', '.join(names)}; the inputs given "
                                     + (f"name {stray} " if stray else "") + (f"lack {missing}" if missing else ""))
        inputs = [inputs[n] for n in names]

    values = [as_tensor(x, f"input {i} of {name!r}", InputMismatchError) for i, x in enumerate(inputs)]
    if len(values) != len(ir.graph_inputs):
        raise InputMismatchError(f"{name!r} takes {len(ir.graph_inputs)} inputs "
                                 f"({', '.join(t.name for t in ir.graph_inputs)}); {len(values)} were given")
    return values
