"""The dynamic-shape report (``npu_compiler.dynamic_report``) on a small BERT with a symbolic batch and sequence:
the per-bucket figures, the bucket sets' expected figures recomputed here from them, the suggestion against a brute
force over subsets, and the refusals."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from npu_compiler import compile
from npu_compiler.costmodel import cost_program, load_hardware
from npu_compiler.dynamic_buckets import SizeCost, suggest
from npu_compiler.dynamic_report import DynamicReportError, bucket_report

transformers = pytest.importorskip("transformers")

HIDDEN, INTERMEDIATE, LAYERS = 64, 128, 2
#: A served traffic: short requests mostly, a long tail (lengths in 8..512, the model's range).
TRAFFIC = {8: 5, 20: 40, 33: 60, 47: 30, 64: 25, 100: 15, 130: 10, 200: 6, 300: 3, 470: 1}


@pytest.fixture(scope="module")
def bert_ir():
    from torch.export import Dim

    from torch_ir import extract_ir

    cfg = transformers.BertConfig(vocab_size=100, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                  num_attention_heads=4, intermediate_size=INTERMEDIATE, max_position_embeddings=512,
                                  attn_implementation="eager")
    with torch.device("meta"):
        model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    batch, seq = Dim("batch", min=1, max=16), Dim("seq", min=8, max=512)
    ir = extract_ir(model, (ids, mask), dynamic_shapes={"input_ids": {0: batch, 1: seq},
                                                        "attention_mask": {0: batch, 1: seq}})
    assert ir.symbols == {"batch": {"min": 1, "max": 16}, "seq": {"min": 8, "max": 512}}
    return ir


@pytest.fixture(scope="module")
def report(bert_ir):
    return bucket_report(bert_ir, "seq", TRAFFIC, bind={"batch": 1}, buckets=[128, 256, 512])


def _matmul_flops(seq: int) -> int:
    """The encoder's matmul FLOPs at one sequence length, batch 1 (2 per multiply-add): Q, K, V and the output
    projection, the two FFN layers, QK^T and attention x V; plus the pooler."""
    per_layer = 2 * seq * HIDDEN * HIDDEN * 4 + 2 * seq * HIDDEN * INTERMEDIATE * 2 + 2 * seq * seq * HIDDEN * 2
    return LAYERS * per_layer + 2 * HIDDEN * HIDDEN


def _expected_latency(sizes, histogram, latency) -> float:
    total = sum(histogram.values())
    return sum(c * latency[min(s for s in sizes if s >= n)] for n, c in histogram.items()) / total


@pytest.mark.slow
def test_per_bucket_figures_grow_with_the_bucket_and_match_the_kernel_formulas(report, bert_ir):
    sizes = list(report.candidates)
    assert sizes == sorted(sizes) and sizes[0] == 8 and sizes[-1] == 512
    assert {12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 470} <= set(sizes)  # the grid and the longest length
    arenas = [report.sizes[s].arena_bytes for s in sizes]
    latencies = [report.sizes[s].latency_ms for s in sizes]
    assert all(a < b for a, b in zip(arenas, arenas[1:])), arenas
    assert all(a < b for a, b in zip(latencies, latencies[1:])), latencies
    for size in (8, 128, 512):  # matmuls are most of the work; softmax, norms and GELU add a little
        flops = report.sizes[size].flops
        assert _matmul_flops(size) <= flops <= 1.15 * _matmul_flops(size), (size, flops, _matmul_flops(size))
        # the hidden state (seq x 64 float32) lives in the arena at least once
        assert report.sizes[size].arena_bytes >= size * HIDDEN * 4
    program = compile(bert_ir, bind={"batch": 1, "seq": 256})
    assert report.sizes[256].arena_bytes == program.memory.arena_bytes
    assert report.sizes[256].latency_ms == pytest.approx(cost_program(program, load_hardware("edge_4tops")).latency_ms)


def test_bucket_sets_recomputed_from_the_per_bucket_figures(report):
    latency = {s: c.latency_ms for s, c in report.sizes.items()}
    flops = {s: c.flops for s, c in report.sizes.items()}
    total = sum(TRAFFIC.values())
    given = report.given
    assert given.sizes == (128, 256, 512)
    assert given.expected_latency_ms == pytest.approx(_expected_latency((128, 256, 512), TRAFFIC, latency))
    served = {n: min(s for s in given.sizes if s >= n) for n in TRAFFIC}
    executed = sum(c * flops[served[n]] for n, c in TRAFFIC.items())
    useful = sum(c * flops[n] for n, c in TRAFFIC.items())  # few lengths: each costed exactly
    assert given.waste == pytest.approx((executed - useful) / executed)
    arenas = [report.sizes[s].arena_bytes for s in given.sizes]
    assert (given.arena_shared, given.arena_sum) == (max(arenas), sum(arenas))
    assert given.share == pytest.approx({128: (total - 10 - 6 - 3 - 1) / total, 256: (10 + 6) / total,
                                        512: (3 + 1) / total})
    upper = report.upper_bound
    assert not report.interpolated and report.upper_bound_points == tuple(TRAFFIC)
    assert upper.expected_latency_ms == pytest.approx(sum(c * latency[n] for n, c in TRAFFIC.items()) / total)
    assert upper.waste == 0 and upper.arena_shared == report.sizes[512].arena_bytes
    # padding only costs: the plan sized at run time is the fastest, and the suggestion beats the given set
    assert upper.expected_latency_ms < report.suggested.expected_latency_ms <= given.expected_latency_ms


def _brute_force(histogram, latency, arena, candidates, max_buckets, cap=None) -> float:
    longest = max(histogram)
    allowed = [s for s in candidates if cap is None or arena[s] <= cap]
    best = float("inf")
    for k in range(1, max_buckets + 1):
        for subset in itertools.combinations(allowed, k):
            if max(subset) >= longest:
                best = min(best, _expected_latency(subset, histogram, latency))
    return best


@pytest.mark.parametrize("max_buckets", [1, 2, 3, 4])
def test_the_suggestion_is_the_best_subset(report, max_buckets):
    latency = {s: c.latency_ms for s, c in report.sizes.items()}
    arena = {s: c.arena_bytes for s, c in report.sizes.items()}
    candidates = list(report.candidates)
    chosen = suggest(TRAFFIC, report.sizes, candidates, max_buckets)
    assert len(chosen) <= max_buckets and max(chosen) >= max(TRAFFIC)
    assert _expected_latency(chosen, TRAFFIC, latency) == pytest.approx(
        _brute_force(TRAFFIC, latency, arena, candidates, max_buckets), rel=1e-12)
    cap = arena[256]  # a cap the longest length (470) cannot meet: none left holds it
    assert suggest(TRAFFIC, report.sizes, [s for s in candidates if arena[s] <= cap], max_buckets) is None


def test_the_report_suggestion_under_a_memory_cap(bert_ir, report):
    traffic = {n: c for n, c in TRAFFIC.items() if n <= 200}
    cap = report.sizes[256].arena_bytes
    capped = bucket_report(bert_ir, "seq", traffic, bind={"batch": 1}, memory_cap=cap, max_buckets=3)
    latency = {s: c.latency_ms for s, c in capped.sizes.items()}
    arena = {s: c.arena_bytes for s, c in capped.sizes.items()}
    assert capped.suggested.arena_shared <= cap and len(capped.suggested.sizes) <= 3
    assert capped.suggested.expected_latency_ms == pytest.approx(
        _brute_force(traffic, latency, arena, list(capped.candidates), 3, cap), rel=1e-12)


def test_the_dynamic_programme_matches_brute_force_on_random_costs():
    rng = random.Random(0)
    for _ in range(60):
        sizes = sorted(rng.sample(range(8, 200), rng.randint(1, 8)))
        costs = {s: SizeCost(s, s * 100 + rng.randint(0, 50), s * 1000, s * rng.uniform(0.5, 1.5)) for s in sizes}
        histogram = {n: rng.randint(1, 20) for n in rng.sample(range(8, sizes[-1] + 1), rng.randint(1, 6))}
        k = rng.randint(1, 4)
        latency = {s: c.latency_ms for s, c in costs.items()}
        chosen = suggest(histogram, costs, sizes, k)
        assert len(chosen) <= k and max(chosen) >= max(histogram)
        best = _brute_force(histogram, latency, {s: 0 for s in sizes}, sizes, k)
        assert _expected_latency(chosen, histogram, latency) == pytest.approx(best, rel=1e-12)


@pytest.mark.slow
def test_many_lengths_interpolate_the_upper_bound_within_a_percent(bert_ir):
    lengths = list(range(8, 200, 3)) * 2 + list(range(8, 60))  # 86 distinct lengths: over the 48 costed exactly
    r = bucket_report(bert_ir, "seq", lengths, bind={"batch": 1})
    assert r.interpolated and len(r.upper_bound_points) < len(r.histogram)
    hw = load_hardware("edge_4tops")
    exact = {n: cost_program(compile(bert_ir, bind={"batch": 1, "seq": n}), hw).latency_ms for n in r.histogram}
    expected = sum(c * exact[n] for n, c in r.histogram.items()) / sum(r.histogram.values())
    assert r.upper_bound.expected_latency_ms == pytest.approx(expected, rel=0.01)
    assert r.histogram == {n: lengths.count(n) for n in set(lengths)}  # a list is counted into a histogram
    assert any("interpolated" in line for line in r.table())


def test_the_cap_refusal_names_the_length_and_the_bytes(bert_ir, report):
    need = report.sizes[470].arena_bytes  # the smallest candidate holding the longest length is the length itself
    with pytest.raises(DynamicReportError, match=rf"length 470 .*seq=470, needs {need:,} arena bytes") as err:
        bucket_report(bert_ir, "seq", TRAFFIC, bind={"batch": 1}, memory_cap=need - 1)
    assert "memory_cap" in str(err.value) and f"--memory-cap {need}" in err.value.cli


@pytest.mark.parametrize(("lengths", "kwargs", "message"), [
    ([8, 600], {}, r"length 600 is outside the range of 'seq' .*\(8\.\.512\)"),
    ({4: 3}, {}, r"length 4 is outside the range of 'seq' .*\(8\.\.512\)"),
    ([], {}, "no observed lengths"),
    ({16: -1}, {}, "count -1"),
    ([16, 300], {"buckets": [64, 128]}, r"do not cover the observed lengths 300; fix: add a bucket of at least 300"),
    ([16], {"buckets": [64, 64]}, "distinct sizes"),
    ([16], {"buckets": [4, 64]}, r"bucket 4 of 'seq' is outside its range \(8\.\.512\)"),
    ([16], {"bind": {}}, r"symbol\(s\) batch must be fixed"),
    ([16], {"bind": {"batch": 1, "seq": 16}}, "both reported on and bound"),
    ([16], {"memory_cap": 0}, "memory_cap 0"),
    ([16], {"max_buckets": 0}, "max_buckets 0"),
])
def test_bad_input_is_one_clear_error(bert_ir, lengths, kwargs, message):
    kwargs = {"bind": {"batch": 1}, **kwargs}
    with pytest.raises(DynamicReportError, match=message):
        bucket_report(bert_ir, "seq", lengths, **kwargs)


def test_an_unknown_symbol_lists_the_symbols(bert_ir):
    with pytest.raises(DynamicReportError, match=r"no symbol 'tokens' .* batch, seq"):
        bucket_report(bert_ir, "tokens", [16], bind={"batch": 1})
    with pytest.raises(DynamicReportError) as err:
        bucket_report(bert_ir, "seq", [16])
    assert "--bind batch=1" in err.value.cli


def test_csv_and_plots(report, tmp_path):
    import csv

    path = report.to_csv(tmp_path / "r.csv")
    rows = list(csv.DictReader(path.open()))
    buckets = [r for r in rows if r["row"] == "bucket"]
    sets = {r["name"]: r for r in rows if r["row"] == "set"}
    assert [int(r["name"]) for r in buckets] == list(report.candidates)
    assert set(sets) == {"given", "suggested", "upper bound"}
    assert sets["given"]["sizes"] == "128 256 512"
    assert float(sets["upper bound"]["expected_latency_ms"]) == pytest.approx(report.upper_bound.expected_latency_ms,
                                                                              rel=1e-5)
    pytest.importorskip("matplotlib")
    for png in report.plot(tmp_path / "plots"):
        assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
