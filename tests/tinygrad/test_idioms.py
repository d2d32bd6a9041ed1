"""tinygrad's spellings of common ops come back as the ATen op: one record per case, checked against tinygrad."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tinygrad.tensor import Tensor

import torch_ir
from torch_ir.frontends.tinygrad import import_tinygrad

from ..helpers import assert_outputs_close

# (name, function of x (2, 3, 4), the op list after import)
CASES = [
    ("exp", lambda x: x.exp(), ["exp"]),
    ("log", lambda x: (x * x + 1).log(), ["mul", "add", "log"]),
    ("sigmoid", lambda x: x.sigmoid(), ["sigmoid"]),
    ("silu", lambda x: x.silu(), ["silu"]),
    ("relu", lambda x: x.relu(), ["relu"]),
    ("sub_div", lambda x: (x - 2.0) / (x * x + 1), ["sub", "mul", "add", "div"]),
    ("softmax", lambda x: x.softmax(-1), ["_softmax"]),
    ("softmax_middle_axis", lambda x: x.softmax(1), ["_softmax"]),
    ("sum_keepdim", lambda x: x.sum(axis=(0, 2), keepdim=True), ["sum"]),
    ("max", lambda x: x.max(axis=1), ["amax"]),
    ("cat", lambda x: x.cat(x * 2, dim=1), ["mul", "cat"]),
    ("stack", lambda x: Tensor.stack(x, x + 1, dim=2), ["add", "stack"]),
]


@pytest.mark.parametrize("name, fn, ops", CASES, ids=[c[0] for c in CASES])
def test_idiom(name, fn, ops):
    x = Tensor(np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32))
    ir, _ = import_tinygrad(fn, [x])
    assert [n.op_type.split(".")[1] for n in ir.nodes] == ops, str(ir)
    actual = torch_ir.IRExecutor(ir).run([torch.from_numpy(x.numpy())])
    assert_outputs_close(actual, [torch.from_numpy(fn(x).numpy())])
