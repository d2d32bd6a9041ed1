"""Fusion into the NPU op set for CNNs and the ops every model has: CONV (+ batch norm, + activation),
GEMM + activation, LAYER_NORM, SOFTMAX, EMBEDDING.

A fused node is named after what it computes, keeping its number as it grows (``conv_1`` ->
``conv_bn_1`` -> ``conv_bn_relu_1``, ``gemm`` -> ``gemm_relu``), never after the last node it replaced;
``build.node`` names it (the rule is in ``build.py``'s docstring).
"""

from __future__ import annotations

from torch_ir.activations import ACTIVATIONS, ATEN_ACTIVATION_OPS, activation_of
from torch_ir.ir import TensorMeta
from torch_ir.rewrite import Match, Op, Rule, Var

from .build import node, out, producer_op, static, temp

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
    if attrs.get("padding") not in (None, "same", "valid") and isinstance(attrs.get("padding"), str):
        return f"padding={attrs['padding']!r} is neither 'same' nor 'valid'"
    if rank not in (1, 2, 3):
        return f"a {rank}-D convolution"
    if attrs.get("padding") == "same" and not static(list(m["w"].shape)):
        return "padding='same' with a symbolic kernel size"
    return None


def _string_padding(attrs: dict, w: TensorMeta, rank: int) -> tuple[list[int], list[int]]:
    """``padding="valid"`` / ``"same"`` as (left, right) pads per spatial dim. "same" pads d·(k-1) in all,
    the odd one on the right, as PyTorch does (stride 1; PyTorch refuses "same" otherwise)."""
    if attrs.get("padding") == "valid":
        return [0] * rank, [0] * rank
    dilation = _spatial(attrs.get("dilation"), rank, 1)
    total = [d * (int(k) - 1) for d, k in zip(dilation, w.shape[2:])]
    return [t // 2 for t in total], [t - t // 2 for t in total]


def _conv(m: Match):
    root = m.node()
    attrs, rank = root.attrs, len(m["x"].shape) - 2
    bias, x = root.inputs[2:3], m["x"]
    nodes = []
    if isinstance(attrs.get("padding"), str):
        left, right = _string_padding(attrs, m["w"], rank)
        padding = left
        if left != right:  # an even kernel under "same": the extra column goes in an explicit pad first
            extra = [r - lf for lf, r in zip(left, right)]
            padded = temp(m, x, [*x.shape[:2], *(s + e for s, e in zip(x.shape[2:], extra))], "_pad")
            pad = [v for e in reversed(extra) for v in (0, e)]  # F.pad order: last dim first
            nodes.append(node(m, "aten.pad.default", [x], {"pad": pad, "mode": "constant", "value": 0.0},
                              [padded], suffix="_pad"))
            x = padded
    else:
        padding = _spatial(attrs.get("padding"), rank, 0)
    return [*nodes, node(m, "CONV", [x, m["w"], *bias], {
        "stride": _spatial(attrs.get("stride"), rank, 1), "padding": padding,
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


# -- activations (the ATen forms of each: torch_ir.activations) ----------------------------------

def _activation(m: Match):
    producer = m.node("producer")
    act = activation_of(m.node().op_type, m.node().attrs)
    if act is None or producer.attrs.get("activation") is not None:
        return None
    return [node(m, producer.op_type, list(producer.inputs), {**producer.attrs, "activation": act})]


# -- norms, softmax, embedding --------------------------------------------------------------------

def _layer_norm(m: Match):
    root = m.node()  # _layer_norm_check has made sure the inputs are x[, weight[, bias]]
    return [node(m, "LAYER_NORM", list(root.inputs), {
        "normalized_shape": list(root.attrs["normalized_shape"]), "eps": root.attrs.get("eps", 1e-5)},
        outputs=root.outputs[:1])]


def _layer_norm_check(m: Match) -> str | None:
    root = m.node()
    if len(root.inputs) == 2 and "weight" in root.attrs and root.attrs["weight"] is None:
        return "layer norm with a bias and no weight (LAYER_NORM's optional inputs are weight, then bias)"
    return None


def _batch_norm_check(m: Match) -> str | None:
    bn = m.node()
    if bn.op_type == "aten.batch_norm.default" and bn.attrs.get("training"):
        return "batch norm in training mode (batch statistics) is not a per-channel scale and shift"
    if len(bn.inputs) != 5:
        return "batch norm without an affine weight and bias"
    return None


def _batch_norm(m: Match):
    """A batch norm left after CONV folding (one after a concat or a pool) -> BATCH_NORM."""
    bn = m.node()
    return [node(m, "BATCH_NORM", list(bn.inputs), {"eps": bn.attrs.get("eps", 1e-5)}, outputs=bn.outputs[:1])]


def _lrn(m: Match):
    """x / (k + alpha · avg_pool3d(pad(x²)))^beta, as torch's local_response_norm and ONNX's LRN write it -> LRN."""
    pool, pad, x = m.node("pool").attrs, m.node("pad").attrs, m["x"]
    size = (pool.get("kernel_size") or [0])[0]
    window_ok = (pool.get("kernel_size") == [size, 1, 1] and pool.get("stride") in (None, [1, 1, 1], [1])
                 and not any(pool.get("padding") or []) and not pool.get("ceil_mode")
                 and pool.get("count_include_pad", True) and pool.get("divisor_override") is None)
    pad_ok = (pad.get("pad") == [0, 0, 0, 0, size // 2, (size - 1) // 2] and pad.get("mode", "constant") == "constant"
              and pad.get("value") in (None, 0, 0.0))
    n, *rest = x.shape if len(x.shape) == 4 else [None]
    if not (window_ok and pad_ok and out(m, "in5d").shape == [n, 1, *rest] and out(m, "out4d").shape == x.shape):
        return None
    alpha, k, beta = (m.node(name).attrs.get(key) for name, key in (("scale", "other"), ("shift", "other"),
                                                                    ("pow", "exponent")))
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (alpha, k, beta)):
        return None
    return [node(m, "LRN", [x], {"size": size, "alpha": alpha, "beta": beta, "k": k})]


_RESHAPE = "aten.reshape.default"
_LRN_PATTERN = Op("aten.div.Tensor", x, Op("aten.pow.Tensor_Scalar", Op(
    ("aten.add.Tensor", "aten.add.Scalar"), Op(("aten.mul.Tensor", "aten.mul.Scalar"), Op(_RESHAPE, Op(
        "aten.avg_pool3d.default", Op("aten.pad.default", Op(_RESHAPE, Op("aten.mul.Tensor", x, x, name="square"),
                                                             name="in5d"), name="pad"), name="pool"),
        name="out4d"), name="scale"), name="shift"), name="pow"))

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


#: The origin (``Provenance.origin``) of the nodes the ONNX importer makes for a Gather.
_ONNX_GATHER = "onnx:Gather "


def _wrapped_ids(m: Match):
    """EMBEDDING(w, remainder(ids, V)) with V the table's rows, the remainder ONNX Gather's -> EMBEDDING(w, ids,
    negative_wraps).

    ONNX Gather takes ids in [-V, V), a negative one counting from the end, and its importer wraps them with
    this remainder; EMBEDDING's ``negative_wraps`` does the same and refuses the rest, as onnxruntime does.
    A remainder the model wrote itself (``emb(ids % V)`` in PyTorch) wraps every id, past V too, so it stays.
    """
    wrap = m.node("wrap")
    origin = wrap.provenance.origin if wrap.provenance is not None else None
    if wrap.attrs.get("other") != m["w"].shape[0] or not (origin or "").startswith(_ONNX_GATHER):
        return None
    return [node(m, "EMBEDDING", [m["w"], m["x"]], {"negative_wraps": True})]


def _row_lookup_check(m: Match) -> str | None:
    if producer_op(m, m["w"]) is not None:
        return "the table is computed, not a weight"
    return None


_CONV_OR_GEMM = ("CONV", "GEMM")

RULES = [
    Rule("conv", "conv", Op(("aten.conv2d.default", "aten.conv1d.default", "aten.conv3d.default",
                             "aten.conv2d.padding", "aten.conv1d.padding", "aten.conv3d.padding",
                             "aten.convolution.default"), x, w, exact_arity=False), _conv, check=_conv_check,
         doc="conv1d/2d/3d (padding numbers, 'same' or 'valid'), convolution -> CONV"),
    Rule("conv_batch_norm", "conv",
         Op(("aten._native_batch_norm_legit_no_training.default", "aten.batch_norm.default"),
            Op("CONV", exact_arity=False, name="conv"), exact_arity=False), _conv_bn, check=_conv_bn_check,
         doc="batch norm (inference) of a CONV -> CONV with the batch norm folded"),
    Rule("layer_norm", "norm", Op(("aten.layer_norm.default", "aten.native_layer_norm.default"), x,
                                  exact_arity=False), _layer_norm, check=_layer_norm_check,
         doc="layer_norm, native_layer_norm -> LAYER_NORM"),
    Rule("lrn", "norm", _LRN_PATTERN, _lrn,
         doc="x / (k + alpha · avg_pool3d(pad(x²)))^beta (local_response_norm, ONNX LRN) -> LRN"),
    Rule("embedding", "embedding", Op("aten.embedding.default", w, x), _embedding, check=_row_lookup_check,
         doc="embedding(w, ids) -> EMBEDDING(w, ids)"),
    Rule("gathered_rows", "embedding",
         Op("aten.reshape.default", Op("aten.index_select.default", w, Op("aten.reshape.default", x),
                                       name="select")), _gathered_rows,
         doc="reshape(index_select(w, flatten(ids), 0)) -> EMBEDDING(w, ids) (ONNX Gather on a table)"),
    Rule("embedding_wrapped_ids", "embedding",
         Op("EMBEDDING", w, Op("aten.remainder.Scalar", x, name="wrap")), _wrapped_ids,
         doc="EMBEDDING(w, ids mod rows) of ONNX Gather -> EMBEDDING(w, ids, negative_wraps): ids in [-rows, rows)"),
]

LATE_NORM_RULES = [
    Rule("batch_norm", "norm", Op(("aten._native_batch_norm_legit_no_training.default", "aten.batch_norm.default"),
                                  x, exact_arity=False), _batch_norm, check=_batch_norm_check,
         doc="batch norm (inference) that no CONV absorbed -> BATCH_NORM (a per-channel scale and shift)"),
]

SOFTMAX_RULES = [
    Rule("softmax", "softmax", Op(("aten.softmax.int", "aten._softmax.default"), x), _softmax,
         doc="softmax that is not part of attention -> SOFTMAX"),
]

ACTIVATION_RULES = [
    Rule(f"{kind.lower()}_activation", "activation", Op(ATEN_ACTIVATION_OPS, Op(kind, exact_arity=False,
                                                                               name="producer"), exact_arity=False),
         _activation, doc=f"{'/'.join(ACTIVATIONS)} of a {kind} -> the {kind} with the activation fused")
    for kind in _CONV_OR_GEMM
]
