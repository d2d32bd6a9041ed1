"""Overlays carried across stages through provenance (npu_tools.view.overlays), on a graph written by hand."""

from __future__ import annotations

import pytest

from npu_tools.view.overlays import carry
from npu_tools.view.stages import GraphNode, StageGraph


def node(id_: str, sources: list[str]) -> GraphNode:
    return GraphNode(id_, "op", "", [], [], sources=sources)


GRAPHS = [
    StageGraph("extracted", [node("matmul", ["matmul"]), node("add", ["add"]), node("relu", ["relu"]),
                             node("view", ["view"])]),
    StageGraph("fused", [node("gemm", ["matmul", "add", "relu"]), node("view", ["view"])]),
    StageGraph("compiled", [node("d0", ["matmul", "add"]), node("d1", ["relu"]), node("d2", ["view"])]),
]


def test_a_dispatch_measurement_reaches_every_stage_each_contributor_once():
    overlay = carry("cycles", {"d0": 100.0, "d1": 10.0}, "compiled", GRAPHS)
    assert overlay.on("compiled") == {"d0": 100.0, "d1": 10.0}
    # the fused GEMM computes what d0 and d1 compute: their sum, each counted once
    assert overlay.on("fused") == {"gemm": 110.0}
    # an extracted node shows the dispatch computing it; the unmeasured view has no value
    assert overlay.on("extracted") == {"matmul": 100.0, "add": 100.0, "relu": 10.0}


def test_errors_take_the_largest_and_text_is_joined():
    error = carry("error", {"matmul": 1e-6, "add": 3e-5, "relu": 2e-5}, "extracted", GRAPHS, reduce="max")
    assert error.on("compiled") == {"d0": 3e-5, "d1": 2e-5} and error.on("fused") == {"gemm": 3e-5}
    placement = carry("placement", {"d0": "NPU", "d1": "host: no kernel"}, "compiled", GRAPHS, reduce="join")
    assert placement.on("fused") == {"gemm": "NPU; host: no kernel"}


def test_a_wrong_stage_or_reduction_is_refused():
    with pytest.raises(ValueError, match="no stage 'lowered'"):
        carry("x", {}, "lowered", GRAPHS)
    with pytest.raises(ValueError, match="reduce must be one of"):
        carry("x", {}, "compiled", GRAPHS, reduce="mean")
