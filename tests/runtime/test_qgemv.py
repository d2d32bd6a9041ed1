"""The weight-only quantized decode GEMV (``npu_runtime.backends.cpu_qgemv``, ``gemv_q.c``) on GGUF Q8_0 / Q4_0 /
Q5_0 / Q4_K / Q6_K blocks: every kernel (portable C, AVX2, AVX-512) and the torch fallback against
``gguf.quants.dequantize`` (the reference package) and a float64 matmul, exactly where the arithmetic is
exact, and the checks that stand between a tensor and a raw pointer."""

from __future__ import annotations

import importlib.resources

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize

from npu_runtime.backends import cpu_gemv_build, cpu_qgemv
from torch_ir.quant.numerics import int8_groups

GGML = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
        "q5_0": gguf.GGMLQuantizationType.Q5_0, "q4_K": gguf.GGMLQuantizationType.Q4_K,
        "q6_K": gguf.GGMLQuantizationType.Q6_K}
BYTES = {"q8_0": 34, "q4_0": 18, "q5_0": 22, "q4_K": 144, "q6_K": 210}
ELEMS = {"q8_0": 32, "q4_0": 32, "q5_0": 32, "q4_K": 256, "q6_K": 256}
#: where each layout keeps its fp16 scales (Q4_K: d and dmin; the 6- and 8-bit sub-scales, Q5_0's fifth bits, stay
#: random bytes)
FP16_AT = {"q8_0": (0,), "q4_0": (0,), "q5_0": (0,), "q4_K": (0, 2), "q6_K": (208,)}
#: the exact test's scale exponents and |x| bound: every product and partial sum a multiple of 2^-2 below 2^22
EXACT = {"q8_0": ((-2, 2), 8), "q4_0": ((-2, 2), 8), "q5_0": ((-2, 2), 8), "q4_K": ((-2, 0), 8),
         "q6_K": ((-2, 0), 2)}
U = 2.0**-24  # fp32's unit roundoff


@pytest.fixture(scope="module")
def qlib():
    library = cpu_qgemv._load()
    if library is None:
        pytest.skip(f"no native quantized GEMV here: {cpu_qgemv.native_status()}")
    return library


@pytest.fixture(params=list(cpu_qgemv.ISAS))
def isa(request, qlib) -> str:
    """Each kernel this CPU can run (the portable one always; AVX2 is also run where AVX-512 is the default)."""
    if cpu_qgemv.ISAS[request.param] > qlib.isa:
        pytest.skip(f"this CPU has no {request.param}")
    return request.param


@pytest.fixture
def fallback(monkeypatch):
    """Every call through the torch path (what a machine without gcc runs)."""
    for name, value in (("library", None), ("failed", "no compiler (test)"), ("warned", False)):
        monkeypatch.setattr(cpu_qgemv._kernel, name, value)
    monkeypatch.setattr(cpu_gemv_build.NativeKernel, "enabled", True)


def random_blocks(qtype: str, n: int, k: int, seed: int, exp: tuple[int, int] | None = None,
                  wide: bool = False) -> np.ndarray:
    """``n`` rows of random blocks: every code and sub-scale byte random (Q8_0's -128 and Q6_K's -128 scale
    included, which GGML's quantizer never writes but a file may hold), fp16 scales finite: normal * 0.02,
    or 2^e, e in ``exp``, or (``wide``) any finite fp16 bit pattern: subnormals to 65504, either sign."""
    rng = np.random.default_rng(seed)
    nb = k // ELEMS[qtype]
    blocks = rng.integers(0, 256, size=(n, nb, BYTES[qtype]), dtype=np.uint8)
    for at in FP16_AT[qtype]:
        if wide:
            bits = rng.integers(0, 1 << 16, size=(n, nb), dtype=np.uint16)
            d = np.where((bits & 0x7C00) == 0x7C00, bits & 0x83FF, bits).astype(np.uint16).view(np.float16)
        elif exp is None:
            d = (rng.standard_normal((n, nb)) * 0.02).astype(np.float16)
        else:
            d = np.ldexp(np.ones((n, nb)), rng.integers(exp[0], exp[1] + 1, size=(n, nb))).astype(np.float16)
        blocks[..., at:at + 2] = d.reshape(n, nb, 1).view(np.uint8)
    return blocks.reshape(n, nb * BYTES[qtype])


def reference(raw: np.ndarray, qtype: str, x: np.ndarray, bias: np.ndarray | None = None):
    """The float64 product of ``x`` with gguf's dequantized weights, and ``Σ |x·w| (+ |bias|)`` per output."""
    w = gguf_dequantize(raw, GGML[qtype]).astype(np.float64)
    assert w.shape == (raw.shape[0], x.shape[1])
    want, scale = x.astype(np.float64) @ w.T, np.abs(x.astype(np.float64)) @ np.abs(w).T
    if bias is not None:
        want, scale = want + bias, scale + np.abs(bias)
    return want, scale


def check_close(y: torch.Tensor, want: np.ndarray, scale: np.ndarray, k: int) -> None:
    """Within fp32's rounding of a dot product: ``d·q`` is exact in fp32 (11 x 8 bits), so the reference is
    exact and the error is the result's roundings alone. Each term passes through at most ``k + 8`` of them
    (its product; the sums in its block, of its row and of the lanes; the scale by ``d``; the bias), in any
    order the kernels or BLAS use, so ``|error| <= γ(k + 8) · Σ|x·w|`` (Higham's bound, γ(n) = nu / (1 - nu)).
    Typical errors are ~sqrt(k) times smaller; the exact test below catches layout mistakes bit for bit."""
    n = k + 8
    tol = n * U / (1 - n * U) * scale
    err = np.abs(y.numpy().astype(np.float64) - want)
    assert (err <= tol).all(), f"max error {err.max():.3g}, tolerance there {tol.flat[err.argmax()]:.3g}"


CASES = [(q, *shape) for q in ("q8_0", "q4_0", "q5_0") for shape in
         [(1, 37, 256), (4, 67, 896), (1, 9, 4864), (3, 1, 32), (8, 19, 128), (9, 17, 64)]]
# the k-quants on the Qwen2.5-0.5B/1.5B rows they can hold (K = 4864, 1536, 8960; 896 is refused, below)
CASES += [(q, *shape) for q in ("q4_K", "q6_K") for shape in
          [(1, 37, 256), (4, 21, 1536), (1, 9, 4864), (2, 5, 8960), (3, 1, 256), (8, 19, 512), (9, 17, 256)]]


@pytest.mark.parametrize(("qtype", "m", "n", "k"), CASES)
def test_every_kernel_against_gguf(isa, qtype, m, n, k):
    raw = random_blocks(qtype, n, k, seed=m * 1000 + n)
    x = np.random.default_rng(k).standard_normal((m, k)).astype(np.float32)
    want, scale = reference(raw, qtype, x)
    y = cpu_qgemv.QGemv(torch.from_numpy(raw), qtype)(torch.from_numpy(x), isa=isa)
    check_close(y, want, scale, k)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0", "q5_0"])
def test_weights_quantized_by_gguf(isa, qtype):
    """Blocks as llama.cpp's quantizer writes them (``gguf.quants.quantize``), on Qwen2.5-0.5B's K = 896, the rows a
    "Q4_K_M" file stores as Q5_0 because they are not whole 256-weight super-blocks."""
    n, k = 40, 896
    w = np.random.default_rng(31).standard_normal((n, k)).astype(np.float32)
    raw = gguf.quants.quantize(w, GGML[qtype])
    assert raw.shape == (n, k // 32 * BYTES[qtype])
    x = np.random.default_rng(32).standard_normal((3, k)).astype(np.float32)
    y = cpu_qgemv.QGemv(torch.from_numpy(raw), qtype)(torch.from_numpy(x), isa=isa)
    check_close(y, *reference(raw, qtype, x), k)


@pytest.mark.parametrize("qtype", list(GGML))
@pytest.mark.parametrize("m", [1, 4])
def test_exact_arithmetic_gives_the_exact_result(isa, qtype, m):
    """Scales 2^e (e in EXACT's range, >= -2) and small integer x: every weight, product, partial sum and
    result is a multiple of 1/4 below 2^22 (checked: Σ|x·w| bounds them all), exact in fp32 in any order, so
    any kernel must give the float64 result bit for bit (a nibble, bit or scale taken from the wrong place
    would show)."""
    k, n = 256, 67
    exp, xmax = EXACT[qtype]
    raw = random_blocks(qtype, n, k, seed=7 + m, exp=exp)
    x = np.random.default_rng(m).integers(-xmax, xmax + 1, size=(m, k)).astype(np.float32)
    want, scale = reference(raw, qtype, x)
    assert scale.max() < 2.0**22
    y = cpu_qgemv.QGemv(torch.from_numpy(raw), qtype)(torch.from_numpy(x), isa=isa)
    np.testing.assert_array_equal(y.numpy().astype(np.float64), want)


@pytest.mark.parametrize("qtype", list(GGML))
def test_bias_threads_and_ggml_ids(qlib, qtype):
    """A bias is added; two threads give the bits of one (a row is always summed alike), with float or int8 x;
    GGML's type id names the layout as well as its name."""
    m, n, k = 2, 1000, 512
    raw = random_blocks(qtype, n, k, seed=3, wide=True)
    x = np.random.default_rng(4).standard_normal((m, k)).astype(np.float32)
    bias = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    plan = cpu_qgemv.QGemv(torch.from_numpy(raw), GGML[qtype], torch.from_numpy(bias))
    one = plan(torch.from_numpy(x), threads=1)
    assert torch.equal(plan(torch.from_numpy(x), threads=2), one)
    want, scale = reference(raw, qtype, x, bias.astype(np.float64))
    check_close(one, want, scale, k)
    one = plan(torch.from_numpy(x), threads=1, activations="int8")
    assert torch.equal(plan(torch.from_numpy(x), threads=2, activations="int8"), one)
    want, bound = int8_contract(raw, qtype, x)
    steps = 2 * (k // 32) + 16
    err = np.abs(one.numpy().astype(np.float64) - (want + bias))
    assert (err <= steps * U * (bound + np.abs(bias))).all()


@pytest.mark.parametrize("qtype", list(GGML))
def test_the_torch_fallback_dequantizes_like_gguf(fallback, qtype):
    k = 3 * ELEMS[qtype]
    raw = random_blocks(qtype, 13, k, seed=11)
    np.testing.assert_array_equal(cpu_qgemv.dequantize(torch.from_numpy(raw), qtype).numpy(),
                                  gguf_dequantize(raw, GGML[qtype]))
    x = np.random.default_rng(12).standard_normal((4, k)).astype(np.float32)
    with pytest.warns(RuntimeWarning, match="no compiler"):
        y = cpu_qgemv.qgemv(torch.from_numpy(x), torch.from_numpy(raw), qtype)
    check_close(y, *reference(raw, qtype, x), k)
    assert cpu_qgemv.native_status().startswith("torch (")


@pytest.mark.parametrize("qtype", list(GGML))
def test_scales_of_every_magnitude(isa, qtype):
    """fp16 scales drawn from every finite bit pattern (subnormals, 65504, both signs; Q4_K's dmin too)."""
    m, n, k = 2, 23, 512
    raw = random_blocks(qtype, n, k, seed=21, wide=True)
    x = np.random.default_rng(22).standard_normal((m, k)).astype(np.float32)
    y = cpu_qgemv.QGemv(torch.from_numpy(raw), qtype)(torch.from_numpy(x), isa=isa)
    check_close(y, *reference(raw, qtype, x), k)


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K"])
def test_k_quants_refuse_rows_that_are_not_whole_super_blocks(qlib, qtype):
    """Qwen2.5's K = 896 is 3.5 super-blocks: such a row cannot be a k-quant (llama.cpp files use another type)."""
    plan = cpu_qgemv.QGemv(torch.from_numpy(random_blocks(qtype, 3, 1024, 0)), qtype.upper())
    with pytest.raises(ValueError, match=f"K = 896 is not a multiple of {qtype}'s block of 256"):
        plan(torch.zeros(1, 896))
    assert cpu_qgemv.qtype_of(GGML[qtype]) is cpu_qgemv.QTYPES[qtype]


def test_the_isa_cap(qlib, monkeypatch):
    monkeypatch.setenv("TORCH_IR_QGEMV_ISA", "c")
    assert cpu_qgemv.native_status().startswith("native c,")
    monkeypatch.setenv("TORCH_IR_QGEMV_ISA", "sse9")
    with pytest.raises(ValueError, match="TORCH_IR_QGEMV_ISA='sse9' is not one of c, avx2, avx512"):
        cpu_qgemv.native_status()
    w = torch.from_numpy(random_blocks("q8_0", 3, 32, 0))
    with pytest.raises(ValueError, match="isa 'neon' is not one of"):
        cpu_qgemv.QGemv(w, "q8_0")(torch.zeros(1, 32), isa="neon")


def test_bad_inputs_are_refused_before_the_kernel(qlib):
    w = torch.from_numpy(random_blocks("q8_0", 5, 64, 0))  # [5, 68]
    x = torch.zeros(1, 64)
    plan = cpu_qgemv.QGemv(w, "q8_0")
    with pytest.raises(ValueError, match="K = 48 is not a multiple of q8_0's block of 32"):
        plan(torch.zeros(1, 48))
    with pytest.raises(ValueError, match="x has K = 96, the q8_0 weight holds K = 64"):
        plan(torch.zeros(1, 96))
    with pytest.raises(ValueError, match="whole blocks of 34 bytes; got 67 bytes per row"):
        cpu_qgemv.QGemv(w[:, :67].contiguous(), "q8_0")
    with pytest.raises(ValueError, match="whole blocks of 18 bytes; got 68 bytes per row"):
        cpu_qgemv.QGemv(w, "q4_0")
    with pytest.raises(ValueError, match="weight must be a 2-D uint8 tensor"):
        cpu_qgemv.QGemv(w.reshape(-1), "q8_0")
    with pytest.raises(ValueError, match="weight must be contiguous"):
        cpu_qgemv.QGemv(torch.from_numpy(random_blocks("q8_0", 5, 128, 0))[:, :68], "q8_0")
    with pytest.raises(TypeError, match="weight must be a CPU uint8 tensor, got torch.int8"):
        cpu_qgemv.QGemv(w.view(torch.int8), "q8_0")
    with pytest.raises(ValueError, match=r"'q5_1' is not one of q8_0, q4_0, q5_0, q4_K, q6_K \(GGML ids 8, 2, 6, 12, "
                                         r"14\)"):
        cpu_qgemv.QGemv(w, "q5_1")
    with pytest.raises(ValueError, match="x must be contiguous"):
        plan(torch.zeros(2, 128)[:, ::2])
    with pytest.raises(TypeError, match="x must be a CPU float32 tensor, got torch.float64"):
        plan(x.double())
    with pytest.raises(ValueError, match="bias has shape"):
        cpu_qgemv.QGemv(w, "q8_0", torch.zeros(4))
    with pytest.raises(ValueError, match="out has shape"):
        plan(x, out=torch.zeros(1, 4))
    buf = torch.zeros(64 + 5)
    with pytest.raises(ValueError, match="out overlaps x"):
        plan(buf[:64].view(1, 64), out=buf[60:65].view(1, 5))
    shrunk = torch.zeros(5, 68, dtype=torch.uint8)
    shrunk.untyped_storage().resize_(100)
    with pytest.raises(ValueError, match="weight claims 340 bytes beyond what its storage holds"):
        cpu_qgemv.QGemv(shrunk, "q8_0")


def test_the_source_is_package_data():
    source = importlib.resources.files("npu_runtime.backends").joinpath("gemv_q.c").read_text(encoding="utf-8")
    assert "int qgemv_packed(" in source


# ------------------------------------------------------------------------------ activations="int8"


#: per layout, bytes of a block set to the int8 path's extremes: (start, stop, fill of row 0, fill of row 1). Q8_0's
#: codes -128 and 127 (|-128| is 128 only as an unsigned byte; 127 + 128 times q = 127 saturates AVX2's int16 pairs);
#: Q6_K's 6-bit codes 0 and 63 with sub-scales -128 (the largest integer sums: 4 · 32 · 127 · 128 per lane); the
#: 4- and 5-bit codes 0 and 15 / 31 (Q4_K's 6-bit scales and mins 0, then 63)
EXTREME = {"q8_0": [(2, 34, 0x80, 0x7F)], "q4_0": [(2, 18, 0x00, 0xFF)], "q5_0": [(2, 22, 0x00, 0xFF)],
           "q4_K": [(4, 144, 0x00, 0xFF)], "q6_K": [(0, 192, 0x00, 0xFF), (192, 208, 0x80, 0x80)]}


def with_extremes(raw: np.ndarray, qtype: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``raw`` with rows 0 and 1 made of :data:`EXTREME` codes, and ``x`` with its first two groups constant (q = 127
    and -127 everywhere): an overflow or a saturation of the integer sums shows there."""
    blocks = raw.reshape(raw.shape[0], -1, BYTES[qtype]).copy()
    for start, stop, low, high in EXTREME[qtype]:
        blocks[0, :, start:stop], blocks[1, :, start:stop] = low, high
    x = x.copy()
    x[:, :32], x[:, 32:64] = 1.5, -0.25
    return blocks.reshape(raw.shape), x


def int8_codes(blocks: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group of 32 weights (blocks ``[n, B, bytes]`` -> ``[n, G, ...]``): the integer codes ``[n, G, 32]``, each
    code's scale D ``[n, G, 32]`` and the group's min M ``[n, G]`` as ggml makes them (fp32 products), from the
    layouts themselves (ggml-common.h): Q8_0's int8 codes; Q4_0: nibble − 8; Q5_0: (nibble | bit e of qh << 4) −
    16; Q4_K: nibble, gguf's get_scale_min; Q6_K: (ql's nibble | 2 bits of qh << 4) − 32, a scale per 16."""
    n = blocks.shape[0]
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)  # [n, B, 1] (Q6_K's is at 208)
    if qtype == "q8_0":
        codes = blocks[..., 2:34].view(np.int8).astype(np.int64)
    elif qtype == "q4_0":
        nib = blocks[..., 2:18]
        codes = np.concatenate([nib & 15, nib >> 4], axis=-1).astype(np.int64) - 8  # [n, G, 32]
    elif qtype == "q5_0":
        qh = blocks[..., 2:6].copy().view("<u4")  # [n, G, 1]
        fifth = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int64)  # bit e for element e
        nib = blocks[..., 6:22]
        codes = (np.concatenate([nib & 15, nib >> 4], axis=-1).astype(np.int64) | (fifth << 4)) - 16
    elif qtype == "q4_K":
        sc, mn = gguf.quants.Q4_K.get_scale_min(blocks[..., 4:16].reshape(-1, 12))
        dmin = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
        sd = (d.reshape(-1, 1) * sc.astype(np.float32)).reshape(n, -1, 1)
        sm = (dmin.reshape(-1, 1) * mn.astype(np.float32)).reshape(n, -1)
        qs = blocks[..., 16:].reshape(n, -1, 4, 1, 32)
        codes = np.concatenate([qs & 15, qs >> 4], axis=-2).reshape(n, -1, 32).astype(np.int64)
        return codes, np.broadcast_to(sd, codes.shape), sm
    else:  # q6_K: per half of 128, ql's low nibbles of bytes 0-31, 32-63, their high nibbles; qh's bits 0-1 .. 6-7
        ql = blocks[..., :128].reshape(n, -1, 2, 2, 32)
        low = np.stack([ql & 15, ql >> 4], axis=3).reshape(n, -1, 2, 4, 32)
        high = (blocks[..., 128:192].reshape(n, -1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3
        codes = (low | (high << 4)).reshape(n, -1, 32).astype(np.int64) - 32
        d = blocks[..., 208:210].copy().view(np.float16).astype(np.float32)  # [n, B, 1]
        sd = (d * blocks[..., 192:208].view(np.int8).astype(np.float32)).reshape(n, -1, 2, 1)
        return codes, np.broadcast_to(sd, (*sd.shape[:3], 16)).reshape(codes.shape), np.zeros(codes.shape[:2])
    return codes, np.broadcast_to(d, codes.shape), np.zeros(codes.shape[:2])


def int8_contract(raw: np.ndarray, qtype: str, x: np.ndarray):
    """The int8 path's contract in numpy, independently of the module: x per group of 32 to ``q = round(x / dx)``
    (fp32, ties to even), ``dx = max|x| / 127`` (fp32); per group the exact integer sums of ``code·q`` (per scale:
    Q6_K's two of 16) and ``sx = Σ q``; ``y = Σ dx·(Σ D·code·q − M·sx)`` in float64 (:func:`int8_codes`). Returns y
    and ``Σ |dx|·(Σ |D·code·q| + |M|·|sx|)``: every fp32 rounding of any lane order is relative to that."""
    m, k = x.shape
    g = x.reshape(m, k // 32, 32)
    dx = np.abs(g).max(axis=-1, keepdims=True) / np.float32(127)
    q = np.round(np.divide(g, dx, out=np.zeros_like(g), where=dx > 0)).astype(np.int64)
    codes, sd, sm = int8_codes(raw.reshape(raw.shape[0], -1, BYTES[qtype]), qtype)
    sd = sd.astype(np.float64)
    isum = np.einsum("ngi,mgi->mng", sd * codes, q)  # D·code·q: < 2^53, exact in float64
    iabs = np.einsum("ngi,mgi->mng", np.abs(sd * codes), np.abs(q))
    sx = q.sum(-1)[:, None, :]
    dxx = dx[..., 0].astype(np.float64)[:, None, :]
    want = (dxx * (isum - sm * sx)).sum(-1)
    bound = (np.abs(dxx) * (iabs + np.abs(sm) * np.abs(sx))).sum(-1)
    return want, bound


@pytest.mark.parametrize(("qtype", "m", "n", "k"), [(q, m, n, k) for q in ("q8_0", "q4_0", "q5_0") for m, n, k in
                                                    [(1, 37, 896), (3, 21, 4864), (5, 9, 64), (2, 9, 32)]] +
                         [(q, m, n, k) for q in ("q4_K", "q6_K") for m, n, k in
                          [(1, 37, 1536), (3, 9, 4864), (5, 5, 8960), (2, 9, 256)]])
def test_int8_activations_keep_their_contract(isa, qtype, m, n, k):
    """Exact integer group sums, scaled in fp32: within γ(2G + 16) of the bound (G groups; each term passes
    through its scale's product, its lane's, the lane and group sums, the min's products and the bias). Rows 0 and 1
    hold extreme codes against groups of q = ±127 (:func:`with_extremes`); the contract itself is the reference's
    ``int8_groups(x, 32) · dequantize(W)ᵀ`` (float64; gguf's values) to within the fp32 rounding of ``dx·q``."""
    raw = random_blocks(qtype, n, k, seed=k + m, wide=True)
    x = np.random.default_rng(n).standard_normal((m, k)).astype(np.float32)
    raw, x = with_extremes(raw, qtype, x)
    want, bound = int8_contract(raw, qtype, x)
    xq = int8_groups(torch.from_numpy(x), 32).double().numpy()
    assert (np.abs(want - xq @ gguf_dequantize(raw, GGML[qtype]).astype(np.float64).T) <= 2 * U * bound).all()
    y = cpu_qgemv.QGemv(torch.from_numpy(raw), qtype)(torch.from_numpy(x), isa=isa, activations="int8")
    steps = 2 * (k // 32) + 16
    err = np.abs(y.numpy().astype(np.float64) - want)
    assert (err <= steps * U / (1 - steps * U) * bound).all(), f"max error {err.max():.3g}"
    exact, _ = reference(raw, qtype, x)
    print(f"{qtype} int8 vs exact weights, random data: {np.abs(want - exact).max() / np.abs(exact).max():.2e}")


def exact_int8_case(qtype: str, m: int = 2, n: int = 19, k: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """Power-of-two weight scales and x already on int8 groups (an integer per element, ±127 once per group, times
    2^-1: dx = 2^-1 exactly): every int8-path sum is exact."""
    raw = random_blocks(qtype, n, k, seed=5, exp=(-2, 0))
    rng = np.random.default_rng(6)
    q = rng.integers(-4, 5, size=(m, k // 32, 32))
    q[..., 0] = rng.choice([-127, 127], size=(m, k // 32))
    return raw, (q * 0.5).reshape(m, k).astype(np.float32)


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0", "q5_0", "q4_K", "q6_K"])
def test_int8_activations_are_exact_where_x_is_int8(isa, qtype):
    """x already on int8 groups (an integer per element, ±127 once per group, times 2^-1: dx = 2^-1 exactly) and
    power-of-two weight scales: the int8 path is exact, so it equals the float path and the float64 product."""
    raw, x = exact_int8_case(qtype)
    want, scale = reference(raw, qtype, x)
    assert scale.max() < 2.0**21  # every product a multiple of 2^-2 · 2^-1: each partial sum exact in fp32
    plan = cpu_qgemv.QGemv(torch.from_numpy(raw), qtype)
    np.testing.assert_array_equal(plan(torch.from_numpy(x), isa=isa, activations="int8").numpy(), want)
    np.testing.assert_array_equal(plan(torch.from_numpy(x), isa=isa).numpy(), want)


@pytest.mark.parametrize("qtype", ["q4_K", "q6_K"])
def test_int8_activations_fallback_and_refusals(fallback, monkeypatch, qtype):
    raw = random_blocks(qtype, 7, 512, seed=8)
    x = np.random.default_rng(9).standard_normal((2, 512)).astype(np.float32)
    want, bound = int8_contract(raw, qtype, x)
    with pytest.warns(RuntimeWarning, match="no compiler"):
        y = cpu_qgemv.qgemv(torch.from_numpy(x), torch.from_numpy(raw), qtype, activations="int8")
    assert (np.abs(y.numpy() - want) <= 600 * U * bound).all()
    plan = cpu_qgemv.QGemv(torch.from_numpy(random_blocks("q6_K", 2, 256, 0)), "q6_K")
    with pytest.raises(ValueError, match="activations 'fp16' is not one of float32, int8"):
        plan(torch.zeros(1, 256), activations="fp16")
    monkeypatch.setattr(cpu_qgemv, "INT8_QTYPES", ("q4_0", "q5_0"))  # every layout has an int8 kernel now
    with pytest.raises(ValueError, match="activations='int8' takes q4_0, q5_0 weights, not q6_K"):
        plan(torch.zeros(1, 256), activations="int8")
