"""Small ONNX graphs for the importer tests, and onnxruntime as the trusted implementation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper


def make_model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, list]], outputs: list[tuple[str, int, list]],
               initializers: dict[str, np.ndarray] | None = None, opset: int = 17) -> onnx.ModelProto:
    """A checked model: ``inputs``/``outputs`` are (name, element type, shape) triples."""
    graph = helper.make_graph(
        nodes, "test_graph",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8  # readable by every onnxruntime
    onnx.checker.check_model(model)
    return model


def ort_run(model: onnx.ModelProto | str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The outputs onnxruntime computes, as tensors."""
    import onnxruntime as ort

    source = model if isinstance(model, str) else model.SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
    return [torch.from_numpy(np.asarray(y)) for y in session.run(None, feeds)]


FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def reshape_by_shape_model(batch: int | str = 2) -> onnx.ModelProto:
    """Conv -> Relu, then the exporter's Shape -> Gather -> Unsqueeze -> Concat -> Reshape flatten."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Shape", ["r"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["r", "target"], ["y"]),
    ]
    inits = {"w": rng.standard_normal((4, 3, 3, 3), dtype=np.float32), "b": rng.standard_normal(4, dtype=np.float32),
             "zero": np.array(0, np.int64), "axes0": np.array([0], np.int64), "minus1": np.array([-1], np.int64)}
    return make_model(nodes, [("x", FLOAT, [batch, 3, 8, 8])], [("y", FLOAT, [batch, 256])], inits)
