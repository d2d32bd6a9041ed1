"""Element-wise ONNX ops: unary math, activations, broadcasting binary ops, logic, casts."""

# ruff: noqa: N802 - converters are named after the ONNX op they translate (Conv, MatMul, ...)

from __future__ import annotations

import torch

from torch_ir import dtypes

from ....ops.values import dtype_from_name
from ..context import Ctx, UnsupportedNode
from ..dtypes import IR_TO_ONNX, ONNX_TO_IR
from . import converter

# ONNX op -> ATen op of the same meaning (one input, no attributes)
_UNARY = {
    "Abs": "abs", "Neg": "neg", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "reciprocal",
    "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh",
    "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh", "Tanh": "tanh", "Sigmoid": "sigmoid",
    "Relu": "relu", "Ceil": "ceil", "Floor": "floor", "Round": "round", "Sign": "sign", "Erf": "erf",
    "IsNaN": "isnan", "Not": "logical_not", "Softplus": "softplus", "Mish": "mish",
    "HardSwish": "hardswish",
}
# ONNX op -> ATen op, both broadcasting (numpy rules), same input dtypes
_BINARY = {
    "Add": "add.Tensor", "Sub": "sub.Tensor", "Mul": "mul.Tensor", "Equal": "eq.Tensor", "Less": "lt.Tensor",
    "Greater": "gt.Tensor", "LessOrEqual": "le.Tensor", "GreaterOrEqual": "ge.Tensor", "And": "logical_and",
    "Or": "logical_or", "Xor": "logical_xor", "BitwiseAnd": "bitwise_and.Tensor", "BitwiseOr": "bitwise_or.Tensor",
    "BitwiseXor": "bitwise_xor.Tensor",
}
# variadic ONNX op -> the ATen op that folds two inputs
_VARIADIC = {"Max": "maximum", "Min": "minimum", "Sum": "add.Tensor", "Mean": "add.Tensor"}


def _widen(ctx: Ctx, *xs):
    """uint16/32/64 as int64: torch's CPU kernels lack arithmetic on them (the result is cast back)."""
    return [ctx.cast(x, "int64") if ctx.dtype(x) in ("uint16", "uint32", "uint64") else x for x in xs]


def _unary(onnx_op: str, aten_op: str):
    def convert(ctx: Ctx, x):
        return ctx.aten(aten_op, x)
    convert.__name__ = convert.__qualname__ = onnx_op
    convert.__doc__ = f"{onnx_op}(x) -> aten.{aten_op}"
    return convert


def _binary(onnx_op: str, aten_op: str):
    def convert(ctx: Ctx, a, b):
        return ctx.aten(aten_op, *_widen(ctx, a, b))
    convert.__name__ = convert.__qualname__ = onnx_op
    convert.__doc__ = f"{onnx_op}(a, b) -> aten.{aten_op}"
    return convert


def _variadic(onnx_op: str, aten_op: str):
    def convert(ctx: Ctx, *xs):
        xs = _widen(ctx, *xs)
        out = xs[0]
        for x in xs[1:]:
            out = ctx.aten(aten_op, out, x)
        if onnx_op == "Mean":
            out = ctx.aten("div.Scalar", out, len(xs))
        if len(xs) == 1:
            out = ctx.aten("clone", out)
        return out
    convert.__name__ = convert.__qualname__ = onnx_op
    convert.__doc__ = f"{onnx_op}(x0, x1, ...) -> aten.{aten_op} folded over the inputs"
    return convert


for _op, _aten in _UNARY.items():
    converter(_op)(_unary(_op, _aten))
for _op, _aten in _BINARY.items():
    converter(_op)(_binary(_op, _aten))
for _op, _aten in _VARIADIC.items():
    converter(_op)(_variadic(_op, _aten))


def _is_int(ctx: Ctx, x) -> bool:
    return not ctx.dtype(x).startswith(("float", "bfloat", "complex"))


@converter("Div")
def Div(ctx: Ctx, a, b):
    a, b = _widen(ctx, a, b)
    # integer division truncates toward zero in ONNX (C semantics), as aten's "trunc" mode does
    return ctx.aten("div.Tensor_mode", a, b, rounding_mode="trunc") if _is_int(ctx, a) else ctx.aten("div.Tensor", a, b)


@converter("Mod")
def Mod(ctx: Ctx, a, b, *, fmod=0):
    a, b = _widen(ctx, a, b)
    # fmod=0: the result has the divisor's sign (Python's %, aten.remainder); fmod=1: the dividend's (C fmod)
    return ctx.aten("fmod.Tensor" if fmod else "remainder.Tensor", a, b)


@converter("Pow")
def Pow(ctx: Ctx, x, y):
    # ONNX keeps the base's type whatever the exponent's; ATen would promote
    return ctx.cast(ctx.aten("pow.Tensor_Tensor", x, y), ctx.dtype(x))


@converter("BitShift")
def BitShift(ctx: Ctx, x, y, *, direction):
    x, y = _widen(ctx, x, y)
    op = "bitwise_left_shift.Tensor" if direction == "LEFT" else "bitwise_right_shift.Tensor"
    return ctx.aten(op, x, y)


@converter("BitwiseNot", since=18)
def BitwiseNot(ctx: Ctx, x):
    return ctx.aten("bitwise_not", *_widen(ctx, x))


@converter("Identity")
def Identity(ctx: Ctx, x):
    return x


@converter("Cast")
def Cast(ctx: Ctx, x, *, to, saturate=1, round_mode="up"):
    if to not in ONNX_TO_IR:
        raise UnsupportedNode(f"Cast to element type {to} has no torch dtype")
    target = ONNX_TO_IR[to]
    if target == "float8_e8m0fnu" and ctx.dtype(x) != target:
        raise UnsupportedNode("a Cast to FLOAT8E8M0 (ONNX's round_mode differs from torch's conversion)")
    if target.startswith("float8") and not saturate:
        raise UnsupportedNode("a float8 Cast without saturation (ONNX's overflow rules differ from torch's)")
    if target.startswith("float8") and saturate and not ctx.dtype(x).startswith("float8"):
        # ONNX saturates out-of-range values (infinities included) to the largest finite float8
        limit = float(torch.finfo(dtype_from_name(target)).max)
        x = ctx.aten("clamp", ctx.cast(ctx.tensor(x), "float32"), -limit, limit)
    return ctx.cast(ctx.tensor(x), target)


@converter("CastLike")
def CastLike(ctx: Ctx, x, like, *, saturate=1, round_mode="up"):
    if ctx.dtype(like) not in IR_TO_ONNX:
        raise UnsupportedNode(f"CastLike to {ctx.dtype(like)}, which has no torch dtype")
    return Cast(ctx, x, to=IR_TO_ONNX[ctx.dtype(like)], saturate=saturate)


@converter("Where")
def Where(ctx: Ctx, cond, a, b):
    return ctx.aten("where.self", cond, a, b)


@converter("Clip", since=6)
def Clip_6(ctx: Ctx, x, *, min=-3.4028234663852886e38, max=3.4028234663852886e38):  # noqa: A002 - ONNX names
    return ctx.aten("clamp", x, min, max)


@converter("Clip", since=11)
def Clip(ctx: Ctx, x, lo=None, hi=None):
    # bounds are tensors here; clamp.Tensor keeps x's dtype for same-typed bounds
    if lo is None and hi is None:
        return x
    return ctx.aten("clamp.Tensor", x, lo, hi)


@converter("Elu")
def Elu(ctx: Ctx, x, *, alpha=1.0):
    return ctx.aten("elu", x, alpha)


@converter("Selu")
def Selu(ctx: Ctx, x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return ctx.aten("elu", x, alpha, gamma)  # elu(x, alpha, scale) = scale * (x > 0 ? x : alpha*(e^x - 1))


@converter("Celu")
def Celu(ctx: Ctx, x, *, alpha=1.0):
    return ctx.aten("celu", x, alpha)


@converter("LeakyRelu")
def LeakyRelu(ctx: Ctx, x, *, alpha=0.01):
    return ctx.aten("leaky_relu", x, alpha)


@converter("ThresholdedRelu")
def ThresholdedRelu(ctx: Ctx, x, *, alpha=1.0):
    return ctx.aten("threshold", x, alpha, 0.0)  # x where x > alpha, else 0


@converter("HardSigmoid")
def HardSigmoid(ctx: Ctx, x, *, alpha=0.2, beta=0.5):
    return ctx.aten("clamp", ctx.aten("add.Scalar", ctx.aten("mul.Scalar", x, alpha), beta), 0.0, 1.0)


@converter("Softsign")
def Softsign(ctx: Ctx, x):
    return ctx.aten("div.Tensor", x, ctx.aten("add.Scalar", ctx.aten("abs", x), 1.0))


@converter("Gelu", since=20)
def Gelu(ctx: Ctx, x, *, approximate="none"):
    return ctx.aten("gelu", x, approximate=approximate)


@converter("Swish", since=24)
def Swish(ctx: Ctx, x, *, alpha=1.0):
    return ctx.aten("mul.Tensor", x, ctx.aten("sigmoid", ctx.aten("mul.Scalar", x, alpha)))


@converter("PRelu")
def PRelu(ctx: Ctx, x, slope):
    # ONNX broadcasts the slope (numpy rules); aten.prelu wants it per channel, so spell it out
    neg = ctx.aten("lt.Scalar", x, 0)
    return ctx.aten("where.self", neg, ctx.aten("mul.Tensor", x, slope), x)


@converter("Shrink")
def Shrink(ctx: Ctx, x, *, bias=0.0, lambd=0.5):
    low, high = ctx.aten("lt.Scalar", x, -lambd), ctx.aten("gt.Scalar", x, lambd)
    zero = ctx.aten("zeros_like", x)
    shifted_up, shifted_down = ctx.aten("add.Scalar", x, bias), ctx.aten("sub.Scalar", x, bias)
    return ctx.aten("where.self", low, shifted_up, ctx.aten("where.self", high, shifted_down, zero))


@converter("IsInf", since=10)
def IsInf(ctx: Ctx, x, *, detect_negative=1, detect_positive=1):
    if detect_negative and detect_positive:
        return ctx.aten("isinf", x)
    if detect_positive:
        return ctx.aten("isposinf", x)
    if detect_negative:
        return ctx.aten("isneginf", x)
    return ctx.aten("zeros_like", x, dtype=torch.bool)


@converter("BitCast", since=26)
def BitCast(ctx: Ctx, x, *, to):
    target = ONNX_TO_IR.get(to)
    source = ctx.dtype(x)
    if target is None or not dtypes.is_dtype(source) or dtypes.get_dtype(target).bits != dtypes.get_dtype(source).bits:
        raise UnsupportedNode("BitCast between types of different sizes")
    return ctx.aten("view.dtype", x, dtype_from_name(target))


@converter("OneHot", since=9)
def OneHot(ctx: Ctx, indices, depth, values, *, axis=-1):
    n = int(ctx.ints(ctx.cast(depth, "int64") if ctx.const(depth) is not None else depth, "OneHot's depth")[0])
    rank = ctx.rank(indices) + 1
    axis = axis + rank if axis < 0 else axis
    idx = ctx.cast(indices, "int64")
    # negative indices count from the end; out-of-range ones match no position (an all-off row)
    idx = ctx.aten("where.self", ctx.aten("lt.Scalar", idx, 0), ctx.aten("add.Scalar", idx, n), idx)
    positions = [1] * rank
    positions[axis] = n
    hot = ctx.aten("eq.Tensor", ctx.aten("unsqueeze", idx, axis), ctx.arange(n, positions))
    off = ctx.aten("select.int", values, 0, 0)
    on = ctx.aten("select.int", values, 0, 1)
    return ctx.aten("where.self", hot, on, off)
