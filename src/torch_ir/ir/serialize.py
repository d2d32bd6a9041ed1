"""NPU_IR <-> JSON. The data classes know nothing of this module.

Attribute values are JSON already (the frontends encode dtypes, symbols and the like as tagged
objects such as ``{"dtype": "float32"}``), so this codec is a plain walk over the fields. Tensor values
(``constant_values``, the ``fill`` and ``values`` of ``non_persistent_buffers`` recipes) are plain Python
numbers in memory, infinities and NaN included; on disk a non-finite number is the tagged object
``{"float": "-inf"}`` that attributes use, since strict JSON has no such numbers.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..fileio import atomic_write, check_output_path, file_kind, read_input
from ..ops.values import decode_value, encode_value
from ..quant.spec import QuantSpec
from .core import NPU_IR, OpNode, Provenance, TensorMeta
from .validate import IRValidationError, check_document, check_integrity

# 1.1: non_persistent_buffers, inlined_constant_keys, non-finite constant values, mutations of graph inputs
# 1.2: a node's provenance (source nodes, module path, frontend origin, rewrite rules)
# 1.3: a tensor's ``quant`` is an executable quantization spec (torch_ir.quant.QuantSpec)
IR_VERSION = "1.3"
FORMAT = "torch_ir"


def tensor_to_dict(t: TensorMeta) -> dict[str, Any]:
    d: dict[str, Any] = {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
    for key in ("role", "layout", "bits"):
        value = getattr(t, key)
        if value is not None:
            d[key] = value
    if t.quant is not None:
        d["quant"] = t.quant.to_dict()
    return d


def tensor_from_dict(d: dict[str, Any]) -> TensorMeta:
    return TensorMeta(
        name=d["name"], shape=list(d["shape"]), dtype=d["dtype"],
        role=d.get("role"), layout=d.get("layout"), quant=quant_from_dict(d.get("quant"), d["name"]),
        bits=d.get("bits", _planned_bits(d.get("quant"))),
    )


def _planned_bits(quant: dict[str, Any] | None) -> int | None:
    """A pre-1.3 ``quant`` that only planned a width (``{"bits": 8, ...}``): the width, now ``bits``."""
    return quant.get("bits") if isinstance(quant, dict) and "dtype" not in quant else None


def quant_from_dict(d: dict[str, Any] | None, tensor: str) -> QuantSpec | None:
    """A tensor's quantization spec; before 1.3 ``quant`` could hold a planned bit-width with no scales (the
    old annotator's ``{"bits": 8, ...}``): that is the tensor's ``bits`` now, not a spec."""
    if d is None or ("dtype" not in d and "bits" in d):
        return None
    return QuantSpec.from_dict(d, f"tensor {tensor!r}: quant")


def provenance_to_dict(p: Provenance) -> dict[str, Any]:
    """Plain JSON, only the fields that are set (a program's dispatches carry the same dict)."""
    d: dict[str, Any] = {"nodes": list(p.nodes)}
    for key in ("module", "origin"):
        if getattr(p, key) is not None:
            d[key] = getattr(p, key)
    if p.rules:
        d["rules"] = list(p.rules)
    return d


def provenance_from_dict(d: dict[str, Any]) -> Provenance:
    return Provenance(nodes=list(d["nodes"]), module=d.get("module"), origin=d.get("origin"),
                      rules=list(d.get("rules", [])))


def _recipe_json(recipe: dict[str, Any] | None, code: Callable[[Any], Any]) -> dict[str, Any] | None:
    """A non-persistent buffer's recipe with its numbers (``fill``, ``values``) encoded or decoded by ``code``."""
    if recipe is None:
        return None
    return {key: code(value) if key in ("fill", "values") else value for key, value in recipe.items()}


def ir_to_dict(ir: NPU_IR) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "ir_version": IR_VERSION,
        "model_name": ir.model_name,
        "producer": dict(ir.producer),
        "graph_inputs": [tensor_to_dict(t) for t in ir.graph_inputs],
        "graph_outputs": [tensor_to_dict(t) for t in ir.graph_outputs],
        "weights": [tensor_to_dict(t) for t in ir.weights],
        "weight_name_mapping": dict(ir.weight_name_mapping),
        "weight_aliases": {k: list(v) for k, v in ir.weight_aliases.items()},
        "constants": [tensor_to_dict(t) for t in ir.constants],
        "constant_values": {k: encode_value(v) for k, v in ir.constant_values.items()},
        "symbols": {k: dict(v) for k, v in ir.symbols.items()},
        "mutations": dict(ir.mutations),
        "non_persistent_buffers": {k: _recipe_json(v, encode_value) for k, v in ir.non_persistent_buffers.items()},
        "inlined_constant_keys": dict(ir.inlined_constant_keys),
        "nodes": [
            {
                "name": n.name,
                "op_type": n.op_type,
                "inputs": [tensor_to_dict(t) for t in n.inputs],
                "outputs": [tensor_to_dict(t) for t in n.outputs],
                "attrs": n.attrs,
                **({"provenance": provenance_to_dict(n.provenance)} if n.provenance else {}),
            }
            for n in ir.nodes
        ],
        "metadata": ir.metadata,
    }


def ir_from_dict(doc: Any, *, source: str = "<dict>") -> NPU_IR:
    """Build an NPU_IR from its JSON form, refusing malformed documents with the bad field's path.

    The file writes a tensor out at its definition and at every use; in memory each value is one ``TensorMeta``,
    shared by its definition and the uses that say the same of it (``_Values``)."""
    try:
        check_document(doc, source=source)
    except RecursionError:
        raise IRValidationError(f"{source}: nested too deeply to be an IR; extract or save the IR again") from None
    values = _Values()
    graph_inputs = values.define_all(doc["graph_inputs"])
    weights = values.define_all(doc["weights"])
    constants = values.define_all(doc.get("constants", []))
    nodes = [_node_from_dict(n, values) for n in doc["nodes"]]
    ir = NPU_IR(
        model_name=doc["model_name"],
        producer=dict(doc.get("producer", {})),
        graph_inputs=graph_inputs,
        graph_outputs=[values.use(t) for t in doc["graph_outputs"]],
        weights=weights,
        weight_name_mapping=dict(doc.get("weight_name_mapping", {})),
        weight_aliases={k: list(v) for k, v in doc.get("weight_aliases", {}).items()},
        constants=constants,
        constant_values={k: decode_value(v) for k, v in doc.get("constant_values", {}).items()},
        symbols={k: dict(v) for k, v in doc.get("symbols", {}).items()},
        mutations=dict(doc.get("mutations", {})),
        non_persistent_buffers={k: _recipe_json(v, decode_value)
                                for k, v in doc.get("non_persistent_buffers", {}).items()},
        inlined_constant_keys=dict(doc.get("inlined_constant_keys", {})),
        nodes=nodes,
        metadata=dict(doc.get("metadata", {})),
    )
    check_integrity(ir, source=source)
    return ir


def _node_from_dict(n: dict[str, Any], values: _Values) -> OpNode:
    inputs = [values.use(t) for t in n["inputs"]]  # uses first: a node never reads its own output
    return OpNode(
        name=n["name"], op_type=n["op_type"], inputs=inputs, outputs=values.define_all(n["outputs"]),
        attrs=dict(n.get("attrs", {})),
        provenance=provenance_from_dict(n["provenance"]) if "provenance" in n else None,
    )


class _Values:
    """The tensors defined so far while a document is read, so that a use gets its definition's object.

    A use that says something else of its tensor (a role, layout or quantization of its own; a shape that the
    integrity check then refuses) keeps an object of its own, so what the document says of each use is kept."""

    def __init__(self) -> None:
        self._defined: dict[str, tuple[dict[str, Any], TensorMeta]] = {}

    def define_all(self, docs: list[dict[str, Any]]) -> list[TensorMeta]:
        made = []
        for d in docs:
            t = tensor_from_dict(d)
            self._defined.setdefault(t.name, (d, t))  # a name defined twice is the integrity check's to refuse
            made.append(t)
        return made

    def use(self, d: dict[str, Any]) -> TensorMeta:
        known = self._defined.get(d.get("name"))
        if known is not None and known[0] == d:
            return known[1]
        t = tensor_from_dict(d)
        return known[1] if known is not None and known[1] == t else t


def save_ir(ir: NPU_IR, path: str | os.PathLike, *, indent: int | None = None) -> None:
    """Write ``ir`` as JSON. The file appears whole or not at all (``torch_ir.fileio.atomic_write``);
    an unwritable path raises ``OutputWriteError`` before the IR is encoded."""
    path = Path(path)
    check_output_path(path, "IR file")
    check_integrity(ir, source=f"IR {ir.model_name!r} being saved to {path}")
    with gc_paused():
        text = json.dumps(ir_to_dict(ir), indent=indent, allow_nan=False)
    atomic_write(path, text, what="IR file")


def load_ir(path: str | os.PathLike) -> NPU_IR:
    """Read an IR JSON file written by :meth:`NPU_IR.save`, checking it field by field.

    Every failure is one ``TorchIRError`` naming the file: a malformed document, JSON nested deeper than
    Python can parse or check (a RecursionError), and running out of memory (a MemoryError) included.
    """
    path = Path(path)
    try:
        data = read_input(path, "IR file", "extract or save the IR again")
        with gc_paused():
            return ir_from_dict(_parse_json(data, path), source=str(path))
    except RecursionError:
        raise IRValidationError(f"{path}: nested too deeply to be an IR file; extract or save the IR again") from None
    except MemoryError:
        raise IRValidationError(
            f"{path}: out of memory while loading the IR file; free memory, or check the file (a JSON file needs "
            "a few times its size to load: a small file that needs more is corrupt or hostile)") from None


def _parse_json(data: bytes, path: Path) -> Any:
    """The JSON document of an IR file, strictly (no NaN/Infinity literals)."""
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError as e:
        kind = file_kind(data)
        if kind is not None:
            raise IRValidationError(f"{path} is {kind}, not an IR file (JSON); give the IR that torch-ir extract, "
                                    "import-onnx or normalize wrote") from None
        raise IRValidationError(f"{path}: not a text (UTF-8) file: {e}") from None
    except json.JSONDecodeError as e:
        if file_kind(data) is not None:
            raise IRValidationError(f"{path} is {file_kind(data)}, not an IR file (JSON); give the IR that torch-ir "
                                    "extract, import-onnx or normalize wrote") from None
        raise IRValidationError(
            f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
            "the file is corrupt or truncated; extract or save the IR again"
        ) from None
    except ValueError as e:  # NaN/Infinity literals, integers past Python's digit limit
        raise IRValidationError(f"{path}: not strict JSON ({e}); extract or save the IR again") from None


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value (non-finite numbers are stored tagged, as {{\"float\": \"nan\"}})")


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Building or walking a large IR allocates many small objects; in a process that also holds
    torch (hundreds of thousands of tracked objects) the collector's passes would dominate the time.
    Loading and saving run under it, and so do ``normalize`` and the rewrite engine."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
