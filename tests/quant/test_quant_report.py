"""The quantization accuracy report: per-layer SQNR and cosine of a quantized IR against its float one, the first
layer whose error jumps, next-token KLD and top-1 agreement of an LLM, the report files, and the mixed-precision
search joined to the cost model. Quantized IRs come from the test's own QDQ inserter (``qdq_helper``); expected
values are computed here from their definitions, never by the code under test."""

from __future__ import annotations

import copy
import csv
import math

import pytest
import torch
from torch import nn

import torch_ir
from npu_compiler.passes import normalize
from npu_compiler.quantize.report import (
    PARETO_COLUMNS,
    Target,
    compare_quantized,
    propose_mixed_precision,
    token_agreement,
    write_report,
)
from torch_ir.executor import IRExecutor

from .qdq_helper import qdq_quantize


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))
        x = torch.relu(self.c3(x))
        return self.fc(x.mean((2, 3)))


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    model = SmallCNN().eval()
    ir = normalize(torch_ir.extract_ir(model, (torch.randn(1, 3, 8, 8),), allow_real_weights=True))
    g = torch.Generator().manual_seed(1)
    calibration = [[torch.randn(1, 3, 8, 8, generator=g)] for _ in range(4)]
    evaluation = [[torch.randn(1, 3, 8, 8, generator=g)] for _ in range(3)]
    return ir, model.state_dict(), calibration, evaluation


def _sqnr(expected: torch.Tensor, actual: torch.Tensor) -> float:
    e, a = expected.double(), actual.double()
    return 10 * math.log10(float((e * e).sum()) / float(((a - e) ** 2).sum()))


def test_unquantized_tensor_is_exact_quantized_ones_finite_and_narrower_is_worse(cnn):
    ir, sd, cal, ev = cnn
    by_bits = {}
    for bits in (8, 4):
        q, qw = qdq_quantize(ir, sd, {"w": bits, "a": 8, "overrides": {"conv_relu": None}}, cal)
        by_bits[bits] = report = compare_quantized(ir, sd, q, qw, ev)
        rows = {la.node: la for la in report.layers}
        assert [la.node for la in report.layers] == ["conv_relu", "conv_relu_1", "conv_relu_2", "mean", "gemm"]
        assert math.isinf(rows["conv_relu"].sqnr_db) and rows["conv_relu"].cosine == pytest.approx(1.0)
        assert all(math.isfinite(rows[n].sqnr_db) for n in ("conv_relu_1", "conv_relu_2", "gemm"))
        # the output's SQNR by its definition, over the three inputs together
        exp = torch.cat([IRExecutor(ir, sd).run(x)[0] for x in ev])
        act = torch.cat([IRExecutor(q, qw).run(x)[0] for x in ev])
        assert report.output_sqnr_db == pytest.approx(_sqnr(exp, act), rel=1e-9)
    eight, four = ({la.node: la for la in by_bits[b].layers} for b in (8, 4))
    assert 25 < eight["conv_relu_1"].sqnr_db < 60  # 8-bit weights and activations: tens of dB, not exact
    for node in ("conv_relu_1", "conv_relu_2", "gemm"):
        assert four[node].sqnr_db < eight[node].sqnr_db - 6  # 4 bits fewer: about 24 dB less, at least one bit
        assert four[node].cosine < eight[node].cosine <= 1.0


def test_a_broken_quantize_is_the_first_jump_and_a_sound_one_has_none(cnn):
    ir, sd, cal, ev = cnn
    q, qw = qdq_quantize(ir, sd, {"w": 8, "a": 8}, cal)
    sound = compare_quantized(ir, sd, q, qw, ev)
    assert sound.first_jump is None and sound.verdict.kind == "ok"
    q, qw = qdq_quantize(ir, sd, {"w": 8, "a": 8}, cal, broken=("conv_relu_2", 100.0))
    broken = compare_quantized(ir, sd, q, qw, ev)
    assert broken.first_jump is not None and broken.first_jump.node == "conv_relu_2"
    assert broken.verdict.kind == "fault" and "conv_relu_2" in broken.summary()
    assert broken.worst(1)[0].node == "conv_relu_2"


def test_the_rule_is_the_bisects():
    import npu_tools.debug.drift as tools
    import torch_ir.verify.drift as core

    assert tools.judge is core.judge and tools.NodeError is core.NodeError


def test_kld_of_identical_logits_is_zero_and_by_hand_otherwise():
    logits = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))
    same = token_agreement([(logits, logits.clone())])
    assert same.positions == 10 and same.mean_kld == 0.0 and same.top1_pct == 100.0
    p = torch.tensor([[0.0, 0.0]], dtype=torch.float64)  # [1/2, 1/2] against [1/4, 3/4]
    q = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64)
    by_hand = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    diff = token_agreement([(p, q)])
    assert diff.mean_kld == pytest.approx(by_hand, rel=1e-12) and diff.top1_pct == 0.0


@pytest.fixture(scope="module")
def tiny_qwen():
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from ..llm.checkpoints import tiny_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("qwen2"), attn_implementation="sdpa").eval()

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=ids, use_cache=False).logits

    wrapper = Logits().eval()
    ids = torch.randint(4, 300, (1, 12), generator=torch.Generator().manual_seed(2))
    ir = normalize(torch_ir.extract_ir(wrapper, (ids,), allow_real_weights=True))
    return ir, wrapper.state_dict(), ids


def test_a_tiny_qwen2_gets_a_finite_kld_and_itself_zero(tiny_qwen):
    ir, sd, ids = tiny_qwen
    logits = ir.graph_outputs[0].name
    g = torch.Generator().manual_seed(3)
    runs = [[torch.randint(4, 300, (1, 12), generator=g)] for _ in range(2)]
    itself = compare_quantized(ir, sd, ir, sd, runs, logits=logits)
    assert itself.tokens.positions == 24 and itself.tokens.mean_kld == 0.0 and itself.tokens.top1_pct == 100.0
    q, qw = qdq_quantize(ir, sd, {"w": 4, "a": 8}, [[ids]])
    report = compare_quantized(ir, sd, q, qw, runs, logits=logits)
    t = report.tokens
    assert t.positions == 24 and math.isfinite(t.mean_kld) and t.mean_kld > 0 and 0 <= t.top1_pct <= 100
    assert t.max_kld >= t.p99_kld >= t.mean_kld * 0 and math.isfinite(report.output_sqnr_db)


def _renamed(ir, old: str, new: str):
    out = copy.deepcopy(ir)
    out.node(old).name = new
    return out


def test_files_escape_model_names(cnn, tmp_path):
    ir, sd, cal, ev = cnn
    hostile = "<script>alert(1)</script>"
    ir = _renamed(ir, "conv_relu_1", hostile)
    q, qw = qdq_quantize(ir, sd, {"w": 8, "a": 8}, cal)
    report = compare_quantized(ir, sd, q, qw, ev)
    assert hostile in [la.node for la in report.layers]
    for png in (True, False):
        paths = write_report(report, tmp_path, png=png)
        page = (tmp_path / "report.html").read_text()
        assert hostile not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        figure = paths[2].read_bytes()
        assert figure.startswith(b"\x89PNG") if png else hostile.encode() not in figure
    rows = list(csv.DictReader((tmp_path / "accuracy.csv").open()))
    assert [r["node"] for r in rows][1] == hostile and rows[0]["sqnr_db"] != "inf"


def test_mixed_precision_reaches_the_target_by_widening_and_costs_each_assignment(cnn, tmp_path):
    ir, sd, cal, ev = cnn
    report = propose_mixed_precision(ir, sd, {"w": 4, "a": 4}, cal, ev, target=Target(min_sqnr_db=40.0),
                                     quantize_fn=qdq_quantize, hardware="edge_4tops", ladder=((8, 8), None))
    tried = report.assignments
    assert tried[0].kind == "base" and not tried[0].meets_target and tried[0].output_sqnr_db < 40
    assert report.output_sqnr_db >= 40 and tried[-1].meets_target and tried[-1].precisions
    greedy = [a for a in tried if a.kind == "greedy"]
    probes = {a.widened: a.output_sqnr_db for a in tried if a.kind == "probe"}
    assert greedy and greedy[0].widened == max(probes, key=probes.get)  # the most sensitive layer first
    assert report.pareto and all(a.cost is not None and a.cost.cycles > 0 and a.cost.dram_bytes > 0 for a in tried)
    write_report(report, tmp_path, png=False)
    rows = list(csv.DictReader((tmp_path / "pareto.csv").open()))
    assert tuple(rows[0]) == PARETO_COLUMNS and len(rows) == len(tried)
    assert all(int(r["cycles"]) > 0 and int(r["dram_bytes"]) > 0 and float(r["latency_ms"]) > 0 for r in rows)
