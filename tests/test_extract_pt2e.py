"""PT2E-quantized models (torchao's prepare_pt2e/convert_pt2e) extract into the quantized IR.

Real torchao quantizers (XNNPACK per channel, X86 Inductor) quantize a small CNN and an MLP; the extracted IR
holds QUANTIZE/DEQUANTIZE with quantization specs and computes exactly what the exported program computes.
Expected values come from torch (the program's own graph and outputs), never from the code under test.
"""

from __future__ import annotations

import copy
import functools
import json
import struct
import warnings

import pytest
import torch
import torch.nn as nn

pytest.importorskip("torchao")

from torch_ir import extract_ir, from_exported_program, load_ir  # noqa: E402
from torch_ir.errors import ExtractionError, UnsafeInputError  # noqa: E402
from torch_ir.executor import IRExecutor  # noqa: E402
from torch_ir.ir import NPU_IR, OpNode, TensorMeta  # noqa: E402
from torch_ir.weights import exported_program_state, save_weights  # noqa: E402


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.BatchNorm2d(16)
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(self.b2(self.c2(x)))
        return self.fc(self.pool(x).flatten(1))


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(24, 48), nn.ReLU(), nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 5))


MODELS = {"cnn": (CNN, (2, 3, 12, 12)), "mlp": (_mlp, (4, 24))}


def _quantizer(name: str):
    if name.startswith("xnnpack"):
        from torchao.testing.pt2e._xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config
        config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=name == "xnnpack_dynamic")
        return XNNPACKQuantizer().set_global(config)
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )
    return X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())


@functools.cache
def quantized(model: str, quantizer: str) -> tuple[torch.fx.GraphModule, torch.export.ExportedProgram, tuple]:
    """(converted module, its exported program, example inputs) of a calibrated PT2E model."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    build, shape = MODELS[model]
    torch.manual_seed(0)
    m = build().eval()
    for mod in m.modules():  # batch-norm statistics that are not the identity, so folding them matters
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    args = (torch.randn(shape),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_pt2e(torch.export.export(m, args).module(), _quantizer(quantizer))
        for _ in range(4):
            prepared(torch.randn(shape))
        converted = convert_pt2e(prepared)
        ep = torch.export.export(converted, args)
    return converted, ep, args


STATIC_CASES = [(m, q) for m in MODELS for q in ("xnnpack", "x86")]
CASES = [*STATIC_CASES, ("mlp", "xnnpack_dynamic")]


def _weight_free_ir(model: str, quantizer: str) -> NPU_IR:
    converted, _, args = quantized(model, quantizer)
    on_meta = copy.deepcopy(converted).to("meta")
    assert all(t.is_meta for t in on_meta.state_dict().values())
    return extract_ir(on_meta, tuple(a.to("meta") for a in args), model_name=f"{model}_{quantizer}")


@pytest.mark.parametrize(("model", "quantizer"), CASES)
def test_extracted_ir_computes_exactly_what_the_program_computes(model, quantizer):
    _, ep, args = quantized(model, quantizer)
    ir = _weight_free_ir(model, quantizer)
    ops = ir.op_histogram()
    assert ops.get("QUANTIZE") and ops.get("DEQUANTIZE"), ops
    assert not [op for op in ops if op.startswith("quantized_decomposed.")], ops
    # Weight-free: the only values the IR holds are the per-tensor scales and zero points (0-d constants).
    assert all(not isinstance(v, list) for v in ir.constant_values.values())
    executor, reference = IRExecutor(ir, ep), ep.module()
    torch.manual_seed(1)
    for gain in (0.5, 1.0, 8.0):  # 8x saturates the input quantizer
        x = torch.randn(args[0].shape) * gain
        (got,) = executor.run([x])
        assert torch.equal(got, reference(x))


@pytest.mark.parametrize(("model", "quantizer"), STATIC_CASES)
def test_quantized_tensors_carry_the_programs_parameters(model, quantizer):
    _, ep, _ = quantized(model, quantizer)
    ir = from_exported_program(ep, model)
    nodes = {n.name: n for n in ir.nodes}
    weights = {w.name: w for w in ir.weights}
    seen = 0
    for fx in ep.graph.nodes:
        name = str(fx.target)
        if name == "quantized_decomposed.quantize_per_tensor.default":
            x, scale, zp, qmin, qmax, dtype = fx.args
            node = nodes[fx.name]
            spec = node.outputs[0].quant
            assert (node.op_type, spec.scale, spec.zero_point, spec.method) == \
                ("QUANTIZE", scale, zp, "multiply_inverse")
            assert spec.dtype == node.outputs[0].dtype == str(dtype).removeprefix("torch.")
            seen += 1
        elif name == "quantized_decomposed.dequantize_per_channel.default":
            q, scale, zp, axis, qmin, qmax, dtype = fx.args
            w = weights[q.name]
            assert w.dtype == "int8" and w.quant is not None and w.quant.axis == axis == 0
            assert (w.quant.scale, w.quant.zero_point) == (scale.name, zp.name)
            assert weights[scale.name].shape == weights[zp.name].shape == [w.shape[0]]
            assert nodes[fx.name].op_type == "DEQUANTIZE"
            seen += 1
    assert seen >= 4


def test_saved_ir_keeps_specs_and_runs_from_an_int8_safetensors_file(tmp_path):
    _, ep, args = quantized("cnn", "xnnpack")
    ir = from_exported_program(ep, "cnn")
    ir.save(str(tmp_path / "cnn.json"))
    loaded = load_ir(tmp_path / "cnn.json")
    specs = {t.name: t.quant for t in [*ir.weights, *(o for n in ir.nodes for o in n.outputs)] if t.quant}
    assert len(specs) >= 5
    assert {t.name: t.quant for t in [*loaded.weights, *(o for n in loaded.nodes for o in n.outputs)]
            if t.quant} == specs
    path = tmp_path / "cnn.safetensors"
    save_weights(exported_program_state(ep), path)
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])  # safetensors: a JSON header, then raw tensor bytes (no pickle)
    quantized_weights = [w for w in loaded.weights if w.quant is not None]
    for w in quantized_weights:
        assert header[loaded.weight_name_mapping[w.name]]["dtype"] == "I8"
    assert header["_zero_point_0"]["dtype"] == "I64"
    x = torch.randn(args[0].shape)
    (got,) = IRExecutor(loaded, str(path)).run([x])
    assert torch.equal(got, ep.module()(x))


class _DirectOps(nn.Module):
    """The quantized_decomposed overloads PT2E emits, called directly: per tensor with Python numbers and a
    narrow range, per tensor with tensor parameters, per channel with float32 scales and int64 zero points."""

    def __init__(self, scale_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.register_buffer("s", (torch.rand(16, generator=g) * 0.05 + 1e-3).to(scale_dtype))
        self.register_buffer("z", torch.randint(-20, 20, (16,), generator=g))
        self.register_buffer("s0", torch.tensor([0.0123456789]))
        self.register_buffer("z0", torch.tensor([3]))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        qd = torch.ops.quantized_decomposed
        a = qd.quantize_per_tensor(x, 0.1 / 3, 7, -127, 127, torch.int8)  # a scale no float32 holds
        b = qd.quantize_per_tensor.tensor(x, self.s0, self.z0, 0, 255, torch.uint8)
        c = qd.quantize_per_channel(x, self.s, self.z, 1, -128, 127, torch.int8)
        return (a, qd.dequantize_per_tensor(a, 0.1 / 3, 7, -127, 127, torch.int8), b,
                qd.dequantize_per_tensor.tensor(b, self.s0, self.z0, 0, 255, torch.uint8), c,
                qd.dequantize_per_channel(c, self.s, self.z, 1, -128, 127, torch.int8))


def _near_ties(scale: float) -> torch.Tensor:
    """float32 values at and a few ulps around (k + 1/2) * scale: where x / scale and x * (1 / scale), or an
    inverse of the scale rounded to float32 first, round to different integers (about one value in ten)."""
    k = torch.arange(-130, 130, dtype=torch.float64)
    values = [((k + 0.5) * scale).to(torch.float32)]
    up, down = torch.tensor(float("inf")), torch.tensor(float("-inf"))
    for _ in range(3):
        values.append(torch.nextafter(values[-1], up))
    values.append(torch.nextafter(values[0], down))
    return torch.cat(values)


def test_each_overload_is_bit_exact_ties_and_saturation_included():
    import torch.ao.quantization.fx._decomposed  # noqa: F401 - defines torch.ops.quantized_decomposed

    torch.manual_seed(2)
    x = torch.randn(512, 16, 9) * 3
    x.view(-1)[:1300] = _near_ties(0.1 / 3)
    ep = torch.export.export(_DirectOps(), (x,))
    ir = from_exported_program(ep, "direct")
    quantize = [n for n in ir.nodes if n.op_type == "QUANTIZE"]
    assert quantize[0].attrs == {"dtype": "int8", "method": "multiply_inverse", "qmin": -127}
    assert quantize[2].attrs["axis"] == 1 and quantize[2].outputs[0].quant.scale == "b_s"
    for got, want in zip(IRExecutor(ir, ep).run([x]), ep.module()(x)):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_float64_per_channel_scales_are_refused_by_name():
    import torch.ao.quantization.fx._decomposed  # noqa: F401

    ep = torch.export.export(_DirectOps(torch.float64), (torch.randn(2, 16, 3),))
    with pytest.raises(ExtractionError, match=r"'quantize_per_channel'.*'b_s' are float64.*Fix: store the scales"):
        from_exported_program(ep, "direct")


def test_an_ir_file_may_not_name_quantized_decomposed_ops():
    import torch.ao.quantization.fx._decomposed  # noqa: F401 - the op exists in this process

    x, y = TensorMeta("x", [4], "float32", role="input"), TensorMeta("y", [4], "int8")
    attrs = {"scale": 0.1, "zero_point": 0, "quant_min": -128, "quant_max": 127, "dtype": {"dtype": "int8"}}
    ir = NPU_IR(model_name="hostile", graph_inputs=[x], graph_outputs=[y], weights=[],
                nodes=[OpNode("n0", "quantized_decomposed.quantize_per_tensor.default", [x], [y], attrs)])
    with pytest.raises(UnsafeInputError, match="namespace 'quantized_decomposed'"):
        IRExecutor(ir, {})


def test_dynamic_quantization_computes_its_parameters_with_aten_ops():
    _, ep, _ = quantized("mlp", "xnnpack_dynamic")
    assert "quantized_decomposed.choose_qparams.tensor" in {str(n.target) for n in ep.graph.nodes}
    ir = from_exported_program(ep, "mlp")
    quantize = [n for n in ir.nodes if n.op_type == "QUANTIZE"]
    assert quantize and all(isinstance(n.outputs[0].quant.scale, str) for n in quantize)
    assert "aten.aminmax.default" in ir.op_histogram()


def test_an_unmapped_quantized_decomposed_op_is_refused_at_extraction():
    import torch.ao.quantization.fx._decomposed  # noqa: F401

    class PerToken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            s, z = torch.ops.quantized_decomposed.choose_qparams_per_token_asymmetric(x, torch.int8)
            return torch.ops.quantized_decomposed.quantize_per_token(x, s, z, -128, 127, torch.int8)

    ep = torch.export.export(PerToken(), (torch.randn(3, 8),))
    with pytest.raises(ExtractionError, match=r"choose_qparams_per_token_asymmetric.*Fix: quantize per tensor"):
        from_exported_program(ep, "per_token")


def test_torchao_int8_weight_only_extracts_as_plain_aten_ops():
    """quantize_(Int8WeightOnlyConfig) with its tensor subclass unwrapped exports to ATen ops on plain int8 and
    float32 parameters (the codes cast to float, a matmul, a per-output-channel scale); nothing to map."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_
    from torchao.utils import unwrap_tensor_subclass

    torch.manual_seed(4)
    m, x = _mlp().eval(), torch.randn(4, 24)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantize_(m, Int8WeightOnlyConfig())
        eager = m(x)
        ep = torch.export.export(unwrap_tensor_subclass(m), (x,))
    ir = from_exported_program(ep, "mlp_w8")
    int8 = {tuple(w.shape) for w in ir.weights if w.dtype == "int8"}
    assert {(48, 24), (32, 48), (5, 32)} <= int8  # the codes (beside them: unused [N, 1] zero points)
    assert all(op.startswith("aten.") for op in ir.op_histogram())
    (got,) = IRExecutor(ir, ep).run([x])
    assert torch.equal(got, eager)
