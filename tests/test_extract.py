"""extract_ir / from_exported_program: what real graphs contain, and the errors users get."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import torch_ir
from torch_ir import extract_ir
from torch_ir.errors import ExtractionError
from torch_ir.weights import module_state

from .helpers import assert_outputs_close, build_pair


class Mutating(torch.nn.Module):
    """In-place ops, dropout, no_grad (wrap_with_set_grad_enabled), a buffer written with index_copy_."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.5)
        self.register_buffer("cache", torch.zeros(3, 4))
        self.register_buffer("scale", torch.full((4,), 2.0), persistent=False)

    def forward(self, x, pos):
        with torch.no_grad():
            h = self.fc(x)
        h = self.drop(h)
        h.mul_(self.scale)
        self.cache.index_copy_(0, pos, h)
        return torch.relu_(h) + self.cache.sum(0)


def test_buffer_mutation_is_recorded_and_replayed():
    meta, real = build_pair(Mutating)
    x, pos = torch.randn(1, 4), torch.tensor([1])
    ir = torch_ir.extract_ir(meta, (x, pos))
    assert [n.op_type for n in ir.nodes if "index_copy" in n.op_type] == ["aten.index_copy.default"]
    assert list(ir.mutations) == ["b_cache"] and ir.weight_name_mapping["b_cache"] == "cache"
    assert ir.tensor("b_cache").role == "kv"
    assert not any(n.op_type.endswith("_") or "higher_order" in n.op_type for n in ir.nodes)
    executor = torch_ir.IRExecutor(ir, module_state(real))
    for step in range(2):
        x, pos = torch.randn(1, 4), torch.tensor([step])
        (out,) = executor.run([x, pos])
        assert_outputs_close([out], [real(x, pos)])
    torch.testing.assert_close(executor.state["b_cache"], real.cache)


class MultiOut(torch.nn.Module):
    def forward(self, x, y):
        parts = torch.split(x, 2, dim=1)
        values, indices = torch.topk(y, 2)
        return torch.cat([parts[1], parts[0]], dim=1), values, indices, torch.where(x > 0, x, None or 0.0)


def test_multi_output_ops_tensor_lists_and_scalars():
    x, y = torch.randn(3, 4), torch.randn(3, 5)
    ir = torch_ir.extract_ir(MultiOut(), (x, y))
    split = next(n for n in ir.nodes if n.op_type.startswith("aten.split"))
    assert len(split.outputs) == 2
    cat = next(n for n in ir.nodes if n.op_type == "aten.cat.default")
    assert cat.attrs["tensors"] == [0, 1]
    outs = torch_ir.IRExecutor(ir).run([x, y])
    assert_outputs_close(outs, MultiOut()(x, y))


class Shapes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        b, t, _ = x.shape
        n = torch.tensor(x.shape[1]).item()  # aten.item on a shape
        return self.fc(x).reshape(b * t, 4) * n, torch.arange(t)


def test_dynamic_shapes_become_symbols_and_bind_at_run_time():
    meta, real = build_pair(Shapes)
    dims = ({0: Dim("batch", min=1, max=16), 1: Dim("seq", min=2, max=64)},)
    ir = torch_ir.extract_ir(meta, (torch.randn(2, 5, 4),), dynamic_shapes=dims)
    batch, seq, _ = ir.graph_inputs[0].shape
    assert isinstance(batch, str) and isinstance(seq, str)
    assert ir.symbols[batch] == {"min": 1, "max": 16} and ir.symbols[seq] == {"min": 2, "max": 64}
    executor = torch_ir.IRExecutor(ir, module_state(real))
    for shape in [(3, 7, 4), (1, 2, 4)]:
        x = torch.randn(shape)
        assert_outputs_close(executor.run([x]), real(x))
    with pytest.raises(torch_ir.InputMismatchError, match=r"outside the range \[2, 64\]"):
        executor.run([torch.randn(2, 100, 4)])


class KwargsModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, input_ids, attention_mask=None):
        return self.emb(input_ids) * attention_mask[..., None]


def test_keyword_inputs():
    meta, real = build_pair(KwargsModel)
    kwargs = {"input_ids": torch.tensor([[1, 2, 3]]), "attention_mask": torch.ones(1, 3)}
    ir = torch_ir.extract_ir(meta, (), example_kwargs=kwargs)
    assert [t.name for t in ir.graph_inputs] == ["input_ids", "attention_mask"]
    out = torch_ir.IRExecutor(ir, module_state(real)).run(kwargs)
    assert_outputs_close(out, real(**kwargs))


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids))


def test_tied_weights_load_from_either_name(tmp_path):
    meta, real = build_pair(Tied)
    ir = torch_ir.extract_ir(meta, (torch.tensor([[1, 2, 3]]),))
    assert ir.weight_aliases == {"emb.weight": ["head.weight"]}
    path = tmp_path / "w.safetensors"
    torch_ir.save_weights(real.state_dict(), path)  # keeps one copy of the tied tensor
    ids = torch.tensor([[3, 4, 5]])
    for source in (path, {"head.weight": real.head.weight.detach()}, real.state_dict()):
        assert_outputs_close(torch_ir.IRExecutor(ir, source).run([ids]), real(ids))


def test_from_exported_program_uses_state_dict_keys():
    meta, real = build_pair(Mutating)
    ep = torch.export.export(real, (torch.randn(1, 4), torch.tensor([0])))
    ir = torch_ir.from_exported_program(ep, "mutating")
    assert set(ir.weight_name_mapping.values()) == {"fc.weight", "fc.bias", "cache", "scale"}
    x, pos = torch.randn(1, 4), torch.tensor([2])
    expected = real(x, pos)
    real.cache.zero_()
    assert_outputs_close(torch_ir.IRExecutor(ir, module_state(real)).run([x, pos]), expected)


# -- errors ----------------------------------------------------------------------------------------

def test_real_weights_are_refused_with_the_fix():
    expected = r"(?s)not on the meta device \(fc.weight.*torch.device\('meta'\)"
    with pytest.raises(torch_ir.ExtractionError, match=expected):
        torch_ir.extract_ir(Shapes(), (torch.randn(2, 3, 4),))


def test_real_weights_accepted_behind_the_flag():
    model = Shapes()
    ir = torch_ir.extract_ir(model, (torch.randn(2, 3, 4),), allow_real_weights=True)
    assert ir.weight_name_mapping == {"p_fc_weight": "fc.weight", "p_fc_bias": "fc.bias"}


class Branchy(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


def test_data_dependent_branch_says_what_to_do():
    with pytest.raises(torch_ir.ExtractionError, match=r"data-dependent control flow.*torch.cond"):
        torch_ir.extract_ir(Branchy(), (torch.randn(3),))


def test_non_module_is_refused():
    with pytest.raises(torch_ir.ExtractionError, match="expects a torch.nn.Module"):
        torch_ir.extract_ir(lambda x: x, (torch.randn(2),))


class Constants(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.offset = torch.tensor([1.0, -2.0, 3.0])  # a plain attribute: neither parameter nor buffer

    def forward(self, x):
        return x * torch.tensor([0.5, 2.0, 4.0], device=x.device) + self.offset.to(x.device)  # made in forward


def test_lifted_constants_from_forward_and_from_plain_attributes(tmp_path):
    meta, real = build_pair(Constants)
    ir = torch_ir.extract_ir(meta, (torch.randn(2, 3),))
    assert [c.role for c in ir.constants] == ["constant", "constant"]
    inline = [c.name for c in ir.constants if c.name in ir.constant_values]
    stored = [c.name for c in ir.constants if c.name not in ir.constant_values]
    assert len(inline) == 1 and [ir.weight_name_mapping[n] for n in stored] == ["offset"]
    ir.save(tmp_path / "c.json")
    ir = torch_ir.load_ir(tmp_path / "c.json")
    x = torch.randn(2, 3)
    assert_outputs_close(torch_ir.IRExecutor(ir, real).run([x]), real(x))


class GradModes(torch.nn.Module):
    """enable_grad inside forward leaves a wrap_with_set_grad_enabled higher-order op; .to() an assert."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        with torch.enable_grad():
            h = self.fc(x)
        return h.to(torch.float16).float() * 2


def test_higher_order_ops_are_inlined_and_asserts_dropped():
    meta, real = build_pair(GradModes)
    x = torch.randn(2, 4)
    with torch.no_grad():
        raw = torch.export.export(meta, (x.to("meta"),))
    raw_targets = {str(n.target) for n in raw.graph.nodes}
    assert "wrap_with_set_grad_enabled" in str(raw_targets)  # the case really arises
    assert "aten._assert_tensor_metadata.default" in raw_targets
    ir = torch_ir.extract_ir(meta, (x,))
    assert not any("higher_order" in n.op_type or "assert" in n.op_type for n in ir.nodes)
    assert_outputs_close(torch_ir.IRExecutor(ir, real.state_dict()).run([x]), real(x))


def test_dropout_is_removed_only_when_not_training():
    class Drops(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.dropout(x, 0.5, training=False) + torch.nn.functional.dropout(x, 0.5, True)

    ops = [n.op_type for n in torch_ir.extract_ir(Drops(), (torch.randn(8),)).nodes]
    assert ops.count("aten.dropout.default") == 1 and "aten.add.Tensor" in ops


def test_hugging_face_dynamic_cache_is_handled():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    assert config.use_cache  # the default, which returns a DynamicCache that export cannot capture
    meta, real = build_pair(lambda: transformers.LlamaForCausalLM(config))
    ids = torch.tensor([[1, 5, 9, 2]])
    with pytest.warns(UserWarning, match="(?s)extracting it with use_cache=False.*StaticCacheLM"):
        ir = torch_ir.extract_ir(meta, (), example_kwargs={"input_ids": ids})
    assert [t.name for t in ir.graph_inputs] == ["input_ids"]
    (logits,) = torch_ir.IRExecutor(ir, module_state(real)).run({"input_ids": ids})
    assert_outputs_close([logits], real(input_ids=ids, use_cache=False).logits)
    ok, report = torch_ir.verify_ir(ir, None, real, (), test_kwargs={"input_ids": ids})
    assert ok, report.to_text()


def test_one_tensor_for_two_inputs_is_refused():
    """torch.export given one tensor object for two inputs traces one graph input for both (checked here on torch
    itself: its program ignores the first argument), so extract_ir refuses rather than produce that IR."""
    class TwoInputs(torch.nn.Module):
        def forward(self, a, b):
            return a * 2 + b.sum()

    x = torch.zeros(2, 3)
    program = torch.export.export(TwoInputs(), (x, x)).module()
    a, b = torch.ones(2, 3), torch.zeros(2, 3)
    assert not torch.equal(program(a, b), TwoInputs()(a, b))  # the silent merge this guards against

    t = torch.zeros(2, 3, device="meta")
    with pytest.raises(ExtractionError, match=r"example input 0 and example input 1 are the same tensor object.*"
                                              r"x\.clone\(\)"):
        extract_ir(TwoInputs(), (t, t))
    with pytest.raises(ExtractionError, match="example input 0 and example keyword input 'b'"):
        extract_ir(TwoInputs(), (t,), example_kwargs={"b": t})
    ir = extract_ir(TwoInputs(), (t, torch.zeros(2, 3, device="meta")))  # distinct tensors: two inputs
    assert len(ir.graph_inputs) == 2
