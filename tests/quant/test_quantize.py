"""The toolkit quantizes a float model itself: presets, calibration, overrides, the KV cache, bad input.

The float reference is always the model itself run by PyTorch eager (never the code under test); integer codes are
compared bit-exactly, floats with a bound per preset (see ``BOUNDS``).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import torch_ir
from npu_compiler.quantize import PRESETS, QuantConfig, QuantizeError, get_preset, quantize
from npu_tools.zoo import build_pair, get_model
from torch_ir.executor import IRExecutor
from torch_ir.ir import load_ir
from torch_ir.weights import module_state, save_weights

#: Bound on ||quantized - float|| / ||float|| of the outputs over held-out inputs, per preset (measured: about a
#: third of each). A b-bit uniform quantizer's relative RMS error is about 2^-b·(range/RMS)/sqrt(12); for
#: Gaussian-like tensors range/RMS is ~6-8, so 8-bit steps give under 1 % per tensor and a few layers ~1-2 %; a
#: held-out input beyond the calibrated range is clipped (the MLP's second input: ~4 %), whence 6 % with 8- or
#: 16-bit activations; 8-bit weights alone stay under 1 %: 2 %. 4-bit weights (16 levels) are ~5 % after the
#: clipping search: 12 %. fp8 e4m3's 3-bit mantissa rounds each weight and activation by up to 2^-4 (~3.6 % RMS)
#: and compounds over the layers: 8 %.
BOUNDS = {"w8a8": 0.06, "w8a16": 0.02, "16a8w": 0.06, "w4a16": 0.12, "w4a8": 0.12, "16a4w": 0.12, "fp8": 0.08}
QUANTIZED = [p for p in PRESETS if p != "float"]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


@pytest.fixture(scope="module", params=["convnet", "mlp"])
def model(request):
    """(name, float IR, real model, calibration samples, held-out inputs), seeded."""
    entry = get_model(request.param)
    meta, real = build_pair(entry)
    args, _ = entry.example_inputs()
    ir = torch_ir.extract_ir(meta, args, model_name=entry.name)
    g = torch.Generator().manual_seed(1)
    calib = [tuple(torch.randn(a.shape, generator=g) for a in args) for _ in range(8)]
    held_out = [tuple(torch.randn(a.shape, generator=g) for a in args) for _ in range(4)]
    return request.param, ir, real, calib, held_out


@pytest.mark.parametrize("preset", QUANTIZED)
def test_each_preset_runs_close_to_float(model, preset):
    name, ir, real, calib, held_out = model
    qir, qweights = quantize(ir, module_state(real), preset, calibration=calib)
    run = IRExecutor(qir, qweights, check_shapes=True)
    for x in held_out:
        with torch.no_grad():
            want = real(*x)
        assert rel_err(run.run(list(x))[0], want) < BOUNDS[preset], (name, preset)
    hist = qir.op_histogram()
    assert hist["DEQUANTIZE"] >= 3  # one per quantized weight at least
    assert ("QUANTIZE" in hist) == (get_preset(preset).act_dtype is not None)
    assert {"CONV", "GEMM"} & set(hist)  # the float ops stay, read through DEQUANTIZE


def test_float_output_names_are_kept(model):
    _, ir, real, calib, _ = model
    from npu_compiler.passes import normalize

    qir, _ = quantize(ir, module_state(real), "w8a8", calibration=calib)
    float_outputs = {t.name for n in normalize(ir).nodes for t in n.outputs}
    assert float_outputs <= {t.name for n in qir.nodes for t in n.outputs}
    assert [t.name for t in qir.graph_outputs] == [t.name for t in ir.graph_outputs]


def test_w8a8_weights_are_the_folded_weights_rounded_to_their_scale():
    """The first conv's batch norm is folded (computed here from the model, independently), then each output
    channel is rounded to its own scale: every code is within half a step of the folded weight unless clipped."""
    meta, real = build_pair("convnet")
    args, _ = get_model("convnet").example_inputs()
    ir = torch_ir.extract_ir(meta, args)
    qir, qw = quantize(ir, module_state(real), "w8a16")
    conv, bn = real.features[0][0], real.features[0][1]
    k = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    folded = (conv.weight * k[:, None, None, None]).detach()
    codes, scale = qw["features.0.0.weight"], qw["features.0.0.weight_scale"]
    assert codes.dtype == torch.int8 and scale.shape == (8,)
    deq = codes.to(torch.float32) * scale[:, None, None, None]
    inside = folded.abs() <= 127 * scale[:, None, None, None]
    half_step = (scale / 2).reshape(-1, 1, 1, 1).expand_as(folded)
    assert inside.float().mean() > 0.9  # the clipping search clips a few outliers at most
    assert torch.all((deq - folded).abs()[inside] <= half_step[inside] * (1 + 1e-6))
    bias = qw["features.0.0.weight_folded_bias"]
    torch.testing.assert_close(bias, (bn.bias - bn.running_mean * k).detach())
    assert "bn_eps" not in qir.nodes[[n.op_type for n in qir.nodes].index("CONV")].attrs


@pytest.mark.parametrize("preset", ["w4a16_g8", "w4a8", "16a4w", "fp8"])
def test_quantized_weights_are_stored_as_computed_and_round_trip_through_safetensors(tmp_path, preset):
    """4-bit codes are packed (uint8, two a byte: half the bytes of int8 codes); fp8 ones are float8_e4m3fn. Saved
    and loaded (IR JSON, safetensors), the model computes bit for bit the same."""
    meta, real = build_pair("mlp")
    args, _ = get_model("mlp").example_inputs()
    ir = torch_ir.extract_ir(meta, args, model_name="mlp")
    calib = [tuple(torch.randn(a.shape) for a in args) for _ in range(4)]
    qir, qw = quantize(ir, module_state(real), preset, calibration=calib)
    quantized = [w for w in qir.weights if w.quant is not None]
    assert quantized and all(w.dtype == get_preset(preset).weight_dtype for w in quantized)
    for w in quantized:
        stored = qw[qir.weight_name_mapping.get(w.name, w.name)]
        if preset == "fp8":
            assert stored.dtype == torch.float8_e4m3fn and list(stored.shape) == w.shape
            continue
        assert stored.dtype == torch.uint8
        assert stored.numel() * 2 == int(np.prod(w.shape))  # two codes a byte: half the bytes of int8 codes
    qir.save(tmp_path / "q.json")
    save_weights(qw, tmp_path / "q.safetensors")
    loaded_ir, loaded_w = load_ir(tmp_path / "q.json"), load_file(tmp_path / "q.safetensors")
    assert all(torch.equal(loaded_w[k], v) for k, v in qw.items())
    x = [torch.randn(a.shape, generator=torch.Generator().manual_seed(5)) for a in args]
    assert torch.equal(IRExecutor(loaded_ir, loaded_w).run(x)[0], IRExecutor(qir, qw).run(x)[0])


def test_w4a16_groups_follow_k_and_fall_back_per_channel():
    """convnet: the first conv's K (3·3·3 = 27) is not a multiple of 8, the second's (8·3·3 = 72) and the head's
    (16) are: per channel, then per group of 8 along the flattened K."""
    meta, real = build_pair("convnet")
    args, _ = get_model("convnet").example_inputs()
    qir, qw = quantize(torch_ir.extract_ir(meta, args), module_state(real), "w4a16_g8")
    layers = qir.metadata["quantize"]["layers"]
    grans = [next(iter(v["weights"].values())) for v in layers.values()]
    assert grans[0]["granularity"] == "channel" and grans[0]["dtype"] == "uint8"  # 27 is odd: no 4-bit packing
    assert [g["granularity"] for g in grans[1:]] == ["group", "group"]
    assert qw["features.2.0.weight_scale"].shape == (16, 72 // 8)
    with pytest.raises(QuantizeError, match=r"group_size 8 does not divide its weight's K \(27"):
        quantize(torch_ir.extract_ir(meta, args), module_state(real),
                 QuantConfig(weight_dtype="int4", weight_granularity="group", group_size=8, act_dtype=None,
                             strict_groups=True))


def test_overrides_keep_layers_float_or_at_8_bits():
    meta, real = build_pair("convnet")
    args, _ = get_model("convnet").example_inputs()
    calib = [tuple(torch.randn(a.shape) for a in args) for _ in range(4)]
    config = get_preset("w4a8").with_overrides({"features.0": "w8a8", "head": None})
    qir, qw = quantize(torch_ir.extract_ir(meta, args), module_state(real), config, calibration=calib)
    assert qw["features.0.0.weight"].dtype == torch.int8  # 8 bits, unpacked
    assert qw["features.2.0.weight"].dtype == torch.uint8 and qir.tensor("p_features_2_0_weight").dtype == "int4"
    assert qw["head.weight"].dtype == torch.float32
    gemm = next(n for n in qir.nodes if n.op_type == "GEMM")
    assert gemm.inputs[0].name == "flatten" and gemm.inputs[1].name == "p_head_weight"  # float in, float weight


@pytest.mark.parametrize("observer", ["percentile", "mse"])
def test_other_observers_calibrate_a_model_as_well(model, observer):
    _, ir, real, calib, held_out = model
    config = replace(get_preset("w8a8"), act_observer=observer)
    qir, qw = quantize(ir, module_state(real), config, calibration=calib)
    ranges = [a for layer in qir.metadata["quantize"]["layers"].values() for a in layer["activations"].values()]
    assert ranges and all(a["observer"] == observer for a in ranges)
    with torch.no_grad():
        want = real(*held_out[0])
    assert rel_err(IRExecutor(qir, qw).run(list(held_out[0]))[0], want) < BOUNDS["w8a8"]


def test_observers_clip_an_outlier():
    from npu_compiler.quantize.observers import Observer

    values = torch.cat([torch.randn(10000, generator=torch.Generator().manual_seed(0)), torch.tensor([50.0])])
    ranges = {}
    for kind in ("minmax", "percentile", "mse"):
        obs = Observer(kind, percentile=99.9)
        obs.observe(values)
        ranges[kind] = obs.range("int8", True)
    assert ranges["minmax"][1] == 50.0
    want_hi = float(np.percentile(values.numpy(), 99.9))
    assert ranges["percentile"][1] == pytest.approx(want_hi, rel=1e-3)
    assert ranges["mse"][1] < 50.0


def test_bad_input_is_refused_with_the_fix(tmp_path):
    meta, real = build_pair("mlp")
    args, _ = get_model("mlp").example_inputs()
    ir = torch_ir.extract_ir(meta, args)
    state = module_state(real)
    with pytest.raises(QuantizeError, match="unknown quantization preset 'w3a3'.*w8a8.*w4a16.*fp8"):
        quantize(ir, state, "w3a3")
    with pytest.raises(QuantizeError, match="w8a8 quantizes activations.*calibration"):
        quantize(ir, state, "w8a8")
    bad = torch.randn(args[0].shape[0], args[0].shape[1] + 1)
    with pytest.raises(QuantizeError, match=r"calibration sample 0: input 'x' has shape \[.*\]; the IR declares"):
        quantize(ir, state, "w8a8", calibration=[bad])
    np.savez(tmp_path / "a.npz", x=np.zeros(list(args[0].shape), np.float64))
    with pytest.raises(QuantizeError, match=r"calibration file .*a\.npz: input 'x' is float64"):
        quantize(ir, state, "w8a8", calibration=str(tmp_path))
    np.savez(tmp_path / "a.npz", y=np.zeros(list(args[0].shape), np.float32))
    with pytest.raises(QuantizeError, match=r"a\.npz: the IR takes inputs \['x'\]; missing \['x'\]"):
        quantize(ir, state, "w8a8", calibration=str(tmp_path))
    with pytest.raises(QuantizeError, match="missing' does not exist or is not a directory; give a directory"):
        quantize(ir, state, "w8a8", calibration=str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(QuantizeError, match=r"holds no \.npz file; write one per sample, each with the arrays \['x'\]"):
        quantize(ir, state, "w8a8", calibration=str(tmp_path / "empty"))


@pytest.fixture(scope="module")
def tiny_qwen2():
    """A Qwen2-shaped LLM (hidden 128: K of 128 and 256, whole groups of 128) with a static KV cache of 32."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from tests.llm.checkpoints import tiny_config
    from torch_ir.frontends.hf import extract_lm

    config = tiny_config("qwen2", hidden_size=128, intermediate_size=256)
    torch.manual_seed(0)
    real = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    with torch_ir.build_on_meta():
        meta = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    return real, extract_lm(meta, 32)


def _lm_inputs(seed: int, length: int = 12) -> dict[str, torch.Tensor]:
    ids = torch.randint(4, 300, (1, length), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "cache_position": torch.arange(length)}


@pytest.mark.slow
def test_w4a16_g128_llm_runs_with_packed_grouped_weights(tiny_qwen2):
    """w4a16 g128 needs no calibration (activations stay float). Bound: this model's logits move ~1.2 % (RMS) with
    int8 weights; 4 bits fewer make each step 16 times coarser, ~19 %: 25 %. (Random Gaussian weights have no
    outliers, so groups gain little over channels here; on real checkpoints they do.)"""
    real, ir = tiny_qwen2
    qir, qw = quantize(ir, module_state(real), "w4a16")
    specs = {w.name: w.quant for w in qir.weights if w.quant is not None}
    assert len(specs) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
    assert all(s.dtype == "uint4" and s.group_size == 128 and s.axis == 1 for s in specs.values())
    key = qir.weight_name_mapping["p_model_model_layers_0_mlp_down_proj_weight"]
    assert qw[key].dtype == torch.uint8 and tuple(qw[key].shape) == (128, 128)  # [128, 256] codes, packed
    assert tuple(qw[key + "_scale"].shape) == (128, 2) and qw[key + "_zero_point"].dtype == torch.uint8
    inputs = _lm_inputs(3)
    with torch.no_grad():
        want = real(inputs["input_ids"]).logits[:, -1:]
    got = IRExecutor(qir, qw, check_shapes=True).run(inputs)[0]
    assert rel_err(got, want) < 0.25


def test_kv_cache_is_fake_quantized_at_kv_bits(tiny_qwen2):
    real, ir = tiny_qwen2
    calib = [_lm_inputs(seed) for seed in (10, 11)]
    config = replace(get_preset("w4a16"), kv_bits=8)
    qir, qw = quantize(ir, module_state(real), config, calibration=calib)
    writes = [n for n in qir.nodes if n.op_type == "KV_UPDATE"]
    assert len(writes) == 4
    producers = {t.name: n for n in qir.nodes for t in n.outputs}
    for node in writes:
        dq = producers[node.inputs[1].name]
        assert dq.op_type == "DEQUANTIZE" and producers[dq.inputs[0].name].attrs["dtype"] == "int8"
        assert dq.inputs[0].quant.dtype == "int8" and dq.inputs[0].quant.zero_point is None
    assert not any(k.startswith(("key_cache", "value_cache")) for k in qw)  # the caches start empty: not stored
    inputs = _lm_inputs(3)
    with torch.no_grad():
        want = real(inputs["input_ids"]).logits[:, -1:]
    assert rel_err(IRExecutor(qir, qw).run(inputs)[0], want) < 0.25  # int8 cache entries add ~0.1 % to w4a16's


def _images(g: torch.Generator, n: int, size: int = 64) -> torch.Tensor:
    """Seeded random images with structure at several scales: smooth colour fields plus pixel noise."""
    low = torch.randn(n, 3, 8, 8, generator=g)
    x = torch.nn.functional.interpolate(low, size=(size, size), mode="bilinear", align_corners=False)
    return x + 0.3 * torch.randn(n, 3, size, size, generator=g)


def _resnet18(g: torch.Generator, classes: int = 100):
    """ResNet-18 (transformers' ResNet, basic blocks [2, 2, 2, 2], widths 64-512), seeded, batch norms with
    non-trivial statistics, and its ``classes`` prototype images.

    A random network maps every input to nearly the same pooled features (they differ by ~15 % of their norm), so
    a random head puts all inputs in one or two classes and top-1 agreement measures only noise. The head is
    therefore a nearest-class-mean classifier over the pooled features of seeded prototype images, and the test
    images are a prototype plus as much noise again as makes the float model's decisions non-trivial (a third of
    them no longer the prototype's class): a data set with class structure, as a trained model sees."""
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                          embedding_size=64, num_labels=classes)
    torch.manual_seed(0)
    real = ResNetForImageClassification(config).eval()
    with torch.no_grad():
        for m in real.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5, generator=g)
                m.running_var.uniform_(0.5, 1.5, generator=g)
                m.weight.uniform_(0.5, 1.5, generator=g)
                m.bias.uniform_(-0.2, 0.2, generator=g)
        prototypes = _images(g, classes)
        feats = real.resnet(prototypes).pooler_output.flatten(1)
        mean = feats.mean(0)
        w = torch.nn.functional.normalize(feats - mean, dim=1)
        real.classifier[1].weight.copy_(w)
        real.classifier[1].bias.copy_(-w @ mean)
    with torch_ir.build_on_meta():
        meta = ResNetForImageClassification(config).eval()
    return real, meta, prototypes


TEST_IMAGES = 400


@pytest.mark.slow
def test_w8a8_resnet18_keeps_top1_agreement():
    """w8a8 ResNet-18 on 400 seeded 64x64 images, calibrated on 16 others: top-1 agrees with float on >= 95 %.
    Run: pytest -m slow -s tests/quant/test_quantize.py -k resnet18 (prints the figure)."""
    pytest.importorskip("transformers")
    g = torch.Generator().manual_seed(0)
    real, meta, prototypes = _resnet18(g)
    batch, noise = 8, 0.75

    def images() -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randint(len(prototypes), (batch,), generator=g)
        return prototypes[labels] + noise * _images(g, batch), labels

    ir = torch_ir.extract_ir(meta, (torch.zeros(batch, 3, 64, 64),), model_name="resnet18")
    calib = [images()[0] for _ in range(2)]
    qir, qw = quantize(ir, module_state(real), "w8a8", calibration=calib)
    run = IRExecutor(qir, qw)
    agree = source = 0
    classes: set[int] = set()
    for _ in range(TEST_IMAGES // batch):
        x, labels = images()
        with torch.no_grad():
            want = real(x).logits.argmax(-1)
        agree += int((run.run([x])[0].argmax(-1) == want).sum())
        source += int((want == labels).sum())
        classes |= set(want.tolist())
    print(f"w8a8 ResNet-18: top-1 agreement {agree}/{TEST_IMAGES} = {agree / TEST_IMAGES:.1%}; the float model "
          f"predicts {len(classes)} classes, its prototype's for {source / TEST_IMAGES:.0%}")
    assert len(classes) >= 20 and source < TEST_IMAGES  # the decisions are varied and not all trivial
    assert agree / TEST_IMAGES >= 0.95
