"""The rewrite engine in linear time (issue 27, item 4): indices updated by each rewrite, one ``TensorMeta`` per value.

What must not change is the result, so these tests hold the fast paths to the slow ones they replace:
the engine's producer/user/reader indices against a rebuild after every rewrite (``index_checks``), names
drawn by ``fresh`` against a scan from ``base``, the output renaming against the dict round trip it replaced,
and normalize of a loaded IR (tensors shared) against normalize of the extracted one. No timing is asserted:
``bench/normalize/scaling.py`` measures the speed.
"""

from __future__ import annotations

import dataclasses
import functools
import random

import pytest

from npu_compiler import compile as npu_compile
from npu_compiler.compiler import with_public_output_names
from npu_compiler.passes import NormalizeOptions, normalize
from npu_tools.zoo import get_model
from torch_ir import extract_ir
from torch_ir.ir import NPU_IR, OpNode, TensorMeta, ir_from_dict, ir_to_dict, load_ir
from torch_ir.rewrite import Op, Rule, Var, index_checks, rewrite
from torch_ir.rewrite_state import RewriteContext, RewriteGraph

# normalize's op histograms on zoo models, as the engine that rebuilt its indices after every rewrite gave them
# (b840737); the serialized IRs of the whole zoo were compared before and after as well (identical)
EXPECTED_OPS = {
    "llama": {"ATTENTION": 2, "EMBEDDING": 1, "GATE_UP": 2, "GEMM": 5, "QKV_PROJ": 2, "RMS_NORM": 5, "ROPE_QK": 2,
              "aten._to_copy.default": 1, "aten.cat.default": 1, "aten.cos.default": 1, "aten.index.Tensor": 1,
              "aten.logical_and.default": 1, "aten.mul.Tensor": 1, "aten.reshape.default": 4, "aten.sin.default": 1},
    "llama_kv": {"ATTENTION": 2, "EMBEDDING": 1, "GATE_UP": 2, "GEMM": 5, "KV_UPDATE": 4, "QKV_PROJ": 2, "RMS_NORM": 5,
                 "ROPE_QK": 2, "aten._to_copy.default": 1, "aten.add.Tensor": 1, "aten.arange.default": 1,
                 "aten.cat.default": 1, "aten.cos.default": 1, "aten.le.Tensor": 1, "aten.mul.Tensor": 1,
                 "aten.reshape.default": 6, "aten.select.int": 1, "aten.sin.default": 1},
    "bert": {"ATTENTION": 2, "EMBEDDING": 3, "GEMM": 7, "LAYER_NORM": 5, "QKV_PROJ": 2, "aten._to_copy.default": 1,
             "aten.add.Tensor": 2, "aten.expand.default": 1, "aten.gather.default": 1, "aten.index.Tensor": 1,
             "aten.logical_and.default": 1, "aten.select.int": 1, "aten.slice.Tensor": 1, "aten.tanh.default": 1,
             "aten.where.ScalarOther": 1},
    "resnet": {"CONV": 8, "GEMM": 1, "aten.add.Tensor": 2, "aten.max_pool2d.default": 1, "aten.mean.dim": 1,
               "aten.relu.default": 2, "aten.reshape.default": 1},
}
# symbols of the zoo's dynamic models, bound so that their IR compiles (a program has static shapes)
BIND = {"llama_kv": {"seq": 2}}


@functools.cache
def _extracted(name: str) -> NPU_IR:
    entry = get_model(name)
    if not entry.available():
        pytest.skip(f"zoo model {name!r} needs {', '.join(entry.requires)}")
    args, kwargs = entry.example_inputs()
    return extract_ir(entry.build("meta"), tuple(args), model_name=name, example_kwargs=kwargs,
                      dynamic_shapes=entry.dynamic_shapes)


def _doc(ir: NPU_IR) -> dict:
    """The IR as saved, less normalize's wall-clock timings."""
    doc = ir_to_dict(ir)
    for stage in doc["metadata"].get("normalize", {}).get("stages", []):
        stage.pop("seconds", None)
    return doc


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXPECTED_OPS))
def test_indices_agree_with_a_rebuild_after_every_rewrite(name: str, tmp_path) -> None:
    ir = _extracted(name)
    plain = normalize(ir)
    with index_checks():  # every rewrite of every stage, and the compiler's kernel fusion, checked
        checked = normalize(ir)
        npu_compile(ir, fallback="cpu", bind=BIND.get(name))
    assert _doc(checked) == _doc(plain)
    assert dict(sorted(plain.op_histogram().items())) == EXPECTED_OPS[name]
    ir.save(tmp_path / "ir.json")  # loaded, each value is one TensorMeta: the same result
    assert _doc(normalize(load_ir(tmp_path / "ir.json"))) == _doc(plain)


def test_a_broken_index_is_caught() -> None:
    graph = RewriteGraph(_small_ir().nodes, {}, set())
    graph.check()
    graph.users["a"] += 1
    with pytest.raises(AssertionError, match="use counts"):
        graph.check()


# -- one TensorMeta per value --------------------------------------------------------------------------------

def _t(name: str, **kw) -> TensorMeta:
    return TensorMeta(name, [2, 3], "float32", **kw)


def _small_ir(use_layout: str | None = None) -> NPU_IR:
    """x -> relu -> a; add(a, x) -> b. ``use_layout``: what the add's use of ``a`` says of its layout."""
    x, a = _t("x", role="input"), _t("a")
    relu = OpNode("relu", "aten.relu.default", [x], [a])
    used = _t("a", layout=use_layout) if use_layout else _t("a")
    add = OpNode("add", "aten.add.Tensor", [used, _t("x", role="input")], [_t("b")], {"alpha": 1})
    return NPU_IR("small", [x], [_t("b")], [], [relu, add])


def test_loading_shares_one_tensor_meta_per_value() -> None:
    ir = ir_from_dict(ir_to_dict(_small_ir()))
    relu, add = ir.nodes
    assert add.inputs[0] is relu.outputs[0]
    assert add.inputs[1] is relu.inputs[0] is ir.graph_inputs[0]
    assert ir.graph_outputs[0] is add.outputs[0]


def test_a_use_that_says_more_keeps_its_own_object() -> None:
    doc = ir_to_dict(_small_ir(use_layout="NC"))
    ir = ir_from_dict(doc)
    relu, add = ir.nodes
    assert add.inputs[0] is not relu.outputs[0] and add.inputs[0].layout == "NC"
    assert ir_to_dict(ir) == doc  # read back exactly as written


def test_annotate_and_renaming_keep_one_object_per_value(tmp_path) -> None:
    _extracted("llama").save(tmp_path / "ir.json")
    npu = normalize(load_ir(tmp_path / "ir.json"), NormalizeOptions(node_prefix="n", tensor_prefix="t"))
    defined = {t.name: t for t in [*npu.graph_inputs, *npu.weights, *npu.constants]}
    defined.update((t.name, t) for n in npu.nodes for t in n.outputs)
    assert all(t is defined[t.name] for n in npu.nodes for t in n.inputs)
    assert all(t is defined[t.name] for t in npu.graph_outputs)


def test_public_output_names_as_the_dict_round_trip_gave() -> None:
    ir = normalize(_extracted("llama_kv"))  # outputs and buffer mutations to rename
    doc = ir_to_dict(ir)
    outputs = doc["graph_outputs"]
    renames = {t["name"]: "output" if len(outputs) == 1 else f"output_{i}" for i, t in enumerate(outputs)}
    for t in [*doc["graph_outputs"], *(t for n in doc["nodes"] for t in n["inputs"] + n["outputs"])]:
        t["name"] = renames.get(t["name"], t["name"])
    doc["mutations"] = {k: renames.get(v, v) for k, v in doc["mutations"].items()}
    assert ir_to_dict(with_public_output_names(ir)) == ir_to_dict(ir_from_dict(doc))


# -- names and order ------------------------------------------------------------------------------------------

def _scan(ctx: RewriteContext, base: str, nodes_only: bool, reusable: set[str]) -> str:
    """``fresh`` as it was: try ``base``, ``base_1``, ... from the start."""
    name, n = base, 0
    while name in ctx._pending or (name not in reusable and ctx.taken(name, nodes_only=nodes_only)):
        n += 1
        name = f"{base}_{n}"
    return name


def test_fresh_gives_the_first_free_name_as_a_scan_would() -> None:
    rng = random.Random(0)
    nodes = [OpNode(name, "aten.relu.default", [_t("x")], [_t(f"{name}_out")])
             for name in ("gemm", "gemm_1", "gemm_3", "rope_2")]
    ctx = RewriteContext(NPU_IR("names", [_t("x")], [], [], nodes))
    drawn: list[str] = []
    for _ in range(400):
        base, nodes_only = rng.choice(["gemm", "rope", "gemm_1"]), rng.random() < 0.5
        reusable = set(rng.sample(drawn, min(len(drawn), rng.randrange(3))))
        if rng.random() < 0.2:
            reusable.add("gemm_1")  # a name of the input IR that a replacement removes
        expected = _scan(ctx, base, nodes_only, reusable)
        assert ctx.fresh(base, nodes_only=nodes_only, reusable=reusable) == expected
        drawn.append(expected)
        if rng.random() < 0.3:
            ctx._commit([])
        elif rng.random() < 0.2:
            ctx._release()


def test_order_keys_survive_many_insertions_at_one_place() -> None:
    ir = _small_ir()
    graph = RewriteGraph(ir.nodes, {}, set())
    add = graph.slots[id(ir.nodes[1])]
    made = [OpNode(f"r{i}", "aten.relu.default", [_t("x")], [_t(f"r{i}")]) for i in range(100)]
    for node in made:  # each just before ``add``, so the gap there halves each time
        graph.insert_before(add, [node])
    graph.check()
    assert [n.name for n in graph] == ["relu", *(n.name for n in made), "add"]
    assert graph.readers("x") == [ir.nodes[0], *made, ir.nodes[1]]


def _siblings_ir() -> NPU_IR:
    """Three relus of x; the last reads the second's output too (defined after the first)."""
    x = _t("x")
    r0 = OpNode("r0", "aten.relu.default", [x], [_t("y0")])
    r1 = OpNode("r1", "aten.relu.default", [x], [_t("y1")])
    r2 = OpNode("r2", "aten.add.Tensor", [x, r1.outputs[0]], [_t("y2")], {"alpha": 1})
    return NPU_IR("siblings", [x], [t for n in (r0, r1, r2) for t in n.outputs], [], [r0, r1, r2])


def _absorbing(sibling: str) -> Rule:
    """At r0, make one node that also defines ``sibling``'s output (as QKV_PROJ absorbs K and V)."""
    def check(m):
        m.absorb(next(n for n in m.users(m["x"]) if n.name == sibling))

    def replace(m):
        other = m.absorbed[0]
        return [OpNode("both", "npu.pair", [m["x"]], [*m.node().outputs, *other.outputs])]

    return Rule("pair", "test", Op("aten.relu.default", Var("x")), replace, check=check)


def test_absorbing_a_sibling_defined_after_the_root() -> None:
    with index_checks():
        result = rewrite(_siblings_ir(), [_absorbing("r1")], check=False)
    assert [n.name for n in result.ir.nodes] == ["both", "r2"]
    assert result.ir.nodes[1].inputs[1] is result.ir.nodes[0].outputs[1]


def test_absorbing_a_node_that_reads_what_follows_the_root_is_refused() -> None:
    with index_checks():
        result = rewrite(_siblings_ir(), [_absorbing("r2")], check=False)
    assert not result.changed
    assert result.rejected == [("pair", "r0", "absorbed node 'r2' reads ['y1'], defined after the root 'r0'"),
                               ("pair", "r1", "absorbed node 'r2' reads ['y1'], defined after the root 'r1'")]


def test_an_alias_rewrites_the_later_readers_only() -> None:
    x = _t("x")
    view = OpNode("view", "aten.reshape.default", [x], [_t("v")], {"shape": [2, 3]})
    users = [OpNode(f"u{i}", "aten.relu.default", [view.outputs[0]], [_t(f"u{i}")]) for i in range(3)]
    ir = NPU_IR("alias", [x], [u.outputs[0] for u in users], [], [view, *users])
    same = Rule("same_shape", "test", Op("aten.reshape.default", Var("x")), lambda m: m["x"])
    with index_checks():
        result = rewrite(ir, [same])
    assert [n.name for n in result.ir.nodes] == ["u0", "u1", "u2"]
    assert all(n.inputs[0] is x for n in result.ir.nodes)
    assert all(dataclasses.replace(n, inputs=u.inputs) == u for n, u in zip(result.ir.nodes, users))
