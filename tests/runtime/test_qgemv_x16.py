"""The int8 path on 16-row interleaved copies of the weights (``cpu_qgemv.interleaved``, ``gemv_q_x16.c``): the
copy's layout against a numpy packing written from the C file's description, the contract's bound and exactness
against gguf's dequantized weights (float64), each row's result independent of how many rows a call has, and when
the copy is made, shared and used."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize

from npu_runtime.backends import cpu_blocks, cpu_qgemv
from torch_ir.quant.numerics import int8_groups

from .test_qgemv import (
    BYTES,
    GGML,
    U,
    exact_int8_case,
    int8_codes,
    int8_contract,
    random_blocks,
    reference,
    with_extremes,
)
from .test_qgemv_prefill import bits

LAYOUTS = list(cpu_qgemv.X16_QTYPES)


@pytest.fixture(scope="module")
def native():
    """A kernel that reads the copies: AVX2 or better (elsewhere ``interleaved`` gives None: tested below)."""
    library = cpu_qgemv._load()
    if library is None or library.isa < cpu_qgemv.ISAS["avx2"]:
        pytest.skip("no AVX2 kernel here")
    return library


@pytest.fixture(params=["avx2", "avx512"])
def isa(request, native):
    """Each kernel that reads the copies (``isa=`` caps the call): AVX2's, and AVX-512 VNNI's where the CPU has it."""
    if request.param == "avx512" and not native.lib.qgemv_vnni():
        pytest.skip("no AVX-512 VNNI here")
    return request.param


def planned(raw: np.ndarray, qtype: str, bias: np.ndarray | None = None) -> cpu_qgemv.QGemv:
    plan = cpu_qgemv.QGemv(torch.from_numpy(raw), qtype, None if bias is None else torch.from_numpy(bias))
    assert plan.interleave(always=True)
    return plan


def unsigned_codes(blocks: np.ndarray, qtype: str) -> np.ndarray:
    """``[n, B, elements]`` codes made unsigned as the records hold them (Q4_0 + 8, Q5_0 + 16, Q8_0 + 128, Q6_K +
    32, Q4_K as they are), from the test module's own decoding of the GGUF layouts."""
    n, nb = blocks.shape[:2]
    codes, _, _ = int8_codes(blocks, qtype)  # [n, G, 32]
    offset = {"q4_0": 8, "q5_0": 16, "q8_0": 128, "q4_K": 0, "q6_K": 32}[qtype]
    return (codes.reshape(n, nb, -1) + offset).astype(np.uint8)


def steps(u: np.ndarray) -> np.ndarray:
    """``[16 rows, 32 elements]`` unsigned codes as a record's steps ``[t, row, 4]`` (element 4t + i at byte i)."""
    return u.reshape(16, 8, 4).transpose(1, 0, 2)


def x16_reference(raw: np.ndarray, qtype: str) -> bytes:
    """The interleaved copy as gemv_q_x16.c's comment describes it, in numpy: records of (group, block), each 16
    rows' fp16 scales first, then the codes in 4-byte steps [step][row][4], rows past N zero."""
    n = raw.shape[0]
    blocks = raw.reshape(n, -1, BYTES[qtype])
    groups = -(-n // 16)
    padded = np.zeros((groups * 16, *blocks.shape[1:]), np.uint8)
    padded[:n] = blocks
    u = unsigned_codes(padded, qtype)
    live = (np.arange(groups * 16) < n)[:, None, None]
    out = []
    for g in range(groups):
        for b in range(blocks.shape[1]):
            rows = slice(16 * g, 16 * g + 16)
            blk, code = padded[rows, b], np.where(live[rows, 0], u[rows, b], 0).astype(np.uint8)
            if qtype in ("q4_0", "q5_0", "q8_0"):
                record = [blk[:, 0:2].reshape(-1)]
                if qtype == "q8_0":
                    record.append(steps(code).reshape(-1))
                else:
                    if qtype == "q5_0":  # the fifth bits: per step a 64-bit mask, bit 4r + i
                        fifth = steps(code >> 4)  # [t, r, 4] in element order: steps 0-3 low nibbles, 4-7 high
                        record.append(np.packbits(fifth.reshape(8, 64), axis=1, bitorder="little").reshape(-1))
                    low = steps(code & 15)
                    record.append((low[:4] | low[4:] << 4).reshape(-1))
            elif qtype == "q4_K":
                sc, mn = scales_mins(blk)
                record = [blk[:, 0:2].reshape(-1), blk[:, 2:4].reshape(-1), sc.T.reshape(-1), mn.T.reshape(-1),
                          chunked(code & 15)]
            else:  # q6_K
                record = [blk[:, 208:210].reshape(-1), blk[:, 192:208].T.reshape(-1), chunked(code & 15)]
                high = code.reshape(16, 4, 2, 8, 4) >> 4  # [r, c, j, t, i]
                planes = (high << (2 * np.arange(4))[None, :, None, None, None]).sum(1)  # [r, j, t, i]
                record.append(planes.transpose(2, 1, 0, 3).astype(np.uint8).reshape(-1))
            out.append(np.concatenate(record))
    return np.concatenate(out).tobytes()


def scales_mins(blk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 6-bit scales and mins ``[rows, 8]``, as ggml's get_scale_min_k4 unpacks them."""
    s = blk[:, 4:16].astype(np.int64)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc.astype(np.uint8), mn.astype(np.uint8)


def chunked(low: np.ndarray) -> np.ndarray:
    """A super-block's 4-bit values ``[16 rows, 256]`` as records hold them: chunk c, step t, row r, byte i = element
    64c + 4t + i (low nibble) and 64c + 32 + 4t + i (high nibble)."""
    v = low.reshape(16, 4, 2, 8, 4)  # [r, c, j, t, i]
    return (v[:, :, 0] | v[:, :, 1] << 4).transpose(1, 2, 0, 3).astype(np.uint8).reshape(-1)


@pytest.mark.parametrize("qtype", LAYOUTS)
@pytest.mark.parametrize("n", [1, 16, 37])
def test_the_copy_is_the_described_layout(native, qtype, n):
    k = 512
    raw = random_blocks(qtype, n, k, seed=n, wide=True)
    copy = cpu_qgemv.interleaved(torch.from_numpy(raw), qtype)
    assert copy.numel() == -(-n // 16) * (k // (256 if qtype.endswith("K") else 32)) * cpu_qgemv.X16_QTYPES[qtype]
    assert copy.numpy().tobytes() == x16_reference(raw, qtype)


@pytest.mark.parametrize("qtype", LAYOUTS)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 37, 1536), (3, 21, 4864), (5, 9, 512), (2, 16, 256), (1, 2, 256)])
def test_the_contract_holds_on_the_copy(isa, qtype, m, n, k):
    """The bound of ``test_int8_activations_keep_their_contract`` (every term's roundings, any order), with extreme
    codes against q = ±127 in rows 0 and 1 and a bias; N = 2, 9, 21, 37 leave a group's rows unused."""
    raw = random_blocks(qtype, n, k, seed=k + m, wide=True)
    x = np.random.default_rng(n).standard_normal((m, k)).astype(np.float32)
    raw, x = with_extremes(raw, qtype, x)
    bias = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    want, bound = int8_contract(raw, qtype, x)
    y = planned(raw, qtype, bias)(torch.from_numpy(x), activations="int8", isa=isa)
    nsteps = 2 * (k // 32) + 16
    err = np.abs(y.numpy().astype(np.float64) - (want + bias))
    assert (err <= nsteps * U / (1 - nsteps * U) * (bound + np.abs(bias))).all(), f"max error {err.max():.3g}"


@pytest.mark.parametrize("qtype", LAYOUTS)
def test_the_copy_is_exact_where_x_is_int8(isa, qtype):
    """x on int8 groups and power-of-two scales (``test_int8_activations_are_exact_where_x_is_int8``): the float64
    product, bit for bit."""
    raw, x = exact_int8_case(qtype)
    want, _ = reference(raw, qtype, x)
    np.testing.assert_array_equal(planned(raw, qtype)(torch.from_numpy(x), activations="int8", isa=isa).numpy(), want)


@pytest.mark.parametrize("qtype", LAYOUTS)
def test_each_row_of_x_gets_its_own_result(isa, qtype):
    """Up to 8 rows of x per pass over a group's records: every row's result is, bit for bit, the one-row call's, for
    M = 1..9 and 128 (two threads), and within the contract's bound of gguf's weights times ``int8_groups(x)``."""
    n, k = 37, 512
    raw, x = with_extremes(random_blocks(qtype, n, k, seed=31, wide=True),
                           qtype, np.random.default_rng(32).standard_normal((128, k)).astype(np.float32))
    plan = planned(raw, qtype)
    alone = np.concatenate([plan(torch.from_numpy(x[i:i + 1]), activations="int8", threads=1, isa=isa).numpy()
                            for i in range(128)])
    want = int8_groups(torch.from_numpy(x), 32).double().numpy() @ gguf_dequantize(raw, GGML[qtype]).astype(
        np.float64).T
    _, bound = int8_contract(raw, qtype, x)
    nsteps = 2 * (k // 32) + 18
    assert (np.abs(alone - want) <= nsteps * U / (1 - nsteps * U) * bound).all()
    for m in (*range(1, 10), 128):
        y = plan(torch.from_numpy(x[:m]), activations="int8", threads=2 if m == 128 else 1, isa=isa)
        np.testing.assert_array_equal(bits(y), bits(alone[:m]), err_msg=f"M = {m}")


@pytest.mark.parametrize("qtype", LAYOUTS)
def test_the_avx2_kernel_gives_the_vnni_kernels_bits(native, qtype):
    """Both kernels sum the same integers exactly and take the same fp32 steps per row (gemv_q_x16.c), so a
    VNNI machine's two results are equal, bit for bit, for every layout and 1, 3 and 9 rows of x."""
    if not native.lib.qgemv_vnni():
        pytest.skip("no AVX-512 VNNI here")
    n, k = 37, 1024
    raw, x = with_extremes(random_blocks(qtype, n, k, seed=41, wide=True),
                           qtype, np.random.default_rng(42).standard_normal((9, k)).astype(np.float32))
    plan = planned(raw, qtype, np.random.default_rng(43).standard_normal(n).astype(np.float32))
    for m in (1, 3, 9):
        xm = torch.from_numpy(x[:m])
        np.testing.assert_array_equal(bits(plan(xm, activations="int8", isa="avx2")),
                                      bits(plan(xm, activations="int8", isa="avx512")), err_msg=f"M = {m}")


def test_when_the_copy_is_made_and_read(native, monkeypatch):
    raw = torch.from_numpy(random_blocks("q4_0", 40, 256, seed=1))
    first = cpu_qgemv.interleaved(raw, "q4_0")
    assert cpu_qgemv.interleaved(raw, "q4_0") is first  # one copy per weight while it lives
    assert cpu_qgemv.interleaved(raw.clone(), "q4_0") is not first
    plan, x = planned(raw.numpy(), "q4_0"), torch.randn(3, 256)
    gguf = cpu_qgemv.QGemv(raw, "q4_0")
    # a call capped below AVX2, and the float path, read the GGUF layout: the GGUF kernels' bits
    np.testing.assert_array_equal(bits(plan(x, activations="int8", isa="c")),
                                  bits(gguf(x, activations="int8", isa="c")))
    np.testing.assert_array_equal(bits(plan(x)), bits(gguf(x)))
    monkeypatch.setenv("TORCH_IR_QGEMV_ISA", "c")
    assert cpu_qgemv.interleaved(raw, "q4_0") is None
    monkeypatch.delenv("TORCH_IR_QGEMV_ISA")
    monkeypatch.setenv("TORCH_IR_QGEMV_X16", "0")
    assert not cpu_qgemv.QGemv(raw, "q4_0").interleave()
    monkeypatch.delenv("TORCH_IR_QGEMV_X16")
    del first, plan
    gc.collect()
    assert not any(key[0] == raw.data_ptr() for key in cpu_qgemv._INTERLEAVED.keys())


def test_which_layouts_get_a_copy(native, monkeypatch):
    """The runtime's choice (``interleave()``): every layout where the CPU has AVX-512 VNNI; with AVX2 alone (or an
    ``avx2`` cap) those whose GGUF kernels are compute-bound, not Q8_0 and Q6_K (measured no faster from memory)."""
    weights = {t: torch.from_numpy(random_blocks(t, 16, 256, seed=5)) for t in LAYOUTS}
    vnni = bool(native.lib.qgemv_vnni())
    for t in LAYOUTS:
        assert cpu_qgemv.QGemv(weights[t], t).interleave() == (vnni or t in ("q4_0", "q5_0", "q4_K")), t
    monkeypatch.setenv("TORCH_IR_QGEMV_ISA", "avx2")
    assert [t for t in LAYOUTS if cpu_qgemv.QGemv(weights[t], t).interleave()] == ["q4_0", "q5_0", "q4_K"]
    assert all(cpu_qgemv.QGemv(weights[t], t).interleave(always=True) for t in LAYOUTS)


def test_block_linear_reads_the_copy_with_int8_activations(native):
    q, k = torch.from_numpy(random_blocks("q4_0", 32, 256, 1)), torch.from_numpy(random_blocks("q4_K", 16, 256, 2))
    layer = cpu_blocks.BlockLinear([(q, "q4_0"), (k, "q4_K")], None, int8=True)
    assert all(part.gemv._w16 is not None for part in layer.parts)
    assert all(part.gemv._w16 is None for part in cpu_blocks.BlockLinear([(q, "q4_0")], None).parts)
    x, out = torch.randn(1, 256), torch.empty(1, 48)
    layer(x, out)
    want = torch.cat([cpu_qgemv.QGemv(w, t)(x, activations="int8") for w, t in ((q, "q4_0"), (k, "q4_K"))], dim=1)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_refusals(native):
    with pytest.raises(ValueError, match="whole q4_0 blocks"):
        cpu_qgemv.interleaved(torch.zeros(4, 17, dtype=torch.uint8), "q4_0")
    with pytest.raises(TypeError, match="weight must be a CPU uint8 tensor"):
        cpu_qgemv.interleaved(torch.zeros(4, 18, dtype=torch.int16), "q4_0")
    with pytest.raises(ValueError, match="weight type 'q4_1'"):
        cpu_qgemv.interleaved(torch.zeros(4, 20, dtype=torch.uint8), "q4_1")


@pytest.mark.parametrize("qtype", LAYOUTS)
def test_many_rows_of_x_on_avx2_give_the_one_row_kernels_bits(native, qtype):
    """From 4 rows of x the AVX2 kernel decodes each group of 16 rows once into a scratch and takes 4 rows of x (Q6_K
    2) per pass (gemv_q_x16t.c); below, it decodes the records again per row. Both sum the same integers and take
    the same fp32 steps: every row's result, bias added, is the one-row call's bit for bit, for row counts with and
    without a remainder, a last group of 16 rows only partly filled (N = 45: 13 rows), one and two threads, and K of
    1, 3 and 35 super-blocks (K = 8960: Qwen2.5-1.5B's down projection)."""
    rng = np.random.default_rng(61)
    for n, k, m in ((45, 256, 13), (45, 768, 7), (16, 8960, 6), (3, 256, 4)):
        raw, x = with_extremes(random_blocks(qtype, n, k, seed=n + k, wide=True), qtype,
                               rng.standard_normal((m, k)).astype(np.float32))
        plan = planned(raw, qtype, rng.standard_normal(n).astype(np.float32))
        alone = np.concatenate([plan(torch.from_numpy(x[i:i + 1]), activations="int8", isa="avx2", threads=1).numpy()
                                for i in range(m)])
        for threads in (1, 2):
            y = plan(torch.from_numpy(x), activations="int8", isa="avx2", threads=threads)
            np.testing.assert_array_equal(bits(y), bits(alone), err_msg=f"[{n}, {k}], M = {m}, {threads} threads")


@pytest.mark.parametrize("qtype", list(cpu_qgemv.X16_GROUP_QTYPES))
def test_the_groups_path_reads_the_gguf_layout_as_the_copy(native, qtype):
    """``path="groups"`` (Q8_0, Q6_K: no copy on AVX2) decodes 16 rows of the GGUF layout at a time into the copy's
    AVX2 prefill scratch (gemv_q_x16t.c): every row's result is the copy's, bit for bit, and within the contract's
    bound against the numpy reference; for 1 to 33 rows of x, partly filled last groups (N = 45, 37, 3), bias, K of
    1, 2, 3 and 35 super-blocks, extreme codes against q = ±127, one and two threads. The weight keeps no copy."""
    rng = np.random.default_rng(67)
    for n, k, m in ((45, 256, 13), (45, 768, 1), (16, 8960, 6), (3, 256, 4), (37, 512, 33)):
        raw, x = with_extremes(random_blocks(qtype, n, k, seed=n + k, wide=True), qtype,
                               rng.standard_normal((m, k)).astype(np.float32))
        bias = rng.standard_normal(n).astype(np.float32)
        gguf = cpu_qgemv.QGemv(torch.from_numpy(raw), qtype, torch.from_numpy(bias))
        assert gguf.groups() and gguf._w16 is None
        copy = planned(raw, qtype, bias)
        want = copy(torch.from_numpy(x), activations="int8", isa="avx2", threads=1)
        for threads in (1, 2):
            y = gguf(torch.from_numpy(x), activations="int8", path="groups", threads=threads)
            np.testing.assert_array_equal(bits(y), bits(want), err_msg=f"[{n}, {k}], M = {m}, {threads} threads")
        exact, bound = int8_contract(raw, qtype, x)
        nsteps = 2 * (k // 32) + 16
        err = np.abs(y.numpy().astype(np.float64) - (exact + bias))
        assert (err <= nsteps * U / (1 - nsteps * U) * (bound + np.abs(bias))).all(), f"max error {err.max():.3g}"
    raw, x = exact_int8_case(qtype)  # exact sums: the float64 product itself
    want, _ = reference(raw, qtype, x)
    y = cpu_qgemv.QGemv(torch.from_numpy(raw), qtype)(torch.from_numpy(x), activations="int8", path="groups")
    np.testing.assert_array_equal(y.numpy(), want)


def test_when_the_groups_path_runs(native, monkeypatch):
    """Where it cannot run it refuses with the reason (float x, another layout, a weight with a copy, an isa cap
    below AVX2) and ``groups()`` says False; without a native kernel the torch fallback runs; a prefill of
    ``BlockLinear`` with int8 activations takes it where it does (the integer kernel forced:
    ``INT8_PREFILL="native"``; ``INT8_GROUPS=False`` keeps the GGUF layout's kernel), decode rows the GGUF layout's
    kernel."""
    q8, q4 = (torch.from_numpy(random_blocks(t, 32, 256, seed=9)) for t in ("q8_0", "q4_0"))
    x = torch.randn(cpu_qgemv.PREFILL_ROWS, 256)
    copied = cpu_qgemv.QGemv(q8, "q8_0")
    assert copied.interleave(always=True) and not copied.groups()
    for plan, kwargs in ((cpu_qgemv.QGemv(q8, "q8_0"), {}), (cpu_qgemv.QGemv(q4, "q4_0"), {"activations": "int8"}),
                         (copied, {"activations": "int8"}), (cpu_qgemv.QGemv(q8, "q8_0"),
                                                             {"activations": "int8", "isa": "c"})):
        with pytest.raises(ValueError, match="path 'groups' takes activations='int8' on a q8_0/q6_K weight without"):
            plan(x, path="groups", **kwargs)
    assert not cpu_qgemv.QGemv(q8, "q8_0").groups("c")
    previous = cpu_qgemv.set_native_enabled(False)
    try:  # no kernel: the torch fallback of the same contract, a forced path included
        torch.testing.assert_close(cpu_qgemv.QGemv(q8, "q8_0")(x, activations="int8", path="groups"),
                                   cpu_qgemv.torch_qgemv_int8(x, q8, "q8_0"), rtol=0, atol=0)
    finally:
        cpu_qgemv.set_native_enabled(previous)
    monkeypatch.setenv("TORCH_IR_QGEMV_X16", "0")
    assert not cpu_qgemv.QGemv(q8, "q8_0").groups()
    monkeypatch.delenv("TORCH_IR_QGEMV_X16")
    monkeypatch.setattr(cpu_blocks, "INT8_PREFILL", "native")
    layer = cpu_blocks.BlockLinear([(q8, "q8_0")], None, int8=True)
    part = layer.parts[0]
    assert part.groups == (part.gemv._w16 is None)  # on AVX-512 VNNI the copy is read instead
    out = torch.empty(x.shape[0], 32)
    layer(x, out)
    gguf = cpu_qgemv.QGemv(q8, "q8_0")
    want = gguf(x, activations="int8", path="groups") if part.groups else copied(x, activations="int8")
    np.testing.assert_array_equal(bits(out), bits(want))
    if part.groups:  # switched off (a benchmark's comparison): the GGUF layout's integer kernel
        monkeypatch.setattr(cpu_blocks, "INT8_GROUPS", False)
        layer(x, out)
        np.testing.assert_array_equal(bits(out), bits(gguf(x, activations="int8")))
        assert not np.array_equal(bits(out), bits(want))  # another order of fp32 sums: the switch did act
        monkeypatch.setattr(cpu_blocks, "INT8_GROUPS", True)
    layer(x[:1], out[:1])
    decode = gguf if part.groups else copied
    np.testing.assert_array_equal(bits(out[:1]), bits(decode(x[:1], activations="int8")))
