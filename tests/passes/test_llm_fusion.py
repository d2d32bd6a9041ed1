"""The fused decoder layer (issue 14, item 5): what a Llama/Qwen2 layer normalizes and compiles to, and that
the numbers stay those of the transformers model.

Per layer, with a static KV cache: RMS_NORM, QKV_PROJ (head-major outputs), ROPE_QK, KV_UPDATE (key),
KV_UPDATE (value), ATTENTION, GEMM (o_proj, residual add folded), RMS_NORM, GATE_UP, GEMM (down_proj,
residual add folded): ten kernels, no permute; the cache positions are computed once per model. Without a
cache, the same less the two cache writes: eight dispatches per layer in the compiled program.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler.passes import normalize
from npu_program.kernels import KERNELS
from npu_runtime import Device, Executor, load_weights
from npu_runtime.backends.cpu_kernels import GateUp
from npu_runtime.backends.cpu_transformer import Attention
from npu_tools.zoo import build_pair as zoo_pair
from npu_tools.zoo import get_model
from torch_ir.ir import specialize
from torch_ir.weights import module_state

from ..helpers import assert_outputs_close, build_pair

DECODE_LAYER = ["RMS_NORM", "QKV_PROJ", "ROPE_QK", "KV_UPDATE", "KV_UPDATE", "ATTENTION", "GEMM", "RMS_NORM",
                "GATE_UP", "GEMM"]
NO_CACHE_LAYER = [op for op in DECODE_LAYER if op != "KV_UPDATE"]


def _entry(name: str):
    entry = get_model(name)
    if not entry.available():
        pytest.skip(f"zoo model {name!r} needs {', '.join(entry.requires)}")
    return entry


@pytest.fixture(scope="module")
def llama_kv() -> torch_ir.NPU_IR:
    """The static-cache Llama's IR, extracted once (normalize does not modify its input)."""
    entry = _entry("llama_kv")
    meta, _ = zoo_pair(entry)
    args, kwargs = entry.example_inputs()
    return torch_ir.extract_ir(meta, args, example_kwargs=kwargs, dynamic_shapes=entry.dynamic_shapes)


def _layers(ops_and_weights: list[tuple[str, list[str]]]) -> list[list[str]]:
    """The op types of each decoder layer: from one input_layernorm RMS_NORM to the next (the last layer up to
    the final norm), model-level work (embedding, positions, rotary tables, mask, lm_head) left out."""
    starts = [i for i, (op, ws) in enumerate(ops_and_weights) if op == "RMS_NORM"
              and any("input_layernorm" in w for w in ws)]
    end = next(i for i, (op, ws) in enumerate(ops_and_weights) if op == "RMS_NORM"
               and any(w.endswith("model_norm_weight") for w in ws))
    bounds = [*starts, end]
    return [[op for op, _ in ops_and_weights[a:b]] for a, b in zip(bounds, bounds[1:])]


def _kernel_layers(ir: torch_ir.NPU_IR) -> list[list[str]]:
    """Per layer, the nodes that are kernels (views are free)."""
    views = {name for name, k in KERNELS.items() if k.view}
    return _layers([(n.op_type, [t.name for t in n.inputs]) for n in ir.nodes if n.op_type not in views])


@pytest.mark.parametrize("seq", [None, 1, 6], ids=["symbolic", "decode", "prefill"])
def test_llama_kv_layer_is_ten_kernels_with_positions_once(llama_kv, seq):
    ir = llama_kv
    if seq is not None:
        ir = specialize(ir, {"seq": seq})
    out = normalize(ir)
    layers = _kernel_layers(out)
    assert len(layers) == 2 and all(layer == DECODE_LAYER for layer in layers), layers
    ops = [n.op_type for n in out.nodes]
    assert "aten.permute.default" not in ops
    assert ops.count("aten.select.int") == 1 and ops.count("aten.arange.default") == (1 if seq is None else 0)
    # one position tensor for every cache write, computed before the first layer
    index = {n.inputs[2].name for n in out.nodes if n.op_type == "KV_UPDATE"}
    assert len(index) == 1
    first_layer = next(i for i, n in enumerate(out.nodes) if n.op_type == "RMS_NORM")
    assert ops[:first_layer].count("aten.add.Tensor") == 1 and ops[first_layer:].count("aten.add.Tensor") == 0
    attention = next(n for n in out.nodes if n.op_type == "ATTENTION")
    assert [t.name for t in attention.inputs[1:3]] == [n.outputs[0].name for n in out.nodes
                                                       if n.op_type == "KV_UPDATE"][:2]
    assert attention.inputs[3].dtype == "bool"  # the graph's mask: positions not yet written are hidden


def test_llama_kv_fused_prefill_then_decode_matches_the_model(llama_kv):
    entry = _entry("llama_kv")
    _, real = zoo_pair(entry)
    ir = normalize(llama_kv)
    kv = [w.name for w in ir.weights if w.role == "kv"]
    executor = torch_ir.IRExecutor(ir, {k: v.clone() for k, v in module_state(real).items()})
    prompt = entry.example_inputs()[1]
    n = prompt["input_ids"].shape[1]
    steps = [prompt, *({"input_ids": torch.tensor([[t]]), "cache_position": torch.tensor([n + i])}
                       for i, t in enumerate((5, 9)))]
    for step in steps:
        outputs = executor.run(step)
        with torch.no_grad():
            assert_outputs_close(outputs, real(**step))
        for b in kv:
            torch.testing.assert_close(executor.state[b], real.get_buffer(ir.weight_name_mapping[b]))
    tokens = torch.cat([prompt["input_ids"], torch.tensor([[5, 9]])], dim=1)
    with torch.no_grad():
        uncached = real.model(input_ids=tokens, use_cache=False).logits
    torch.testing.assert_close(outputs[0][:, -1], uncached[:, -1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_no_cache_llm_compiles_to_eight_dispatches_per_layer(name, monkeypatch):
    entry = _entry(name)
    meta, real = zoo_pair(entry)
    args, kwargs = entry.example_inputs()
    ir = torch_ir.extract_ir(meta, args, example_kwargs=kwargs)
    program = npu_compiler.compile(ir)
    layers = _layers([(d.kernel, list(d.inputs)) for d in program.dispatches if not d.at_bind])
    assert len(layers) == 2 and all(layer == NO_CACHE_LAYER for layer in layers), layers
    # the gate and up weights stay two tensors under their state-dict keys
    keys = set(program.weight_keys.values())
    assert {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"} <= keys
    device = Device()
    executor = Executor(program, device)
    executor.bind(load_weights(module_state(real), program, device))
    kernels = {kind: [k for d, k in zip(program.dispatches, executor.kernels) if d.kernel == kind]
               for kind in ("GATE_UP", "ATTENTION")}
    assert len(kernels["GATE_UP"]) == 2 and all(isinstance(k, GateUp) for k in kernels["GATE_UP"])
    assert len(kernels["ATTENTION"]) == 2 and all(isinstance(k, Attention) for k in kernels["ATTENTION"])

    def no_copy(*args, **kwargs):
        raise AssertionError("the key/value heads were repeated (copied) for grouped-query attention")

    monkeypatch.setattr(torch.Tensor, "repeat_interleave", no_copy)
    monkeypatch.setattr(torch, "repeat_interleave", no_copy)
    outs = executor.run({s.name: kwargs[s.name].numpy() for s in program.input_specs})
    monkeypatch.undo()
    with torch.no_grad():
        expected = real(**kwargs)
    assert_outputs_close([torch.from_numpy(outs[s.name].to_numpy()) for s in program.output_specs], expected)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_no_cache_llm_normalized_matches_the_model(name):
    entry = _entry(name)
    meta, real = zoo_pair(entry)
    args, kwargs = entry.example_inputs()
    out = normalize(torch_ir.extract_ir(meta, args, example_kwargs=kwargs))
    assert all(layer == NO_CACHE_LAYER for layer in _kernel_layers(out))
    qkv = [n for n in out.nodes if n.op_type == "QKV_PROJ"]
    assert all(n.attrs["heads_first"] for n in qkv)
    assert all(n.attrs["has_bias"] is (name == "qwen2") for n in qkv)  # Qwen2's q, k and v have biases
    outputs = torch_ir.IRExecutor(out, real).run([kwargs[t.name] for t in out.graph_inputs])
    with torch.no_grad():
        assert_outputs_close(outputs, real(**kwargs))


class GatedMlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(16, 24, False), nn.Linear(16, 24, False), nn.Linear(24, 16, False)

    def forward(self, x):
        return x + self.down(nn.functional.silu(self.gate(x)) * self.up(x))


def test_gate_up_concatenates_its_weights_once_at_bind_time(monkeypatch):
    meta, real = build_pair(GatedMlp)
    program = npu_compiler.compile(torch_ir.extract_ir(meta, (torch.randn(1, 1, 16, device="meta"),)))
    assert [d.kernel for d in program.dispatches] == ["GATE_UP", "GEMM"]
    gemm = program.dispatches[1]
    assert gemm.params["has_residual"] is True and gemm.params["has_bias"] is False
    assert sorted(program.weight_keys.values()) == ["down.weight", "gate.weight", "up.weight"]
    device = Device()
    executor = Executor(program, device)
    executor.bind(load_weights(module_state(real), program, device))
    kernel = executor.kernels[0]
    assert isinstance(kernel, GateUp) and list(kernel.linear.weight.shape) == [16, 48]

    def no_cat(*args, **kwargs):
        raise AssertionError("GATE_UP concatenated its weights per token")

    monkeypatch.setattr(torch, "cat", no_cat)
    for seed in (0, 1):
        x = torch.randn(1, 1, 16, generator=torch.Generator().manual_seed(seed))
        out = executor.run({program.input_specs[0].name: x.numpy()})
        with torch.no_grad():
            expected = real(x)
        assert_outputs_close([torch.from_numpy(out[program.output_specs[0].name].to_numpy())], expected)
