"""Classes of real models that extraction used to refuse or get wrong (issue 13).

Stray real tensors on a meta-built model, state a forward caches on its first call, non-persistent
buffers and how the IR records them, the weights of an ExportedProgram, the names of dynamic dimensions.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from torch import nn
from torch.export import Dim

import torch_ir
from torch_ir.errors import IRValidationError, LimitExceededError, WeightsMismatchError
from torch_ir.frontends.constants import build_on_meta, known_value
from torch_ir.ir.core import TensorMeta
from torch_ir.weights import buffer_recipe, build_buffer, exported_program_state, module_state

from .helpers import assert_outputs_close, build_pair

transformers = pytest.importorskip("transformers")


# -- 1. a few real tensors on a meta-built model ------------------------------------------------------

def _wav2vec2():
    config = transformers.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16),
        conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
        vocab_size=32)
    return transformers.Wav2Vec2Model(config)


def test_stray_real_tensor_of_a_meta_built_model_is_traced_on_meta_with_a_warning():
    meta, real = build_pair(_wav2vec2)
    # transformers makes it with torch.Tensor(n).uniform_(), which ignores the default device
    assert meta.masked_spec_embed.device.type == "cpu"
    audio = torch.randn(1, 400)
    with pytest.warns(UserWarning, match=r"1 small real tensor\(s\): masked_spec_embed \(32 elements"):
        ir = torch_ir.extract_ir(meta, (audio,))
    assert meta.masked_spec_embed.device.type == "cpu"  # the user's model is left as it was
    ok, report = torch_ir.verify_ir(ir, real.state_dict(), real, (audio,))
    assert ok, report.to_text()


class StrayBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 8)
        self.register_buffer("pos", torch.arange(8, device="cpu"), persistent=False)  # real, whatever the device

    def forward(self, x):
        return self.fc(x) + self.pos


def test_a_stray_non_persistent_buffer_keeps_its_value_as_a_recipe():
    meta, real = build_pair(StrayBuffer)
    x = torch.randn(2, 4)
    with pytest.warns(UserWarning, match=r"small real tensor\(s\): pos \(8 elements"):
        ir = torch_ir.extract_ir(meta, (x,))
    assert ir.non_persistent_buffers == {"pos": {"arange": {"start": 0, "end": 8, "step": 1}, "dtype": "int64",
                                                 "shape": [8]}}
    assert_outputs_close(torch_ir.IRExecutor(ir, real.state_dict()).run([x]), [real(x)])


class MixedDevices(nn.Module):
    """Mostly meta, but one real layer far too big to be a stray of __init__."""

    def __init__(self):
        super().__init__()
        with torch.device("meta"):
            self.small = nn.Linear(4, 300)
        self.big = nn.Linear(300, 300)  # 90,300 real elements

    def forward(self, x):
        return self.big(self.small(x))


def test_a_model_with_real_big_weights_is_still_refused():
    with pytest.raises(torch_ir.ExtractionError, match=r"(?s)not on the meta device \(big.weight, big.bias\)\. "
                                                       r"The rest of the model is on the meta device.*allow_real"):
        torch_ir.extract_ir(MixedDevices(), (torch.randn(2, 4),))
    with torch.device("cpu"):
        real = nn.Linear(4, 4)
    with pytest.raises(torch_ir.ExtractionError, match=r"not on the meta device \(weight, bias\)"):
        torch_ir.extract_ir(real, (torch.randn(2, 4),))


# -- 1. state a forward caches on its first call ----------------------------------------------------

class GridHead(nn.Module):
    """Like Ultralytics' ``Detect``: a grid made from the input's shape on the first call, kept with that shape.

    ``shape`` starts as a class attribute, so the first call adds an instance attribute, which torch.export
    does not put back after a trace (it restores the attributes a module had, such as ``grid``).
    """

    shape = None

    def __init__(self):
        super().__init__()
        self.grid = torch.empty(0)

    def forward(self, x):
        if self.shape != x.shape:
            self.grid = torch.arange(x.shape[-1], device=x.device, dtype=x.dtype)
            self.shape = x.shape
        return x + self.grid


class LeakyGridHead(GridHead):
    """The same with both caches as class attributes: a trace leaves its own (fake) grid in the module."""

    grid = torch.empty(0)

    def __init__(self):
        nn.Module.__init__(self)


class CachesOnFirstCall(nn.Module):
    def __init__(self, head: type[GridHead] = GridHead):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.head = head()

    def forward(self, x):
        return self.head(self.fc(x))


def test_extraction_leaves_first_call_caches_as_they_were():
    meta, real = build_pair(CachesOnFirstCall)
    x = torch.randn(2, 4)
    first = torch_ir.extract_ir(meta, (x,))
    assert "shape" not in vars(meta.head) and meta.head.grid.numel() == 0  # nothing of the trace stays
    second = torch_ir.extract_ir(meta, (x,))  # so a second extraction traces the first call again
    assert [n.op_type for n in second.nodes] == [n.op_type for n in first.nodes] == [
        "aten.linear.default", "aten.arange.default", "aten.add.Tensor"]
    ok, report = torch_ir.verify_ir(second, real, real, (x,))  # the verifier re-exports the model too
    assert ok, report.to_text()


def test_a_cache_left_stale_by_an_earlier_export_is_explained():
    meta, _ = build_pair(CachesOnFirstCall)
    torch.export.export(meta, (torch.randn(2, 4, device="meta"),))  # keeps head.shape, puts head.grid back
    assert meta.head.shape is not None and meta.head.grid.numel() == 0
    with pytest.raises(torch_ir.ExtractionError, match=r"(?s)caches tensors computed from the input's shape.*"
                                                       r"build it again"):
        torch_ir.extract_ir(meta, (torch.randn(2, 4),))


def test_a_tensor_leaked_by_an_earlier_trace_is_refused():
    meta, _ = build_pair(lambda: CachesOnFirstCall(LeakyGridHead))
    torch.export.export(meta, (torch.randn(2, 4, device="meta"),))  # leaves its fake grid in head.grid
    with pytest.raises(torch_ir.ExtractionError, match=r"(?s)head\.grid holds a tensor of an earlier trace.*"
                                                       r"build the model again"):
        torch_ir.extract_ir(meta, (torch.randn(2, 4),))


# -- 3. non-persistent buffers ---------------------------------------------------------------------

def _bert():
    return transformers.BertModel(transformers.BertConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=32, attn_implementation="eager"))


_IDS = {"input_ids": torch.tensor([[5, 9, 12, 3], [7, 1, 40, 2]])}


def test_bert_state_dict_lacks_non_persistent_buffers_and_the_error_says_how_to_supply_them():
    meta, real = build_pair(_bert)
    ir = torch_ir.extract_ir(meta, (), example_kwargs=_IDS)
    assert ir.non_persistent_buffers == {"embeddings.position_ids": None, "embeddings.token_type_ids": None}
    with pytest.raises(WeightsMismatchError) as info:
        torch_ir.IRExecutor(ir, real.state_dict())
    message = str(info.value)
    assert re.search(r"missing non-persistent buffers \(2\): embeddings.position_ids \(int64\[1, 32\]\); "
                     r"embeddings.token_type_ids", message)
    assert "IRExecutor(ir, model)" in message and "{**model.state_dict(), **dict(model.named_buffers())}" in message
    assert "torch_ir.build_on_meta()" in message and "unexpected" not in message
    expected = real(**_IDS).last_hidden_state
    for weights in (real, {**real.state_dict(), **dict(real.named_buffers())}):
        (hidden, *_rest) = torch_ir.IRExecutor(ir, weights).run(_IDS)
        assert_outputs_close([hidden], [expected])


def test_bert_built_under_build_on_meta_records_recipes_and_runs_from_its_state_dict(tmp_path):
    with build_on_meta():
        meta = _bert().eval()
    torch.manual_seed(0)
    real = _bert().eval()
    ir = torch_ir.extract_ir(meta, (), example_kwargs=_IDS)
    path = tmp_path / "bert.json"
    ir.save(path)
    assert json.loads(path.read_text())["non_persistent_buffers"] == {
        "embeddings.position_ids": {"arange": {"start": 0, "end": 32, "step": 1}, "dtype": "int64", "shape": [1, 32]},
        "embeddings.token_type_ids": {"fill": 0, "dtype": "int64", "shape": [1, 32]},
    }
    ir = torch_ir.load_ir(path)
    outputs = torch_ir.IRExecutor(ir, real.state_dict()).run(_IDS)
    assert_outputs_close(outputs, real(**_IDS))
    # a value the user gives wins over the recipe
    state = {**real.state_dict(), "embeddings.token_type_ids": torch.ones(1, 32, dtype=torch.long)}
    (hidden, *_rest) = torch_ir.IRExecutor(ir, state).run(_IDS)
    token_types = torch.ones_like(_IDS["input_ids"])
    assert_outputs_close([hidden], [real(**_IDS, token_type_ids=token_types).last_hidden_state])


def test_llama_rotary_frequencies_are_recorded_by_value():
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, use_cache=False)
    with build_on_meta():
        meta = transformers.LlamaForCausalLM(config).eval()
    torch.manual_seed(0)
    real = transformers.LlamaForCausalLM(config).eval()
    ids = {"input_ids": torch.tensor([[1, 5, 9, 2]])}
    ir = torch_ir.extract_ir(meta, (), example_kwargs=ids)
    recipe = ir.non_persistent_buffers["model.rotary_emb.inv_freq"]
    assert set(recipe) == {"values", "dtype", "shape"}
    torch.testing.assert_close(torch.tensor(recipe["values"]), real.model.rotary_emb.inv_freq, rtol=0, atol=0)
    assert_outputs_close(torch_ir.IRExecutor(ir, real.state_dict()).run(ids), [real(**ids).logits])


def test_buffer_recipes_round_trip():
    cases = [torch.arange(16).expand((2, -1)), torch.arange(12).view(3, 4), torch.arange(3, 30, 3),
             torch.full((2, 3), float("-inf")), torch.zeros(0, 4), torch.tensor([True, False, True]),
             torch.linspace(0, 1, 5), torch.arange(8, dtype=torch.float16)]
    for value in cases:
        recipe = buffer_recipe(value)
        assert recipe is not None, value
        rebuilt = build_buffer(recipe, TensorMeta("b", list(value.shape), str(value.dtype)[6:]), "buffer b")
        torch.testing.assert_close(rebuilt, value, rtol=0, atol=0, equal_nan=True)
    assert next(iter(buffer_recipe(torch.arange(16).expand((2, -1))))) == "arange"
    assert buffer_recipe(torch.randn(100, 100)) is None  # too big to hold by value, no pattern
    assert buffer_recipe(torch.empty(3, device="meta")) is None


def test_a_hostile_recipe_is_refused_before_allocating():
    huge = {"arange": {"start": 0, "end": 1 << 40, "step": 1}, "dtype": "int64", "shape": [1 << 40]}
    with pytest.raises(LimitExceededError, match="buffer b"):
        build_buffer(huge, None, "buffer b")
    with pytest.raises(IRValidationError, match="neither fill shape"):
        build_buffer({"arange": {"start": 0, "end": 5, "step": 1}, "dtype": "int64", "shape": [2, 3]}, None, "b")
    with pytest.raises(IRValidationError, match=r"the recipe makes int64\[4\], the IR declares int64\[5\]"):
        build_buffer({"fill": 0, "dtype": "int64", "shape": [4]}, TensorMeta("b", [5], "int64"), "b")


# -- build_on_meta: what it knows ---------------------------------------------------------------------

def test_build_on_meta_keeps_small_deterministic_values_only():
    stride = torch.tensor([8.0, 16.0])
    with build_on_meta():
        ramp = torch.arange(6).view(2, 3) * 2
        made = torch.tensor([1.0, 2.0])
        drawn = torch.empty(3).uniform_()
        empty = torch.empty(3)
        big = torch.zeros(2048, 1024)  # 2M elements: over SHADOW_LIMIT
        read = math.log(torch.tensor([8.0, 16.0])[1] / 2)  # reading a value into Python works, as on the CPU
        real = stride.clone()
        real /= 2  # an in-place op on a real tensor inside the block happens once
    assert ramp.device.type == "meta" and known_value(ramp).tolist() == [[0, 2, 4], [6, 8, 10]]
    assert known_value(made).tolist() == [1.0, 2.0]
    assert known_value(drawn) is None and known_value(empty) is None and known_value(big) is None
    assert read == pytest.approx(math.log(8.0))
    assert real.tolist() == [4.0, 8.0]
    made.mul_(3)  # a write after the block: nothing followed it, so the value is no longer known
    assert known_value(made) is None


# -- 2. the weights of an exported program ---------------------------------------------------------

class LiftedConstants(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.anchors = torch.linspace(0, 1, 4)  # a plain tensor attribute: a lifted constant
        self.register_buffer("valid_mask", torch.tensor([True, False, True, True]), persistent=False)
        self.table = torch.randn(300, 300)  # too big to inline: stays a stored constant

    def forward(self, x):
        y = self.fc(x) + self.anchors + torch.tensor([0.5, -0.5, 0.0, float("-inf")])  # lifted_tensor_0
        return torch.where(self.valid_mask, y, 0.0) + self.table[:1, :4]


def test_from_exported_program_runs_with_the_programs_own_state_and_constants(tmp_path):
    torch.manual_seed(0)
    model = LiftedConstants().eval()
    x = torch.randn(2, 4)
    ep = torch.export.export(model, (x,))
    ir = torch_ir.from_exported_program(ep, "lifted")
    assert set(ir.inlined_constant_keys.values()) == {"anchors", "lifted_tensor_0"}
    assert ir.non_persistent_buffers["valid_mask"] == {"values": [True, False, True, True], "dtype": "bool",
                                                        "shape": [4]}
    path = tmp_path / "lifted.json"
    ir.save(path)
    ir = torch_ir.load_ir(path)
    expected = model(x)
    for weights in (ep, exported_program_state(ep), {**ep.state_dict, **ep.constants}):
        assert_outputs_close(torch_ir.IRExecutor(ir, weights).run([x]), [expected])
    # and, without the program, from the model itself (valid_mask rebuilt from the IR's recipe)
    assert_outputs_close(torch_ir.IRExecutor(ir, {**model.state_dict(), "table": model.table}).run([x]), [expected])


# -- 6. dynamic dimensions keep their names ----------------------------------------------------------

class Reshapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, y):
        return self.fc(x).reshape(-1), y[:, :-1] * 2


def test_dims_are_named_as_the_user_named_them(tmp_path):
    meta, real = build_pair(Reshapes)
    batch, seq = Dim("batch", min=1, max=16), Dim("seq", min=3, max=64)
    ir = torch_ir.extract_ir(meta, (torch.randn(3, 4), torch.randn(3, 5)),
                             dynamic_shapes=({0: batch}, {0: batch, 1: seq}))
    assert [t.shape for t in ir.graph_inputs] == [["batch", 4], ["batch", "seq"]]
    assert ir.symbols == {"batch": {"min": 1, "max": 16}, "seq": {"min": 3, "max": 64}}
    assert [t.shape for t in ir.graph_outputs] == [["4*batch"], ["batch", "seq - 1"]]
    assert not re.search(r"\bs\d+\b", str(ir))  # no s0, s27: every symbol has the user's name
    ir.save(tmp_path / "named.json")
    executor = torch_ir.IRExecutor(torch_ir.load_ir(tmp_path / "named.json"), real)
    x, y = torch.randn(5, 4), torch.randn(5, 9)
    assert_outputs_close(executor.run([x, y]), real(x, y))
    ok, report = torch_ir.verify_ir(ir, real, real, (x, y))
    assert ok, report.to_text()


def test_a_dim_named_like_a_grammar_function_keeps_torchs_name():
    meta, _ = build_pair(Reshapes)
    ir = torch_ir.extract_ir(meta, (torch.randn(3, 4), torch.randn(3, 5)),
                             dynamic_shapes=({0: Dim("Max", min=1, max=8)}, {0: Dim("Max", min=1, max=8)}))
    assert ir.graph_inputs[0].shape[0] != "Max" and ir.graph_inputs[0].shape[0] in ir.symbols


def test_module_state_still_has_every_buffer():
    _, real = build_pair(_bert)
    assert "embeddings.position_ids" in module_state(real)
