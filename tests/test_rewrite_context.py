"""``RewriteContext``: what one ``rewrite`` call gives its rules (``m.ctx``) instead of module globals.

Fresh names that avoid every node and tensor name and are given back when a replacement is not
applied, and a cache that lives exactly as long as the call.
"""

from __future__ import annotations

import threading

import pytest

from npu_compiler.passes import Op, Rule, Var
from torch_ir.ir import NPU_IR, OpNode, TensorMeta
from torch_ir.rewrite import RewriteContext, rewrite

RELU, NEG, EXP = "aten.relu.default", "aten.neg.default", "aten.exp.default"


def _t(name: str) -> TensorMeta:
    return TensorMeta(name, [2, 3], "float32")


def _unary(name: str, op: str, x: TensorMeta, out: str | None = None) -> OpNode:
    return OpNode(name, op, [x], [_t(out or name)])


def _ir() -> NPU_IR:
    """x -> a = relu(x) -> b = neg(a); c = exp(a): ``a`` is read twice. Tensor ``fused`` already exists."""
    x, fused = _t("x"), _t("fused")
    a = _unary("a", RELU, x)
    b = _unary("b", NEG, a.outputs[0])
    c = _unary("c", EXP, a.outputs[0])
    d = OpNode("d", "aten.add.Tensor", [c.outputs[0], fused], [_t("d")])
    return NPU_IR("ctx", [x, fused], [b.outputs[0], d.outputs[0]], [], [a, b, c, d])


def _renamer(op: str, base: str, seen: list[RewriteContext]) -> Rule:
    """op(x) -> op(x) as a new node named ``ctx.fresh(base)`` (renamed once: the new name ends in ``_n``)."""
    def replace(m):
        seen.append(m.ctx)
        root = m.node()
        if root.name.startswith(base):
            return None  # renamed already
        return [OpNode(m.ctx.fresh(base, nodes_only=True), root.op_type, list(root.inputs), list(root.outputs))]

    return Rule(f"rename_{op}", "test", Op(op, Var("x")), replace)


def test_the_context_of_one_call_is_shared_by_its_rules_and_not_by_other_calls():
    seen: list[RewriteContext] = []
    rules = [_renamer(NEG, "n", seen), _renamer(EXP, "e", seen)]
    first = rewrite(_ir(), rules)
    assert len({id(c) for c in seen}) == 1 and isinstance(seen[0], RewriteContext)
    assert seen[0].ir.model_name == "ctx"
    before = seen[0]
    rewrite(_ir(), rules)
    assert seen[-1] is not before  # a second call: a new context, nothing carried over
    assert [n.name for n in first.ir.nodes] == ["a", "n", "e", "d"]


def test_fresh_names_avoid_nodes_and_tensors():
    ctx = RewriteContext(_ir())
    assert ctx.fresh("a") == "a_1"  # a node (and a tensor)
    assert ctx.fresh("fused") == "fused_1"  # only a tensor: free as a node name, not as a tensor name
    assert ctx.fresh("fused", nodes_only=True) == "fused"
    assert ctx.fresh("a") == "a_2"  # a_1 is drawn by the replacement being built
    with pytest.raises(ValueError, match="already used"):
        ctx.claim("b")
    assert ctx.claim("b", reusable=["b"]) == "b"  # a node the replacement removes lends its name
    ctx._release()
    assert ctx.fresh("a") == "a_1"  # a replacement that was not applied gives its names back


def test_names_of_a_rejected_replacement_are_given_back():
    """neg(relu(x)) -> one node: rejected, relu's output is also read by exp. The name it drew is free again."""
    def fuse(m):
        return [OpNode(m.ctx.fresh("fused", nodes_only=True), NEG, [m["x"]], list(m.node().outputs))]

    seen: list[RewriteContext] = []
    rules = [Rule("neg_relu", "test", Op(NEG, Op(RELU, Var("x"))), fuse), _renamer(EXP, "fused", seen)]
    result = rewrite(_ir(), rules)
    assert result.applied == {"rename_aten.exp.default": 1}
    assert [r[0] for r in result.rejected] == ["neg_relu"]  # tried on every sweep, drawing "fused" each time
    assert [n.name for n in result.ir.nodes] == ["a", "b", "fused", "d"]  # ... and giving it back


def test_the_cache_lives_for_one_call():
    computed: list[str] = []

    def replace(m):
        m.ctx.cached(("seen", m.node().name), lambda: computed.append(m.node().name))
        return None  # never applies: the engine tries it on every sweep

    rules = [Rule("probe", "test", Op(RELU, Var("x")), replace),
             Rule("rename", "test", Op(NEG, Var("x")),
                  lambda m: None if m.node().name != "b" else
                  [OpNode("b2", NEG, list(m.node().inputs), list(m.node().outputs))])]
    rewrite(_ir(), rules)  # two sweeps: the rename, then one that finds nothing
    assert computed == ["a"]  # once per call, however often the match is tried
    rewrite(_ir(), rules)
    assert computed == ["a", "a"]  # a new call computes again


def test_two_rewrites_at_once_do_not_share_names():
    """Two threads each draw names from their own context (a module-level name set would mix them up)."""
    results: dict[int, list[str]] = {}

    def work(i: int) -> None:
        seen: list[RewriteContext] = []
        names = []
        for _ in range(20):
            names.append([n.name for n in rewrite(_ir(), [_renamer(NEG, "n", seen)]).ir.nodes])
        results[i] = names

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(names == [["a", "n", "c", "d"]] * 20 for names in results.values())
