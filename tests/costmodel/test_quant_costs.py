"""The cost model counts bits: the bytes of quantized weights (packed int4, their scales), the MAC rate of the width
a dispatch computes in (per operand width, from the hardware file, derived by rule where the file leaves one out),
the weight/activation split of the reports, and the hardware file's new fields refused when hostile. Every expected
figure is worked out by hand from the shapes and the rates, never by calling the code under test."""

from __future__ import annotations

import copy
import csv
import dataclasses
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler.costmodel import CostModelError, HardwareError, cost_program, hardware_from_dict, load_hardware
from npu_compiler.costmodel.hardware_template import hardware_template, hardware_to_dict
from npu_compiler.costmodel.precision import quantized_width
from npu_compiler.costmodel.report import cost_csv, report_html
from npu_program.kernels import KERNELS
from npu_program.program import CompiledProgram, Dispatch, MemoryPlan, TensorSpec

from .test_costmodel import TOY

M, K, N = 4, 256, 64  # a [M, K] x [N, K]ᵀ linear layer
MACS = M * N * K


def hw_with(rates: dict[str, float], rows: int = 4, cols: int = 4, name: str = "toy") -> Any:
    return hardware_from_dict({**TOY, "array": {"rows": rows, "cols": cols}, "macs_per_cycle": rates}, name)


def linear(bias: bool = False) -> CompiledProgram:
    with torch.device("meta"):
        model = nn.Linear(K, N, bias=bias)
    program = npu_compiler.compile(torch_ir.extract_ir(model, (torch.empty(M, K, device="meta"),)))
    assert [d.kernel for d in program.dispatches] == ["GEMM"]
    return program


@pytest.fixture(scope="module")
def gemm() -> CompiledProgram:
    return linear()


@pytest.fixture(scope="module")
def gemm_bias() -> CompiledProgram:
    return linear(bias=True)


# -- bytes -------------------------------------------------------------------------------------------------------------

def test_a_w4a16_weight_is_packed_int4_plus_its_g128_fp16_scales(gemm):
    """The TOY SRAM (64 KiB a buffer) holds both operands: each is read once."""
    row = cost_program(gemm, hw_with({"int8": 1, "fp16": 0.5, "bf16": 0, "fp32": 0}), precision="w4a16").rows[0]
    weight = N * K // 2 + N * (K // 128) * 2  # codes two per byte + one float16 scale per 128 of K per row
    assert weight == 8448
    assert row.weight_bytes == weight
    assert row.activation_bytes == M * K * 2 + M * N * 2  # float16 x in, y out
    assert row.dram_bytes == weight + M * K * 2 + M * N * 2
    assert row.dtype == "fp16" and row.operands == "float16 x int4 g128"
    assert row.weight_sizes == ((gemm.weight_specs[0].name, weight),)


def test_w8a8_int8_weights_with_per_channel_scales_and_an_int32_bias(gemm_bias):
    report = cost_program(gemm_bias, hw_with({"int8": 1, "fp16": 0.5, "bf16": 0, "fp32": 0}), precision="w8a8")
    row = report.rows[0]
    assert row.weight_bytes == N * K + N * 4 + N * 4  # int8 codes, a float32 scale per row, the int32 bias
    assert row.activation_bytes == M * K + M * N  # int8 activations
    assert row.dtype == "int8" and row.operands == "int8 x int8 per-channel"
    assert report.weights_stored == N * K + N * 4 + N * 4
    # as compiled (float32), the same program: every byte four
    fp32 = cost_program(gemm_bias, hw_with({"int8": 1, "fp16": 0.5, "bf16": 0, "fp32": 1})).rows[0]
    assert (fp32.weight_bytes, fp32.activation_bytes) == ((N * K + N) * 4, (M * K + M * N) * 4)
    assert fp32.dtype == "fp32"


def test_a_conv_weight_has_one_scale_per_output_channel():
    with torch.device("meta"):
        model = nn.Conv2d(3, 8, 3)
    program = npu_compiler.compile(torch_ir.extract_ir(model, (torch.empty(1, 3, 8, 8, device="meta"),)))
    row = next(r for r in cost_program(program, hw_with({"int8": 1, "fp16": 1, "bf16": 0, "fp32": 0}),
                                       precision="w8a8").rows if r.kernel == "CONV")
    assert row.weight_bytes == 8 * 3 * 3 * 3 + 8 * 4 + 8 * 4  # codes, per-channel float32 scales, int32 bias
    assert row.activation_bytes == 3 * 8 * 8 + 8 * 6 * 6  # int8 in, int8 out
    # w4a16: K = 27 is not a multiple of 128: one (partial) group of K a channel, a float16 scale each
    w4 = next(r for r in cost_program(program, hw_with({"int8": 1, "fp16": 1, "bf16": 0, "fp32": 0}),
                                      precision="w4a16").rows if r.kernel == "CONV")
    assert w4.weight_bytes == 8 * 27 // 2 + 8 * 2 + 8 * 2  # int4 codes, scales, the float16 bias


# -- MAC rates per width -----------------------------------------------------------------------------------------------

def test_each_precision_computes_at_its_widths_rate(gemm):
    """On a 1 x 1 output-stationary array a GEMM takes M*N folds of K cycles at one MAC a cycle: MACs / rate."""
    hw = hw_with({"int8": 4, "fp16": 1, "bf16": 0, "fp32": 0.5, "int4": 8}, rows=1, cols=1)
    cycles = {p: cost_program(gemm, hw, precision=p).rows[0].array_cycles
              for p in ("w8a8", "w4a8", "w4a16", "w8a16", "w8a16_int", "fp32")}
    assert cycles == {
        "w8a8": MACS // 4,  # int8 x int8 at the int8 rate
        "w4a8": MACS // 4,  # int8 x int4: the wider operand's rate, not int4's 8
        "w4a16": MACS // 1,  # weights dequantized inside: fp16 MACs
        "w8a16": MACS // 1,
        "w8a16_int": MACS // 2,  # int16 x int8, int16 left out: half the int8 rate (DERIVED_RATES)
        "fp32": MACS * 2,
    }
    assert cost_program(gemm, hw, precision="w8a16_int").rows[0].dtype == "int16"


def test_a_width_left_out_is_derived_and_one_given_as_zero_is_not():
    hw = hw_with({"int8": 2, "fp16": 0.5, "bf16": 0, "fp32": 0})
    assert (hw.mac_rate("int4"), hw.mac_rate("int16"), hw.mac_rate("fp8")) == (2, 1, 0.5)
    assert "int4" not in hw.macs_per_cycle and hw.native_dtype == "int8"  # derived rates are no design point
    zero = hw_with({"int8": 2, "fp16": 0.5, "bf16": 0, "fp32": 0, "int16": 0, "fp8": 0})
    assert (zero.mac_rate("int16"), zero.mac_rate("fp8")) == (0, 0)
    assert hw_with({"int8": 1, "fp16": 0, "bf16": 0, "fp32": 0, "int4": 3}).native_dtype == "int4"
    assert hw.peak_tops("int4") == pytest.approx(2 * 16 * 2 * 100e6 / 1e12)


def test_a_quantized_width_without_a_rate_is_refused_naming_the_file_and_width(gemm):
    with pytest.raises(CostModelError, match=r"preset ethos_u55_256: dispatch .* computes in fp16, but "
                                             r"macs_per_cycle\.fp16 of preset ethos_u55_256 is 0"):
        cost_program(gemm, load_hardware("ethos_u55_256"), precision="w4a16")
    no_int8 = hw_with({"int8": 0, "fp16": 1, "bf16": 0, "fp32": 0}, name="my_npu.toml")
    with pytest.raises(CostModelError, match=r"computes in int16, but macs_per_cycle\.int16, which my_npu\.toml "
                                             r"leaves out: derived as 0\.5 x macs_per_cycle\.int8 is 0"):
        cost_program(gemm, no_int8, precision="w8a16_int")
    # float work the part cannot run is still costed at the slowest rate and flagged, as before
    assert cost_program(gemm, no_int8, dtype="int8").rows[0].flags
    assert cost_program(gemm, load_hardware("edge_4tops"), precision="fp32").rows[0].flags == (
        "fp32 is unsupported by edge NPU 4 TOPS: costed at the slowest supported rate",)
    with pytest.raises(CostModelError, match="precision 'w3a7' is not one .* w8a8, w4a8, w8a16, w4a16"):
        cost_program(gemm, no_int8, precision="w3a7")


def test_the_presets_rate_their_widths():
    edge, tpu, u55 = (load_hardware(p) for p in ("edge_4tops", "tpu_v1", "ethos_u55_256"))
    assert (edge.mac_rate("int4"), edge.mac_rate("int8"), edge.mac_rate("int16")) == (2, 1, 0.5)
    assert (tpu.mac_rate("int16"), tpu.mac_rate("int4")) == (0.5, 1)  # 8 x 16 bits at half speed; int4 derived
    assert u55.mac_rate("int16") == 0.5 and u55.mac_rate("fp8") == 0


# -- quantized dispatches as compiled --------------------------------------------------------------------------------

def _spec(name: str, shape: list[int], dtype: str) -> TensorSpec:
    return TensorSpec(name, shape, dtype)


@pytest.mark.parametrize(("kernel", "x", "w", "params", "width"), [
    ("QGEMM", "int8", "int8", {}, "int8"),
    ("QGEMM", "uint8", "int8", {}, "int8"),
    ("QGEMM", "int16", "int8", {}, "int16"),  # 16 x 8: the wider operand
    ("QGEMM", "int16", "uint8", {"w_dtype": "int4"}, "int16"),
    ("QCONV", "int8", "uint8", {"w_dtype": "int4"}, "int8"),  # int4 codes held packed as uint8: the attr says
    ("QGEMM", "int4", "int4", {}, "int4"),
    ("DQGEMM", "float16", "uint8", {"w_dtype": "int4", "group_size": 128}, "fp16"),  # dequantized inside
    ("DQGEMM", "bfloat16", "int8", {"w_dtype": "int8"}, "bf16"),
])
def test_a_quantized_dispatch_computes_at_its_operands_width(kernel, x, w, params, width):
    d = Dispatch(kernel, "q", ["x", "w"], ["y"], params=params)
    got, operands = quantized_width(d, [_spec("x", [M, K], x), _spec("w", [N, K], w)], [_spec("y", [M, N], x)])
    assert got == width
    assert operands.startswith(f"{x} x {params.get('w_dtype', w)}")


@pytest.fixture
def dqgemm_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """DQGEMM's kernel record, or until npu_program has it (another change adds it), GEMM's record under its name:
    the same mapping (x [M, K] times w [N, K]ᵀ) and every tensor read whole."""
    if "DQGEMM" not in KERNELS:
        monkeypatch.setitem(KERNELS, "DQGEMM", dataclasses.replace(KERNELS["GEMM"], name="DQGEMM"))


def test_a_compiled_dqgemm_reads_its_packed_weight_and_scales_whatever_dtype_says(dqgemm_record):
    tensors = [_spec("x", [M, K], "float16"), _spec("w", [N, K], "int4"), _spec("w_scale", [N, K // 128], "float16"),
               _spec("y", [M, N], "float16")]
    specs = {t.name: t for t in tensors}
    program = CompiledProgram(
        model_name="dq", target="cpu", input_specs=[specs["x"]], output_specs=[specs["y"]],
        weight_specs=[specs["w"], specs["w_scale"]], weight_keys={}, tensors=specs,
        dispatches=[Dispatch("DQGEMM", "fc", ["x", "w", "w_scale"], ["y"],
                             params={"trans_b": True, "w_dtype": "int4", "axis": 1, "group_size": 128})],
        memory=MemoryPlan(arena_bytes=0, offsets={}, no_reuse_bytes=0))
    hw = hw_with({"int8": 1, "fp16": 0.5, "bf16": 0, "fp32": 0})
    for kw in ({}, {"dtype": "int8"}, {"precision": "w8a8"}):  # a quantized dispatch is costed as it is
        row = cost_program(program, hw, **kw).rows[0]
        assert row.weight_bytes == N * K // 2 + N * (K // 128) * 2
        assert row.activation_bytes == M * K * 2 + M * N * 2 and row.dtype == "fp16"


# -- reports -----------------------------------------------------------------------------------------------------------

def test_the_reports_show_the_width_and_the_split(gemm_bias):
    hw = hw_with({"int8": 1, "fp16": 0.5, "bf16": 0, "fp32": 0})
    report = cost_program(gemm_bias, hw, precision="w4a16")
    rows = list(csv.DictReader(io.StringIO(cost_csv(report))))
    assert rows[0]["dtype"] == "fp16" and rows[0]["operands"] == "float16 x int4 g128"
    assert int(rows[0]["weight_bytes"]) + int(rows[0]["activation_bytes"]) == int(rows[0]["dram_bytes"])
    weight = N * K // 2 + N * 2 * 2 + N * 2  # codes, two float16 scales a row, the float16 bias
    assert int(rows[0]["weight_bytes"]) == weight
    text = report.summary()
    assert f"DRAM by role: weights {weight:,} bytes, activations {M * K * 2 + M * N * 2:,} bytes" in text
    assert "compute widths: fp16 1 (100.0% of cycles)" in text
    assert text.splitlines()[1] == "costed at precision w4a16 (weights and activations by role)"
    page = report_html(report, hw, figure="")
    assert "compute width" in page and "DRAM by role" in page and "int4 1 (derived)" in page


# -- the hardware file's new fields ------------------------------------------------------------------------------------

BASE = {**TOY, "macs_per_cycle": {"int8": 1.0, "fp16": 0.5, "bf16": 0, "fp32": 0}}


@pytest.mark.parametrize(("value", "pattern"), [
    (-1, r'"macs_per_cycle\.int4" = -1 must be 0 or positive'),
    ("fast", r'"macs_per_cycle\.int4" = "fast" must be a number'),
    (True, r'"macs_per_cycle\.int4" = true must be a number .*a boolean is not one'),
    (1e9, r'"macs_per_cycle\.int4" = 1e\+09 is outside 0 \(unsupported\) or 0\.001\.\.1000'),
    (1e-9, r'"macs_per_cycle\.int4" = 1e-09 is outside'),
    (math.inf, r'"macs_per_cycle\.int4" = inf must be a finite number'),
    ([1], r'"macs_per_cycle\.int4" = an array of 1 item must be a number'),
])
def test_a_bad_width_rate_is_refused_by_name(value, pattern):
    doc = copy.deepcopy(BASE)
    doc["macs_per_cycle"]["int4"] = value
    with pytest.raises(HardwareError, match=pattern):
        hardware_from_dict(doc, "test")


def test_an_unknown_width_or_a_missing_required_one_is_refused(tmp_path: Path):
    doc = copy.deepcopy(BASE)
    doc["macs_per_cycle"]["int2"] = 4
    with pytest.raises(HardwareError, match=r'"macs_per_cycle\.int2" is not a known key \(known here: bf16, fp16, '
                                            r'fp32, fp8, int16, int4, int8\)'):
        hardware_from_dict(doc, "test")
    doc = copy.deepcopy(BASE)
    del doc["macs_per_cycle"]["int8"]
    with pytest.raises(HardwareError, match=r'"macs_per_cycle\.int8" is missing'):
        hardware_from_dict(doc, "test")
    path = tmp_path / "npu.json"  # a file: NaN is read by JSON and refused by the field check, naming the file
    doc = copy.deepcopy(BASE)
    doc["macs_per_cycle"]["int16"] = math.nan
    path.write_text(json.dumps(doc))
    with pytest.raises(HardwareError, match=rf'hardware file {path}: field "macs_per_cycle\.int16" = nan'):
        load_hardware(path)


def test_the_template_writes_the_widths_and_loads_back(tmp_path: Path):
    for preset in ("edge_4tops", "tpu_v1"):
        hw = load_hardware(preset)
        path = tmp_path / f"{preset}.toml"
        path.write_text(hardware_template(hw))
        again = load_hardware(path)
        assert again.macs_per_cycle == hw.macs_per_cycle
        assert {w: again.mac_rate(w) for w in ("int4", "int16", "fp8")} == \
            {w: hw.mac_rate(w) for w in ("int4", "int16", "fp8")}
    assert "int4" in hardware_to_dict(load_hardware("edge_4tops"))["macs_per_cycle"]
    assert "int4" not in hardware_to_dict(load_hardware("tpu_v1"))["macs_per_cycle"]
    assert "# int4 = 1" in hardware_template(load_hardware("tpu_v1"))  # left out: shown commented, with its rule


def test_the_cli_costs_at_a_precision(gemm, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from npu_tools.cli import main

    path = tmp_path / "linear.npubin"
    gemm.save(path)
    assert main(["cost", str(path), "--hw", "edge_4tops", "--precision", "w4a16", "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "costed at w4a16 (--precision): weight-only int4" in out
    weight = N * K // 2 + N * (K // 128) * 2
    assert f"DRAM by role: weights {weight:,} bytes" in out
    rows = list(csv.DictReader((tmp_path / "out" / "cost.csv").open()))
    assert [(r["dtype"], r["operands"], int(r["weight_bytes"])) for r in rows] == [("fp16", "float16 x int4 g128",
                                                                                    weight)]
    assert main(["cost", str(path), "--hw", "edge_4tops", "--precision", "w2a2"]) == 2
    assert "--precision w2a2: not a precision the cost model knows; fix: give one of fp32" in capsys.readouterr().err
    assert main(["cost", str(path), "--hw", "edge_4tops", "--precision", "w8a8", "--dtype", "int8"]) == 2
    assert "both say what to cost at" in capsys.readouterr().err


def test_a_compiled_qadd_moves_its_codes_bytes_whatever_dtype_says():
    """QADD (the quantized residual add) is vector work at its codes' width: three 1-byte tensors and six scalars,
    under any ``dtype`` or ``precision`` override."""
    shape = [1, 64, 14, 14]
    n = 64 * 14 * 14
    scalars = [_spec(name, [], dtype) for name, dtype in (("sa", "float32"), ("za", "uint8"), ("sb", "float32"),
                                                          ("zb", "uint8"), ("sy", "float32"), ("zy", "uint8"))]
    tensors = [_spec("a", shape, "uint8"), _spec("b", shape, "uint8"), *scalars, _spec("y", shape, "uint8")]
    specs = {t.name: t for t in tensors}
    program = CompiledProgram(
        model_name="qadd", target="cpu", input_specs=[specs["a"], specs["b"]], output_specs=[specs["y"]],
        weight_specs=scalars, weight_keys={}, tensors=specs,
        dispatches=[Dispatch("QADD", "add", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"],
                             params={"out_dtype": "uint8", "activation": None, "method": "divide"})],
        memory=MemoryPlan(arena_bytes=0, offsets={}, no_reuse_bytes=0))
    assert KERNELS["QADD"].cost(tensors[:8], tensors[8:]).flops == n  # one operation an element, as an add
    hw = hw_with({"int8": 1, "fp16": 0.5, "bf16": 0, "fp32": 0})
    for kw in ({}, {"dtype": "fp16"}, {"precision": "w8a8"}):
        row = cost_program(program, hw, **kw).rows[0]
        assert row.dram_bytes_read + row.dram_bytes_written == 3 * n + 3 * 4 + 3 and row.dtype == "int8", kw


def test_a_compiled_qlut_moves_its_codes_bytes_whatever_dtype_says():
    """QLUT (a quantized elementwise chain as a table) is vector work at its codes' width: two 1-byte tensors and
    four scalars (the table is made once when the weights are bound), under any ``dtype`` or ``precision``."""
    shape = [1, 128, 3072]
    n = 128 * 3072
    scalars = [_spec(name, [], dtype) for name, dtype in (("sx", "float32"), ("zx", "uint8"), ("sy", "float32"),
                                                          ("zy", "uint8"))]
    tensors = [_spec("x", shape, "uint8"), *scalars, _spec("y", shape, "uint8")]
    specs = {t.name: t for t in tensors}
    program = CompiledProgram(
        model_name="qlut", target="cpu", input_specs=[specs["x"]], output_specs=[specs["y"]],
        weight_specs=scalars, weight_keys={}, tensors=specs,
        dispatches=[Dispatch("QLUT", "gelu", ["x", "sx", "zx", "sy", "zy"], ["y"],
                             params={"functions": "mul erf", "numbers": [0.7071067932881648], "out_dtype": "uint8",
                                     "method": "divide"})],
        memory=MemoryPlan(arena_bytes=0, offsets={}, no_reuse_bytes=0))
    assert KERNELS["QLUT"].cost(tensors[:5], tensors[5:]).flops == n  # one lookup an element
    hw = hw_with({"int8": 1, "fp16": 0.5, "bf16": 0, "fp32": 0})
    for kw in ({}, {"dtype": "fp16"}, {"precision": "w8a8"}):
        row = cost_program(program, hw, **kw).rows[0]
        assert row.dram_bytes_read + row.dram_bytes_written == 2 * n + 2 * 4 + 2 and row.dtype == "int8", kw
