"""QDQ patterns into the quantized NPU ops: QCONV, QGEMM (integer compute) and DQGEMM (weight-only).

A QDQ model (ONNX's QDQ format, PyTorch PT2E, the toolkit's own quantizer) computes in float between
DEQUANTIZE and QUANTIZE nodes; an NPU computes those ops in integers. These rules run in the late-fusion stage,
after the earlier ones have made CONV and GEMM and fused a ReLU into them:

* ``QUANTIZE(CONV(DEQUANTIZE(x_q), DEQUANTIZE(w_q), bias?))`` -> ``QCONV(x_q, w_q, ..., y_scale, y_zp)``;
* ``QUANTIZE(GEMM(DEQUANTIZE(x_q), DEQUANTIZE(w_q), bias?))`` -> ``QGEMM`` (the GEMM's ``trans_b``);
* ``QUANTIZE(matmul/bmm/mm(DEQUANTIZE(a_q), DEQUANTIZE(b_q)))`` -> ``QGEMM(trans_b=False)`` (attention's products
  of two activations, a MatMul by a quantized weight);
* ``GEMM(x, DEQUANTIZE(w_q), bias?)`` and ``matmul(x, DEQUANTIZE(w_q))`` of a weight, with x float (not dequantized,
  or no QUANTIZE after) -> ``DQGEMM`` (weight-only: w8a16, w4a16).

The fused op reads the codes and the very scale and zero-point tensors the DEQUANTIZE/QUANTIZE nodes read; its
output is the QUANTIZE's tensor (name and ``quant`` spec). A bias is a float one as it is (the op quantizes it
to int32 at x_scale·w_scale) or, if it is ``DEQUANTIZE`` of int32 codes with no zero point (ONNX), the codes
(onnxruntime's QDQ fusion takes them so). A DEQUANTIZE that others also read stays for them (``shared_interior``):
the fused op reads its codes. Where a pattern does not apply (a CONV with a batch norm or a residual, an activation
other than ReLU, an output quantized per channel or to a narrowed range) the QDQ ops stay: they compute the same
in float. Integer compute rounds once where QDQ rounds twice, so the two agree within one output step.
"""

from __future__ import annotations

from torch_ir.activations import ATEN_ACTIVATION_OPS
from torch_ir.ir import OpNode, TensorMeta
from torch_ir.quant.numerics import storage_dtype
from torch_ir.rewrite import Match, Op, Rule, Var

from .build import node
from .fusion import _activation

_DQ, _Q = "DEQUANTIZE", "QUANTIZE"
_MATMULS = ("aten.matmul.default", "aten.bmm.default", "aten.mm.default")
#: Code types the integer ops take for activations, and for the output a QUANTIZE makes.
_ACT_TYPES = ("int8", "uint8", "int16", "uint16")
_OUT_TYPES = ("int8", "uint8", "int16", "uint16")
_W_TYPES = ("int8", "uint8", "int4", "uint4")


def _dq(name: str) -> Op:
    return Op(_DQ, Var(f"{name}_q"), exact_arity=False, name=f"dq_{name}")


def zero_point(m: Match, dq: OpNode, new: list[OpNode]) -> TensorMeta:
    """The zero point of a DEQUANTIZE or QUANTIZE (the same inputs), or zeros of its codes' type (a node put in
    ``new``): the integer ops take one always."""
    if len(dq.inputs) > 2:
        return dq.inputs[2]
    dtype = str(storage_dtype(dq.attrs["dtype"])).removeprefix("torch.")
    zp = TensorMeta(m.ctx.fresh(f"{dq.inputs[0].name}_zero_point") if m.ctx else f"{dq.inputs[0].name}_zero_point",
                    [], dtype, role="activation")
    new.append(OpNode(zp.name, "aten.full.default", [], [zp], {"size": [], "fill_value": 0,
                                                              "dtype": {"dtype": dtype}}))
    return zp


def per_tensor_problem(n: OpNode, what: str, codes: tuple[str, ...], op: str) -> str | None:
    """Why the QUANTIZE or DEQUANTIZE ``n`` (``what`` it is to the ``op`` a rule makes) is not one per-tensor scale
    and zero point over one of ``codes``, or None: what QADD, QMAXPOOL and the moved codes ask of their QDQ nodes."""
    a = n.attrs
    if a.get("dtype") not in codes:
        return f"the {what} holds {a.get('dtype')} codes; {op} reads {', '.join(codes)}"
    if a.get("axis") is not None or a.get("group_size") is not None or any(t.numel() != 1 for t in n.inputs[1:3]):
        return f"the {what} is quantized per channel or group ({op} takes per-tensor scales)"
    return None


def _dq_problem(dq: OpNode, what: str, types: tuple[str, ...], axes: tuple[int | None, ...]) -> str | None:
    a = dq.attrs
    if a["dtype"] not in types:
        return f"the {what}'s codes are {a['dtype']}; the integer ops take {', '.join(types)}"
    if a.get("group_size") is not None or a.get("axis") not in axes:
        return f"the {what} is quantized per {'group' if a.get('group_size') else 'axis ' + str(a.get('axis'))}"
    return None


def _q_problem(q: OpNode, computed: TensorMeta, users: list[OpNode]) -> str | None:
    a = q.attrs
    if a["dtype"] not in _OUT_TYPES:
        return f"the output is quantized to {a['dtype']}; the integer ops requantize to {', '.join(_OUT_TYPES)}"
    if a.get("axis") is not None or a.get("qmin") is not None or a.get("qmax") is not None:
        return "the output is quantized per channel or to a narrowed range"
    if len(users) != 1:
        return f"{computed.name!r} is also read outside the QDQ pattern"
    return None


def _bias(m: Match, op: OpNode, at: int) -> tuple[list[TensorMeta], str | None]:
    """The bias input for the integer op (none, a float one, or int32 codes), or why it cannot be taken."""
    if len(op.inputs) <= at:
        return [], None
    b = op.inputs[at]
    p = m.producer(b)
    if p is None or p.op_type != _DQ:
        return ([b], None) if m.is_param(b) else ([], "the bias is computed, not a weight")
    zp = p.inputs[2] if len(p.inputs) > 2 else None
    if p.attrs["dtype"] == "int32" and (zp is None or m.scalar(zp) == 0) and p.attrs.get("axis") in (None, 0):
        return [p.inputs[0]], None
    return [b], None  # a dequantized bias of another kind: its float value, quantized again inside


def _integer_op(m: Match, op_type: str, attrs: dict, bias_at: int) -> list[OpNode] | None:
    """The QCONV/QGEMM that takes the QUANTIZE root's place (root: QUANTIZE, ``op``: the float op)."""
    op, dx, dw, q = m.node("op"), m.node("dq_x"), m.node("dq_w"), m.node()
    bias, _ = _bias(m, op, bias_at)
    new: list[OpNode] = []
    x_zp, w_zp = zero_point(m, dx, new), zero_point(m, dw, new)
    y_zp = zero_point(m, q, new)
    inputs = [dx.inputs[0], dw.inputs[0], dx.inputs[1], x_zp, dw.inputs[1], w_zp, *bias, q.inputs[1], y_zp]
    attrs = {**attrs, "w_dtype": dw.attrs["dtype"], "has_bias": bool(bias), "out_dtype": q.attrs["dtype"],
             "activation": op.attrs.get("activation")}
    return [*new, node(m, op_type, inputs, attrs)]


def _common_problem(m: Match, w_axes: tuple[int | None, ...]) -> str | None:
    op = m.node("op")
    if op.attrs.get("activation") not in (None, "relu"):
        return f"activation {op.attrs['activation']!r} (the integer ops fuse relu only)"
    if op.attrs.get("has_residual"):
        return "a residual add is fused in"
    return (_dq_problem(m.node("dq_x"), "input", _ACT_TYPES, (None,))
            or _dq_problem(m.node("dq_w"), "weight", _W_TYPES, w_axes)
            or _q_problem(m.node(), op.outputs[0], m.users(op.outputs[0])))


def _qconv_check(m: Match) -> str | None:
    conv = m.node("op")
    if conv.attrs.get("bn_eps") is not None:
        return "a batch norm is folded into the CONV (fold it into the weights before quantizing)"
    return _common_problem(m, (None, 0)) or _bias(m, conv, 2)[1]


def _qconv(m: Match) -> list[OpNode] | None:
    a = m.node("op").attrs
    return _integer_op(m, "QCONV", {k: a[k] for k in ("stride", "padding", "dilation")} | {
        "groups": a.get("groups", 1)}, 2)


def _qgemm_check(m: Match) -> str | None:
    gemm = m.node("op")
    if gemm.attrs.get("trans_a"):
        return "x is transposed (trans_a)"
    axes = (None, 0, -2) if gemm.attrs.get("trans_b", True) else (None, 1, -1)
    return _common_problem(m, axes) or _bias(m, gemm, 2)[1]


def _qgemm(m: Match) -> list[OpNode] | None:
    return _integer_op(m, "QGEMM", {"trans_b": m.node("op").attrs.get("trans_b", True)}, 2)


def _qmatmul_check(m: Match) -> str | None:
    w_rank = len(m["w_q"].shape)
    return _common_problem(m, (None, w_rank - 1, -1))


def _qmatmul(m: Match) -> list[OpNode] | None:
    return _integer_op(m, "QGEMM", {"trans_b": False}, 2)


# -- weight-only ----------------------------------------------------------------------------------------------

def _integer_later(m: Match, op: OpNode) -> bool:
    """Whether ``op`` reads a dequantized x and its result is quantized (through at most an activation): the integer
    rule, rooted at that QUANTIZE, decides; the weight-only one leaves it."""
    p = m.producer(op.inputs[0])
    if p is None or p.op_type != _DQ:
        return False
    users = m.users(op.outputs[0])
    if len(users) == 1 and users[0].op_type in ATEN_ACTIVATION_OPS:
        users = m.users(users[0].outputs[0])
    return len(users) == 1 and users[0].op_type == _Q


def _dqgemm_check(m: Match) -> str | None:
    op, dw = m.node("op"), m.node("dq_w")
    if not m.is_param(m["w_q"]):
        return None  # a product of two activations: not weight-only
    if op.attrs.get("trans_a") or op.attrs.get("has_residual"):
        return "x is transposed or a residual add is fused in"
    if dw.attrs.get("out_dtype", "float32") != m.node("op").inputs[0].dtype:
        return f"the weight dequantizes to {dw.attrs.get('out_dtype', 'float32')}, x is {op.inputs[0].dtype}"
    if len(m["w_q"].shape) != 2:
        return f"the weight has rank {len(m['w_q'].shape)}; DQGEMM takes a 2-D weight"
    return _bias(m, op, 2)[1] if op.op_type == "GEMM" else None


def _dqgemm(m: Match) -> list[OpNode] | None:
    op, dw = m.node("op"), m.node("dq_w")
    if not m.is_param(m["w_q"]) or _integer_later(m, op):
        return None
    p = m.producer(op.inputs[2]) if len(op.inputs) > 2 else None
    bias = [] if len(op.inputs) <= 2 else [op.inputs[2]]
    if p is not None:
        return None  # a dequantized (int32) bias: DQGEMM takes a float bias only
    zp = dw.inputs[2:3]
    a = dw.attrs
    return [node(m, "DQGEMM", [op.inputs[0], dw.inputs[0], dw.inputs[1], *zp, *bias], {
        "trans_b": op.attrs.get("trans_b", True) if op.op_type == "GEMM" else False, "w_dtype": a["dtype"],
        "axis": a.get("axis"), "group_size": a.get("group_size"), "has_zero_point": bool(zp),
        "has_bias": bool(bias), "activation": op.attrs.get("activation")})]


_x = Var("x")

RULES = [
    Rule("qdq_conv", "quantized", Op(_Q, Op("CONV", _dq("x"), _dq("w"), exact_arity=False, name="op"),
                                     exact_arity=False), _qconv, check=_qconv_check, shared_interior=True,
         doc="QUANTIZE(CONV(DEQUANTIZE(x), DEQUANTIZE(w), bias?)) [relu] -> QCONV (int8 compute)"),
    Rule("qdq_gemm", "quantized", Op(_Q, Op("GEMM", _dq("x"), _dq("w"), exact_arity=False, name="op"),
                                     exact_arity=False), _qgemm, check=_qgemm_check, shared_interior=True,
         doc="QUANTIZE(GEMM(DEQUANTIZE(x), DEQUANTIZE(w), bias?)) [relu] -> QGEMM (int8 compute)"),
    Rule("qdq_matmul", "quantized", Op(_Q, Op(_MATMULS, _dq("x"), _dq("w"), name="op"), exact_arity=False),
         _qmatmul, check=_qmatmul_check, shared_interior=True,
         doc="QUANTIZE(matmul(DEQUANTIZE(a), DEQUANTIZE(b))) -> QGEMM(trans_b=False) (attention's products)"),
    Rule("weight_only_gemm", "quantized", Op("GEMM", _x, _dq("w"), exact_arity=False, name="op"), _dqgemm,
         check=_dqgemm_check, shared_interior=True,
         doc="GEMM(x, DEQUANTIZE(w), bias?) with x float -> DQGEMM (weight-only: w8a16, w4a16)"),
    Rule("weight_only_matmul", "quantized", Op(_MATMULS, _x, _dq("w"), name="op"), _dqgemm, check=_dqgemm_check,
         shared_interior=True, doc="matmul(x, DEQUANTIZE(w)) of a 2-D weight, x float -> DQGEMM(trans_b=False)"),
    Rule("dqgemm_activation", "quantized",
         Op(ATEN_ACTIVATION_OPS, Op("DQGEMM", exact_arity=False, name="producer"), exact_arity=False), _activation,
         doc="an activation of a DQGEMM -> the DQGEMM with the activation fused"),
]
