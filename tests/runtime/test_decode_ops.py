"""The decode step's small ops as C calls (``npu_runtime.backends.cpu_decode_ops``): RMS_NORM, ROPE_QK and
ATTENTION over a KV cache against ``torch_ir``'s reference implementations and against the CPU backend's torch
kernels (the path they replace), fp32, bf16 and fp16, every ISA variant bit for bit the same, the checks before the
raw pointers, the fallback, and a decode program running them."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import torch_ir
from npu_program.program import Dispatch, TensorSpec
from npu_runtime.backends import cpu_decode_ops as dops
from npu_runtime.backends import cpu_gemv_build
from npu_runtime.backends.cpu_transformer import Attention, RmsNorm, Rope
from torch_ir.ops import npu

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
HALF = (torch.bfloat16, torch.float16)
NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
#: fp32: one unit in the last place (relative); bf16 and fp16: the same for their 8- and 11-bit significands
ULP = {torch.float32: 2.0**-23, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


@pytest.fixture(scope="module")
def library() -> cpu_gemv_build.Library:
    lib = dops._kernel.load()
    if lib is None:
        pytest.skip(f"no native decode ops here: {dops.native_status()}")
    return lib


@pytest.fixture(autouse=True)
def native_on(monkeypatch):
    monkeypatch.setattr(dops, "_enabled", True)
    monkeypatch.setattr(cpu_gemv_build.NativeKernel, "enabled", True)
    monkeypatch.setattr(dops, "_isa", None)


def rand(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def torch_kernel(cls, dispatch: Dispatch, specs: dict[str, TensorSpec], inputs, outputs) -> None:
    """The CPU backend's kernel for ``dispatch`` on its torch path (the native kernels switched off)."""
    kernel = cls(dispatch, specs)
    previous = dops.set_native_enabled(False)
    try:
        kernel.run(inputs, outputs)
    finally:
        dops.set_native_enabled(previous)


def specs_of(names: list[str], tensors: list[torch.Tensor]) -> dict[str, TensorSpec]:
    return {n: TensorSpec(n, list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in zip(names, tensors)}


def within_ulps(a: torch.Tensor, b: torch.Tensor, ulps: float, floor: float = 0.0) -> None:
    a64, b64 = a.double(), b.double()
    tol = ulps * ULP[a.dtype] * torch.maximum(a64.abs(), b64.abs()) + floor
    bad = (a64 - b64).abs() > tol
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} differ, worst {(a64 - b64).abs().max().item():.3g}"


# ------------------------------------------------------------------------------------------------ RMS_NORM


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [896, 64, 37])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_matches_reference_and_torch_kernel(library, dtype, n, with_weight):
    x, w = rand((1, 1, n), dtype, n) * 3, rand((n,), dtype, n + 1)
    out = torch.empty_like(x)
    assert dops.rms_norm(x, w if with_weight else None, out, 1e-6)
    want = npu.rms_norm(x, w if with_weight else None, eps=1e-6)
    old = torch.empty_like(x)
    inputs = [x, w] if with_weight else [x]
    names = ["x", "w", "y"][: len(inputs)] + ["y"]
    torch_kernel(RmsNorm, Dispatch("RMS_NORM", "rms", names[:-1], ["y"], {"eps": 1e-6}),
                 specs_of(["x", "y"], [x, out]), inputs, [old])
    # fp32: the sums of squares differ in order only (n terms, relative error under n ulps; the scale is its
    # inverse square root): a few ulps. bf16: the same fp32 scale rounded to 8 bits, once or twice (after
    # the weight), may land on the neighbour: one bf16 ulp per rounding
    ulps = 4.0 if dtype == torch.float32 else 2.0
    for other in (want, old):
        within_ulps(out, other, ulps)
    if dtype in HALF:  # and nearly always exactly equal
        assert (out == want).float().mean() > 0.97


def test_rms_norm_in_place(library):
    x = rand((1, 1, 896), torch.float32, 3)
    want = npu.rms_norm(x, None, eps=1e-5)
    assert dops.rms_norm(x, None, x, 1e-5)
    within_ulps(x, want, 4.0)


# ------------------------------------------------------------------------------------------------- ROPE_QK


def rope_inputs(dtype: torch.dtype, heads: int, kv_heads: int, d: int, seed: int):
    q, k = rand((1, heads, 1, d), dtype, seed), rand((1, kv_heads, 1, d), dtype, seed + 1)
    angle = rand((1, 1, 1, d), torch.float32, seed + 2) * 7
    return q, k, angle.cos().to(dtype), angle.sin().to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,d", [(14, 2, 64), (4, 4, 128), (3, 1, 6)])
def test_rope_qk_is_the_reference_bit_for_bit(library, dtype, heads, kv_heads, d):
    q, k, cos, sin = rope_inputs(dtype, heads, kv_heads, d, d)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    assert dops.rope_qk(q, k, cos, sin, q_out, k_out)
    want_q, want_k = npu.rope_qk(q, k, cos, sin)
    # every product and the sum rounded to the dtype as the reference's ops round them: the same bits
    assert torch.equal(q_out, want_q) and torch.equal(k_out, want_k)
    old_q, old_k = torch.empty_like(q), torch.empty_like(k)
    names = ["q", "k", "cos", "sin", "q_out", "k_out"]
    torch_kernel(Rope, Dispatch("ROPE_QK", "rope", names[:4], names[4:], {}),
                 specs_of(names, [q, k, cos, sin, q_out, k_out]), [q, k, cos, sin], [old_q, old_k])
    # the torch kernel rounds x·cos, then adds the other product unrounded (addcmul): one rounding apart
    within_ulps(q_out, old_q, 2.0, floor=ULP[dtype] * 4)
    within_ulps(k_out, old_k, 2.0, floor=ULP[dtype] * 4)


def test_rope_qk_in_place(library):
    q, k, cos, sin = rope_inputs(torch.float32, 14, 2, 64, 5)
    want_q, want_k = npu.rope_qk(q, k, cos, sin)
    assert dops.rope_qk(q, k, cos, sin, q, k)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)


# ----------------------------------------------------------------------------------------------- ATTENTION


def cache_mask(kind: str, b: int, h: int, s: int, seed: int) -> torch.Tensor | None:
    g = torch.Generator().manual_seed(seed)
    if kind == "none":
        return None
    if kind == "prefix":  # what a decode program passes: positions up to the current one (le_1)
        return (torch.arange(s) <= s // 2).view(1, 1, 1, s).expand(b, 1, 1, s).contiguous()
    if kind == "random_per_head":
        m = torch.rand((b, h, 1, s), generator=g) < 0.6
        m[:, 0, :, :] = False  # one head sees nothing: its output is zeros
        return m
    if kind == "additive":
        m = torch.randn((1, 1, 1, s), generator=g)
        m[..., s // 3:] = float("-inf")
        return m
    raise ValueError(kind)


def float64_attention(q, k, v, mask, scale):
    """The reference op in float64 on the same (widened) values: the truth both fp32 kernels approximate."""
    m = mask if mask is None or mask.dtype == torch.bool else mask.double()
    return npu.attention(q.double(), k.double(), v.double(), m, scale=scale, merge_heads=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,d", [(14, 2, 64), (4, 4, 128), (7, 1, 128)])
@pytest.mark.parametrize("mask_kind", ["prefix", "random_per_head", "additive", "none"])
def test_attention_matches_reference_and_torch_kernel(library, dtype, heads, kv_heads, d, mask_kind):
    b, s, scale = (2 if mask_kind == "random_per_head" else 1), 96, 1 / math.sqrt(d)
    q = rand((b, heads, 1, d), dtype, d)
    k, v = rand((b, kv_heads, s, d), dtype, d + 1), rand((b, kv_heads, s, d), dtype, d + 2)
    mask = cache_mask(mask_kind, b, heads, s, d)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(dtype)
    out = torch.empty(b, 1, heads * d, dtype=dtype)
    assert dops.attention(q, k, v, mask, out, scale)
    truth = float64_attention(q, k, v, mask, scale)
    # fp32 arithmetic on dtype inputs: softmax weights within ~S ulps, the weighted sum of S terms
    # likewise (relative to the sum of |p·v|), then one rounding to the dtype
    bound = (s + d) * ULP[torch.float32] * 4 * (v.double().abs().amax() + 1)
    tol = bound + ULP[dtype] / 2 * truth.abs() if dtype in HALF else bound
    assert ((out.double() - truth).abs() <= tol).all()
    if mask_kind == "random_per_head":
        assert (out.view(b, heads, d)[:, 0] == 0).all()  # the head that sees no position
    names = ["q", "k", "v", "mask", "y"] if mask is not None else ["q", "k", "v", "y"]
    inputs = [q, k, v, mask] if mask is not None else [q, k, v]
    params = {"scale": scale, "causal": False, "merge_heads": True}
    dispatch = Dispatch("ATTENTION", "attention", names[:-1], ["y"], params)
    old = torch.empty_like(out)
    torch_kernel(Attention, dispatch, specs_of(names, [*inputs, out]), inputs, [old])
    if dtype == torch.float32:
        assert ((out.double() - old.double()).abs() <= 2 * bound).all()
        ref = npu.attention(q, k, v, mask, scale=scale, merge_heads=True)  # the reference op itself, in fp32
        assert ((out.double() - ref.double()).abs() <= 2 * bound).all()
    else:  # both round one fp32 value each: equal, or neighbours where the two fp32 values straddle a midpoint
        # (farther apart only where the weighted sum cancels to a value whose steps are finer than two fp32 sums'
        # error: S terms, each within S fp32 roundings of sum p·|v|)
        sums = 2 * s * ULP[torch.float32] / 2 * float64_attention(q, k, v.abs(), mask, scale)
        within_ulps(out, old, 1.0, floor=sums.view_as(out))
        assert (out == old).float().mean() > 0.97


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_isa_variant_gives_the_same_bits(library, dtype, monkeypatch):
    q, k, v = rand((1, 14, 1, 64), dtype, 1), rand((1, 2, 200, 64), dtype, 2), rand((1, 2, 200, 64), dtype, 3)
    mask = cache_mask("prefix", 1, 14, 200, 0)
    x, w = rand((1, 1, 896), dtype, 4), rand((896,), dtype, 5)
    both = (rand((1, 2 * 4864), dtype, 6).float() * 8).to(dtype)  # GATE_UP's gate and up, silu's whole range
    results = []
    for isa in range(library.isa + 1):
        monkeypatch.setattr(dops, "_isa", isa)
        out, y, z = torch.empty(1, 1, 896, dtype=dtype), torch.empty_like(x), torch.empty(1, 4864, dtype=dtype)
        assert dops.attention(q, k, v, mask, out, 0.125) and dops.rms_norm(x, w, y, 1e-6) and dops.silu_mul(both, z)
        results.append((out, y, z))
    for result in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(result, results[0]))


def test_every_fp16_value_widens_and_rounds_alike_in_every_variant(library, monkeypatch):
    """The x86 variants convert fp16 with F16C, the portable one in plain C: every one of the 65,536 bit patterns
    through both. Two cache positions, equal scores: out = v0 / 2 + v1 / 2, exact in fp32, then rounded to fp16 (v1
    is v0's neighbour pattern, so half the sums are ties; subnormals, the largest values, inf and NaN included)."""
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
    v = torch.stack([every, every.roll(1)]).view(2, 1024, 64).transpose(0, 1).unsqueeze(0).contiguous()  # [1,H,2,D]
    q, k = torch.zeros(1, 1024, 1, 64, dtype=torch.float16), torch.zeros_like(v)
    want = (v[0, :, 0].float() * 0.5 + v[0, :, 1].float() * 0.5).half().reshape(-1)
    nan = want.isnan()
    results = []
    for isa in range(library.isa + 1):
        monkeypatch.setattr(dops, "_isa", isa)
        out = torch.empty(1, 1, 1024 * 64, dtype=torch.float16)
        assert dops.attention(q, k, v, None, out, 1.0)
        got = out.reshape(-1)
        assert torch.equal(got.isnan(), nan)
        assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16)), f"isa {isa}"
        results.append(got.view(torch.int16))
    assert all(torch.equal(r, results[0]) for r in results[1:])  # NaN payloads too


def test_rows_without_a_softmax_give_zeros_in_every_variant(library, monkeypatch):
    """Per head of a group (two query heads per cache head): every position hidden from it by an additive -inf
    mask while the other head sees them, a +inf score, a NaN query: zeros for that head (the vectorized exp and
    sums of the softmax keep this), the other heads the reference's softmax."""
    q, k, v = rand((1, 4, 1, 16), torch.float32, 1), rand((1, 2, 40, 16), torch.float32, 2), \
        rand((1, 2, 40, 16), torch.float32, 3)
    mask = torch.zeros(1, 4, 1, 40)
    mask[0, 0] = float("-inf")  # head 0 sees nothing; head 1 (same cache head) sees all
    q[0, 2, 0, 0] = float("nan")
    k[0, 1, 7] = float("inf") * torch.sign(q[0, 3, 0])  # head 3's score at position 7 is +inf (head 2's is NaN)
    scores = (q @ k.repeat_interleave(2, dim=1).transpose(-1, -2)) * 0.25 + mask
    want = (torch.softmax(scores, -1) @ v.repeat_interleave(2, dim=1)).reshape(1, 1, 64)
    want[..., :16] = 0.0
    want[..., 32:] = 0.0
    for isa in range(library.isa + 1):
        monkeypatch.setattr(dops, "_isa", isa)
        out = torch.full((1, 1, 64), 7.0)
        assert dops.attention(q, k, v, mask, out, 0.25)
        assert torch.equal(out[..., :16], want[..., :16]) and torch.equal(out[..., 32:], want[..., 32:])
        torch.testing.assert_close(out[..., 16:32], want[..., 16:32], rtol=4e-6, atol=1e-6)


def test_hidden_cache_rows_are_not_read(library):
    """A hidden position is skipped: with the reference reading it as -inf, garbage there changes nothing."""
    q, k, v = rand((1, 4, 1, 64), torch.float32, 1), rand((1, 2, 64, 64), torch.float32, 2), \
        rand((1, 2, 64, 64), torch.float32, 3)
    mask = (torch.arange(64) < 20).view(1, 1, 1, 64)
    out, again = torch.empty(1, 1, 256), torch.empty(1, 1, 256)
    assert dops.attention(q, k, v, mask, out, 0.125)
    k[:, :, 20:], v[:, :, 20:] = 1e30, 1e30
    assert dops.attention(q, k, v, mask, again, 0.125)
    assert torch.equal(out, again)


# ------------------------------------------------------------------------------------------------ checks


def test_checks_before_the_pointers(library):
    q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    out = torch.empty(1, 1, 64)
    with pytest.raises(ValueError, match="contiguous"):
        dops.attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), v, None, out, 1.0)
    with pytest.raises(TypeError, match="float32/bfloat16"):
        dops.attention(q, k, v.double(), None, out, 1.0)
    with pytest.raises(TypeError, match="one dtype"):
        dops.attention(q, k, v.bfloat16(), None, out, 1.0)
    with pytest.raises(ValueError, match="overlaps"):
        dops.attention(q, k, v, None, q.view(1, 1, 64), 1.0)
    with pytest.raises(ValueError, match="does not fit"):
        dops.attention(torch.randn(1, 3, 1, 16), k, v, None, torch.empty(1, 1, 48), 1.0)
    with pytest.raises(ValueError, match="positions"):
        dops.attention(q, k, v, torch.ones(1, 1, 1, 7, dtype=torch.bool), out, 1.0)
    shrunk = torch.randn(1, 2, 8, 16)
    shrunk.untyped_storage().resize_(64)
    with pytest.raises(ValueError, match="storage"):
        dops.attention(q, shrunk, v, None, out, 1.0)
    base = torch.randn(40)
    with pytest.raises(ValueError, match="overlaps"):  # out shifted over x: not x itself
        dops.rms_norm(base[:32].view(1, 1, 32), None, base[8:].view(1, 1, 32), 1e-6)
    with pytest.raises(ValueError, match="one row"):
        dops.rope_qk(q, k[:, :, :1].contiguous(), torch.ones(32), torch.ones(16), torch.empty_like(q),
                     torch.empty(1, 2, 1, 16))


def test_held_tensors_are_checked_when_first_seen_and_when_they_change(library):
    held = (dops.Held(), dops.Held(), dops.Held())
    q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    out = torch.empty(1, 1, 64)
    with pytest.raises(ValueError, match="contiguous"):
        dops.attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), v, None, out, 1.0, held=held)
    assert dops.attention(q, k, v, None, out, 1.0, dops.attention_scratch(4, 2, 8, 16), held=held)
    with pytest.raises(ValueError, match="v has shape"):  # another cache length: v is checked again
        dops.attention(q, torch.randn(1, 2, 9, 16), v, None, out, 1.0, held=held)
    with pytest.raises(ValueError, match="scratch holds"):  # another scratch: checked again
        dops.attention(q, k, v, None, out, 1.0, torch.empty(3), held=held)
    weight_held = dops.Held()
    x, y = torch.randn(1, 1, 16), torch.empty(1, 1, 16)
    assert dops.rms_norm(x, torch.ones(16), y, 1e-6, weight_held)
    with pytest.raises(TypeError, match="float32/bfloat16"):
        dops.rms_norm(x, torch.ones(16, dtype=torch.float64), y, 1e-6, weight_held)


# ------------------------------------------------------------------------------------------ the fallback


def test_off_switch_runs_torch(library):
    x, out = torch.randn(1, 1, 32), torch.empty(1, 1, 32)
    previous = dops.set_native_enabled(False)
    try:
        assert not dops.rms_norm(x, None, out, 1e-6)
        assert dops.native_status().startswith("torch")
    finally:
        dops.set_native_enabled(previous)


def test_no_compiler_warns_once_and_the_kernels_still_compute(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    kernel = cpu_gemv_build.NativeKernel("decode ops", dops._build, lambda lib: "?", "torch runs them")
    monkeypatch.setattr(dops, "_kernel", kernel)
    q, k, cos, sin = rope_inputs(torch.float32, 4, 2, 16, 0)
    specs = specs_of(["q", "k", "cos", "sin", "qo", "ko"], [q, k, cos, sin, q, k])
    rope = Rope(Dispatch("ROPE_QK", "rope", ["q", "k", "cos", "sin"], ["qo", "ko"], {}), specs)
    assert rope.native
    outs = [torch.empty_like(q), torch.empty_like(k)]
    with pytest.warns(RuntimeWarning, match="decode ops"):
        rope.run([q, k, cos, sin], outs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rope.run([q, k, cos, sin], outs)  # once only
    want = npu.rope_qk(q, k, cos, sin)
    within_ulps(outs[0], want[0], 2.0, floor=1e-6)
    within_ulps(outs[1], want[1], 2.0, floor=1e-6)


# ------------------------------------------------------------------------------------------- in a program


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_program_runs_them_and_generates_the_same_tokens(library, dtype):
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from npu_compiler.llm import compile_lm
    from npu_runtime import Device, load_weights
    from npu_runtime.backends.cpu_kernels import make_kernel
    from npu_runtime.generate import Generator
    from tests.llm.checkpoints import tiny_config
    from torch_ir.frontends.hf import extract_lm
    from torch_ir.weights import module_state

    config = tiny_config("qwen2", num_attention_heads=4, num_key_value_heads=2, hidden_size=128)
    torch.manual_seed(0)
    real = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).eval()
    with torch_ir.build_on_meta():
        meta = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).eval()
    programs = compile_lm(extract_lm(meta, 64), chunk=16)
    for program, native in ((programs.decode, True), (programs.prefill_program(), False)):
        specs = {**program.tensors, **{w.name: w for w in program.weight_specs},
                 **{s.name: s.tensor_spec() for s in program.state_specs}}  # as the Executor gives them
        kinds = {d.kernel: make_kernel(d, specs, set()).native for d in program.dispatches
                 if d.kernel in ("RMS_NORM", "ROPE_QK", "ATTENTION")}
        assert kinds == dict.fromkeys(("RMS_NORM", "ROPE_QK", "ATTENTION"), native)
    device = Device()
    gen = Generator(programs.prefill, programs.decode, load_weights(module_state(real), programs.prefill, device),
                    device)
    prompt = torch.randint(4, 300, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    runs = {}
    for native in (True, False):
        previous = dops.set_native_enabled(native)
        try:
            runs[native] = gen.generate(prompt, 12, keep_logits=True)
        finally:
            dops.set_native_enabled(previous)
    step = 0.0
    for i, (a, b) in enumerate(zip(runs[True].logits, runs[False].logits)):
        if runs[True].tokens[:i] != runs[False].tokens[:i]:
            break  # after a different token the two runs decode different inputs
        step = max(step, float(abs(a - b).max() / (abs(b).max() + 1e-6)))
    # fp32: rounding-level differences through two layers; bf16: a flipped rounding here and there, a
    # few bf16 ulps of the logits' range
    assert step < (1e-4 if dtype == torch.float32 else 5e-2)
    if dtype == torch.float32:
        assert runs[True].tokens == runs[False].tokens


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_prefill_chunk_reads_only_the_live_positions_of_a_long_cache(dtype):
    """The multi-token (torch) path: 8 queries at positions 4-11 of a 64-position cache see positions 0-11; past
    them every score is hidden, so the products stop there (``live_positions``). Garbage past them changes
    nothing, and the result is the reference's over the whole cache."""
    t, s, offset, d = 8, 64, 4, 32
    q, k, v = rand((1, 4, t, d), dtype, 1), rand((1, 2, s, d), dtype, 2), rand((1, 2, s, d), dtype, 3)
    mask = (torch.arange(s).view(1, s) <= offset + torch.arange(t).view(t, 1)).view(1, 1, t, s)
    names, params = ["q", "k", "v", "mask", "y"], {"scale": 0.125, "causal": False, "merge_heads": True}
    dispatch = Dispatch("ATTENTION", "attention", names[:-1], ["y"], params)
    out, again = torch.empty(1, t, 4 * d, dtype=dtype), torch.empty(1, t, 4 * d, dtype=dtype)
    torch_kernel(Attention, dispatch, specs_of(names, [q, k, v, mask, out]), [q, k, v, mask], [out])
    truth = float64_attention(q, k, v, mask, 0.125).view_as(out)
    k[:, :, offset + t:], v[:, :, offset + t:] = 1e30, 1e30  # inf in fp16
    torch_kernel(Attention, dispatch, specs_of(names, [q, k, v, mask, again]), [q, k, v, mask], [again])
    assert torch.equal(out, again)
    bound = (s + d) * ULP[torch.float32] * 4 * (v[:, :, :offset + t].double().abs().amax() + 1)
    assert ((out.double() - truth).abs() <= bound + ULP[dtype] / 2 * truth.abs()).all()
