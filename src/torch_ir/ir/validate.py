"""Checks for IR documents and IR objects.

``check_document`` walks a parsed JSON document and names the path of the first bad field
(``nodes[12].inputs[0].shape: expected list of int or str``). ``check_integrity`` is the structural
checker the passes run after every rewrite: unique names, every tensor defined before use with
the shape and dtype it was defined with, graph outputs produced, weights declared.
``schema.json`` beside this file documents the same format for other tools.
"""

from __future__ import annotations

import math
from typing import Any

from torch_ir.dtypes import DTYPES, is_dtype

from ..errors import IRValidationError, TorchIRError
from ..limits import get_limits
from ..ops.symbolic import parse_sym
from ..ops.values import check_value
from ..quant.spec import QuantSpec, check_fits, node_disagrees
from .core import NPU_IR, ROLES, OpNode

SUPPORTED_MAJOR = 1

#: How deep a free-form value of a file may nest lists and objects: an IR's ``metadata``, ``producer`` and
#: tensors' ``quant``, a program's ``metadata`` and embedded ``ir`` (whose tensor values nest up to
#: ``MAX_VALUE_RANK`` deep). JSON parsing stops near Python's recursion limit, so a value that just parses
#: would make a later walk over it (``copy.deepcopy``, ``json.dumps`` when the file is saved again) raise a
#: RecursionError naming no file; within this bound those walks have room to spare.
MAX_JSON_DEPTH = 100


def _fail(source: str, path: str, rule: str) -> None:
    raise IRValidationError(f"{source}: {path}: {rule}")


# -- document (JSON) level -------------------------------------------------------------------------

def _check_tensor(t: Any, path: str, source: str) -> None:
    if not isinstance(t, dict):
        _fail(source, path, f"expected an object with name/shape/dtype, got {type(t).__name__}")
    for key in ("name", "shape", "dtype"):
        if key not in t:
            _fail(source, f"{path}.{key}", "missing required field")
    if not isinstance(t["name"], str) or not t["name"]:
        _fail(source, f"{path}.name", "expected a non-empty string")
    shape = t["shape"]
    max_dim = get_limits().max_dim
    if not isinstance(shape, list) or not all(
        isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= max_dim) for d in shape
    ):
        _fail(source, f"{path}.shape", f"expected list of int or str (sizes from 0 to {max_dim}, or symbols)")
    for d in shape:
        if isinstance(d, str):
            parse_sym(d, f"{source}: {path}.shape")
    if not isinstance(t["dtype"], str):
        _fail(source, f"{path}.dtype", "expected a dtype name string such as 'float32'")
    if not is_dtype(t["dtype"]):
        _fail(source, f"{path}.dtype", f"unknown dtype {t['dtype'][:60]!r}; expected one of {', '.join(DTYPES)}")
    bits = t.get("bits")
    if bits is not None and (not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= 64):
        _fail(source, f"{path}.bits", f"expected a bit-width from 1 to 64 or null, got {bits!r}")
    role = t.get("role")
    if role is not None and role not in ROLES:
        _fail(source, f"{path}.role", f"expected one of {', '.join(ROLES)}, got {role!r}")
    quant = t.get("quant")
    if quant is not None:
        if not isinstance(quant, dict):
            _fail(source, f"{path}.quant", f"expected an object (a quantization spec) or null, got "
                                           f"{type(quant).__name__}")
        _check_nesting(quant, f"{path}.quant", source)
        if "dtype" in quant or "bits" not in quant:  # before 1.3: a planned width only, read as ``bits``
            QuantSpec.from_dict(quant, f"{source}: {path}.quant")


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` deep (a scalar: 0, ``[]``: 1).

    Iterative, so it cannot itself overflow the stack; it stops at the first container past ``limit``.
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _check_nesting(value: Any, path: str, source: str) -> None:
    if nested_deeper_than(value, MAX_JSON_DEPTH):
        _fail(source, path, f"nested more than {MAX_JSON_DEPTH} lists or objects deep; not a value a "
                            "torch_ir writer produces")


def _check_list(doc: dict, key: str, source: str, required: bool = True) -> list:
    if key not in doc:
        if required:
            _fail(source, key, "missing required field")
        return []
    value = doc[key]
    if not isinstance(value, list):
        _fail(source, key, f"expected a list, got {type(value).__name__}")
    return value


def _check_str_map(doc: dict, key: str, source: str) -> None:
    """``weight_aliases`` maps a name to a list of names; ``weight_name_mapping`` and ``mutations`` to one."""
    value = doc.get(key, {})
    many = key == "weight_aliases"
    ok = (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)) if many else \
        (lambda v: isinstance(v, str))
    if not isinstance(value, dict) or not all(ok(v) for v in value.values()):
        _fail(source, key, f"expected an object mapping names to {'lists of names' if many else 'names'}")


def check_document(doc: Any, *, source: str = "<dict>") -> None:
    """Raise IRValidationError naming the first field of ``doc`` that breaks the format."""
    if not isinstance(doc, dict):
        _fail(source, "$", f"expected a JSON object at the top level, got {type(doc).__name__}")
    version = doc.get("ir_version")
    if not isinstance(version, str):
        _fail(source, "ir_version", "missing; this is not an IR file written by torch_ir")
    try:
        major = int(version.split(".")[0])
    except ValueError:
        major = -1
    if major != SUPPORTED_MAJOR:
        _fail(
            source, "ir_version",
            f"version {version!r} is not supported (this torch_ir reads {SUPPORTED_MAJOR}.x); "
            "re-extract the model with this version of torch_ir",
        )
    if not isinstance(doc.get("model_name"), str):
        _fail(source, "model_name", "expected a string")
    for key in ("graph_inputs", "graph_outputs", "weights"):
        for i, t in enumerate(_check_list(doc, key, source)):
            _check_tensor(t, f"{key}[{i}]", source)
    for i, t in enumerate(_check_list(doc, "constants", source, required=False)):
        _check_tensor(t, f"constants[{i}]", source)
    for key in ("weight_name_mapping", "weight_aliases", "mutations"):
        _check_str_map(doc, key, source)
    for key in ("producer", "metadata", "constant_values", "non_persistent_buffers", "inlined_constant_keys"):
        if not isinstance(doc.get(key, {}), dict):
            _fail(source, key, f"expected an object, got {type(doc[key]).__name__}")
    for key in ("producer", "metadata"):  # free-form: only their depth is checked
        _check_nesting(doc.get(key, {}), key, source)
    _check_constant_values(doc, source)
    _check_buffers(doc.get("non_persistent_buffers", {}), source)
    keys = doc.get("inlined_constant_keys", {})
    if not all(isinstance(v, str) for v in keys.values()):
        _fail(source, "inlined_constant_keys", "expected an object mapping constant names to state keys")
    for i, node in enumerate(_check_list(doc, "nodes", source)):
        path = f"nodes[{i}]"
        if not isinstance(node, dict):
            _fail(source, path, "expected an object")
        for key in ("name", "op_type"):
            if not isinstance(node.get(key), str) or not node[key]:
                _fail(source, f"{path}.{key}", "expected a non-empty string")
        for key in ("inputs", "outputs"):
            for j, t in enumerate(_check_list(node, key, f"{source}: {path}")):
                _check_tensor(t, f"{path}.{key}[{j}]", source)
        attrs = node.get("attrs", {})
        if not isinstance(attrs, dict):
            _fail(source, f"{path}.attrs", "expected an object of attribute values")
        for name, value in attrs.items():
            _check_attr(value, f"{path}.attrs.{name}", source)
        if "provenance" in node:
            check_provenance(node["provenance"], f"{path}.provenance", source)
    _check_symbols(doc.get("symbols", {}), source)


def check_provenance(p: Any, path: str, source: str) -> None:
    """A node's (or a dispatch's) provenance: ``{"nodes": [str], "module"?: str, "origin"?: str, "rules"?: [str]}``."""
    if not isinstance(p, dict):
        _fail(source, path, "expected an object {nodes, module, origin, rules}")
    unknown = set(p) - {"nodes", "module", "origin", "rules"}
    if unknown:
        _fail(source, path, f"unknown keys {sorted(unknown)}; a provenance has nodes, module, origin and rules")
    for key in ("nodes", "rules"):
        value = p.get(key, [])
        if key == "nodes" and "nodes" not in p:
            _fail(source, f"{path}.nodes", "missing; expected a list of node names")
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            _fail(source, f"{path}.{key}", "expected a list of strings")
    for key in ("module", "origin"):
        if key in p and not isinstance(p[key], str):
            _fail(source, f"{path}.{key}", "expected a string")


#: How deep a tensor value may nest (its rank); JSON parsers and the walks below recurse once a level.
MAX_VALUE_RANK = 64
_NON_FINITE = ("inf", "-inf", "nan")


def _check_numbers(value: Any, path: str, source: str, depth: int = 0) -> None:
    """A tensor value: a number, a bool, ``{"float": "inf" | "-inf" | "nan"}``, or nested lists of those."""
    if isinstance(value, list):
        if depth >= MAX_VALUE_RANK:
            _fail(source, path, f"nested more than {MAX_VALUE_RANK} lists deep; not a tensor value")
        for i, v in enumerate(value):
            _check_numbers(v, f"{path}[{i}]", source, depth + 1)
    elif isinstance(value, dict):
        if set(value) != {"float"} or value["float"] not in _NON_FINITE:
            _fail(source, path, f'{str(value)[:80]} is not a number; a non-finite number is written '
                                f'{{"float": "inf"}}, {{"float": "-inf"}} or {{"float": "nan"}}')
    elif not isinstance(value, (int, float, bool)):
        _fail(source, path, f"expected a number, a bool or a list of them, got {type(value).__name__}")


def _value_shape(value: Any) -> list[int] | None:
    """The shape of a nested-list value whose lists are regular, else None."""
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def _check_constant_values(doc: dict, source: str) -> None:
    declared = {t.get("name"): t for t in doc.get("constants", []) if isinstance(t, dict)}
    for name, value in doc.get("constant_values", {}).items():
        path = f"constant_values[{name!r}]"
        if name not in declared:
            _fail(source, path, "holds a value for a name that is not a declared constant")
        _check_numbers(value, path, source)


_RECIPES = ("arange", "fill", "values")


def check_buffer_recipes(buffers: Any, source: str) -> None:
    """A ``non_persistent_buffers`` map read from any file (an IR, a program's metadata): an object from state-dict
    keys to null or a recipe of one of the fixed kinds (arange, fill, values), checked field by field. Recipes are
    data that ``torch_ir.weights.build_buffer`` evaluates by that table; nothing in them is run."""
    if not isinstance(buffers, dict) or not all(isinstance(k, str) for k in buffers):
        _fail(source, "non_persistent_buffers", "expected an object from state-dict keys to null or a recipe")
    _check_buffers(buffers, source)


def _check_buffers(buffers: dict, source: str) -> None:
    """``non_persistent_buffers``: state-dict key -> null, or a recipe (see docs/ir_spec.md)."""
    max_dim = get_limits().max_dim
    for key, recipe in buffers.items():
        path = f"non_persistent_buffers[{key!r}]"
        if recipe is None:
            continue
        if not isinstance(recipe, dict):
            _fail(source, path, "expected null or a recipe object")
        kinds = [k for k in _RECIPES if k in recipe]
        if len(kinds) != 1 or set(recipe) != {kinds[0], "dtype", "shape"}:
            _fail(source, path, f"a recipe has dtype, shape and exactly one of {', '.join(_RECIPES)}; "
                                f"got the fields {sorted(recipe)[:8]}")
        if not isinstance(recipe["dtype"], str) or not is_dtype(recipe["dtype"]):
            _fail(source, f"{path}.dtype", f"unknown dtype; expected one of {', '.join(DTYPES)}")
        shape = recipe["shape"]
        if not isinstance(shape, list) or len(shape) > MAX_VALUE_RANK or not all(
                isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= max_dim for d in shape):
            _fail(source, f"{path}.shape", f"expected a list of at most {MAX_VALUE_RANK} sizes from 0 to {max_dim}")
        kind = kinds[0]
        if kind == "arange":
            spec = recipe["arange"]
            finite = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
            if not isinstance(spec, dict) or set(spec) != {"start", "end", "step"} or not all(
                    finite(v) for v in spec.values()):
                _fail(source, f"{path}.arange", "expected {start, end, step}, three finite numbers")
            if spec["step"] == 0:
                _fail(source, f"{path}.arange.step", "must not be 0")
        elif kind == "fill":
            if isinstance(recipe["fill"], list):
                _fail(source, f"{path}.fill", "expected one number")
            _check_numbers(recipe["fill"], f"{path}.fill", source)
        else:
            _check_numbers(recipe["values"], f"{path}.values", source)
            if _value_shape(recipe["values"]) != shape and math.prod(shape) != 0:
                _fail(source, f"{path}.values", f"a value of shape {_value_shape(recipe['values'])}, "
                                                f"the recipe declares {shape}")


def _check_attr(value: Any, path: str, source: str) -> None:
    try:
        check_value(value, f"{source}: {path}")
    except ValueError as e:
        if isinstance(e, TorchIRError):
            raise
        raise IRValidationError(str(e)) from None


def _check_symbols(symbols: Any, source: str) -> None:
    """``symbols``: name -> {"min": int | null, "max": int | null, "expr": {"sym": ...} (optional)}."""
    if not isinstance(symbols, dict):
        _fail(source, "symbols", "expected an object mapping symbol names to their ranges")
    for name, spec in symbols.items():
        path = f"symbols.{name}"
        if not name.isidentifier():
            _fail(source, path, "a symbol name must be an identifier such as 's0' or 'batch'")
        if not isinstance(spec, dict):
            _fail(source, path, "expected an object with min, max and optionally expr")
        for bound in ("min", "max"):
            value = spec.get(bound)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                _fail(source, f"{path}.{bound}", "expected an integer or null")
        if "expr" in spec:
            if not (isinstance(spec["expr"], dict) and set(spec["expr"]) == {"sym"}):
                _fail(source, f"{path}.expr", 'expected {"sym": "<expression>"}')
            _check_attr(spec["expr"], f"{path}.expr", source)


# -- object level ------------------------------------------------------------------------------------

def _node_context(ir: NPU_IR, index: int) -> str:
    lo, hi = max(0, index - 1), min(len(ir.nodes), index + 2)
    lines = [("> " if i == index else "  ") + f"[{i}] {ir.nodes[i].name}: {ir.nodes[i]}" for i in range(lo, hi)]
    return "\n" + "\n".join(lines)


def check_integrity(ir: NPU_IR, *, source: str | None = None) -> None:
    """Structural checks on an IR object; the message shows the offending node and its neighbours."""
    source = source or f"IR {ir.model_name!r}"
    defined: dict[str, tuple[list, str]] = {}

    def define(t, path: str) -> None:
        if t.name in defined:
            _fail(source, path, f"tensor name {t.name!r} is defined twice; names must be unique")
        defined[t.name] = (list(t.shape), t.dtype)

    for key in ("graph_inputs", "weights", "constants"):
        for i, t in enumerate(getattr(ir, key)):
            define(t, f"{key}[{i}]")
    node_names: set[str] = set()
    for i, node in enumerate(ir.nodes):
        _check_node(ir, i, node, defined, node_names, source)
        for j, t in enumerate(node.outputs):
            define(t, f"nodes[{i}].outputs[{j}]")
    for i, t in enumerate(ir.graph_outputs):
        if t.name not in defined:
            _fail(source, f"graph_outputs[{i}]", f"output {t.name!r} is never produced by any node or input")
    _check_quant_specs(ir, defined, source)
    weight_names = {w.name for w in ir.weights}
    stored = weight_names | {c.name for c in ir.constants}  # constants without inline values are stored too
    for name in ir.weight_name_mapping:
        if name not in stored:
            _fail(source, f"weight_name_mapping[{name!r}]", "maps a name that is not a declared weight or constant")
    input_names = {t.name for t in ir.graph_inputs}
    for buf, value in ir.mutations.items():
        if buf not in weight_names and buf not in input_names:
            _fail(source, f"mutations[{buf!r}]", "mutated tensor is not a declared weight/buffer or graph input")
        if value not in defined:
            _fail(source, f"mutations[{buf!r}]", f"new value {value!r} is never produced")
    # A recipe must make the buffer's declared shape and dtype. A key no weight maps to is left alone: a pass
    # that removes an unread buffer may leave its entry, which then only goes unused.
    by_key = {ir.weight_name_mapping.get(w.name, w.name): w for w in ir.weights}
    for key, recipe in ir.non_persistent_buffers.items():
        weight = by_key.get(key)
        if weight is None or recipe is None:
            continue
        if list(recipe.get("shape", [])) != list(weight.shape) or recipe.get("dtype") != weight.dtype:
            _fail(source, f"non_persistent_buffers[{key!r}]",
                  f"the recipe makes {recipe.get('dtype')}{recipe.get('shape')}, buffer {weight.name!r} is "
                  f"{weight.dtype}{weight.shape}")


def _check_quant_specs(ir: NPU_IR, defined: dict[str, tuple[list, str]], source: str) -> None:
    """Every quantization spec fits its tensor; a named scale or zero point is a tensor of the IR."""
    for t in ir.tensors():
        if t.quant is None:
            continue
        where = f"{source}: tensor {t.name!r}"
        for name in t.quant.names():
            if name not in defined:
                _fail(source, f"tensor {t.name!r}.quant", f"names {name!r} as a scale or zero point, but no "
                      "tensor of the IR has that name (add it to the weights or constants)")
        check_fits(t.quant, list(t.shape), t.dtype, where, {n: defined[n][0] for n in t.quant.names()})
    for i, n in enumerate(ir.nodes):
        why = node_disagrees(n.op_type, n.attrs, n.inputs, n.outputs)
        if why is not None:
            _fail(source, f"nodes[{i}]", why + _node_context(ir, i))


def _check_node(ir: NPU_IR, i: int, node: OpNode, defined: dict, node_names: set, source: str) -> None:
    if node.name in node_names:
        _fail(source, f"nodes[{i}].name", f"node name {node.name!r} is used twice{_node_context(ir, i)}")
    node_names.add(node.name)
    for j, t in enumerate(node.inputs):
        if t.name not in defined:
            _fail(
                source, f"nodes[{i}].inputs[{j}]",
                f"tensor {t.name!r} is used before it is defined (or never defined){_node_context(ir, i)}",
            )
        shape, dtype = defined[t.name]
        if list(t.shape) != shape or t.dtype != dtype:
            _fail(
                source, f"nodes[{i}].inputs[{j}]",
                f"{t.name!r} is used as {t.dtype}{list(t.shape)} but was defined as {dtype}{shape}"
                f"{_node_context(ir, i)}",
            )
