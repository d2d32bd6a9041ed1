"""The cost model against SCALE-Sim v3 on a few small shapes, in every dataflow (the full sweep is
``bench/cost/run.py``). Skipped without ``scalesim``."""

from __future__ import annotations

import pytest

from npu_compiler.costmodel.crosscheck import METRICS, TOLERANCE, ArrayConfig, Shape, compare

pytest.importorskip("scalesim")

SHAPES = [
    Shape.gemm("bert.scores/4", "BERT-base, a quarter of one head", 32, 32, 64),  # q kᵀ
    Shape.gemm("qwen2.decode.o_proj/8", "Qwen2-0.5B decode, an eighth", 1, 112, 112),  # M = 1
    Shape.conv("r50.l3.conv2/16", "ResNet-50 3x3, narrowed", 7, 3, 16, 24, pad=1),
    Shape.conv("r50.l2.downsample/8", "ResNet-50 strided 1x1, narrowed", 14, 1, 32, 40, stride=2),
    Shape.conv("r50.conv1/8", "ResNet-50 7x7 stem, smaller input", 28, 7, 3, 16, stride=2, pad=3),
]


@pytest.mark.parametrize("dataflow", ["os", "ws", "is"])
def test_our_cycles_and_traffic_are_within_ten_percent_of_scalesim(dataflow: str) -> None:
    # 8 x 12: rows and columns differ, so a swapped mapping would show; 1 MiB SRAMs keep every operand resident
    config = ArrayConfig(8, 12, dataflow, 1024, 1024, 1024)
    for c in compare(SHAPES, config):
        for metric in METRICS:
            if c.gated(metric):
                assert abs(c.diff(metric)) <= TOLERANCE, (c.shape.name, metric, c.ours, c.theirs)
        assert c.theirs.compute_cycles > 0 and c.theirs.sram_reads > 0  # SCALE-Sim really ran


def test_partial_sums_go_to_dram_in_scalesim_only_where_k_folds() -> None:
    """The one figure that differs by design: weight-stationary SCALE-Sim writes each K fold's partial sums out."""
    c, = compare([Shape.gemm("k3folds", "example", 16, 12, 24)], ArrayConfig(8, 12, "ws", 1024, 1024, 1024))
    assert not c.gated("dram_writes")
    assert c.ours.dram_writes == 16 * 12
    assert c.theirs.dram_writes >= 3 * 16 * 12  # ceil(24 / 8) = 3 folds of K
