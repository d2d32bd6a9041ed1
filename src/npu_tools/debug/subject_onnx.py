"""Subjects from an ONNX model; onnxruntime is trusted."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from torch_ir.inputs import random_inputs

from .subject import Subject, WeightsUsed, given_inputs


def subject_from_onnx(model: str | os.PathLike | Any, *, inputs: Sequence[Any] | None = None, seed: int = 0,
                      input_shapes: Mapping[str, Sequence[int]] | None = None,
                      name: str | None = None) -> Subject:
    """A subject from an ONNX model (a path or a ``ModelProto``); onnxruntime is trusted.

    Example::

        subject = subject_from_onnx("model.onnx", input_shapes={"input": [1, 3, 32, 32]})

    IR tensors made from ONNX values keep their ONNX names, so ``trusted_values`` asks onnxruntime for
    every one of them at once (each made an extra graph output).
    """
    import onnx

    from torch_ir.frontends.onnx import load_model
    from torch_ir.frontends.onnx.importer import Importer
    from torch_ir.frontends.onnx.verify import check_onnx_sizes, run_onnxruntime

    loaded = load_model(model, input_shapes)
    check_onnx_sizes(loaded)  # onnxruntime allocates what the file asks: sizes are checked first
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model))
    name = name or loaded.model.graph.name or (Path(model).stem if not isinstance(model, onnx.ModelProto) else None) \
        or "onnx_model"
    ir, weights = Importer(loaded, name).run()
    shapes = {k: list(v) for k, v in (input_shapes or {}).items()}
    values = given_inputs(ir, inputs, name) if inputs is not None else random_inputs(ir, seed, shapes=shapes)
    outputs = [t.name for t in ir.graph_outputs]

    def run_trusted() -> list[torch.Tensor]:
        return run_onnxruntime(proto, ir, values, outputs)

    def trusted_values() -> dict[str, torch.Tensor]:
        onnx_names = {o for n in proto.graph.node for o in n.output if o}
        named = [t.name for n in ir.nodes for t in n.outputs if t.name in onnx_names]
        found = dict(zip(named, run_onnxruntime(proto, ir, values, named)))
        found.update({t.name: v for t, v in zip(ir.graph_inputs, values)})
        return found

    return Subject(name=name, ir=ir, weights=weights, inputs=values, trusted="onnxruntime",
                   run_trusted=run_trusted, trusted_values=trusted_values, frontend="onnx",
                   weights_used=WeightsUsed.own("the ONNX model's own weights (its initializers)"))
