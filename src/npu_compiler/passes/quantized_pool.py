"""The quantized max pool: ``QUANTIZE(max_pool2d(DEQUANTIZE(x)))`` -> ``QMAXPOOL``.

A QDQ CNN (onnxruntime's ``quantize_static``) leaves the pool after its stem as a DEQUANTIZE, a float max pool and
a QUANTIZE: a ResNet's stem then writes 3.2 MB of float32 (64 x 112 x 112) and reads it back twice, which took as
long as its three largest convolutions together. ``QMAXPOOL`` computes the same float32 steps, so the rule is
exact: its reference is the chain itself, and a backend may pool the codes only because, for a finite scale,
``(q - zp) · s`` rounded to float32 is monotone in ``q`` (non-decreasing for ``s >= 0``, non-increasing for
``s < 0``), so each window's maximum is the dequantized value of its largest code (its smallest for ``s < 0``).
The backends check the scale when the weights are bound and pool the codes only then; onnxruntime's QDQ optimizer
drops the same pair only after reading a positive scale.

It applies when both scales and zero points are per tensor, the codes are int8/uint8, the DEQUANTIZE gives float32
to a 4-D ``aten.max_pool2d`` (the QUANTIZE does not narrow the code range); a DEQUANTIZE or pool read elsewhere
stays for its other readers.
"""

from __future__ import annotations

from torch_ir.ir import OpNode
from torch_ir.rewrite import Match, Op, Rule, Var

from .build import node
from .quantized import per_tensor_problem, zero_point
from .quantized_add import CODES

_POOL = "aten.max_pool2d.default"


def _pair(value: object, default: list[int]) -> list[int] | None:
    """A pool attribute as [h, w] (one int repeated, as torch reads it), ``default`` when absent or empty."""
    if value is None or value == []:
        return list(default)
    if isinstance(value, int):
        return [value, value]
    if isinstance(value, (list, tuple)) and len(value) in (1, 2) and all(isinstance(v, int) for v in value):
        return [int(value[0]), int(value[-1])]
    return None


def _window(pool: OpNode) -> dict | None:
    """The pool's attributes as QMAXPOOL's (stride defaults to the kernel, as torch's), None when malformed."""
    a = pool.attrs
    kernel = _pair(a.get("kernel_size"), [])
    if not kernel:
        return None
    attrs = {"kernel_size": kernel, "stride": _pair(a.get("stride"), kernel),
             "padding": _pair(a.get("padding"), [0, 0]), "dilation": _pair(a.get("dilation"), [1, 1]),
             "ceil_mode": bool(a.get("ceil_mode", False))}
    return None if any(v is None for v in attrs.values()) else attrs


def _check(m: Match) -> str | None:
    q, pool, dq = m.node(), m.node("pool"), m.node("dq")
    problem = per_tensor_problem(dq, "input", CODES, "QMAXPOOL") or per_tensor_problem(q, "output", CODES, "QMAXPOOL")
    if problem:
        return problem
    if dq.attrs.get("out_dtype", "float32") != "float32" or q.inputs[0].dtype != "float32":
        return f"the pool runs in {q.inputs[0].dtype}, not float32"
    if q.attrs.get("qmin") is not None or q.attrs.get("qmax") is not None:
        return "the output is quantized to a narrowed range"
    if len(dq.outputs[0].shape) != 4:
        return f"the pool's input has rank {len(dq.outputs[0].shape)} (QMAXPOOL pools [N, C, H, W])"
    window = _window(pool)
    if window is None:
        return f"the pool's attributes {pool.attrs} are not [h, w] pairs"
    if window["ceil_mode"] and not all(isinstance(d, int) for d in dq.outputs[0].shape[2:]):
        return "ceil_mode over a symbolic image size"
    return None


def _qmaxpool(m: Match) -> list[OpNode]:
    q, dq = m.node(), m.node("dq")
    new: list[OpNode] = []
    x_zp = zero_point(m, dq, new)
    y_zp = zero_point(m, q, new)
    attrs = {**_window(m.node("pool")), "out_dtype": q.attrs["dtype"], "method": q.attrs.get("method", "divide")}
    return [*new, node(m, "QMAXPOOL", [dq.inputs[0], dq.inputs[1], x_zp, q.inputs[1], y_zp], attrs)]


RULES = [
    Rule("qdq_maxpool", "quantized",
         Op("QUANTIZE", Op(_POOL, Op("DEQUANTIZE", Var("x"), exact_arity=False, name="dq"), exact_arity=False,
                           name="pool"), exact_arity=False),
         _qmaxpool, check=_check, shared_interior=True,
         doc=f"QUANTIZE(max_pool2d(DEQUANTIZE(x))) -> QMAXPOOL (a max pool of {'/'.join(CODES)} codes)"),
]
