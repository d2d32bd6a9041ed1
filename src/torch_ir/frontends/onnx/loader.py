"""Load an ONNX model ready for conversion: checked, in a supported opset, fully shape-inferred.

The model's graph is loaded without its external data (``load_external_data=False``), so a model
of any size costs only its graph here; initializer values are read one at a time later
(``initializer_value``). Files over 2 GB are checked and shape-inferred through their path, as
protobuf cannot hold them in one message.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ...errors import ExtractionError

#: The ai.onnx opsets the converter tables cover; models outside are converted into this range.
MIN_OPSET, MAX_OPSET = 7, 28
_PROTOBUF_LIMIT = 2**31  # bytes in one protobuf message


class InvalidModelError(ExtractionError):
    """The ONNX model fails ``onnx.checker``; the message is the checker's, with the file."""


@dataclass
class LoadedModel:
    model: onnx.ModelProto
    source: str  # the file, or "<ModelProto>"
    base_dir: str  # where external data files are found
    opset: int  # the ai.onnx opset after conversion
    symbols: dict[str, str] = field(default_factory=dict)  # ONNX dim_param -> IR symbol name


def load_model(model_or_path: str | os.PathLike | onnx.ModelProto,
               input_shapes: Mapping[str, Sequence[int | str]] | None = None) -> LoadedModel:
    """Read, check, convert to a supported opset, bind ``input_shapes`` and infer every shape.

    Example::

        loaded = load_model("model.onnx", input_shapes={"input": [1, 3, 224, 224]})
        loaded.opset  # e.g. 17
    """
    if isinstance(model_or_path, onnx.ModelProto):
        model, source, base_dir = model_or_path, "<ModelProto>", os.getcwd()
        if model.ByteSize() >= _PROTOBUF_LIMIT:
            raise ExtractionError(
                f"this ONNX model holds {model.ByteSize() / 2**30:.1f} GiB in memory, over protobuf's 2 GiB limit; "
                "save it with external data (onnx.save(model, path, save_as_external_data=True)) and pass the path")
        _check(model, source)
    else:
        path = Path(model_or_path)
        if not path.is_file():
            raise FileNotFoundError(f"ONNX model {str(path)!r} does not exist")
        source, base_dir = str(path), str(path.parent)
        _check(str(path), source)  # by path: works over 2 GB and checks external data references
        model = onnx.load(str(path), load_external_data=False)
    model = _convert_opset(model, source)
    if input_shapes:
        _bind_input_shapes(model, input_shapes, source)
    model = _infer_shapes(model, source)
    return LoadedModel(model, source, base_dir, ai_onnx_opset(model), _symbol_names(model))


def ai_onnx_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return MAX_OPSET  # a model of custom-domain ops only


def initializer_value(tensor: onnx.TensorProto, base_dir: str) -> np.ndarray:
    """One initializer's value, read from its external data file when it has one."""
    return numpy_helper.to_array(tensor, base_dir=base_dir)


def _check(model: str | onnx.ModelProto, source: str) -> None:
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as e:
        raise InvalidModelError(
            f"{source}: the ONNX model is invalid (onnx.checker): {e}\n"
            "Fix: re-export the model, or repair the node/tensor the checker names."
        ) from None


def _convert_opset(model: onnx.ModelProto, source: str) -> onnx.ModelProto:
    opset = ai_onnx_opset(model)
    if MIN_OPSET <= opset <= MAX_OPSET:
        return model
    target = min(max(opset, MIN_OPSET), MAX_OPSET)
    try:
        return onnx.version_converter.convert_version(model, target)
    except Exception as e:  # noqa: BLE001 - the converter raises bare RuntimeErrors from C++
        raise ExtractionError(
            f"{source}: opset {opset} is outside the supported range {MIN_OPSET}..{MAX_OPSET} and "
            f"onnx.version_converter could not convert it to {target}: {e}. "
            f"Fix: re-export the model with an opset in {MIN_OPSET}..{MAX_OPSET}."
        ) from None


def _bind_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int | str]], source: str) -> None:
    inputs = {i.name: i for i in model.graph.input}
    unknown = sorted(set(shapes) - set(inputs))
    if unknown:
        raise ExtractionError(f"{source}: input_shapes names {unknown}, but the graph inputs are {sorted(inputs)}")
    for name, shape in shapes.items():
        dims = inputs[name].type.tensor_type.shape.dim
        if len(dims) != len(shape):
            raise ExtractionError(f"{source}: input_shapes[{name!r}] = {list(shape)} has rank {len(shape)}, "
                                  f"the input has rank {len(dims)}")
        for dim, want in zip(dims, shape):
            if dim.HasField("dim_value") and dim.dim_value != want:
                raise ExtractionError(
                    f"{source}: input_shapes[{name!r}] = {list(shape)} contradicts the static shape of the input")
            if isinstance(want, int):
                dim.dim_value = want
            else:
                dim.dim_param = want


def _infer_shapes(model: onnx.ModelProto, source: str) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as e:  # noqa: BLE001 - shape inference raises InferenceError and RuntimeError
        raise InvalidModelError(f"{source}: ONNX shape inference failed: {e}") from None


def _symbol_names(model: onnx.ModelProto) -> dict[str, str]:
    """Every dim_param of the graph -> a valid IR symbol name (an identifier, unique)."""
    params = set()
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                params.add(dim.dim_param)
    out, used = {}, set()
    for p in sorted(params):
        name = re.sub(r"\W", "_", p)
        name = name if name and not name[0].isdigit() else f"s_{name}"
        while name in used:
            name += "_"
        used.add(name)
        out[p] = name
    return out
