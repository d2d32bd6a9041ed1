"""Hostile and malformed ONNX files: never code, never other files, never the machine's memory.

Every model is built here with ``onnx.helper`` (or by hand, byte by byte, where the helper refuses).
Each must end, through ``import_onnx`` and through ``torch-ir import-onnx`` / ``verify-onnx``, in a
``TorchIRError`` subclass whose message names the file and the rule, or import as an honest graph
whose huge values stay graph nodes instead of constants folded at import time. The memory cases run
in a fresh interpreter, under an address-space limit, and report the growth of their own peak RSS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from npu_tools.cli import main as torch_ir_main
from tests.hang_guard import no_hang
from torch_ir.errors import (
    ExtractionError,
    IRValidationError,
    LimitExceededError,
    TorchIRError,
    UnsupportedOpError,
)
from torch_ir.frontends.onnx import InvalidModelError, import_onnx
from torch_ir.frontends.onnx.loader import ModelNotFoundError, data_propagation_risk
from torch_ir.limits import get_limits, limits

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
HUGE = [100_000, 100_000]  # 10**10 float32 elements: 37 GiB, over the 16 GiB limit on one allocation
BIG = [50_000, 50_000]  # 9.3 GiB of float32: far over the 64 MiB fold limit, under the allocation limit
GiB = 1 << 30
ROOT = Path(__file__).resolve().parents[2]


# -------------------------------------------------------------------------------------------- builders


def model(nodes, inputs, outputs, initializers=(), opset: int = 17, check: bool = True) -> onnx.ModelProto:
    """A model of ``nodes``; ``inputs``/``outputs`` are (name, element type, shape) triples."""
    graph = helper.make_graph(nodes, "hostile", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], list(initializers))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    if check:
        onnx.checker.check_model(m)
    return m


def save(m: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(m.SerializeToString())
    return path


def i64(name: str, value) -> TensorProto:
    return numpy_helper.from_array(np.array(value, np.int64), name)


def constant_of_shape_model(shape=HUGE) -> onnx.ModelProto:
    """``x + ConstantOfShape(shape)``: folding it would materialize the whole constant."""
    fill = helper.make_tensor("fill", FLOAT, [1], [1.0])
    return model([helper.make_node("ConstantOfShape", ["s"], ["c"], value=fill),
                  helper.make_node("Add", ["x", "c"], ["y"])],
                 [("x", FLOAT, [1])], [("y", FLOAT, list(shape))], [i64("s", list(shape))])


def range_model(limit: int = 10**9) -> onnx.ModelProto:
    """``Range(0, limit)`` then ``Cast`` (data propagation) and ``Add``."""
    return model([helper.make_node("Range", ["a", "b", "d"], ["r"]),
                  helper.make_node("Cast", ["r"], ["rf"], to=FLOAT),
                  helper.make_node("Add", ["x", "rf"], ["y"])],
                 [("x", FLOAT, [1])], [("y", FLOAT, [limit])], [i64("a", 0), i64("b", limit), i64("d", 1)])


def huge_model_outcome(m: onnx.ModelProto | Path, op: str, **kwargs) -> None:
    """A model of a 37 GiB tensor imports with it as a graph node ``op``, or (where the op registry checks
    node output sizes at import) fails with a LimitExceededError naming the file and the limit; fast either way."""
    with no_hang(5, "huge_model_outcome"):
        try:
            ir, weights = import_onnx(m, **kwargs)
        except LimitExceededError as e:
            assert str(m if isinstance(m, Path) else "<ModelProto>") in str(e) and "limit" in str(e), e
        else:
            assert op in ops(ir) and largest_constant_bytes(ir, weights) < 1024


def data_prop_bomb_model(length: int = 10**9) -> onnx.ModelProto:
    """A declared 1-D int64 input of ``length`` elements into ``Cast``: ONNX data propagation alone would spend
    gigabytes on it, before anything of the importer runs."""
    return model([helper.make_node("Cast", ["ids"], ["f"], to=FLOAT), helper.make_node("Neg", ["f"], ["y"])],
                 [("ids", INT64, [length])], [("y", FLOAT, [length])])


def external_tensor(name: str, dims: list[int], location: str, **extra: str) -> TensorProto:
    t = TensorProto(name=name, data_type=FLOAT, dims=dims, data_location=TensorProto.EXTERNAL)
    for key, value in {"location": location, **extra}.items():
        entry = t.external_data.add()
        entry.key, entry.value = key, value
    return t


def external_model(location: str, dims=(4,), **extra: str) -> onnx.ModelProto:
    w = external_tensor("w", list(dims), location, **extra)
    return model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", FLOAT, list(dims))],
                 [("y", FLOAT, list(dims))], [w], check=False)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def nested_if_bytes(depth: int) -> bytes:
    """A model whose If's then_branch holds an If, ``depth`` times, written as protobuf bytes directly (the
    Python protobuf runtime refuses to build more than ~30 levels). Linear in ``depth``."""
    out_vi = helper.make_tensor_value_info("o", FLOAT, [1]).SerializeToString()

    def branch(name: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], name, [],
                                 [helper.make_tensor_value_info("o", FLOAT, [1])])

    leaf = branch("leaf").SerializeToString()
    node_head = (_field(1, b"c") + _field(2, b"o") + _field(4, b"If")
                 + _field(5, helper.make_attribute("else_branch", branch("e")).SerializeToString()))
    attr_head = _field(1, b"then_branch") + _varint(20 << 3) + _varint(onnx.AttributeProto.GRAPH)
    graph_tail = _field(2, b"g") + _field(12, out_vi)
    prefixes, inner = [], len(leaf)
    for _ in range(depth):  # graph{ node{ ..., attribute{ ..., g: <inner graph> } }, name, output }
        attr_len = len(attr_head) + 1 + len(_varint(inner)) + inner
        node_len = len(node_head) + 1 + len(_varint(attr_len)) + attr_len
        prefixes.append(_varint(1 << 3 | 2) + _varint(node_len) + node_head + _varint(5 << 3 | 2)
                        + _varint(attr_len) + attr_head + _varint(6 << 3 | 2) + _varint(inner))
        inner = 1 + len(_varint(node_len)) + node_len + len(graph_tail)
    inputs = (_field(11, helper.make_tensor_value_info("c", BOOL, []).SerializeToString())
              + _field(11, helper.make_tensor_value_info("x", FLOAT, [1]).SerializeToString()))
    graph = b"".join(reversed(prefixes)) + leaf + graph_tail * depth + inputs
    return (_varint(1 << 3) + _varint(8) + _field(8, helper.make_opsetid("", 17).SerializeToString())
            + _field(7, graph))


def ops(ir) -> list[str]:
    return [n.op_type for n in ir.nodes]


def largest_constant_bytes(ir, weights) -> int:
    sizes = [t.numel() * t.element_size() for t in weights.values()]
    sizes += [len(json.dumps(v)) for v in ir.constant_values.values()]
    return max(sizes, default=0)


# ------------------------------------------------------------------------------ files that are no model


def test_empty_file(tmp_path) -> None:
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(InvalidModelError, match=r"empty\.onnx: the file is empty"):
        import_onnx(path)


def test_random_bytes(tmp_path) -> None:
    path = tmp_path / "random.onnx"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(InvalidModelError, match=r"random\.onnx.*(parse|invalid)"):
        import_onnx(path)


def test_truncated_file(tmp_path) -> None:
    data = constant_of_shape_model([2, 2]).SerializeToString()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidModelError, match=r"truncated\.onnx.*(parse|invalid)"):
        import_onnx(path)


def test_directory_path(tmp_path) -> None:
    with pytest.raises(InvalidModelError, match="is a directory, not an ONNX model file"):
        import_onnx(tmp_path)


def test_missing_path_is_also_a_file_not_found_error(tmp_path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist") as info:
        import_onnx(tmp_path / "nope.onnx")
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, TorchIRError)


def test_ten_thousand_nested_if_subgraphs(tmp_path) -> None:
    path = tmp_path / "deep.onnx"
    path.write_bytes(nested_if_bytes(10_000))
    with no_hang(10, "test_ten_thousand_nested_if_subgraphs"):
        with pytest.raises(InvalidModelError, match=r"deep\.onnx"):
            import_onnx(path)


def test_a_few_nested_if_subgraphs_are_a_well_formed_model(tmp_path) -> None:
    """The generator writes valid models: at a small depth the file is checked and reaches the importer."""
    path = tmp_path / "nested.onnx"
    path.write_bytes(nested_if_bytes(3))
    onnx.checker.check_model(str(path))
    with pytest.raises(UnsupportedOpError, match="If"):  # control flow has no IR form yet
        import_onnx(path)


# ------------------------------------------------------------------------------------ broken graphs


def test_node_with_an_undefined_input(tmp_path) -> None:
    m = model([helper.make_node("Relu", ["nowhere"], ["y"])], [("x", FLOAT, [1])], [("y", FLOAT, [1])],
              check=False)
    with pytest.raises(InvalidModelError, match=r"undefined\.onnx.*nowhere"):
        import_onnx(save(m, tmp_path / "undefined.onnx"))
    with pytest.raises(InvalidModelError, match="nowhere"):
        import_onnx(m)


def test_cycle(tmp_path) -> None:
    m = model([helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])],
              [("x", FLOAT, [1])], [("a", FLOAT, [1])], check=False)
    with pytest.raises(InvalidModelError, match=r"cycle\.onnx.*topologically sorted"):
        import_onnx(save(m, tmp_path / "cycle.onnx"))


def test_attribute_of_the_wrong_type(tmp_path) -> None:
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis="last")], [("x", FLOAT, [2])],
              [("y", FLOAT, [2])], check=False)
    with pytest.raises(InvalidModelError, match=r"attr\.onnx.*axis"):
        import_onnx(save(m, tmp_path / "attr.onnx"))


def test_string_attribute_that_is_not_utf8(tmp_path) -> None:
    node = helper.make_node("Pad", ["x", "p"], ["y"])
    node.attribute.append(helper.make_attribute("mode", b"\xff\xfe"))
    m = model([node], [("x", FLOAT, [2])], [("y", FLOAT, [4])], [i64("p", [1, 1])], check=False)
    with pytest.raises(TorchIRError, match=r"utf8\.onnx.*(mode|UTF-8)"):
        import_onnx(save(m, tmp_path / "utf8.onnx"))


def test_hostile_attribute_values_end_as_toolkit_errors(tmp_path) -> None:
    """An attribute the checker lets through but the converter cannot use (a zero block size, an axis out
    of range) is a reported node, not a ZeroDivisionError or an IndexError."""
    cases = [
        helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=0),
        helper.make_node("Concat", ["x", "x"], ["y"], axis=1_000_000),
        helper.make_node("CenterCropPad", ["x", "s"], ["y"], axes=[-(10**12)]),
    ]
    for index, node in enumerate(cases):
        m = model([node], [("x", FLOAT, [1, 4, 2, 2])], [("y", FLOAT, ["a", "b", "c", "d"])], [i64("s", [2])],
                  opset=18, check=False)
        with pytest.raises(TorchIRError, match=node.op_type):
            import_onnx(save(m, tmp_path / f"attr{index}.onnx"), reference_fallback=False)


def test_opset_1_is_converted(tmp_path) -> None:
    m = model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [2])], [("y", FLOAT, [2])], opset=1,
              check=False)
    ir, _ = import_onnx(save(m, tmp_path / "opset1.onnx"))
    assert ops(ir) == ["aten.relu.default"]


def test_opset_999(tmp_path) -> None:
    m = model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [2])], [("y", FLOAT, [2])], opset=999,
              check=False)
    with pytest.raises(ExtractionError, match=r"opset999\.onnx: opset 999 is outside the supported range"):
        import_onnx(save(m, tmp_path / "opset999.onnx"))


def test_sparse_initializer_is_refused_clearly(tmp_path) -> None:
    values = numpy_helper.from_array(np.array([1.0], np.float32), "w")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([0], np.int64), ""), [4])
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", FLOAT, [4])], [("y", FLOAT, [4])],
              check=False)
    m.graph.sparse_initializer.append(sparse)
    with pytest.raises(ExtractionError, match=r"sparse\.onnx: sparse initializers"):
        import_onnx(save(m, tmp_path / "sparse.onnx"))


def test_input_dimension_over_the_limit(tmp_path) -> None:
    m = model([helper.make_node("Relu", ["x"], ["y"])], [("x", FLOAT, [2**50])], [("y", FLOAT, [2**50])])
    with pytest.raises(LimitExceededError, match=r"bigdim\.onnx: graph input 'x'.*limit"):
        import_onnx(save(m, tmp_path / "bigdim.onnx"))


# --------------------------------------------------------------------------------- tensors and files


def test_initializer_declaring_a_terabyte_of_external_data(tmp_path) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0" * 64)
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", FLOAT, [1])], [("y", FLOAT, HUGE)],
              [external_tensor("w", [10**6, 10**6], "w.bin")], check=False)
    with pytest.raises(LimitExceededError, match=r"tera\.onnx: initializer 'w' needs 3\.6 TiB.*limit"):
        import_onnx(save(m, tmp_path / "tera.onnx"))


def test_raw_data_shorter_than_the_dims(tmp_path) -> None:
    w = TensorProto(name="w", data_type=FLOAT, dims=[100_000], raw_data=b"\0" * 16)
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", FLOAT, [100_000])],
              [("y", FLOAT, [100_000])], [w], check=False)
    with pytest.raises(InvalidModelError, match=r"short\.onnx.*\bw\b.*(16 bytes|raw_data)"):
        import_onnx(save(m, tmp_path / "short.onnx"))


def test_raw_data_longer_than_the_dims_is_refused_by_the_importer_itself(tmp_path) -> None:
    """The checker only refuses short raw data; the importer wants exactly the declared bytes."""
    from torch_ir.frontends.onnx.loader import tensor_value

    w = TensorProto(name="w", data_type=FLOAT, dims=[2], raw_data=b"\0" * 4096)
    with pytest.raises(InvalidModelError, match=r"m\.onnx: initializer 'w' declares shape \[2\].*4096 bytes"):
        tensor_value(w, str(tmp_path), "m.onnx", "initializer 'w'")


@pytest.mark.parametrize("location", ["../../etc/passwd", "/etc/passwd", "sub/../../outside.bin"])
def test_external_data_outside_the_model_directory(tmp_path, location) -> None:
    """The defence reportedly held before this work (onnx.checker); it must keep holding."""
    (tmp_path / "outside.bin").write_bytes(b"\0" * 16)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    with pytest.raises(InvalidModelError, match=r"ext\.onnx.*(outside|relative|refused)"):
        import_onnx(save(external_model(location), model_dir / "ext.onnx"))
    with pytest.raises(InvalidModelError, match=r"(outside|relative|refused)"):
        import_onnx(external_model(location))  # a ModelProto: resolved against the working directory


def test_external_data_through_a_symbolic_link(tmp_path) -> None:
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    try:
        (model_dir / "w.bin").symlink_to(tmp_path / "secret.bin")
    except OSError:
        pytest.skip("no symbolic links here")
    with pytest.raises(InvalidModelError, match=r"link\.onnx.*(symbolic link|outside)"):
        import_onnx(save(external_model("w.bin"), model_dir / "link.onnx"))


def test_external_data_readers_refuse_escapes_themselves(tmp_path) -> None:
    """Defence in depth, without onnx.checker in front: the importer's own reader refuses a path outside
    the directory, a link, a FIFO (it would block) and sizes that disagree with the declared shape."""
    from torch_ir.frontends.onnx.loader import tensor_value

    (tmp_path / "outside.bin").write_bytes(b"\0" * 16)
    base = tmp_path / "model"
    base.mkdir()
    (base / "short.bin").write_bytes(b"\0" * 8)
    (base / "ok.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    (base / "link.bin").symlink_to(tmp_path / "outside.bin")
    os.mkfifo(base / "fifo.bin")
    refused = {
        "../outside.bin": "outside|refused", "/etc/passwd": "refused", "link.bin": "symbolic link",
        "fifo.bin": "not a regular file", "short.bin": "is 8 bytes", "missing.bin": "cannot open",
    }
    for location, words in refused.items():
        with pytest.raises(InvalidModelError, match=rf"m\.onnx: initializer 'w'.*({words})"):
            tensor_value(external_tensor("w", [4], location), str(base), "m.onnx", "initializer 'w'")
    with pytest.raises(InvalidModelError, match="length 8.*16 bytes"):
        tensor_value(external_tensor("w", [4], "ok.bin", length="8"), str(base), "m.onnx", "initializer 'w'")
    value = tensor_value(external_tensor("w", [4], "ok.bin", length="16"), str(base), "m.onnx", "initializer 'w'")
    assert value.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_external_data_shorter_than_the_dims(tmp_path) -> None:
    (tmp_path / "w.bin").write_bytes(b"\0" * 8)
    with pytest.raises(InvalidModelError, match=r"shortext\.onnx: initializer 'w'.*8 bytes.*16 bytes"):
        import_onnx(save(external_model("w.bin"), tmp_path / "shortext.onnx"))


def test_constant_attribute_with_external_data_outside(tmp_path) -> None:
    value = external_tensor("v", [4], "../../etc/passwd")
    m = model([helper.make_node("Constant", [], ["c"], value=value), helper.make_node("Add", ["x", "c"], ["y"])],
              [("x", FLOAT, [4])], [("y", FLOAT, [4])], check=False)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    with pytest.raises(InvalidModelError, match=r"const\.onnx.*(outside|refused)"):
        import_onnx(save(m, model_dir / "const.onnx"))


# ------------------------------------------------------------------------- constant folding limits


def test_constant_of_shape_over_the_fold_limit_stays_a_graph_node() -> None:
    with no_hang(5, "test_constant_of_shape_over_the_fold_limit_stays_a_graph_node"):
        ir, weights = import_onnx(constant_of_shape_model(BIG))
    full = next(n for n in ir.nodes if n.op_type == "aten.full.default")
    assert full.attrs["size"] == BIG and full.attrs["fill_value"] == 1.0
    assert largest_constant_bytes(ir, weights) < 1024
    ir, _ = import_onnx(constant_of_shape_model(BIG), reference_fallback=False)  # an ATen op: no fallback needed
    assert "aten.full.default" in ops(ir)


def test_constant_of_shape_of_37_gib(tmp_path) -> None:
    huge_model_outcome(save(constant_of_shape_model(), tmp_path / "cos37.onnx"), "aten.full.default")
    huge_model_outcome(constant_of_shape_model(), "aten.full.default", reference_fallback=False)


def test_huge_range_expand_and_tile_stay_graph_nodes() -> None:
    one = numpy_helper.from_array(np.ones((1, 1), np.float32), "one")
    expand = model([helper.make_node("Expand", ["one", "s"], ["e"]), helper.make_node("Add", ["x", "e"], ["y"])],
                   [("x", FLOAT, [1])], [("y", FLOAT, BIG)], [one, i64("s", BIG)])
    tile = model([helper.make_node("Tile", ["one", "s"], ["e"]), helper.make_node("Add", ["x", "e"], ["y"])],
                 [("x", FLOAT, [1])], [("y", FLOAT, BIG)], [one, i64("s", BIG)])
    huge_model_outcome(range_model(10**10), "aten.arange.start_step")
    for m, op in ((range_model(), "aten.arange.start_step"), (expand, "aten.expand.default"),
                  (tile, "aten.repeat.default")):
        with no_hang(5, "test_huge_range_expand_and_tile_stay_graph_nodes"):
            ir, weights = import_onnx(m)
        assert op in ops(ir)
        assert largest_constant_bytes(ir, weights) < 1024


def test_constant_over_the_fold_limit_with_no_graph_form_is_refused_with_the_limit(tmp_path) -> None:
    """EyeLike of a huge input stays an ONNX op; where ONNX ops are refused it cannot, and the error says why."""
    m = model([helper.make_node("EyeLike", ["x"], ["y"])], [("x", FLOAT, BIG)], [("y", FLOAT, BIG)])
    ir, _ = import_onnx(m)
    assert ops(ir) == ["onnx.EyeLike.default"]
    with pytest.raises(LimitExceededError, match=r"eye\.onnx: node 'EyeLike_0' \(EyeLike\).*max_fold_bytes"):
        import_onnx(save(m, tmp_path / "eye.onnx"), reference_fallback=False)


def test_the_fold_limit_is_applied_before_allocating_and_can_be_raised() -> None:
    """A 4 MiB constant folds by default, stays a node under a 1 MiB limit, folds again under 8 MiB."""
    m = constant_of_shape_model([1024, 1024])
    ir, weights = import_onnx(m)
    assert "aten.full.default" not in ops(ir) and largest_constant_bytes(ir, weights) == 4 << 20
    with limits(max_fold_bytes=1 << 20):
        ir, weights = import_onnx(m)
    assert "aten.full.default" in ops(ir) and largest_constant_bytes(ir, weights) < 1024
    with limits(max_fold_bytes=8 << 20):
        ir, _ = import_onnx(m)
    assert "aten.full.default" not in ops(ir)


def test_a_legitimately_large_constant_folds_under_a_raised_limit() -> None:
    shape = [4096, 8192]  # 128 MiB of float32: over the default 64 MiB
    assert 4096 * 8192 * 4 > get_limits().max_fold_bytes
    ir, weights = import_onnx(constant_of_shape_model(shape))
    assert "aten.full.default" in ops(ir)
    with limits(max_fold_bytes=256 << 20):
        ir, weights = import_onnx(constant_of_shape_model(shape))
    assert "aten.full.default" not in ops(ir)
    (constant,) = [t for t in weights.values() if t.numel() == 4096 * 8192]
    assert constant.shape == torch.Size(shape) and bool((constant == 1).all())


def test_shape_inference_data_propagation_bomb_is_skipped() -> None:
    m = data_prop_bomb_model()
    assert "10000000" in (data_propagation_risk(onnx.shape_inference.infer_shapes(m).graph) or "")
    with no_hang(5, "test_shape_inference_data_propagation_bomb_is_skipped"):
        ir, _ = import_onnx(m)
    assert ir.graph_inputs[0].shape == [10**9]


def test_data_propagation_is_kept_for_ordinary_shape_arithmetic() -> None:
    from tests.onnx.graphs import reshape_by_shape_model

    m = reshape_by_shape_model(batch="N")
    assert data_propagation_risk(onnx.shape_inference.infer_shapes(m).graph) is None


def test_symbolic_size_expressions_do_not_double_without_bound() -> None:
    """``s = s * s`` forty times would make a size expression of 2**40 characters."""
    nodes = [helper.make_node("Shape", ["x"], ["s0"])]
    for k in range(40):
        nodes.append(helper.make_node("Mul", [f"s{k}", f"s{k}"], [f"s{k + 1}"]))
    nodes.append(helper.make_node("Cast", ["s40"], ["y"], to=FLOAT))
    m = model(nodes, [("x", FLOAT, ["n"])], [("y", FLOAT, [1])])
    with no_hang(10, "test_symbolic_size_expressions_do_not_double_without_bound"):
        try:
            import_onnx(m)
        except TorchIRError:
            pass  # refusing is fine; hanging or exhausting memory is not


def test_dropout_mask_of_a_huge_input_is_not_materialized() -> None:
    m = model([helper.make_node("Dropout", ["x"], ["y", "mask"])], [("x", FLOAT, BIG)],
              [("y", FLOAT, BIG), ("mask", BOOL, BIG)])
    ir, weights = import_onnx(m)
    assert "aten.full.default" in ops(ir) and largest_constant_bytes(ir, weights) < 1024


# ------------------------------------------------------------------- memory, in a fresh interpreter

CHILD = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    import torch_ir
    from torch_ir.frontends.onnx import import_onnx

    def status(field):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) << 10
        return 0

    # a regression must fail with MemoryError here, not take the machine: at most 4 GiB more address space
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = status("VmSize") + (4 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    try:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    except OSError:
        pass
    before = status("VmRSS")
    try:
        ir, weights = import_onnx(sys.argv[1])
        error, ops = None, [n.op_type for n in ir.nodes]
    except Exception as e:
        error, ops = f"{type(e).__name__}: {e}", []
    print(json.dumps({"growth": status("VmHWM") - before,
                      "error": error, "ops": ops}))
""")


def run_child(path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=300,
                          env=env, cwd=path.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak RSS from /proc (Linux)")
@pytest.mark.parametrize("build, op", [
    (constant_of_shape_model, "aten.full.default"),
    (lambda: constant_of_shape_model(BIG), "aten.full.default"),
    (lambda: range_model(10**10), "aten.arange.start_step"),
    (data_prop_bomb_model, "aten.neg.default"),
])
def test_tiny_files_asking_for_huge_memory_stay_small(tmp_path, build, op) -> None:
    """Imported as graph nodes, or refused for the allocation limit: under 1 GiB either way (the child's
    run_child timeout is the hang guard)."""
    path = save(build(), tmp_path / "tiny.onnx")
    assert path.stat().st_size < 1024
    result = run_child(path)
    if result["error"] is not None:
        assert result["error"].startswith("LimitExceededError") and "tiny.onnx" in result["error"], result
    else:
        assert op in result["ops"], result
    assert result["growth"] < GiB, result


# ---------------------------------------------------------------------------------- the command line


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    code = torch_ir_main(argv)
    return code, capsys.readouterr().err


def test_command_line_reports_hostile_files_in_one_line(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "random.onnx").write_bytes(np.random.default_rng(1).bytes(1000))
    save(model([helper.make_node("Relu", ["nowhere"], ["y"])], [("x", FLOAT, [1])], [("y", FLOAT, [1])],
               check=False), tmp_path / "undefined.onnx")
    save(external_model("../../etc/passwd"), tmp_path / "escape.onnx")
    (tmp_path / "deep.onnx").write_bytes(nested_if_bytes(10_000))
    (tmp_path / "w.bin").write_bytes(b"\0" * 64)
    save(model([helper.make_node("Add", ["x", "w"], ["y"])], [("x", FLOAT, [1])], [("y", FLOAT, HUGE)],
               [external_tensor("w", [10**6, 10**6], "w.bin")], check=False), tmp_path / "tera.onnx")
    names = ["empty.onnx", "random.onnx", "undefined.onnx", "escape.onnx", "deep.onnx", "tera.onnx", "missing.onnx"]
    for name in names:
        for command in (["import-onnx", name, "-o", "out.json"], ["verify-onnx", name]):
            code, err = _cli(command, capsys)
            assert code == 2, (command, err)
            lines = err.strip().splitlines()
            assert len(lines) == 1 and "error:" in lines[0] and name in lines[0], (command, err)
            assert "Traceback" not in err and "internal error" not in err
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "out.safetensors").exists()


def test_verify_onnx_refuses_to_run_a_tensor_over_the_allocation_limit(tmp_path, capsys, monkeypatch) -> None:
    """The import keeps the 37 GiB constant a graph node; running it (onnxruntime, the executor) would allocate
    it, so verify-onnx refuses before running."""
    monkeypatch.chdir(tmp_path)
    save(constant_of_shape_model(), tmp_path / "cos.onnx")
    code, err = _cli(["verify-onnx", "cos.onnx"], capsys)
    assert code == 2 and "cos.onnx" in err and "limit" in err, err


# ------------------------------------------------------------- onnx.* nodes of a hostile IR file


def test_onnx_reference_ops_check_their_bookkeeping_and_output_sizes() -> None:
    from torch_ir.frontends.onnx.custom_ops import run_reference

    x = torch.ones(2)
    with pytest.raises(IRValidationError, match="num_outputs"):
        run_reference("", "Relu", x, opset=17, num_outputs=10**12)
    with pytest.raises(IRValidationError, match="input_slots"):
        run_reference("", "Relu", x, opset=17, input_slots=[10**12])
    with pytest.raises(IRValidationError, match="tensor attribute"):
        run_reference("", "ConstantOfShape", torch.tensor([2]), opset=17,
                      value=("tensor", "V1000000000", (1,), (0,)))
    with pytest.raises(LimitExceededError, match="ConstantOfShape"):
        run_reference("", "ConstantOfShape", torch.tensor(HUGE * 2), opset=17)
    (y,) = run_reference("", "ConstantOfShape", torch.tensor([2, 3]), opset=17)
    assert y.shape == (2, 3)
