"""The tinygrad importer against tinygrad itself: op lists that read like the model, outputs equal to tinygrad's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tinygrad.nn.state import get_state_dict
from tinygrad.tensor import Tensor

import torch_ir
from npu_compiler.passes import normalize
from torch_ir.errors import ExtractionError
from torch_ir.frontends.tinygrad import import_tinygrad

from ..helpers import assert_outputs_close
from .models import CNN, LLAMA_CONFIG, MLP, LlamaBlock, TinyLlama, add_mul, realize_weights, rotary_tables

RNG = np.random.default_rng(0)


def _tensor(*shape: int) -> Tensor:
    return Tensor(RNG.standard_normal(shape).astype(np.float32))


def _ops(ir: torch_ir.NPU_IR) -> list[str]:
    return [n.op_type.split(".")[1] for n in ir.nodes]


def _check(model, inputs: list[Tensor], tmp_path=None, **kwargs) -> torch_ir.NPU_IR:
    """Import (then save and reload), run with the returned weights; compare with tinygrad's own result."""
    ir, weights = import_tinygrad(model, inputs, **kwargs)
    if tmp_path is not None:
        ir.save(str(tmp_path / "ir.json"))
        ir = torch_ir.load_ir(str(tmp_path / "ir.json"))
    actual = torch_ir.IRExecutor(ir, {k: torch.from_numpy(v) for k, v in weights.items()}).run(
        [torch.from_numpy(x.numpy()) for x in inputs])
    out = model(*inputs)
    expected = [torch.from_numpy(o.numpy()) for o in (out if isinstance(out, (tuple, list)) else [out])]
    assert_outputs_close(actual, expected)
    npu_ir = normalize(ir)  # normalization keeps the numbers on tinygrad's graphs too (issue 5)
    normalized = torch_ir.IRExecutor(npu_ir, {k: torch.from_numpy(v) for k, v in weights.items()}).run(
        [torch.from_numpy(x.numpy()) for x in inputs])
    assert_outputs_close(normalized, expected)
    return ir


def test_seed_001_a_times_b_plus_c(tmp_path):
    a, b, c = _tensor(2, 3), _tensor(2, 3), _tensor(2, 3)
    ir = _check(add_mul, [a, b, c], input_names=["a", "b", "c"])
    assert _ops(ir) == ["mul", "add"]
    assert [t.name for t in ir.graph_inputs] == ["a", "b", "c"]
    assert ir.producer["frontend"] == "tinygrad" and not ir.weights
    ir.save(str(tmp_path / "abc.json"))
    assert _ops(torch_ir.load_ir(str(tmp_path / "abc.json"))) == ["mul", "add"]


def test_mlp_linear_is_one_op_and_weights_are_named_by_path():
    model = realize_weights(MLP())
    ir = _check(model, [_tensor(3, 16)])
    assert _ops(ir) == ["linear", "relu", "linear", "relu", "linear"]
    assert sorted(ir.weight_name_mapping.values()) == sorted(get_state_dict(model))


def test_mlp_without_linear_folding_is_matmul_plus_add():
    from torch_ir.frontends.tinygrad.rules import contraction_rules, shape_rules

    model = realize_weights(MLP((4, 3)))
    ir, _ = import_tinygrad(model, [_tensor(2, 4)], simplify=False)
    assert "matmul" not in _ops(ir) and len(ir.nodes) > 6  # the literal translation: views, mul, sum
    from torch_ir.frontends.tinygrad.rules import simplify_ir

    assert _ops(simplify_ir(ir, shape_rules() + contraction_rules())) == ["permute", "matmul", "add"]


def test_weight_free_import_of_empty_weights():
    model = MLP((8, 4))
    for t in get_state_dict(model).values():
        t.replace(Tensor.empty(*t.shape))
    ir, weights = import_tinygrad(model, [Tensor.empty(2, 8)])
    assert weights == {} and _ops(ir) == ["linear"]
    assert {w.name: w.shape for w in ir.weights} == {"w_layers_0_weight": [4, 8], "w_layers_0_bias": [4]}


def test_cnn_with_batchnorm_pooling_and_head(tmp_path):
    Tensor.training = False  # BatchNorm uses its running statistics
    ir = _check(realize_weights(CNN()), [_tensor(2, 3, 8, 8)], tmp_path)
    # (x - mean) * weight * rsqrt(var + eps) + bias, as tinygrad's BatchNorm writes it
    batch_norm = ["reshape", "sub", "reshape", "mul", "reshape", "add", "rsqrt", "mul", "reshape", "add"]
    assert _ops(ir) == ["conv2d", *batch_norm, "relu", "max_pool2d", "conv2d", "relu", "avg_pool2d", "reshape",
                        "linear"]
    pools = [n.attrs for n in ir.nodes if "pool" in n.op_type]
    assert pools == [{"kernel_size": [2, 2], "stride": [2, 2]}] * 2


@pytest.mark.slow
def test_llama_block(tmp_path):
    """Written the ordinary way: its Linear weights stay lazy until the importer realizes them."""
    block = LlamaBlock()
    cos, sin = rotary_tables(8, 16)
    ir = _check(block, [_tensor(1, 6, 32), cos[:6].contiguous().realize(), sin[:6].contiguous().realize()], tmp_path)
    assert sorted(ir.weight_name_mapping.values()) == sorted(get_state_dict(block))
    hist = ir.op_histogram()
    assert hist["aten.linear.default"] == 7  # q, k, v, o and the three of the gated MLP
    assert hist["aten.matmul.default"] == 2  # scores and the weighted sum of values
    assert hist["aten._softmax.default"] == 1 and hist["aten.silu.default"] == 1


@pytest.mark.slow
def test_llama_block_compiles_whole_and_runs_equal_to_tinygrad():
    """Its causal mask fills with -inf through a scalar_tensor: a fill kernel, not a refusal."""
    from npu_compiler import compile as compile_ir
    from npu_runtime import Device, Executor, load_weights

    block = realize_weights(LlamaBlock())
    cos, sin = rotary_tables(8, 16)
    inputs = [_tensor(1, 6, 32), cos[:6].contiguous().realize(), sin[:6].contiguous().realize()]
    ir, weights = import_tinygrad(block, inputs)
    program = compile_ir(ir)  # strict: every node has a kernel
    device = Device()
    outputs = Executor(program, device).run(
        {spec.name: x.numpy() for spec, x in zip(program.input_specs, inputs)},
        weights=load_weights({k: torch.from_numpy(v) for k, v in weights.items()}, program, device))
    actual = [torch.from_numpy(outputs[spec.name].to_numpy()) for spec in program.output_specs]
    assert_outputs_close(actual, [torch.from_numpy(block(*inputs).numpy())])


@pytest.mark.slow
def test_tiny_llama_end_to_end(tmp_path):
    """Import only (IR executor, saved and reloaded); test_llama_end_to_end.py compiles and runs it."""
    model = realize_weights(TinyLlama(**LLAMA_CONFIG))
    tokens = Tensor(RNG.integers(0, LLAMA_CONFIG["vocab"], (1, 5)).astype(np.int32))
    ir = _check(model, [tokens], tmp_path)
    assert ir.op_histogram()["aten.linear.default"] == 2 * 7 + 1


def test_randomness_in_the_graph_says_to_realize_the_weights():
    """Randomness in forward is not a weight: the message says to keep it out, not to realize weights."""
    with pytest.raises(ExtractionError, match=r"THREEFRY.*generated in the model's forward.*keep randomness "
                                              r"out of forward") as info:
        import_tinygrad(lambda x: x + Tensor.rand(*x.shape), [_tensor(2, 2)])
    assert "realize the weights" not in str(info.value)


# -- models written the ordinary way: lazily initialized weights, never realized by the user ---------------

def _assert_weights_are_the_models(model, weights: dict[str, np.ndarray]) -> None:
    """The returned weights are every state-dict tensor, and the very values the model now holds."""
    state = get_state_dict(model)
    assert sorted(weights) == sorted(state)
    for key, t in state.items():
        assert t.uop.has_buffer_identity(), f"{key} was left lazy"
        np.testing.assert_array_equal(weights[key], t.numpy(), err_msg=key)


def test_lazy_mlp_imports_and_equals_its_own_forward():
    model = MLP((8, 16, 4))
    assert not any(t.uop.has_buffer_identity() for t in get_state_dict(model).values())  # really lazy
    ir = _check(model, [_tensor(3, 8)])  # _check calls the model after the import: same weights, same output
    assert _ops(ir) == ["linear", "relu", "linear"]
    _, weights = import_tinygrad(model, [_tensor(3, 8)])
    _assert_weights_are_the_models(model, weights)
    assert np.abs(weights["layers.0.weight"]).max() > 0  # tinygrad's random init, not zeros


def test_lazy_cnn_with_batchnorm_imports(tmp_path):
    Tensor.training = False
    model = CNN()
    ir = _check(model, [_tensor(2, 3, 8, 8)], tmp_path)
    assert _ops(ir)[0] == "conv2d" and "max_pool2d" in _ops(ir) and _ops(ir)[-1] == "linear"
    assert {"bn1.running_mean", "bn1.running_var", "conv2.weight"} <= set(ir.weight_name_mapping.values())


def test_lazy_weights_are_realized_once():
    """A second import reads the same values: the importer realizes in place, it does not re-draw."""
    model = MLP((4, 3))
    _, first = import_tinygrad(model, [_tensor(2, 4)])
    _, second = import_tinygrad(model, [_tensor(2, 4)])
    for key in first:
        np.testing.assert_array_equal(first[key], second[key], err_msg=key)


def test_lazy_embedding_imports():
    from tinygrad.nn import Embedding

    table = Embedding(10, 4)
    ir = _check(table, [Tensor(np.array([[1, 7, 7, 0]], dtype=np.int32))])
    assert list(ir.weight_name_mapping.values()) == ["weight"]


def test_a_random_tensor_kept_as_an_attribute_is_a_weight():
    class Noisy:
        def __init__(self):
            self.noise = Tensor.rand(2, 3)  # lazy THREEFRY, but reachable from the state dict

        def __call__(self, x: Tensor) -> Tensor:
            return x + self.noise

    model = Noisy()
    ir = _check(model, [_tensor(2, 3)])
    assert _ops(ir) == ["add"] and list(ir.weight_name_mapping.values()) == ["noise"]


def test_empty_weights_stay_weight_free_beside_lazy_ones():
    model = MLP((4, 3))
    layer = model.layers[0]
    layer.weight = Tensor.empty(3, 4)  # declared without data; the bias stays a lazy random init
    ir, weights = import_tinygrad(model, [_tensor(2, 4)])
    assert sorted(ir.weight_name_mapping.values()) == ["layers.0.bias", "layers.0.weight"]
    assert list(weights) == ["layers.0.bias"]


def test_buffers_outside_the_state_dict_become_weights_too():
    hidden = {"empty": Tensor.empty(2, 2), "real": _tensor(2, 2).realize()}  # not attributes: no state-dict path
    x = _tensor(2, 2)
    ir, weights = import_tinygrad(lambda x: x * hidden["empty"] + hidden["real"], [x])
    assert sorted(ir.weight_name_mapping.values()) == ["buffer", "buffer_1"]
    assert list(weights) == ["buffer_1"]  # only the realized one has data
    np.testing.assert_array_equal(weights["buffer_1"], hidden["real"].numpy())


def test_an_unknown_uop_kind_is_named_with_its_position_and_the_fix():
    with pytest.raises(ExtractionError, match=r"MULACC x1, first at UOp #\d+ MULACC.*add one to TABLE"):
        from tinygrad.uop.ops import Ops, UOp

        a = _tensor(2)
        import_tinygrad(lambda a: Tensor(UOp(Ops.MULACC, a.uop.dtype, (a.uop, a.uop, a.uop))), [a])


def test_input_names_never_collide_with_generated_names():
    x, c = _tensor(2, 3), _tensor(2, 3)
    ir = _check(lambda x, c: (x + 1.0) * c, [x, c], input_names=["add", "c"])
    assert _ops(ir) == ["add", "mul"] and len({t.name for t in ir.tensors()}) == len(list(ir.tensors()))


def test_same_tensor_twice_is_refused():
    x = _tensor(2)
    with pytest.raises(ExtractionError, match="same tensor is passed as two example inputs"):
        import_tinygrad(lambda a, b: a + b, [x, x])


def test_deep_graph_needs_no_recursion():
    def deep(x):
        for _ in range(3000):
            x = x + 1.0
        return x

    ir, _ = import_tinygrad(deep, [_tensor(2)], simplify=False)
    assert len(ir.nodes) == 3000


def test_a_reshaped_one_dimensional_input_stays_an_input():
    x = _tensor(6)
    ir = _check(lambda x: x.reshape(2, 3) * 2.0, [x])
    assert _ops(ir) == ["reshape", "mul"] and not ir.weights


def test_numpy_data_made_in_forward_becomes_a_weight_with_its_values():
    table = np.arange(3, dtype=np.float32)
    x = _tensor(2, 3)
    ir = _check(lambda x: x + Tensor(table), [x])
    assert _ops(ir) == ["add"] and [w.shape for w in ir.weights] == [[3]]


# -- tinygrad's spellings of an LLM's pieces read as torch.export writes them (seed 001's end to end) ------

NORM_IDIOMS = [
    ("mean", lambda x: x.mean(axis=1), ["mean"]),
    ("neg", lambda x: -x, ["neg"]),
    ("rsqrt", lambda x: (x * x + 1).rsqrt(), ["mul", "add", "rsqrt"]),  # a product not summed stays a mul
    ("sum_of_squares", lambda x: x.square().sum(-1), ["pow", "sum"]),
    ("variance", lambda x: (x - x.mean(-1, keepdim=True)).square().mean(-1), ["mean", "sub", "pow", "mean"]),
]


@pytest.mark.parametrize("name, fn, ops", NORM_IDIOMS, ids=[c[0] for c in NORM_IDIOMS])
def test_norm_idioms(name, fn, ops):
    ir = _check(fn, [_tensor(2, 3, 4)])
    assert _ops(ir) == ops


def test_rms_norm_normalizes_to_one_op():
    """tinygrad's RMSNorm: x * rsqrt(mean(x * x) + eps) * w -> pow, mean, add, rsqrt, mul, mul -> RMS_NORM."""
    from tinygrad.nn import RMSNorm

    norm = realize_weights(RMSNorm(8, eps=1e-5))
    ir = _check(norm, [_tensor(2, 5, 8)])
    assert _ops(ir) == ["pow", "mean", "add", "rsqrt", "mul", "mul"]
    (node,) = normalize(ir).nodes
    assert node.op_type == "RMS_NORM" and node.attrs["eps"] == pytest.approx(1e-5)


def test_attention_keeps_its_head_axes_and_fuses():
    """q @ kᵀ of (1, H, T, D) heads stays a 4-D matmul of a transposed key (GQA's repeat_interleave
    before it), so the normalization passes find the projections, the rotations and the attention."""
    from .models import Attention

    attention = realize_weights(Attention(16, n_heads=4, n_kv_heads=2, rope="half"))
    cos, sin = rotary_tables(4, 16, halves=True)
    inputs = [_tensor(1, 5, 16), cos[:5].contiguous().realize(), sin[:5].contiguous().realize()]
    ir = _check(attention, inputs)
    matmuls = [n for n in ir.nodes if n.op_type == "aten.matmul.default"]
    assert [n.outputs[0].shape for n in matmuls] == [[1, 4, 5, 5], [1, 4, 5, 4]]
    assert _ops(ir).count("linear") == 4 and ir.nodes[-1].inputs[0].shape == [1, 5, 16]  # wo reads merged heads
    hist = normalize(ir).op_histogram()
    assert hist["QKV_PROJ"] == 1 and hist.get("ROPE", 0) + 2 * hist.get("ROPE_QK", 0) == 2
    assert hist.get("ATTENTION", 0) + hist.get("ATTN_SCORE", 0) == 1 and "aten.matmul.default" not in hist


def test_kwargs_are_python_values_of_the_call():
    class Offset:
        def __init__(self):
            self.table = Tensor(np.arange(8, dtype=np.float32)).realize()

        def __call__(self, x: Tensor, start_pos: int = 0) -> Tensor:
            return x + self.table[start_pos:start_pos + x.shape[0]]

    model, x = Offset(), _tensor(3)
    ir, weights = import_tinygrad(model, [x], kwargs={"start_pos": 2})
    (sl,) = [n for n in ir.nodes if n.op_type == "aten.slice.Tensor"]
    assert (sl.attrs["start"], sl.attrs["end"]) == (2, 5) and [t.name for t in ir.graph_inputs] == ["input_0"]
    (y,) = torch_ir.IRExecutor(ir, {k: torch.from_numpy(v) for k, v in weights.items()}).run(
        [torch.from_numpy(x.numpy())])
    np.testing.assert_allclose(y.numpy(), model(x, start_pos=2).numpy())
    with pytest.raises(ExtractionError, match=r"kwargs \['start_pos'\] are tensors"):
        import_tinygrad(model, [x], kwargs={"start_pos": Tensor([2])})
