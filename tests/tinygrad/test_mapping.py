"""Every UOp kind of the mapping table, imported literally (no rules) and run: equal to tinygrad's own result.

One record per case (a Tensor method, its input dtype, the UOp kinds it must exercise), as the op
coverage tables of JAX and onnxscript do.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tinygrad.dtype import dtypes
from tinygrad.tensor import Tensor
from tinygrad.uop.ops import Ops

import torch_ir
from torch_ir.frontends.tinygrad import import_tinygrad
from torch_ir.frontends.tinygrad.mapping import TABLE

from ..helpers import assert_outputs_close

# (id, function of x, input kind, UOp kinds the graph must contain)
CASES = [
    ("flip", lambda x: x.flip(1), "float", {Ops.FLIP}),
    ("pad_shrink", lambda x: x.pad(((1, 0), (0, 2), (1, 1)))[1:, :3, 1:5], "float", {Ops.PAD, Ops.SHRINK}),
    ("expand", lambda x: x.reshape(2, 1, 3, 4).expand(2, 5, 3, 4), "float", {Ops.EXPAND}),
    ("max_min", lambda x: x.maximum(0.5).minimum(x * 2), "float", {Ops.MAX}),
    ("compare_where", lambda x: (x < 0.1).where(x, (x != 0.3).where(-x, x)), "float",
     {Ops.CMPLT, Ops.CMPNE, Ops.WHERE}),
    ("unary", lambda x: (x * x + 1).sqrt() + x.sin() + (x * x + 1).log2() + x.exp2() + x.trunc(), "float",
     {Ops.SQRT, Ops.SIN, Ops.LOG2, Ops.EXP2, Ops.TRUNC}),
    ("reciprocal_neg", lambda x: (x * x + 1).reciprocal() - x, "float", {Ops.RECIPROCAL}),
    ("pow", lambda x: (x * x + 1) ** x, "float", {Ops.POW}),
    ("cast", lambda x: (x * 10).cast(dtypes.int32).cast(dtypes.float32), "float", {Ops.CAST}),
    ("reduce_max_mul", lambda x: x.max(axis=2) + x.prod(axis=(0, 1)).sum(), "float", {Ops.REDUCE}),
    ("int_div_mod", lambda x: (x + 7) // 3 + (x + 7) % 3, "int", {Ops.FLOORDIV, Ops.FLOORMOD}),
    ("bitwise", lambda x: ((x & 6) | 1) ^ (x << 1) ^ (x >> 1), "int", {Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR}),
    ("bitcast", lambda x: x.bitcast(dtypes.int32) & 0xFF, "float", {Ops.BITCAST}),
    ("stack", lambda x: Tensor.stack(x, x * 2), "float", {Ops.STACK}),
    ("bool_logic", lambda x: ((x > 0) & (x < 0.5)).where(1.0, 0.0), "float", {Ops.AND}),
]


def _input(kind: str) -> Tensor:
    rng = np.random.default_rng(3)
    if kind == "int":
        return Tensor(rng.integers(0, 50, (2, 3, 4)).astype(np.int32))
    return Tensor(rng.standard_normal((2, 3, 4)).astype(np.float32))


@pytest.mark.parametrize("fn, kind, kinds", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_uop_kind(fn, kind, kinds):
    x = _input(kind)
    out = fn(x)
    seen = {u.op for u in out.uop.toposort()}
    assert kinds <= seen, f"the case no longer produces {kinds - seen}; tinygrad changed how it spells it"
    assert all(op in TABLE for op in kinds)
    ir, _ = import_tinygrad(fn, [x], simplify=False)
    actual = torch_ir.IRExecutor(ir).run([torch.from_numpy(x.numpy())])
    assert_outputs_close(actual, [torch.from_numpy(out.numpy())])
    simple, _ = import_tinygrad(fn, [x])  # and the rules keep the numbers
    assert_outputs_close(torch_ir.IRExecutor(simple).run([torch.from_numpy(x.numpy())]), actual)
