"""Load an ONNX model ready for conversion: checked, in a supported opset, fully shape-inferred.

The model's graph is loaded without its external data (``load_external_data=False``), so a model
of any size costs only its graph here; initializer values are read one at a time later
(``initializer_value``). Files over 2 GB are checked and shape-inferred through their path, as
protobuf cannot hold them in one message.

A model file is untrusted data. Every failure to read, check, convert or shape-infer it is an
:class:`InvalidModelError` (or :class:`ExtractionError`) naming the file; a tensor's declared size is
checked against ``torch_ir.limits`` before anything is allocated for it (:func:`tensor_value`); external
data must be a regular file inside the model's directory, holding exactly the bytes the tensor declares.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np
import onnx
from onnx import numpy_helper

from torch_ir import dtypes

from ...errors import ExtractionError, TorchIRError
from ...limits import check_alloc, check_shape

#: The ai.onnx opsets the converter tables cover; models outside are converted into this range.
MIN_OPSET, MAX_OPSET = 7, 28
_PROTOBUF_LIMIT = 2**31  # bytes in one protobuf message


class InvalidModelError(ExtractionError):
    """The ONNX model is malformed: it cannot be parsed, fails ``onnx.checker`` or shape inference, or a tensor
    in it does not hold what it declares; the message names the file and the rule."""


class ModelNotFoundError(InvalidModelError, FileNotFoundError):
    """The ONNX model path does not exist (also a ``FileNotFoundError``)."""


#: A 1-D tensor longer than this may not reach ONNX data propagation, which spends memory and time per
#: element of such a tensor (a declared ``[10**9]`` int64 tensor into ``Cast`` takes gigabytes); the model
#: is then shape-inferred without data propagation.
DATA_PROP_MAX_LENGTH = 1 << 16
#: Ops whose shape inference reads values computed by data propagation (``getShapeInput`` in ONNX).
_SHAPE_INPUT_OPS = {"Reshape", "Expand", "ConstantOfShape"}
#: ONNX element types the dtype table sizes; others (STRING, the 6-bit floats) are sized by onnx's helper.
_TABLE_TYPES = frozenset(d.onnx for d in dtypes.DTYPES.values() if d.onnx is not None)


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
        source, base_dir = str(path), str(path.parent)
        _check_path(path, source)
        _check(str(path), source)  # by path: works over 2 GB and checks external data references
        model = _parse(path, source)
    try:
        model = _convert_opset(model, source)
        if input_shapes:
            _bind_input_shapes(model, input_shapes, source)
        model = _infer_shapes(model, source)
        return LoadedModel(model, source, base_dir, ai_onnx_opset(model), _symbol_names(model))
    except TorchIRError:
        raise
    except RecursionError:
        raise InvalidModelError(f"{source}: the model is nested too deeply to load (subgraphs in subgraphs); "
                                "a hostile or corrupt file?") from None
    except Exception as e:  # noqa: BLE001 - onnx's C++ raises bare RuntimeErrors; every failure names the file
        raise InvalidModelError(f"{source}: the ONNX model cannot be loaded ({type(e).__name__}: {_one_line(e)})"
                                ) from None


def ai_onnx_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return MAX_OPSET  # a model of custom-domain ops only


def initializer_value(tensor: onnx.TensorProto, base_dir: str, source: str = "<ONNX model>") -> np.ndarray:
    """One initializer's value, read from its external data file when it has one (see :func:`tensor_value`)."""
    return tensor_value(tensor, base_dir, source, f"initializer {tensor.name!r}")


def tensor_value(tensor: onnx.TensorProto, base_dir: str, source: str, what: str) -> np.ndarray:
    """The value of a tensor of the model (an initializer, a ``Constant``'s attribute), checked first.

    Its declared shape must pass ``torch_ir.limits.check_shape`` before anything is allocated for it; its
    data (``raw_data``, or the external data file) must hold exactly the bytes the shape and type need.
    Every failure is an :class:`InvalidModelError` or ``LimitExceededError`` naming ``source`` and ``what``.
    """
    where = f"{source}: {what}"
    dims = list(tensor.dims)
    nbytes = _declared_bytes(tensor, where)
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        data = _read_external(tensor, base_dir, nbytes, where)
        inline = onnx.TensorProto()
        inline.CopyFrom(tensor)
        del inline.external_data[:]
        inline.data_location = onnx.TensorProto.DEFAULT
        inline.raw_data = data
        tensor = inline
    elif tensor.HasField("raw_data") and tensor.data_type != onnx.TensorProto.STRING and len(tensor.raw_data) != nbytes:
        raise InvalidModelError(f"{where} declares shape {dims} of {_type_name(tensor.data_type)} ({nbytes} bytes), "
                                f"but its raw_data holds {len(tensor.raw_data)} bytes")
    try:
        return numpy_helper.to_array(tensor)
    except Exception as e:  # noqa: BLE001 - numpy_helper raises ValueError, TypeError, KeyError on bad tensors
        raise InvalidModelError(f"{where} cannot be read: it declares shape {dims} of "
                                f"{_type_name(tensor.data_type)}, and its data does not match ({type(e).__name__}: "
                                f"{_one_line(e)[:200]})") from None


def packed_value(tensor: onnx.TensorProto, base_dir: str, source: str) -> np.ndarray | None:
    """An INT4/UINT4 initializer's bytes as ONNX packs them (two codes per byte, low nibble first), shaped
    ``[..., last/2]`` uint8: ``torch_ir.quant.spec.stored``'s layout when the last dim is even, read without unpacking.
    None when the tensor has no raw bytes (codes in ``int32_data``) or its last dim is odd."""
    dims = list(tensor.dims)
    if tensor.data_type not in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4) or not dims or dims[-1] % 2:
        return None
    where = f"{source}: initializer {tensor.name!r}"
    nbytes = _declared_bytes(tensor, where)
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        data = _read_external(tensor, base_dir, nbytes, where)
    elif tensor.HasField("raw_data"):
        data = tensor.raw_data
        if len(data) != nbytes:
            raise InvalidModelError(f"{where} declares shape {dims} of {_type_name(tensor.data_type)} ({nbytes} "
                                    f"bytes), but its raw_data holds {len(data)} bytes")
    else:
        return None
    return np.frombuffer(data, dtype=np.uint8).reshape([*dims[:-1], dims[-1] // 2]).copy()


def _type_name(data_type: int) -> str:
    values = onnx.TensorProto.DataType.values()
    return onnx.TensorProto.DataType.Name(data_type) if data_type in values else f"element type {data_type}"


def _declared_bytes(tensor: onnx.TensorProto, where: str) -> int:
    """The bytes ``tensor``'s shape and type need (checked against the allocation limit); strings count 1 each."""
    dims = list(tensor.dims)
    if any(d < 0 for d in dims):
        raise InvalidModelError(f"{where} declares a negative dimension in shape {dims}")
    check_shape(dims, 0, where)  # each dimension within max_dim
    numel = math.prod(dims)
    if tensor.data_type in _TABLE_TYPES:  # sizes from the dtype table, packed sub-byte types (INT4, ...) included
        nbytes = dtypes.nbytes(numel, dtypes.from_onnx(tensor.data_type))
    else:
        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        except (KeyError, ValueError, TypeError):
            raise InvalidModelError(f"{where} has {_type_name(tensor.data_type)}, which is not an ONNX tensor "
                                    "element type") from None
        nbytes = numel * (1 if tensor.data_type == onnx.TensorProto.STRING else itemsize)
    return check_alloc(nbytes, where)  # the allocation limit, before anything is read or allocated


def _read_external(tensor: onnx.TensorProto, base_dir: str, nbytes: int, where: str) -> bytes:
    """Exactly ``nbytes`` of ``tensor``'s external data: a regular file inside ``base_dir``, never a link."""
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    rule = ("external data must be a regular file in the model's directory (or below it), named by a relative "
            "path without '..'")
    if not location or "\0" in location or any(p.is_absolute() or ".." in p.parts or p.drive
                                               for p in (PurePosixPath(location), PureWindowsPath(location))):
        raise InvalidModelError(f"{where}: external data location {location!r} is refused: {rule}")
    try:
        offset = int(info.get("offset", "0") or 0)
        length = int(info["length"]) if info.get("length") else None
    except ValueError:
        raise InvalidModelError(f"{where}: external data offset/length {info.get('offset')!r}/{info.get('length')!r} "
                                "are not integers") from None
    if offset < 0 or (length is not None and length != nbytes):
        raise InvalidModelError(f"{where}: external data declares offset {offset} and length {length}, but the "
                                f"tensor's shape {list(tensor.dims)} and type need exactly {nbytes} bytes")
    path = os.path.join(base_dir, location)
    real, real_base = os.path.realpath(path), os.path.realpath(base_dir)
    if os.path.commonpath([real, real_base]) != real_base or os.path.islink(path):
        raise InvalidModelError(f"{where}: external data {location!r} resolves to {real!r}, outside the model's "
                                f"directory {real_base!r} or through a symbolic link: {rule}")
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # before opening: a FIFO would block the open
            raise InvalidModelError(f"{where}: external data {location!r} is not a regular file: {rule}")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_BINARY", 0))
    except OSError as e:
        raise InvalidModelError(f"{where}: cannot open external data {location!r}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise InvalidModelError(f"{where}: external data {location!r} is not a regular file: {rule}")
        if offset + nbytes > st.st_size:
            raise InvalidModelError(f"{where}: external data {location!r} is {st.st_size} bytes; the tensor needs "
                                    f"{nbytes} bytes from offset {offset}")
        f.seek(offset)
        data = f.read(nbytes)
    if len(data) != nbytes:
        raise InvalidModelError(f"{where}: external data {location!r} ended after {len(data)} of {nbytes} bytes")
    return data


def _one_line(error: BaseException | str) -> str:
    """An error text from onnx (often several lines) as one line, for a one-line CLI error."""
    return " ".join(str(error).split()).rstrip(".")


def _check_path(path: Path, source: str) -> None:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ModelNotFoundError(f"ONNX model {source!r} does not exist") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise InvalidModelError(f"{source!r}: cannot read the ONNX model: "
                                f"{getattr(e, 'strerror', None) or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InvalidModelError(f"{source}: is a directory, not an ONNX model file; pass the path of the .onnx file")
    if not stat.S_ISREG(st.st_mode):
        raise InvalidModelError(f"{source}: is not a regular file (a device, a pipe or a socket), not an ONNX model")
    if st.st_size == 0:
        raise InvalidModelError(f"{source}: the file is empty, not an ONNX model")


def _parse(path: Path, source: str) -> onnx.ModelProto:
    try:
        return onnx.load(str(path), load_external_data=False)
    except RecursionError:
        raise InvalidModelError(f"{source}: the model is nested too deeply to parse; a hostile or corrupt file?"
                                ) from None
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, OSError, ...
        raise InvalidModelError(f"{source}: the file cannot be parsed as an ONNX model ({type(e).__name__}: "
                                f"{_one_line(e)})"
                                ) from None


def _check(model: str | onnx.ModelProto, source: str) -> None:
    try:
        onnx.checker.check_model(model)
    except Exception as e:  # noqa: BLE001 - ValidationError, a parse failure, RecursionError, bad_alloc, ...
        reason = "the model is nested too deeply" if isinstance(e, RecursionError) else _one_line(e)
        raise InvalidModelError(
            f"{source}: the ONNX model is invalid (onnx.checker): {reason}. "
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
            f"onnx.version_converter could not convert it to {target}: {_one_line(e)}. "
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
    """Shape inference with data propagation (shape arithmetic), unless a long 1-D tensor could reach it.

    ONNX data propagation spends memory and time per element of every 1-D tensor it sees, so a tiny file
    declaring one of 10**9 elements exhausts the machine. A first pass without it gives the shapes it
    starts from; :func:`data_propagation_risk` decides from them whether the second pass is safe.
    """
    try:
        plain = onnx.shape_inference.infer_shapes(model, data_prop=False)
        if data_propagation_risk(plain.graph) is not None:
            return plain  # shapes from data propagation are a refinement; the import works without them
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except RecursionError:
        raise InvalidModelError(f"{source}: ONNX shape inference failed: the model is nested too deeply") from None
    except Exception as e:  # noqa: BLE001 - shape inference raises InferenceError and RuntimeError
        raise InvalidModelError(f"{source}: ONNX shape inference failed: {_one_line(e)}") from None


def data_propagation_risk(graph: onnx.GraphProto) -> str | None:
    """Why ONNX data propagation could blow up on this (already shape-inferred) graph, or None when it cannot.

    It can when a data-propagating op (``Shape``, ``Gather``, ``Cast``, ``Add``, ...) receives a 1-D tensor
    longer than :data:`DATA_PROP_MAX_LENGTH`, or one whose length is unknown now but could become known
    through data propagation itself (downstream of ``Reshape``/``Expand``/``ConstantOfShape`` fed by it).
    """
    return _risk_in(graph, {}, 0)


_DATA_PROP_OPS = frozenset(s.name for s in onnx.defs.get_all_schemas_with_history()
                           if s.domain == "" and s.has_data_propagation_function)


def _risk_in(graph: onnx.GraphProto, outer: dict, depth: int) -> str | None:
    if depth > 64:
        return "subgraphs nested more than 64 deep"
    dims: dict[str, list | None] = dict(outer)
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        tt = vi.type.tensor_type
        dims[vi.name] = ([d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
                         if vi.type.HasField("tensor_type") and tt.HasField("shape") else None)
    for t in graph.initializer:
        dims[t.name] = list(t.dims)
    propagated: set[str] = set()  # outputs of data-propagating ops: they carry propagated values
    tainted: set[str] = set()  # shapes data propagation may still learn
    for node in graph.node:
        for g in _subgraphs(node):
            reason = _risk_in(g, dims, depth + 1)
            if reason is not None:
                return reason
        ins = [i for i in node.input if i]
        standard = node.domain in ("", "ai.onnx")
        if standard and node.op_type in _DATA_PROP_OPS:
            for name in ins:
                shape = dims.get(name)
                if shape is not None and len(shape) == 1 and (shape[0] or 0) > DATA_PROP_MAX_LENGTH:
                    return f"{node.op_type} receives {name!r} of {shape[0]} elements"
                if name in tainted and (shape is None or (len(shape) == 1 and shape[0] is None)):
                    return f"{node.op_type} receives {name!r}, whose length data propagation may set"
        learns = standard and node.op_type in _SHAPE_INPUT_OPS and any(i in propagated for i in ins)
        for out in (o for o in node.output if o):
            shape = dims.get(out)
            static = shape is not None and all(d is not None for d in shape)
            if not static and (learns or any(i in tainted for i in ins)):
                tainted.add(out)
            if standard and node.op_type in _DATA_PROP_OPS:
                propagated.add(out)
    return None


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def _symbol_names(model: onnx.ModelProto) -> dict[str, str]:
    """Every dim_param of the graph -> a valid IR symbol name (an identifier, unique)."""
    params = set()
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                params.add(dim.dim_param)
    out, used, suffixes = {}, set(), {}
    for p in sorted(params):
        base = re.sub(r"\W", "_", p)
        base = base if base and not base[0].isdigit() else f"s_{base}"
        name, k = base, suffixes.get(base, 0)
        while name in used:  # many parameters alike (a hostile file) cost linear time, not quadratic
            k += 1
            name = f"{base}_{k}"
        suffixes[base] = k
        used.add(name)
        out[p] = name
    return out
