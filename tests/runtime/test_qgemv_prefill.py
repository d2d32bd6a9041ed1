"""The prefill path of the quantized GEMV (``cpu_qgemv``: ``dequantize_rows``, ``gemv_q_deq.c``, and ``QGemv`` from
``PREFILL_ROWS`` rows of float x: tiles of W dequantized, then ``torch.mm``): rows bit-exact with
``gguf.quants.dequantize`` for every layout and kernel, the product within fp32's bound of float64, bad ranges
refused before the C code sees them."""

from __future__ import annotations

import importlib.resources

import numpy as np
import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize

from npu_runtime.backends import cpu_gemv, cpu_qgemv
from torch_ir.quant.numerics import int8_groups

from . import test_qgemv as base
from .test_qgemv import ELEMS, EXACT, GGML, U, check_close, int8_contract, random_blocks, reference, with_extremes

# the GEMV tests' fixtures: the built kernel, each ISA this CPU runs, every call through the torch fallback
qlib, isa, fallback = base.qlib, base.isa, base.fallback


def bits(a: np.ndarray | torch.Tensor) -> np.ndarray:
    """fp32 values as their bits: -0.0 and 0.0 differ, as a NaN would from a number."""
    a = a.numpy() if isinstance(a, torch.Tensor) else a
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("qtype", list(GGML))
@pytest.mark.parametrize(("n0", "n1"), [(0, 37), (3, 30), (36, 37), (0, 1), (11, 11)])
def test_rows_are_gguf_bits(isa, qtype, n0, n1):
    """Scales of every finite fp16 pattern (subnormals, 65504, both signs) and every code byte: the rows' bits are
    gguf's, -0.0 included (d·0 with d < 0)."""
    k = 2 * ELEMS[qtype] + (ELEMS[qtype] if ELEMS[qtype] == 32 else 0)  # an odd count: rows 2-byte aligned only
    raw = random_blocks(qtype, 37, k, seed=n0 * 100 + n1, wide=True)
    want = gguf_dequantize(raw, GGML[qtype])[n0:n1]
    got = cpu_qgemv.dequantize_rows(torch.from_numpy(raw), qtype, n0, n1, isa=isa)
    assert got.shape == (n1 - n0, k)
    np.testing.assert_array_equal(bits(got), bits(want))


@pytest.mark.parametrize("qtype", list(GGML))
def test_rows_with_threads_into_a_given_out(qlib, qtype):
    """Two threads' shares (enough values for the kernel to split them) and a preallocated ``out``."""
    k = 4 * ELEMS[qtype] if ELEMS[qtype] == 256 else 896
    raw = random_blocks(qtype, 301, k, seed=2)
    out = torch.full((300, k), float("nan"))
    got = cpu_qgemv.dequantize_rows(torch.from_numpy(raw), GGML[qtype], 1, 301, out=out, threads=2)
    assert got is out
    np.testing.assert_array_equal(bits(out), bits(gguf_dequantize(raw, GGML[qtype])[1:]))


@pytest.mark.parametrize("qtype", list(GGML))
def test_rows_by_the_torch_fallback(fallback, qtype):
    raw = random_blocks(qtype, 9, ELEMS[qtype] * 2, seed=3, wide=True)
    with pytest.warns(RuntimeWarning, match="no compiler"):
        got = cpu_qgemv.dequantize_rows(torch.from_numpy(raw), qtype, 2, 7)
    np.testing.assert_array_equal(bits(got), bits(gguf_dequantize(raw, GGML[qtype])[2:7]))


def test_bad_ranges_and_buffers_are_refused(qlib):
    w = torch.from_numpy(random_blocks("q4_0", 5, 64, 0))  # [5, 36]
    for n0, n1 in ((-1, 3), (0, 6), (4, 2), (0.0, 3), (6, 6)):
        with pytest.raises(ValueError, match=r"rows \[.*\) are not a range of the weight's 5 rows"):
            cpu_qgemv.dequantize_rows(w, "q4_0", n0, n1)
    with pytest.raises(ValueError, match="out has shape"):
        cpu_qgemv.dequantize_rows(w, "q4_0", 1, 3, out=torch.empty(3, 64))
    with pytest.raises(ValueError, match="out must be contiguous"):
        cpu_qgemv.dequantize_rows(w, "q4_0", 1, 3, out=torch.empty(64, 2).t())
    with pytest.raises(TypeError, match="out must be a CPU float32 tensor"):
        cpu_qgemv.dequantize_rows(w, "q4_0", 1, 3, out=torch.empty(2, 64, dtype=torch.float64))
    with pytest.raises(ValueError, match="whole q8_0 blocks"):
        cpu_qgemv.dequantize_rows(w, "q8_0")
    with pytest.raises(TypeError, match="weight must be a CPU uint8 tensor"):
        cpu_qgemv.dequantize_rows(w.view(torch.int8), "q4_0")
    with pytest.raises(ValueError, match="isa 'neon' is not one of"):
        cpu_qgemv.dequantize_rows(w, "q4_0", isa="neon")
    storage = torch.zeros(5 * 36 + 2 * 64 * 4, dtype=torch.uint8)
    shared = storage[:180].view(5, 36)
    with pytest.raises(ValueError, match="out overlaps weight"):
        cpu_qgemv.dequantize_rows(shared, "q4_0", 0, 2, out=storage[176:176 + 512].view(torch.float32).view(2, 64))


# --------------------------------------------------------------------------------------- the tiled product


@pytest.fixture
def tiles(monkeypatch):
    """Tiles of 16 rows (several per weight, the last one short) and the tiled path from 9 rows of x."""
    monkeypatch.setattr(cpu_qgemv, "TILE_ROWS", 16)
    monkeypatch.setattr(cpu_qgemv, "PREFILL_ROWS", 9)


@pytest.mark.parametrize("qtype", list(GGML))
@pytest.mark.parametrize("m", [9, 33, 128])
def test_tiled_product_within_fp32_bound(isa, tiles, qtype, m):
    """The same contract as the GEMV (an fp32 product of the exactly dequantized weights, bias added once): within
    Higham's γ(k + 8)·Σ|x·w| of the float64 product, whatever order torch.mm sums in."""
    n, k = 53, 2 * ELEMS[qtype] if ELEMS[qtype] == 256 else 96
    raw = random_blocks(qtype, n, k, seed=m, wide=True)
    x = np.random.default_rng(m + 1).standard_normal((m, k)).astype(np.float32)
    bias = np.random.default_rng(m + 2).standard_normal(n).astype(np.float32)
    plan = cpu_qgemv.QGemv(torch.from_numpy(raw), qtype, torch.from_numpy(bias))
    assert plan.tiled(m)
    y = plan(torch.from_numpy(x), isa=isa, path="tiled")
    check_close(y, *reference(raw, qtype, x, bias.astype(np.float64)), k)


@pytest.mark.parametrize("qtype", list(GGML))
def test_tiled_product_exact_where_the_arithmetic_is(qlib, tiles, qtype):
    """Power-of-two scales and small integer x: every sum is exact in fp32 in any order, so each output column
    must be its float64 value bit for bit (a tile written to the wrong columns, or a row dequantized from the wrong
    place, would show)."""
    m, n, k = 33, 45, 256
    exp, xmax = EXACT[qtype]
    raw = random_blocks(qtype, n, k, seed=9, exp=exp)
    x = np.random.default_rng(10).integers(-xmax, xmax + 1, size=(m, k)).astype(np.float32)
    want, scale = reference(raw, qtype, x)
    assert scale.max() < 2.0**22
    out = torch.full((m, n), float("nan"))
    cpu_qgemv.QGemv(torch.from_numpy(raw), qtype)(torch.from_numpy(x), out=out, path="tiled")
    np.testing.assert_array_equal(out.numpy().astype(np.float64), want)


def test_which_calls_are_tiled(qlib):
    """From PREFILL_ROWS rows of float x, whichever path measured faster (each call right either way); int8
    activations keep the GEMV (their contract is its integer sums), even when the tiles are asked for."""
    raw = random_blocks("q4_0", 7, 512, seed=4)
    plan = cpu_qgemv.QGemv(torch.from_numpy(raw), "q4_0")
    m = cpu_qgemv.PREFILL_ROWS
    assert plan.tiled(m) and not plan.tiled(m - 1) and not plan.tiled(m, "int8")
    x = np.random.default_rng(5).standard_normal((m, 512)).astype(np.float32)
    for _ in range(6):  # both paths explored by the policy
        check_close(plan(torch.from_numpy(x)), *reference(raw, "q4_0", x), 512)
    want, bound = int8_contract(raw, "q4_0", x)
    steps = 2 * (512 // 32) + 16
    for path in (None, "tiled"):
        y = plan(torch.from_numpy(x), activations="int8", path=path)
        assert (np.abs(y.numpy() - want) <= steps * U / (1 - steps * U) * bound).all()
    with pytest.raises(ValueError, match="path 'mm' is not one of gemv, tiled"):
        plan(torch.from_numpy(x), path="mm")


@pytest.mark.parametrize("qtype", list(GGML))
def test_int8_rows_per_pass_give_each_rows_own_result(isa, qtype):
    """The integer kernel takes up to 8 rows of x per pass over the weights (each block's codes decoded once for
    them all): every row's result is, bit for bit, that row's alone (M = 1: a decode step), for M = 1..9 and 128
    (the passes' tails: 9 = 8 + 1; 128 on two threads), N = 37 (the streams' tails), rows 0 and 1 extreme codes
    against q = ±127 (:func:`with_extremes`); and within the contract's bound of ``int8_groups(x, 32)`` times gguf's
    dequantized weights in float64 (the bound of ``test_int8_activations_keep_their_contract``, plus the two
    roundings of ``dx·q`` between that reference and the contract's)."""
    n, k = 37, 512
    raw, x = with_extremes(random_blocks(qtype, n, k, seed=31, wide=True),
                           qtype, np.random.default_rng(32).standard_normal((128, k)).astype(np.float32))
    plan = cpu_qgemv.QGemv(torch.from_numpy(raw), qtype)
    alone = np.concatenate([plan(torch.from_numpy(x[i:i + 1]), isa=isa, activations="int8", threads=1).numpy()
                            for i in range(128)])
    w = gguf_dequantize(raw, GGML[qtype]).astype(np.float64)
    want = int8_groups(torch.from_numpy(x), 32).double().numpy() @ w.T
    _, bound = int8_contract(raw, qtype, x)
    steps = 2 * (k // 32) + 16 + 2
    err = np.abs(alone.astype(np.float64) - want)
    assert (err <= steps * U / (1 - steps * U) * bound).all(), f"max error {err.max():.3g}"
    for m in (*range(1, 10), 128):
        y = plan(torch.from_numpy(x[:m]), isa=isa, activations="int8", threads=2 if m == 128 else 1)
        np.testing.assert_array_equal(bits(y), bits(alone[:m]), err_msg=f"M = {m}")


def test_the_path_policy_runs_the_faster_and_probes_the_other():
    """Synthetic times (ns per row), not measured ones: two of each first, then the lower mean, the other again once
    the class's own calls have summed to the try's cost over ``PROBE_SHARE`` (2000 ns dearer: 100,000 ns of calls,
    100 calls of 1000), and a try that changes nothing is spaced by its own cost again."""
    policy, key = cpu_gemv._PathPolicy(), ("q8_0", 896, 4864, 6, 2)
    firsts = []
    for _ in range(4):
        firsts.append(policy.pick(key))
        policy.record(key, firsts[-1], 1000.0 if firsts[-1] else 3000.0)
    assert sorted(firsts) == [False, False, True, True]
    picks = []
    for _ in range(101):
        picks.append(policy.pick(key))
        policy.record(key, picks[-1], 1000.0 if picks[-1] else 3000.0)
    assert picks == [True] * 100 + [False]  # the try after 100 calls
    assert policy.after[key] == pytest.approx(2000.0 / policy.PROBE_SHARE)  # the try cost 2000 again
    assert policy.pick(key) is True
    for _ in range(4):
        policy.record(key, True, 9000.0)
    assert policy.pick(key) is False


def test_a_try_is_bounded_in_calls():
    """Sides within a hair of each other are tried no more often than every ``MIN_CALLS`` calls, and sides far
    apart at least every ``MAX_CALLS``."""
    for other, calls in ((1001.0, cpu_gemv._PathPolicy.MIN_CALLS), (1e9, cpu_gemv._PathPolicy.MAX_CALLS)):
        policy, key = cpu_gemv._PathPolicy(), ("q4_0", 896, 896, 8, 2)
        for _ in range(2):
            policy.record(key, True, 1000.0)
            policy.record(key, False, other)
        picks = []
        while len(picks) <= calls:
            picks.append(policy.pick(key))
            policy.record(key, picks[-1], 1000.0 if picks[-1] else other)
        assert picks == [True] * calls + [False]


def test_a_probe_replaces_its_sides_stale_times():
    """A neighbour's burst slows the faster side (1000 -> 5000 ns per row against the other's 3000), so the policy
    runs the other; when the burst is over, the first try of the faster side (1000 again) brings it back at once
    (the burst's times, stale by then, do not outvote it) and the next try comes soon, to confirm."""
    policy, key = cpu_gemv._PathPolicy(), ("q4_K", 1536, 8960, 8, 2)
    for _ in range(2):
        policy.record(key, True, 1000.0)
        policy.record(key, False, 3000.0)
    for _ in range(4):
        policy.record(key, True, 5000.0)
    assert policy.pick(key) is False
    while policy.pick(key) is False:
        policy.record(key, False, 3000.0)
    policy.record(key, True, 1000.0)  # the try
    assert policy.pick(key) is True and policy.pick(key) is True
    assert policy.after[key] == policy.MIN_CALLS * 1000.0


def test_tiled_refuses_out_over_x(qlib, tiles):
    plan = cpu_qgemv.QGemv(torch.from_numpy(random_blocks("q8_0", 5, 64, 0)), "q8_0")
    buf = torch.zeros(16 * 64 + 5 * 16)
    with pytest.raises(ValueError, match="out overlaps x"):
        plan(buf[:16 * 64].view(16, 64), out=buf[16 * 64 - 8:16 * 64 - 8 + 80].view(16, 5))


def test_the_source_is_package_data():
    """The loader appends gemv_q_deq.c to gemv_q.c; a wheel must ship it (pyproject's package data)."""
    source = importlib.resources.files("npu_runtime.backends").joinpath("gemv_q_deq.c").read_text(encoding="utf-8")
    assert "int qdeq_rows_packed(" in source
