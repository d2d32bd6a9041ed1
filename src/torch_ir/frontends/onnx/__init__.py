"""ONNX frontend: import an ONNX model into the same IR ``extract_ir`` produces.

    >>> ir, weights = import_onnx("model.onnx")                     # doctest: +SKIP
    >>> IRExecutor(ir, weights).run([x])                             # doctest: +SKIP

Stages, in the order data flows through them: ``loader`` (check, opset conversion, shape
inference, symbols), ``importer`` (the node walk, with ``fold`` for values known at import time
and the ``converters`` table into ATen), ``custom_ops`` (the ``onnx.*`` ops kept where ATen has no
counterpart), ``verify`` (compare an imported IR with onnxruntime).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

import onnx
import torch

from ...ir import NPU_IR
from .custom_ops import register_onnx_ops
from .importer import Importer
from .loader import MAX_OPSET, MIN_OPSET, InvalidModelError, ModelNotFoundError, load_model


def import_onnx(model_or_path: str | os.PathLike | onnx.ModelProto, *,
                input_shapes: Mapping[str, Sequence[int | str]] | None = None,
                model_name: str | None = None,
                reference_fallback: bool = True) -> tuple[NPU_IR, dict[str, torch.Tensor]]:
    """Import an ONNX model (a path or a ``ModelProto``) into IR; returns ``(ir, weights)``.

    Example::

        ir, weights = import_onnx("resnet.onnx", input_shapes={"input": [1, 3, 224, 224]})
        (logits,) = IRExecutor(ir, weights).run([x])

    ``input_shapes`` binds symbolic input dimensions (ints) or renames them (strings); binding them
    lets shape computations fold to static attributes. Initializers become weights under their
    ONNX names. ONNX ops with no ATen translation stay ONNX ops (``onnx.<Op>.default``, run by the
    ONNX reference implementation) unless ``reference_fallback=False``, which makes them errors.
    Every node that cannot be imported is listed in one ``UnsupportedOpError``.

    The model is untrusted data: every failure on a malformed or hostile file is a ``TorchIRError``
    naming the file (``InvalidModelError`` for a file that cannot be read or checked), and a value
    known at import time is folded into a constant only under ``torch_ir.limits`` (``max_fold_bytes``,
    computed before allocating); a larger one stays a graph node.
    """
    loaded = load_model(model_or_path, input_shapes)
    name = model_name or loaded.model.graph.name or "onnx_model"
    return Importer(loaded, name, reference_fallback=reference_fallback).run()


def onnx_specializer(model_or_path: str | os.PathLike | onnx.ModelProto, ir: NPU_IR,
                     ) -> Callable[[Mapping[str, int]], NPU_IR]:
    """``sizes -> static IR`` for the symbols of ``ir`` (the model imported with its symbolic inputs): the model
    imported again with those sizes bound, so that its shape arithmetic (``Shape``, ``Gather``, ``Concat`` into a
    ``Reshape``: what a legacy export of a dynamic axis leaves) folds to static attributes, which
    ``torch_ir.ir.specialize`` of the symbolic IR cannot do. What a dynamic program (``npu_compiler.Buckets``)
    compiles an ONNX model's buckets from."""
    def specialize(sizes: Mapping[str, int]) -> NPU_IR:
        shapes = {t.name: [sizes.get(d, d) if isinstance(d, str) else d for d in t.shape] for t in ir.graph_inputs}
        return import_onnx(model_or_path, input_shapes=shapes, model_name=ir.model_name)[0]

    return specialize


__all__ = ["MAX_OPSET", "MIN_OPSET", "InvalidModelError", "ModelNotFoundError", "import_onnx", "load_model",
           "onnx_specializer", "register_onnx_ops"]
