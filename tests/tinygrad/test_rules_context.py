"""The conv and pool rules keep what they trace in the rewrite call's context, not in module globals.

Two imports give their tensors the same names (``sum``, ``mul``, ...) for different convolutions; a rule
list built once must still give each its own parameters, as must two rewrites running at once.
"""

from __future__ import annotations

import copy
import threading

import numpy as np
import torch
from tinygrad.nn import Conv2d
from tinygrad.tensor import Tensor

import torch_ir
from torch_ir.frontends.tinygrad import conv, import_tinygrad, pool, rules
from torch_ir.frontends.tinygrad.rules import all_rules, simplify_ir

from ..helpers import assert_outputs_close
from .models import realize_weights

X = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)


def _literal(model) -> tuple[torch_ir.NPU_IR, dict[str, np.ndarray]]:
    return import_tinygrad(model, [Tensor(X)], simplify=False)


def _conv_attrs(ir: torch_ir.NPU_IR) -> list[dict]:
    return [n.attrs for n in ir.nodes if n.op_type == "aten.conv2d.default"]


def test_one_rule_list_for_two_models_whose_tensors_share_names():
    plain = realize_weights(Conv2d(4, 6, 3, padding=1))
    dilated = realize_weights(Conv2d(4, 6, 3, padding=2, dilation=2))
    (ir_a, w_a), (ir_b, w_b) = _literal(plain), _literal(dilated)
    assert [n.name for n in ir_a.nodes] == [n.name for n in ir_b.nodes]  # same names, other meanings
    shared = all_rules()  # built once, used twice: nothing a rule traced for one may answer for the other
    a, b = simplify_ir(ir_a, shared), simplify_ir(ir_b, shared)
    assert _conv_attrs(a) == [{"padding": [1, 1]}]
    assert _conv_attrs(b) == [{"padding": [2, 2], "dilation": [2, 2]}]
    for ir, weights, model in ((a, w_a, plain), (b, w_b, dilated)):
        out = torch_ir.IRExecutor(ir, {k: torch.from_numpy(v) for k, v in weights.items()}).run([torch.from_numpy(X)])
        assert_outputs_close(out, [torch.from_numpy(model(Tensor(X)).numpy())])


def test_pool_rules_read_the_divisor_from_the_rewrite():
    """avg_pool's window size comes from the IR being rewritten (``m.constant``), not a dict given when the
    rules were built: the list built for no IR at all still recognizes the pool."""
    ir, _ = import_tinygrad(lambda x: x.avg_pool2d(2), [Tensor(X)], simplify=False)
    assert [n.op_type for n in simplify_ir(ir, all_rules()).nodes] == ["aten.avg_pool2d.default"]


def _module_state() -> dict[str, object]:
    return {f"{m.__name__}.{k}": copy.deepcopy(v) for m in (conv, pool, rules) for k, v in vars(m).items()
            if isinstance(v, (dict, set, list)) and not k.startswith("__")}


def test_no_module_state_and_concurrent_rewrites():
    before = _module_state()
    irs = {"plain": _literal(realize_weights(Conv2d(4, 6, 3, padding=1)))[0],
           "strided": _literal(realize_weights(Conv2d(4, 6, 3, stride=2)))[0]}
    shared, found = all_rules(), {}

    def work(key: str) -> None:
        found[key] = [_conv_attrs(simplify_ir(irs[key], shared)) for _ in range(2)]

    threads = [threading.Thread(target=work, args=(k,)) for k in irs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert found == {"plain": [[{"padding": [1, 1]}]] * 2, "strided": [[{"stride": [2, 2]}]] * 2}
    assert _module_state() == before  # the rules wrote nothing at module level (no caches, no name sets)
