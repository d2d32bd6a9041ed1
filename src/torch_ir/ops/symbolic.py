"""Symbolic sizes (``"12*s0"``, ``"floor(s0/2)"``, ``"Max(1, s0 - 1)"``) parsed and evaluated safely.

The expressions come from files (IR attributes, ``symbols.<name>.expr``, ``.npubin`` parameters), so
they are untrusted: they are never given to ``eval``. :func:`parse_sym` accepts only the grammar that
torch's symbolic shapes print (sympy's ``str``):

* integers, and names of symbols (``s0``, ``batch``), bound when the expression is evaluated;
* ``+ - * / // % **`` and parentheses, unary ``-`` and ``+``;
* the functions ``floor ceiling Max Min FloorDiv CeilToInt FloorToInt TruncToInt Mod``.

Anything else (attributes, subscripts, strings, lambdas, keyword arguments, other names called as
functions) is refused with :class:`~torch_ir.errors.UnsafeInputError`. Every intermediate value is an
integer of at most 2**63 in magnitude, so an expression cannot exhaust memory or time either.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
from collections.abc import Callable, Mapping
from fractions import Fraction

from ..errors import IRValidationError, UnsafeInputError

MAX_EXPR_CHARS = 2000
MAX_DEPTH = 64
_BOUND = 1 << 63

_BINARY: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: lambda a, b: Fraction(a // b), ast.Mod: operator.mod,
}


def _pow(a: Fraction, b: Fraction) -> Fraction:
    if b.denominator != 1 or not 0 <= b <= 64:
        raise ValueError(f"exponent {b} is not an integer from 0 to 64")
    return a ** int(b)


def _int_fn(fn: Callable[[Fraction], int]) -> Callable[..., Fraction]:
    return lambda x: Fraction(fn(x))


FUNCTIONS: dict[str, tuple[int, Callable[..., Fraction]]] = {  # name -> (arity, implementation)
    "floor": (1, _int_fn(math.floor)), "ceiling": (1, _int_fn(math.ceil)),
    "FloorToInt": (1, _int_fn(math.floor)), "CeilToInt": (1, _int_fn(math.ceil)),
    "TruncToInt": (1, _int_fn(math.trunc)),
    "Max": (-1, max), "Min": (-1, min),
    "FloorDiv": (2, lambda a, b: Fraction(a // b)), "Mod": (2, operator.mod),
}

_RULE = ("symbolic sizes may use integers, symbol names, + - * / // % **, parentheses and the functions "
         f"{', '.join(FUNCTIONS)}")


def _refuse(expr: str, problem: str, where: str) -> UnsafeInputError:
    prefix = f"{where}: " if where else ""
    return UnsafeInputError(f"{prefix}symbolic size {expr[:80]!r}: {problem}; {_RULE}. The file was not written "
                            "by torch_ir or was altered: re-extract the model")


def _check_node(node: ast.AST, expr: str, where: str, depth: int = 0) -> None:
    if depth > MAX_DEPTH:  # torch's sizes nest a few levels; a deep one only costs stack
        raise _refuse(expr, f"nested more than {MAX_DEPTH} levels deep", where)
    depth += 1
    if isinstance(node, ast.Expression):
        return _check_node(node.body, expr, where, depth)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return None
    if isinstance(node, ast.Name):
        return None
    if isinstance(node, ast.BinOp) and (type(node.op) in _BINARY or isinstance(node.op, ast.Pow)):
        _check_node(node.left, expr, where, depth)
        return _check_node(node.right, expr, where, depth)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _check_node(node.operand, expr, where, depth)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        arity = FUNCTIONS.get(node.func.id, (None,))[0]
        if arity is None:
            raise _refuse(expr, f"calls {node.func.id!r}, which is not an allowed function", where)
        if (arity == -1 and not node.args) or (arity > 0 and len(node.args) != arity):
            raise _refuse(expr, f"{node.func.id} takes {arity if arity > 0 else 'one or more'} arguments", where)
        for arg in node.args:
            _check_node(arg, expr, where, depth)
        return None
    raise _refuse(expr, f"{type(node).__name__} is not part of the grammar", where)


@functools.lru_cache(maxsize=4096)
def _parse(expr: str) -> ast.Expression:
    return ast.parse(expr, mode="eval")


def parse_sym(expr: object, where: str = "") -> ast.Expression:
    """Parse and check ``expr``; raises ``UnsafeInputError`` (naming ``where``) for anything outside the grammar."""
    if not isinstance(expr, str):
        raise _refuse(repr(expr), f"expected a string, got {type(expr).__name__}", where)
    if len(expr) > MAX_EXPR_CHARS:
        raise _refuse(expr, f"longer than {MAX_EXPR_CHARS} characters", where)
    try:
        tree = _parse(expr)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise _refuse(expr, "not a valid expression", where) from None
    try:
        _check_node(tree, expr, where)
    except RecursionError:
        raise _refuse(expr, "nested too deeply", where) from None
    return tree


def sym_names(expr: str) -> set[str]:
    """The symbol names ``expr`` uses (function names excluded)."""
    calls = {id(n.func) for n in ast.walk(parse_sym(expr)) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(parse_sym(expr)) if isinstance(n, ast.Name) and id(n) not in calls}


def eval_sym(expr: str, symbols: Mapping[str, int], where: str = "") -> int:
    """Evaluate a symbolic size with bound ``symbols``; the result is an int (floored like sympy's sizes)."""
    tree = parse_sym(expr, where)
    try:
        value = _eval(tree.body, symbols)
    except KeyError as e:
        prefix = f"{where}: " if where else ""
        raise IRValidationError(f"{prefix}symbolic size {expr[:80]!r} uses symbol {e.args[0]!r}, which no input "
                                f"binds (bound: {dict(symbols)}); the IR is inconsistent: re-extract the model"
                                ) from None
    except (ZeroDivisionError, ValueError, OverflowError, RecursionError) as e:
        raise _refuse(expr, f"cannot be evaluated with {dict(symbols)} ({e})", where) from None
    return math.floor(value)


def _eval(node: ast.AST, symbols: Mapping[str, int]) -> Fraction:
    if isinstance(node, ast.Constant):
        value = Fraction(node.value)
    elif isinstance(node, ast.Name):
        value = Fraction(int(symbols[node.id]))
    elif isinstance(node, ast.BinOp):
        left, right = _eval(node.left, symbols), _eval(node.right, symbols)
        value = _pow(left, right) if isinstance(node.op, ast.Pow) else _BINARY[type(node.op)](left, right)
    elif isinstance(node, ast.UnaryOp):
        operand = _eval(node.operand, symbols)
        value = -operand if isinstance(node.op, ast.USub) else operand
    else:  # ast.Call, checked by parse_sym
        value = FUNCTIONS[node.func.id][1](*(_eval(a, symbols) for a in node.args))  # type: ignore[attr-defined]
    if abs(value) > _BOUND:
        raise OverflowError(f"an intermediate value exceeds 2**63 ({float(value):.3g})")
    return value


__all__ = ["FUNCTIONS", "eval_sym", "parse_sym", "sym_names"]
