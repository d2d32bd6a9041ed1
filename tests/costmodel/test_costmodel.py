"""The NPU cost model: hardware files and presets, hand-derived GEMM cycles, tiling, bounds, a ResNet-18-like
program and host dispatches. Expected cycle counts are derived by hand from the formulas in
``npu_compiler.costmodel.model``'s docstring, never by calling the model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler.costmodel import (
    CSV_COLUMNS,
    CostModelError,
    Hardware,
    HardwareError,
    cost_program,
    hardware_from_dict,
    load_hardware,
    presets,
)
from npu_compiler.costmodel.hardware import PRESET_DIR
from torch_ir.errors import TorchIRError

#: A 4 x 4 output-stationary array at 100 MHz (int8 and half-rate fp16), a big split SRAM, 100 GB/s (1000 bytes
#: per cycle) and no DRAM latency.
TOY = {
    "name": "toy", "clock_mhz": 100, "dataflow": "output_stationary", "dma_overlaps_compute": True,
    "array": {"rows": 4, "cols": 4},
    "macs_per_cycle": {"int8": 1.0, "fp16": 0.5, "bf16": 0, "fp32": 0},
    "vector": {"lanes": 4, "ops_per_cycle": {"elementwise": 1, "normalization": 0.5, "softmax": 0.25,
                                             "reduction": 1, "movement": 1}},
    "sram": {"weights_kib": 64, "activations_kib": 64, "accumulators_kib": 16},
    "dram": {"bandwidth_gbps": 100.0, "latency_ns": 0},
}


def small_hw(**changes: object) -> Hardware:
    hw = hardware_from_dict(TOY, "toy")
    return dataclasses.replace(hw, **changes) if changes else hw


def linear_program(m: int, k: int, n: int, bias: bool = True) -> npu_compiler.CompiledProgram:
    with torch.device("meta"):
        model = nn.Linear(k, n, bias=bias)
    ir = torch_ir.extract_ir(model, (torch.empty(m, k, device="meta"),))
    program = npu_compiler.compile(ir)
    assert [d.kernel for d in program.dispatches] == ["GEMM"]
    return program


# -- hardware files ------------------------------------------------------------------------------------------------


def test_presets_load_with_their_published_figures():
    assert set(presets()) >= {"ethos_u55_256", "edge_4tops", "tpu_v1"}
    u55 = load_hardware("ethos_u55_256")
    assert u55.pes * u55.macs_per_cycle["int8"] == 256 and u55.clock_mhz == 500
    assert load_hardware("edge_4tops").peak_tops("int8") == pytest.approx(4.1, rel=0.01)
    tpu = load_hardware("tpu_v1")
    assert (tpu.rows, tpu.cols, tpu.clock_mhz, tpu.dataflow) == (256, 256, 700, "weight_stationary")
    assert tpu.sram_activations_bytes == 24 * 2**20 and tpu.dram_bandwidth_gbps == 34
    assert tpu.peak_tops() == pytest.approx(92, rel=0.01)


def _write(tmp_path: Path, text: str, name: str = "hw.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _preset_text() -> str:
    return (PRESET_DIR / "edge_4tops.toml").read_text()


def test_a_json_file_loads(tmp_path):
    path = _write(tmp_path, json.dumps(TOY), "hw.json")
    assert load_hardware(path) == dataclasses.replace(small_hw(), source=str(path))
    with pytest.raises(HardwareError, match="must end in .toml or .json"):
        load_hardware(_write(tmp_path, "{}", "hw.yaml"))


@pytest.mark.parametrize(("old", "new", "words"), [
    ("[array]\n", "[array]\ndepth = 3\n", ["array.depth", "not a known key", "fix"]),
    ("weights_kib = 1024", "weights_kib = -5", ["sram.weights_kib", "positive", "fix"]),
    ('dataflow = "output_stationary"', 'dataflow = "row_stationary"', ["dataflow", "weight_stationary", "fix"]),
    ("rows = 32", "rows = 32.5", ["array.rows", "positive integer"]),
    ("accumulators_kib = 128", "accumulators_kib = 128\nshared_kib = 4", ["sram", "not both"]),
    ("lanes = 64\n", "", ["vector.lanes", "missing"]),
])
def test_bad_files_name_the_file_the_field_the_rule_and_the_fix(tmp_path, old, new, words):
    text = _preset_text()
    assert old in text
    path = _write(tmp_path, text.replace(old, new, 1))
    with pytest.raises(HardwareError) as info:
        load_hardware(path)
    message = str(info.value)
    assert str(path) in message
    for word in words:
        assert word in message
    assert isinstance(info.value, TorchIRError) and isinstance(info.value, ValueError)


def test_a_missing_file_or_a_bad_syntax_is_a_clear_error(tmp_path):
    with pytest.raises(HardwareError, match="no such hardware file or preset.*edge_4tops"):
        load_hardware(tmp_path / "nope.toml")
    with pytest.raises(HardwareError, match="cannot be read as TOML"):
        load_hardware(_write(tmp_path, "name = ["))


# -- one GEMM, by hand ---------------------------------------------------------------------------------------------


def test_a_gemm_costs_the_hand_derived_cycles():
    program = linear_program(m=8, k=16, n=8)
    row, = cost_program(program, small_hw(), dtype="int8").rows
    assert row.macs == 8 * 8 * 16
    # output-stationary on 4 x 4: folds = ceil(8/4) * ceil(8/4) = 4, each K + R + C - 2 = 16 + 6 = 22 cycles
    assert row.folds == 4 and row.array_cycles == 88 and row.compute_cycles == 88
    assert row.utilization == pytest.approx(1024 / (88 * 16))
    # int8 bytes: x 8*16 + w 8*16 + bias 8 read, y 8*8 written = 328 at 1000 B/cycle: 1 cycle
    assert (row.dram_bytes_read, row.dram_bytes_written, row.memory_cycles) == (264, 64, 1)
    assert row.bound == "compute" and row.cycles == 88 and row.tiling == "resident"
    # weight-stationary: folds = ceil(K/4) * ceil(N/4) = 8, stream M = 8 after loading R = 4 rows of weights:
    # 8 * (8 + 2 * 4 + 4 - 2) = 144
    ws, = cost_program(program, small_hw(dataflow="weight_stationary"), dtype="int8").rows
    assert ws.array_cycles == 144
    # SRAM words: os reads x 8*16 once per column fold (2) and w 16*8 once per row fold (2), writes y once;
    # ws reads w once, x per column fold, and writes y's partial sums once per K fold (4)
    assert (row.sram_reads, row.sram_writes) == (2 * 128 + 2 * 128, 64)
    assert (ws.sram_reads, ws.sram_writes) == (2 * 128 + 128, 4 * 64)
    # input-stationary: folds = ceil(K/4) * ceil(M/4) = 8, stream N = 8 after loading the inputs: 144 too
    assert cost_program(program, small_hw(dataflow="input_stationary"), dtype="int8").rows[0].array_cycles == 144
    # fp16 at half rate: ceil(88 / 0.5) = 176
    assert cost_program(program, small_hw(), dtype="fp16").rows[0].array_cycles == 176


def test_a_strided_1x1_conv_reads_only_the_pixels_it_uses():
    with torch.device("meta"):
        model = nn.Conv2d(4, 8, 1, stride=2, bias=False)
    program = npu_compiler.compile(torch_ir.extract_ir(model, (torch.empty(1, 4, 8, 8, device="meta"),)))
    row, = cost_program(program, small_hw(), dtype="int8").rows
    # int8: the input's even rows and columns, 4 * 4 * 4 of its 4 * 8 * 8 bytes, the weight 8 * 4, y 8 * 4 * 4
    assert (row.dram_bytes_read, row.dram_bytes_written) == (64 + 32, 128)


def test_utilization_drops_when_the_shape_does_not_fill_the_array():
    full, = cost_program(linear_program(m=8, k=16, n=8), small_hw(), dtype="int8").rows
    thin, = cost_program(linear_program(m=8, k=16, n=2), small_hw(), dtype="int8").rows
    # N = 2 on 4 columns: folds = 2 * 1, 2 * 22 = 44 cycles for 256 MACs
    assert thin.array_cycles == 44 and thin.utilization == pytest.approx(256 / (44 * 16))
    assert thin.utilization < full.utilization


def test_cutting_dram_bandwidth_flips_compute_bound_to_memory_bound():
    program = linear_program(m=8, k=16, n=8)
    assert cost_program(program, small_hw(), dtype="int8").rows[0].bound == "compute"
    # 0.1 GB/s at 100 MHz = 1 byte per cycle: 328 memory cycles against 88 compute
    slow = small_hw(dram_bandwidth_gbps=0.1)
    row, = cost_program(program, slow, dtype="int8").rows
    assert (row.memory_cycles, row.cycles, row.bound) == (328, 328, "memory")
    row, = cost_program(program, dataclasses.replace(slow, dma_overlaps_compute=False), dtype="int8").rows
    assert row.cycles == 88 + 328


def test_operands_that_do_not_fit_are_re_read():
    # W = 256 x 256 int8 = 64 KiB in 16 KiB of weight SRAM: 4 blocks; A = 64 x 256 = 16 KiB in 4 KiB: 4 blocks.
    # keep weights: 64K + 16K * 4 = 128K; keep activations: 16K + 64K * 4 = 272K -> keep weights
    hw = small_hw(sram_weights_bytes=16 * 1024, sram_activations_bytes=4 * 1024)
    row, = cost_program(linear_program(m=64, k=256, n=256), hw, dtype="int8").rows
    assert (row.tiling, row.weight_reads, row.activation_reads) == ("keep weights", 1, 4)
    assert row.dram_bytes_read == 65536 + 16384 * 4 + 256


def test_an_unsupported_dtype_is_costed_at_the_slowest_rate_and_flagged():
    row, = cost_program(linear_program(m=8, k=16, n=8), small_hw()).rows  # float32: fp32 rate is 0
    assert row.dtype == "fp32" and row.array_cycles == 176 and row.flags  # slowest supported: fp16's 0.5
    with pytest.raises(CostModelError, match="int8"):
        cost_program(linear_program(m=8, k=16, n=8), small_hw(), dtype="float64")


# -- a ResNet-18-like program --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def resnet_program() -> npu_compiler.CompiledProgram:
    transformers = pytest.importorskip("transformers")
    config = transformers.ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                                       layer_type="basic")
    with torch.device("meta"):
        model = transformers.ResNetModel(config).eval()
    ir = torch_ir.extract_ir(model, example_kwargs={"pixel_values": torch.empty(1, 3, 224, 224, device="meta")})
    return npu_compiler.compile(ir)


@pytest.mark.parametrize("preset", ["ethos_u55_256", "edge_4tops", "tpu_v1"])
def test_a_resnet18_program_costs_every_dispatch(resnet_program, preset):
    # how fast: bench/cost (a timed assert here would fail on a loaded CI machine, and prove nothing on a quiet one)
    hw = load_hardware(preset)
    report = cost_program(resnet_program, hw, dtype="int8")
    assert len(report.rows) == len(resnet_program.dispatches) and not report.host
    assert all(r.cycles > 0 for r in report.rows)
    convs = [r for r in report.rows if r.kernel == "CONV"]
    assert len(convs) == 20 and all(r.macs > 0 and 0 < r.utilization <= 1 for r in convs)
    # 12 without a residual; the 8 with one add an element per output to the convolution's FLOPs
    assert sum(r.flops == 2 * r.macs for r in convs) == 12 and all(r.flops >= 2 * r.macs for r in convs)
    assert 1.7e9 < report.macs < 1.9e9  # ResNet-18 at 224 x 224: ~1.8 G MACs
    assert report.latency_ms > 0 and report.fps == pytest.approx(1000 / report.latency_ms)
    assert 0 < report.utilization <= 1 and report.peak_sram_bytes <= hw.sram_total_bytes
    layers = report.by_layer(depth=3)
    assert "encoder.stages.0" in layers and sum(g.cycles for g in layers.values()) == report.total_cycles
    rows = report.to_csv_rows()
    assert len(rows) == len(report.rows) and tuple(rows[0]) == CSV_COLUMNS
    assert "utilization" in report.summary()


def test_a_repeated_program_costs_as_many_times_its_parts(resnet_program):
    """Each dispatch is costed on its own: 14 copies of the program cost 14 times one, row for row."""
    hw = load_hardware("edge_4tops")
    one = cost_program(resnet_program, hw)
    big = cost_program(dataclasses.replace(resnet_program, dispatches=resnet_program.dispatches * 14), hw)
    assert len(big.rows) == 14 * len(one.rows) >= 300
    assert [r.cycles for r in big.rows] == [r.cycles for r in one.rows] * 14
    assert big.total_cycles == 14 * one.total_cycles


# -- host dispatches -----------------------------------------------------------------------------------------------


class TopkHistogram(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 32)

    def forward(self, x):
        h = self.fc(x)
        return torch.topk(h, 4, dim=-1).values, torch.histc(h, bins=6, min=-2.0, max=2.0)


def test_host_dispatches_are_listed_apart_with_no_npu_cycles():
    with torch.device("meta"):
        model = TopkHistogram()
    ir = torch_ir.extract_ir(model, (torch.empty(8, 16, device="meta"),))
    program = npu_compiler.compile(ir, fallback="cpu")
    report = cost_program(program, load_hardware("edge_4tops"))
    assert [h.kernel for h in report.host] == ["aten.histc.default"] and report.host[0].reason
    assert {r.kernel for r in report.rows} == {"GEMM", "aten.topk.default"}  # topk is the sorting unit's kernel
    topk = next(r for r in report.rows if r.kernel == "aten.topk.default")
    # 8 rows x 32 elements x ceil(log2 32) = 1280 reduction ops on 64 lanes at 1 per cycle: 20 cycles
    assert topk.macs == 0 and topk.vector_cycles == 20
    assert len(report.rows) + len(report.host) == len(program.dispatches)
    assert "histc" in report.summary()
