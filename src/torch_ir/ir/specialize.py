"""``specialize``: fix an IR's symbolic sizes to numbers, giving the static IR a program is planned for.

An LLM is extracted once with a symbolic sequence length (``seq``) and compiled several times from that
one IR: a prefill program for a chunk of tokens and a decode program for one token. Both come from
``specialize(ir, {"seq": n})``, which evaluates every shape and every symbolic attribute (an
``arange(seq)`` end, a ``reshape`` size) with the given values and drops the bound symbols. Sizes are
checked against each symbol's recorded range, so a decode program cannot be made for a length the
export did not allow.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..ops.symbolic import eval_sym, sym_names
from .core import NPU_IR
from .serialize import ir_from_dict
from .validate import IRValidationError


def specialize(ir: NPU_IR, sizes: Mapping[str, int]) -> NPU_IR:
    """A copy of ``ir`` with the symbols in ``sizes`` replaced by their values (see the module docstring).

    Dimensions and attributes whose expressions use only bound symbols become ints; the rest stay
    symbolic. Raises ``IRValidationError`` for an unknown symbol or a size outside its range.
    """
    _check_sizes(ir, sizes)
    data = ir.to_dict()
    where = f"IR {ir.model_name!r}"
    for key in ("graph_inputs", "graph_outputs", "weights", "constants"):
        data[key] = [_tensor(t, sizes, where) for t in data[key]]
    for node in data["nodes"]:
        node["inputs"] = [_tensor(t, sizes, where) for t in node["inputs"]]
        node["outputs"] = [_tensor(t, sizes, where) for t in node["outputs"]]
        node["attrs"] = _value(node["attrs"], sizes, f"{where}, node {node['name']!r}")
    data["symbols"] = {name: spec for name, spec in data["symbols"].items() if name not in sizes}
    # a new dict: ``data["metadata"]`` is ``ir.metadata`` itself, which a copy must leave as it was
    data["metadata"] = {**data.get("metadata", {}), "specialized": {**ir.metadata.get("specialized", {}), **sizes}}
    return ir_from_dict(data)


def _check_sizes(ir: NPU_IR, sizes: Mapping[str, int]) -> None:
    for name, value in sizes.items():
        spec = ir.symbols.get(name)
        if spec is None:
            raise IRValidationError(f"IR {ir.model_name!r} has no symbol {name!r} to specialize; its symbols are "
                                    f"{sorted(ir.symbols) or 'none (it is static already)'}")
        if not isinstance(value, int) or isinstance(value, bool):
            raise IRValidationError(f"IR {ir.model_name!r}: the size of {name!r} must be an int, got {value!r}")
        low, high = spec.get("min"), spec.get("max")
        if (low is not None and value < low) or (high is not None and value > high):
            raise IRValidationError(f"IR {ir.model_name!r}: {name}={value} is outside the range the model was "
                                    f"exported for ({low}..{high}); export it with a wider torch.export.Dim")


def _bound(expr: str, sizes: Mapping[str, int]) -> bool:
    return sym_names(expr) <= set(sizes)


def _tensor(t: dict[str, Any], sizes: Mapping[str, int], where: str) -> dict[str, Any]:
    shape = [eval_sym(d, sizes, where) if isinstance(d, str) and _bound(d, sizes) else d for d in t["shape"]]
    return {**t, "shape": shape}


def _value(value: Any, sizes: Mapping[str, int], where: str) -> Any:
    """An attribute value (in the IR file's encoding) with its bound ``{"sym": expr}`` entries evaluated."""
    if isinstance(value, dict):
        if set(value) == {"sym"} and isinstance(value["sym"], str) and _bound(value["sym"], sizes):
            return eval_sym(value["sym"], sizes, where)
        return {k: _value(v, sizes, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_value(v, sizes, where) for v in value]
    return value


__all__ = ["specialize"]
