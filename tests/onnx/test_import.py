"""import_onnx on small graphs: folding, symbols, external data, opsets, errors; outputs vs onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from onnx.reference import ReferenceEvaluator

pytest.importorskip("onnxruntime")

from tests.helpers import assert_outputs_close  # noqa: E402
from tests.onnx.graphs import FLOAT, make_model, ort_run, reshape_by_shape_model  # noqa: E402
from torch_ir import IRExecutor, UnsupportedOpError, load_ir, save_weights  # noqa: E402
from torch_ir.frontends.onnx import InvalidModelError, import_onnx, load_model, register_onnx_ops  # noqa: E402
from torch_ir.ops.registry import unregister_op  # noqa: E402


def test_shape_subgraph_folds_to_a_static_reshape() -> None:
    model = reshape_by_shape_model()
    ir, weights = import_onnx(model)
    assert [n.op_type for n in ir.nodes] == ["aten.convolution.default", "aten.relu.default", "aten.reshape.default"]
    assert ir.nodes[-1].attrs["shape"] == [2, -1]
    assert {w.name for w in ir.weights} == {"w", "b"}  # initializers keep their ONNX names
    x = torch.randn(2, 3, 8, 8)
    assert_outputs_close(IRExecutor(ir, weights).run([x]), ort_run(model, [x]))


def test_symbolic_batch_stays_a_symbol_and_runs_at_any_size() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"], axis=-1)]
    w = np.random.default_rng(1).standard_normal((4, 5), dtype=np.float32)
    model = make_model(nodes, [("x", FLOAT, ["batch", 4])], [("y", FLOAT, ["batch", 5])], {"w": w})
    ir, weights = import_onnx(model)
    assert ir.graph_inputs[0].shape == ["batch", 4] and ir.graph_outputs[0].shape == ["batch", 5]
    assert "batch" in ir.symbols
    executor = IRExecutor(ir, weights)
    for n in (1, 7):
        x = torch.randn(n, 4)
        assert_outputs_close(executor.run([x]), ort_run(model, [x]))


def test_input_shapes_binds_symbols_so_shape_arithmetic_folds() -> None:
    model = reshape_by_shape_model(batch="N")
    ir, weights = import_onnx(model, input_shapes={"x": [3, 3, 8, 8]})
    assert ir.graph_inputs[0].shape == [3, 3, 8, 8] and not ir.symbols
    assert all(n.op_type.startswith("aten.") for n in ir.nodes)
    x = torch.randn(3, 3, 8, 8)
    assert_outputs_close(IRExecutor(ir, weights).run([x]), ort_run(model, [x]))


def test_shape_arithmetic_on_symbols_folds_to_symbolic_attributes() -> None:
    model = reshape_by_shape_model(batch="N")
    ir, weights = import_onnx(model, reference_fallback=False)
    assert ir.graph_inputs[0].shape == ["N", 3, 8, 8] and "N" in ir.symbols
    assert ir.nodes[-1].op_type == "aten.reshape.default" and ir.nodes[-1].attrs["shape"] == [{"sym": "N"}, -1]
    executor = IRExecutor(ir, weights)
    for n in (1, 3):
        x = torch.randn(n, 3, 8, 8)
        assert_outputs_close(executor.run([x]), ort_run(model, [x]))


def test_data_dependent_shapes_are_reported_when_onnx_ops_are_refused() -> None:
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]), helper.make_node("Shape", ["nz"], ["s"]),
             helper.make_node("Reshape", ["x", "s"], ["y"])]
    model = make_model(nodes, [("x", FLOAT, [2, 1])], [("y", FLOAT, [2, 1])])
    with pytest.raises(UnsupportedOpError, match=r"NonZero_0': ai.onnx::NonZero \(opset 17\)"):
        import_onnx(model, reference_fallback=False)


def test_external_data_model_from_path(tmp_path) -> None:
    model = reshape_by_shape_model()
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
              size_threshold=256)  # the conv weight goes out; onnxruntime wants shape inputs inline
    assert (tmp_path / "weights.bin").is_file()
    # the graph is loaded without its external data (models over 2 GB are read a tensor at a time)
    assert load_model(path).model.graph.initializer[0].data_location == onnx.TensorProto.EXTERNAL
    ir, weights = import_onnx(path)
    x = torch.randn(2, 3, 8, 8)
    assert_outputs_close(IRExecutor(ir, weights).run([x]), ort_run(str(path), [x]))


@pytest.mark.parametrize("trans_a, trans_b, alpha, beta", [(0, 0, 1.0, 1.0), (1, 0, 0.5, 2.0), (0, 1, 1.0, 1.0),
                                                           (1, 1, 2.0, 0.0)])
def test_gemm_with_its_transposes(trans_a, trans_b, alpha, beta) -> None:
    rng = np.random.default_rng(2)
    a_shape, b_shape = ([4, 3] if trans_a else [3, 4]), ([5, 4] if trans_b else [4, 5])
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=trans_a, transB=trans_b, alpha=alpha, beta=beta)
    inits = {"b": rng.standard_normal(b_shape, dtype=np.float32), "c": rng.standard_normal(5, dtype=np.float32)}
    model = make_model([node], [("a", FLOAT, a_shape)], [("y", FLOAT, [3, 5])], inits)
    ir, weights = import_onnx(model)
    a = torch.randn(*a_shape)
    assert_outputs_close(IRExecutor(ir, weights).run([a]), ort_run(model, [a]))
    if trans_b and not trans_a:
        assert [n.op_type for n in ir.nodes] == ["aten.linear.default"]


def test_old_opset_is_converted_into_the_supported_range() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])]
    model = make_model(nodes, [("x", FLOAT, [2, 3])], [("y", FLOAT, [2, 3])], opset=6)
    ir, weights = import_onnx(model)
    assert ir.producer["opset"] == "7"
    x = torch.randn(2, 3)
    # onnxruntime has no opset-6 kernels; the ONNX reference implementation runs every opset
    expected = ReferenceEvaluator(model).run(None, {"x": x.numpy()})
    assert_outputs_close(IRExecutor(ir, weights).run([x]), [torch.from_numpy(e) for e in expected])


def test_invalid_model_gets_the_checker_message_and_the_file(tmp_path) -> None:
    model = reshape_by_shape_model()
    model.graph.node[0].input[1] = "no_such_tensor"
    path = tmp_path / "broken.onnx"
    onnx.save(model, str(path))
    with pytest.raises(InvalidModelError, match=r"broken\.onnx.*no_such_tensor"):
        import_onnx(path)


def test_all_unsupported_ops_are_listed_at_once() -> None:
    nodes = [helper.make_node("Foo", ["x"], ["a"], domain="com.example", name="foo_1"),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Bar", ["r"], ["b"], domain="com.example", name="bar_1"),
             helper.make_node("Add", ["a", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", FLOAT, [2])],
                              [helper.make_tensor_value_info("y", FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(UnsupportedOpError) as info:
        import_onnx(model)
    text = str(info.value)
    assert "node 'foo_1': com.example::Foo (opset 1)" in text and "node 'bar_1': com.example::Bar (opset 1)" in text
    assert "Add" not in text.split("\n", 1)[1]  # a node fed by unsupported ones is not listed as another problem


def test_ops_without_aten_form_stay_onnx_ops_and_survive_a_save(tmp_path) -> None:
    node = helper.make_node("LpPool", ["x"], ["y"], kernel_shape=[2], p=2)
    model = make_model([node], [("x", FLOAT, [1, 2, 4])], [("y", FLOAT, [1, 2, 3])])
    with pytest.raises(UnsupportedOpError, match="LpPool"):
        import_onnx(model, reference_fallback=False)
    ir, weights = import_onnx(model)
    assert [n.op_type for n in ir.nodes] == ["onnx.LpPool.default"]
    assert ir.metadata["onnx_ops_kept"] == {"LpPool_0": "LpPool: no ATen converter"}
    ir.save(str(tmp_path / "ir.json"))
    save_weights(weights, tmp_path / "w.safetensors")
    x = torch.randn(1, 2, 4)
    unregister_op("onnx.LpPool.default")  # as in a fresh process that only loads the IR
    loaded = load_ir(str(tmp_path / "ir.json"))
    out = IRExecutor(loaded, str(tmp_path / "w.safetensors")).run([x])  # registered on first use
    assert_outputs_close(out, ort_run(model, [x]))
    assert register_onnx_ops(loaded) == ["onnx.LpPool.default"]
