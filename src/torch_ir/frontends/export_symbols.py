"""The symbols of an exported program: their ranges, and the names the user gave them with ``torch.export.Dim``."""

from __future__ import annotations

import keyword
from collections import Counter
from typing import Any

import sympy
from torch.export import ExportedProgram
from torch.utils._sympy.numbers import int_oo

from ..ops.symbolic import FUNCTIONS


def symbol_ranges(ep: ExportedProgram) -> dict[Any, dict[str, int | None]]:
    """Each symbol of the program (a sympy symbol) -> its range."""
    out: dict[Any, dict[str, int | None]] = {}
    for sym, vr in ep.range_constraints.items():
        def bound(x: Any) -> int | None:
            if x in (int_oo, -int_oo) or getattr(x, "is_finite", True) is False:
                return None  # unbounded
            return int(x)
        out[sym] = {"min": bound(vr.lower), "max": bound(vr.upper)}
    return out


def _shape_env(ep: ExportedProgram) -> Any:
    for node in ep.graph.nodes:
        mode = getattr(node.meta.get("val"), "fake_mode", None)
        if node.op == "placeholder" and getattr(mode, "shape_env", None) is not None:
            return mode.shape_env
    return None


def user_symbol_names(ep: ExportedProgram) -> dict[sympy.Symbol, sympy.Symbol]:
    """Each symbol of a dimension the user named with ``torch.export.Dim("batch")`` -> a symbol ``batch``.

    torch.export names the symbols ``s0``, ``s27``...; its shape environment remembers which input dimension
    each comes from (``L['x'].size()[0]``) and which Dim name the user gave that dimension. A name is used
    only when it is unambiguous: one symbol per name, an identifier that is no keyword, no function of the
    symbolic-size grammar (``Max``) and no other symbol's name; otherwise the symbol keeps torch's name.
    """
    env = _shape_env(ep)
    debug = getattr(env, "source_name_to_debug_name", None) if env is not None else None
    if not debug:
        return {}
    names: dict[sympy.Symbol, set[str]] = {}
    for sym, sources in getattr(env, "var_to_sources", {}).items():
        target = env.replacements.get(sym, sym)
        if not isinstance(target, sympy.Symbol):
            continue
        for source in sources:
            source_name = source.name if isinstance(source.name, str) else source.name()
            if source_name in debug:
                names.setdefault(target, set()).add(debug[source_name])
    chosen = {sym: next(iter(found)) for sym, found in names.items() if len(found) == 1}
    counts = Counter(chosen.values())
    taken = {str(sym) for sym in ep.range_constraints} | {str(sym) for sym in env.var_to_sources}
    return {
        sym: sympy.Symbol(name, **sym.assumptions0)
        for sym, name in chosen.items()
        if counts[name] == 1 and name.isidentifier() and not keyword.iskeyword(name) and name not in FUNCTIONS
        and (name == str(sym) or name not in taken)
    }
