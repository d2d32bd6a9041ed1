"""Fusion into the NPU op set for CNNs and the ops every model has: CONV (+ batch norm, + activation),
GEMM + activation, LAYER_NORM, SOFTMAX, EMBEDDING.

A fused node is named after what it computes, keeping its number as it grows (``conv_1`` ->
``conv_bn_1`` -> ``conv_bn_relu_1``, ``gemm`` -> ``gemm_relu``), never after the last node it replaced;
``build.node`` names it (the rule is in ``build.py``'s docstring).
"""

from __future__ import annotations

from .build import node, out, producer_op
from .rewrite import Match, Op, Rule, Var

x, w, b = Var("x"), Var("w"), Var("b")


# -- CONV -----------------------------------------------------------------------------------------

def _spatial(value, rank: int, default: int) -> list[int]:
    if value is None:
        return [default] * rank
    return list(value) * rank if len(value) == 1 else list(value)


def _conv_check(m: Match) -> str | None:
    root = m.node()
    attrs, rank = root.attrs, len(m["x"].shape) - 2
    if root.op_type == "aten.convolution.default" and attrs.get("transposed"):
        return "a transposed convolution stays aten.convolution (CONV is a forward convolution)"
    if isinstance(attrs.get("padding"), str):
        return f"padding={attrs['padding']!r} (a string) is not lowered; export with explicit padding"
    if rank not in (1, 2, 3):
        return f"a {rank}-D convolution"
    return None


def _conv(m: Match):
    root = m.node()
    attrs, rank = root.attrs, len(m["x"].shape) - 2
    bias = root.inputs[2:3]
    return [node(m, "CONV", [m["x"], m["w"], *bias], {
        "stride": _spatial(attrs.get("stride"), rank, 1), "padding": _spatial(attrs.get("padding"), rank, 0),
        "dilation": _spatial(attrs.get("dilation"), rank, 1), "groups": attrs.get("groups", 1),
        "has_bias": bool(bias), "bn_eps": None, "activation": None,
    })]


def _conv_bn_check(m: Match) -> str | None:
    conv, bn = m.node("conv"), m.node()
    if conv.attrs["bn_eps"] is not None or conv.attrs["activation"] is not None:
        return "the CONV already has a batch norm or an activation"
    if len(bn.inputs) != 5:
        return "batch norm without an affine weight and bias"
    if bn.op_type == "aten.batch_norm.default" and bn.attrs.get("training"):
        return "batch norm in training mode (batch statistics) cannot be folded"
    return None


def _conv_bn(m: Match):
    conv, bn = m.node("conv"), m.node()
    gamma, beta, mean, var = bn.inputs[1:5]
    eps = bn.attrs.get("eps", 1e-5)
    return [node(m, "CONV", [*conv.inputs, gamma, beta, mean, var], {**conv.attrs, "bn_eps": eps},
                 outputs=bn.outputs[:1])]


# -- activations ----------------------------------------------------------------------------------

_ACT_OPS = {
    "aten.relu.default": lambda a: "relu",
    "aten.silu.default": lambda a: "silu",
    "aten.gelu.default": lambda a: "gelu_tanh" if a.get("approximate") == "tanh" else "gelu",
    "aten.hardtanh.default": lambda a: "relu6" if (a.get("min_val"), a.get("max_val")) == (0.0, 6.0) else None,
    "aten.clamp.default": lambda a: "relu6" if (a.get("min"), a.get("max")) in ((0, 6), (0.0, 6.0)) else None,
}


def _activation(m: Match):
    producer = m.node("producer")
    act = _ACT_OPS[m.node().op_type](m.node().attrs)
    if act is None or producer.attrs.get("activation") is not None:
        return None
    return [node(m, producer.op_type, list(producer.inputs), {**producer.attrs, "activation": act})]


# -- norms, softmax, embedding --------------------------------------------------------------------

def _layer_norm(m: Match):
    root = m.node()  # _layer_norm_check has made sure the affine weight and bias are there
    return [node(m, "LAYER_NORM", list(root.inputs), {
        "normalized_shape": list(root.attrs["normalized_shape"]), "eps": root.attrs.get("eps", 1e-5)},
        outputs=root.outputs[:1])]


def _layer_norm_check(m: Match) -> str | None:
    return None if len(m.node().inputs) == 3 else "layer norm without an affine weight and bias"


def _softmax(m: Match):
    attrs = m.node().attrs
    if attrs.get("half_to_float"):
        return None
    return [node(m, "SOFTMAX", [m["x"]], {"dim": attrs["dim"], "scale": 1.0})]


def _embedding(m: Match):
    return [node(m, "EMBEDDING", [m["w"], m["x"]])]


def _gathered_rows(m: Match):
    """reshape(index_select(w, reshape(ids, [-1]), 0), ids.shape + [H]) -> EMBEDDING(w, ids) (ONNX Gather)."""
    ids, table = m["x"], m["w"]
    if m.node("select").attrs.get("dim") != 0 or not m.is_param(table) or len(table.shape) != 2:
        return None
    if list(out(m).shape) != list(ids.shape) + [table.shape[1]]:
        return None
    return [node(m, "EMBEDDING", [table, ids])]


def _wrapped_ids(m: Match):
    """EMBEDDING(w, remainder(ids, V)) with V the table's rows -> EMBEDDING(w, ids).

    ONNX Gather wraps negative indices, so exporters add the remainder; EMBEDDING wraps them too.
    """
    if m.node("wrap").attrs.get("other") != m["w"].shape[0]:
        return None
    return [node(m, "EMBEDDING", [m["w"], m["x"]])]


def _row_lookup_check(m: Match) -> str | None:
    if producer_op(m, m["w"]) is not None:
        return "the table is computed, not a weight"
    return None


_CONV_OR_GEMM = ("CONV", "GEMM")

RULES = [
    Rule("conv", "conv", Op(("aten.conv2d.default", "aten.conv1d.default", "aten.conv3d.default",
                             "aten.convolution.default"), x, w, exact_arity=False), _conv, check=_conv_check,
         doc="conv1d/2d/3d, convolution -> CONV"),
    Rule("conv_batch_norm", "conv",
         Op(("aten._native_batch_norm_legit_no_training.default", "aten.batch_norm.default"),
            Op("CONV", exact_arity=False, name="conv"), exact_arity=False), _conv_bn, check=_conv_bn_check,
         doc="batch norm (inference) of a CONV -> CONV with the batch norm folded"),
    Rule("layer_norm", "norm", Op(("aten.layer_norm.default", "aten.native_layer_norm.default"), x,
                                  exact_arity=False), _layer_norm, check=_layer_norm_check,
         doc="layer_norm, native_layer_norm -> LAYER_NORM"),
    Rule("embedding", "embedding", Op("aten.embedding.default", w, x), _embedding, check=_row_lookup_check,
         doc="embedding(w, ids) -> EMBEDDING(w, ids)"),
    Rule("gathered_rows", "embedding",
         Op("aten.reshape.default", Op("aten.index_select.default", w, Op("aten.reshape.default", x),
                                       name="select")), _gathered_rows,
         doc="reshape(index_select(w, flatten(ids), 0)) -> EMBEDDING(w, ids) (ONNX Gather on a table)"),
    Rule("embedding_wrapped_ids", "embedding",
         Op("EMBEDDING", w, Op("aten.remainder.Scalar", x, name="wrap")), _wrapped_ids,
         doc="EMBEDDING(w, ids mod rows) -> EMBEDDING(w, ids): EMBEDDING wraps negative ids itself"),
]

SOFTMAX_RULES = [
    Rule("softmax", "softmax", Op(("aten.softmax.int", "aten._softmax.default"), x), _softmax,
         doc="softmax that is not part of attention -> SOFTMAX"),
]

ACTIVATION_RULES = [
    Rule(f"{kind.lower()}_activation", "activation", Op(tuple(_ACT_OPS), Op(kind, exact_arity=False,
                                                                           name="producer"), exact_arity=False),
         _activation, doc=f"relu/relu6/silu/gelu of a {kind} -> the {kind} with the activation fused")
    for kind in _CONV_OR_GEMM
]
