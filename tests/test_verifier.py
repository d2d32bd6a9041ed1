"""The verifier: passes honest IRs, fails corrupted ones and names the node that was corrupted.

Every expectation comes from eager PyTorch or from the IR's own structure, never from numbers
the verifier printed.
"""

from __future__ import annotations

import copy

import pytest
import torch

import torch_ir
from torch_ir.errors import WeightsMismatchError
from torch_ir.ops import unregister_op
from torch_ir.verify import (
    DEFAULT_TOLERANCES,
    compare_tensors,
    default_tolerance,
    tolerance_for,
    verify_ir,
    verify_ir_with_state_dict,
)


class Net(torch.nn.Module):
    """Linear, ReLU, LayerNorm, an add, and a second (max) output with an int64 part."""

    def __init__(self, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.fc = torch.nn.Linear(4, 8, dtype=dtype)
        self.ln = torch.nn.LayerNorm(8, dtype=dtype)
        self.register_buffer("scale", torch.full((8,), 2.0, dtype=dtype), persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        h = torch.relu(self.fc(x))
        y = self.ln(h) * self.scale + x.sum(-1, keepdim=True)
        return y, h.max(-1)


class Counter(torch.nn.Module):
    """Writes a buffer in place in forward, as a KV cache or a step counter does."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps.add_(1)
        return self.fc(x) * self.steps


def extract_and_build(cls=Net, *args, inputs=None, **extract_kwargs):
    """(IR extracted on meta, a real copy with seeded weights, test inputs)."""
    x = inputs if inputs is not None else torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    with torch.device("meta"):
        meta = cls(*args)
    ir = torch_ir.extract_ir(meta, (x,), **extract_kwargs)
    torch.manual_seed(0)
    return ir, cls(*args).eval(), x


def node_of(ir, op_type: str, index: int = 0):
    return [n for n in ir.nodes if n.op_type == op_type][index]


@pytest.fixture
def broken_relu():
    """The reference implementation of relu with a sign bug (abs), unregistered afterwards."""
    torch_ir.register_op("aten.relu.default", override=True)(lambda x: x.abs())
    yield
    unregister_op("aten.relu.default")


# -- passing -------------------------------------------------------------------------------------

def test_passes_on_small_model():
    ir, model, x = extract_and_build()
    ok, report = verify_ir(ir, model.state_dict() | {"scale": model.scale}, model, (x,))
    assert ok and report.ok, report.to_text()
    assert [d.name for d in report.outputs] == [t.name for t in ir.graph_outputs]
    expected = torch.utils._pytree.tree_leaves(model(x))
    assert [d.shape for d in report.outputs] == [list(t.shape) for t in expected]
    assert report.localization is None
    assert "PASS" in str(report)


def test_state_dict_without_non_persistent_buffers():
    ir, model, x = extract_and_build()
    assert "scale" not in model.state_dict()  # the gap verify_ir_with_state_dict fills
    with pytest.raises(WeightsMismatchError, match="scale"):
        verify_ir(ir, model.state_dict(), model, (x,))
    ok, report = verify_ir_with_state_dict(ir=ir, state_dict=model.state_dict(), original_model=model, test_inputs=(x,))
    assert ok, report.to_text()


def test_weights_default_to_the_models_own():
    ir, model, x = extract_and_build()
    ok, _ = verify_ir(ir, None, model, x)  # a bare tensor is one positional input
    assert ok


def test_model_state_and_mode_are_left_as_found():
    ir, model, x = extract_and_build(Counter)
    model.train()
    ok, report = verify_ir(ir, None, model, (x,))
    assert ok, report.to_text()
    assert model.training
    assert model.steps.item() == 0  # the eager run's in-place update was undone


def test_keyword_inputs_in_any_order():
    class TwoInputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x, scale=None, shift=None):
            return self.fc(x) * scale - shift

    x, scale, shift = torch.randn(2, 4), torch.randn(2, 4), torch.randn(2, 4)
    with torch.device("meta"):
        meta = TwoInputs()
    ir = torch_ir.extract_ir(meta, (x,), example_kwargs={"scale": scale, "shift": shift})
    model = TwoInputs()
    ok, report = verify_ir(ir, None, model, (x,), test_kwargs={"shift": shift, "scale": scale})
    assert ok, report.to_text()


def test_dtype_tolerance_is_reported_per_output():
    ir, model, x = extract_and_build(Net, torch.bfloat16, inputs=torch.randn(3, 4).to(torch.bfloat16))
    ok, report = verify_ir(ir, None, model, (x,))
    assert ok, report.to_text()
    y, values, indices = report.outputs
    assert (y.dtype, (y.rtol, y.atol)) == ("bfloat16", DEFAULT_TOLERANCES[torch.bfloat16])
    assert (indices.dtype, indices.rtol, indices.atol) == ("int64", 0.0, 0.0)


# -- failing and localizing ------------------------------------------------------------------------

def test_wrong_kernel_fails_and_names_its_node(broken_relu):
    ir, model, x = extract_and_build()
    ok, report = verify_ir(ir, None, model, (x,))
    assert not ok and not report.ok
    loc = report.localization
    relu = node_of(ir, "aten.relu.default")
    assert (loc.node, loc.op_type) == (relu.name, "aten.relu.default")
    assert [d.name for d in loc.inputs] == [t.name for t in relu.inputs]
    assert all(d.ok for d in loc.inputs) and not any(d.ok for d in loc.outputs)
    assert loc.sources == []
    assert f"First diverging node: {relu.name} (aten.relu.default)" in report.to_text()


def test_wrong_attribute_fails_and_names_that_add():
    ir, model, x = extract_and_build()
    residual = node_of(ir, "aten.add.Tensor")
    residual.attrs["alpha"] = 2  # y + 2 * x.sum(): a plausible mis-converted attribute
    ok, report = verify_ir(ir, None, model, (x,))
    assert not ok
    loc = report.localization
    assert loc.node == residual.name
    assert all(d.ok for d in loc.inputs)
    upstream = ir.nodes[: ir.nodes.index(residual)]
    assert loc.diverging <= len(ir.nodes) - len(upstream)  # nothing before it was blamed


def test_output_errors_match_eager(broken_relu):
    ir, model, x = extract_and_build()
    ok, report = verify_ir(ir, None, model, (x,))
    with torch.no_grad():
        eager = torch.utils._pytree.tree_leaves(model(x))
    actual = torch_ir.IRExecutor(ir, model).run([x])
    for diff, a, e in zip(report.outputs, actual, eager):
        assert diff.max_abs == pytest.approx(float((a.double() - e.double()).abs().max()))
        assert diff.ok == bool(torch.isclose(a, e, rtol=diff.rtol, atol=diff.atol).all())


def test_user_tolerance_overrides_the_table():
    ir, model, x = extract_and_build()
    torch_ir.register_op("aten.relu.default", override=True)(lambda t: torch.relu(t) * (1 + 1e-3))
    try:
        assert not verify_ir(ir, None, model, (x,))[0]
        ok, report = verify_ir(ir, None, model, (x,), rtol=1e-2, atol=1e-2)
    finally:
        unregister_op("aten.relu.default")
    assert ok, report.to_text()
    assert {(d.rtol, d.atol) for d in report.outputs if d.dtype == "float32"} == {(1e-2, 1e-2)}


def test_wrong_weights_are_named_as_sources():
    ir, model, x = extract_and_build()
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.fc.weight.mul_(-1)
    ok, report = verify_ir(ir, other, model, (x,))
    assert not ok
    loc = report.localization
    weight = next(w.name for w in ir.weights if ir.weight_name_mapping[w.name] == "fc.weight")
    assert [d.name for d in loc.sources] == [weight]
    assert loc.node == node_of(ir, "aten.linear.default").name


def test_dynamic_ir_localizes_at_another_size(broken_relu):
    batch = torch.export.Dim("batch", min=2, max=64)
    ir, model, _ = extract_and_build(dynamic_shapes=({0: batch},))
    assert ir.symbols
    ok, report = verify_ir(ir, None, model, (torch.randn(5, 4),))
    assert not ok
    assert report.localization.node == node_of(ir, "aten.relu.default").name


def test_names_that_do_not_line_up_are_reported_not_guessed(broken_relu):
    ir, model, x = extract_and_build()
    node_of(ir, "aten.layer_norm.default").name = "renamed_by_a_pass"
    ok, report = verify_ir(ir, None, model, (x,))
    assert not ok
    loc = report.localization
    assert loc.node is None
    assert "do not line up" in loc.note and "renamed_by_a_pass" in loc.note


def test_missing_output_is_a_failure():
    ir, model, x = extract_and_build()
    ir.graph_outputs.pop()
    ok, report = verify_ir(ir, None, model, (x,))
    assert not ok
    assert "returns 3 tensors and the IR 2" in report.note


# -- reports -----------------------------------------------------------------------------------------

def test_markdown_has_the_tables(broken_relu):
    ir, model, x = extract_and_build()
    ok, report = verify_ir(ir, None, model, (x,))
    md = report.to_markdown()
    assert md.startswith("## Verification: FAIL")
    header = "| output | shape | dtype | max abs err | max rel err | rtol | atol | result |"
    assert md.count(header) == 2  # the outputs, and the diverging node's outputs
    for t in ir.graph_outputs:
        assert f"| {t.name} | " in md
    assert "### Localization" in md and "| input |" in md
    assert str(report) == report.to_text()


# -- tolerances and comparison -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_float_tolerances_scale_with_precision(dtype):
    rtol, atol = default_tolerance(dtype)
    eps = torch.finfo(dtype).eps
    assert eps <= rtol < 1e3 * max(eps, 1e-7)  # at least one ulp, far below an error one would see
    assert 0 < atol <= rtol


def test_tolerance_table_orders_dtypes():
    rtols = [default_tolerance(d)[0] for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16)]
    assert rtols == sorted(rtols)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool])
def test_integers_and_bool_are_exact_whatever_is_asked(dtype):
    assert default_tolerance(dtype) == (0.0, 0.0)
    assert tolerance_for(dtype, rtol=0.5, atol=3.0) == (0.0, 0.0)


def test_user_values_replace_table_values_one_by_one():
    rtol, atol = DEFAULT_TOLERANCES[torch.float32]
    assert tolerance_for(torch.float32, atol=0.5) == (rtol, 0.5)
    assert tolerance_for(torch.float32, rtol=0.5) == (0.5, atol)


def test_compare_agrees_with_torch_isclose():
    gen = torch.Generator().manual_seed(0)
    expected = torch.randn(1000, generator=gen)
    for scale in (1e-7, 1e-5, 1e-4, 1e-2):
        actual = expected + scale * torch.randn(1000, generator=gen)
        d = compare_tensors("t", actual, expected)
        close = torch.isclose(actual.double(), expected.double(), rtol=d.rtol, atol=d.atol)
        assert d.ok == bool(close.all())
        assert d.mismatched == int((~close).sum())
        assert d.max_abs == pytest.approx(float((actual.double() - expected.double()).abs().max()))


def test_compare_nan_inf_shape_and_dtype():
    nan, inf = float("nan"), float("inf")
    assert compare_tensors("t", torch.tensor([nan, inf, 1.0]), torch.tensor([nan, inf, 1.0])).ok
    assert not compare_tensors("t", torch.tensor([nan, 1.0]), torch.tensor([1.0, 1.0])).ok
    assert not compare_tensors("t", torch.tensor([-inf]), torch.tensor([inf])).ok
    assert "IR shape [3]" in compare_tensors("t", torch.zeros(3), torch.zeros(2)).note
    d = compare_tensors("t", torch.zeros(2, dtype=torch.float64), torch.zeros(2))
    assert not d.ok and "IR dtype float64" in d.note
    assert not compare_tensors("i", torch.tensor([1, 2]), torch.tensor([1, 3])).ok


@pytest.mark.slow
def test_llama_with_a_broken_activation_is_localized():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = transformers.LlamaForCausalLM(cfg)

        def forward(self, ids):
            return self.lm(input_ids=ids, use_cache=False).logits

    seq = torch.export.Dim("seq", min=2, max=32)
    ir, model, _ = extract_and_build(Logits, inputs=torch.randint(0, 64, (1, 8)), dynamic_shapes=({1: seq},))
    ids = torch.randint(0, 64, (1, 5))
    ok, report = verify_ir_with_state_dict(ir=ir, state_dict=model.state_dict(), original_model=model,
                                           test_inputs=(ids,))
    assert ok, report.to_text()  # rotary inv_freq is a non-persistent buffer: filled from the model
    torch_ir.register_op("aten.silu.default", override=True)(lambda t: torch.nn.functional.silu(t) + 0.01)
    try:
        ok, report = verify_ir_with_state_dict(ir=ir, state_dict=model.state_dict(), original_model=model,
                                               test_inputs=(ids,))
    finally:
        unregister_op("aten.silu.default")
    assert not ok
    assert report.localization.node == node_of(ir, "aten.silu.default").name
    assert "layers.0.mlp" in report.localization.module
