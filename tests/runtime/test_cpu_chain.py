"""Chains of native calls (``npu_runtime.backends.cpu_chain``): a decode step whose native dispatches are made by one
C call gives, bit for bit, the logits and the KV cache of the same step made dispatch by dispatch (float weights,
GGUF blocks with float or int8 x, a QKV of two block layouts, bf16); a cache position outside the cache raises the
unchained kernel's own error through a chain; and the glue the chains add (``silu(gate)·up``, the residual add, the
copies, the one-position cache update) against PyTorch's ops."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from npu_runtime import Device, load_weights
from npu_runtime.backends import cpu_chain, cpu_decode_ops
from npu_runtime.generate import Generator
from npu_tools.lm_source import load_lm

from ..gguf.test_config import make_model, write_model
from ..gguf.test_generate import K_QUANTS, MIXED

needs_native = pytest.mark.skipif(cpu_decode_ops._library() is None, reason="the native decode ops cannot be built")
PROMPT = [5, 17, 33, 2, 9, 71]
#: one prompt token: every step a decode step (a prefill's many rows of x may take either of two paths, whichever ran
#: faster, which sum in different orders: no run reproduces another's bits there, chained or not)
STEPS = [5, 3, 44, 8, 90, 12, 60, 7, 1, 25, 38]


@pytest.fixture
def chains_restored():
    previous = cpu_chain.set_enabled(True)
    yield
    cpu_chain.set_enabled(previous)


def _generator(path: Path, **options) -> Generator:
    lm = load_lm(path, max_cache_len=64, **options)
    device = Device()
    return Generator(lm.programs.prefill, lm.programs.decode, load_weights(lm.weights, lm.programs.prefill, device),
                     device)


def _cache(generator: Generator) -> dict[str, np.ndarray]:
    state = generator.decode_exec.state
    return {key: state[key].to_numpy().copy() for key in state.specs}


@pytest.mark.slow
@needs_native
@pytest.mark.parametrize("arch, quant, sizes, options", [
    ("qwen2", {}, {}, {}),  # float weights: the fp32 GEMV, its residual in the call
    ("llama", MIXED, {}, {}),  # Q8_0/Q4_0 blocks, float x
    ("qwen2", {"attn_": "Q8_0", "ffn_": "Q4_0"}, {}, {"int8_activations": True}),
    ("qwen2", K_QUANTS, {"hidden_size": 256, "intermediate_size": 512}, {"int8_activations": True}),  # Q4_K + Q6_K QKV
    ("qwen2", {}, {}, {"dtype": "bfloat16"}),  # bf16 weights and activations
], ids=["float", "blocks", "int8", "k-quants", "bf16"])
def test_a_chained_decode_step_gives_the_unchained_steps_bits(tmp_path: Path, chains_restored, arch: str,
                                                               quant: dict, sizes: dict, options: dict) -> None:
    path = write_model(make_model(arch, **sizes), arch, tmp_path / f"{arch}.gguf", quant)
    generator = _generator(path, **options)
    results = {}
    for chained in (True, False):
        cpu_chain.set_enabled(chained)
        results[chained] = generator.forced_logits(STEPS[:1], STEPS[1:]), _cache(generator)
    cpu_chain.set_enabled(True)
    # the chains hold the step: every dispatch but the host ops and the embedding
    kinds = [d.kernel for d in generator.decode_exec.program.dispatches]
    native = {"RMS_NORM", "QKV_PROJ", "ROPE_QK", "KV_UPDATE", "ATTENTION", "GEMM", "GATE_UP"}
    assert generator.decode_exec.chains.chained() == sum(k in native for k in kinds) > len(kinds) / 2
    np.testing.assert_array_equal(results[True][0], results[False][0])
    assert results[True][1].keys() == results[False][1].keys()
    for key, cache in results[True][1].items():
        np.testing.assert_array_equal(cache, results[False][1][key])


@pytest.mark.slow
@needs_native
def test_a_position_outside_the_cache_raises_the_kernels_own_error_through_a_chain(tmp_path: Path,
                                                                                   chains_restored) -> None:
    generator = _generator(write_model(make_model("qwen2"), "qwen2", tmp_path / "q.gguf", {"blk.": "Q8_0"}))
    generator.generate(PROMPT, 2)
    inputs = {"input_ids": np.array([[7]]), "cache_position": np.array([64])}  # the cache holds positions 0-63
    errors = {}
    for chained in (True, False):
        cpu_chain.set_enabled(chained)
        with pytest.raises(Exception) as caught:  # noqa: PT011 - the type is whatever the unchained kernel raises
            generator.decode_exec.run(inputs)
        errors[chained] = caught
    cpu_chain.set_enabled(True)
    assert generator.decode_exec.chains.chained() > 0
    assert errors[True].type is errors[False].type
    assert str(errors[True].value) == str(errors[False].value)
    assert "KV_UPDATE" in str(errors[True].value)


@pytest.mark.slow
def test_chains_off_make_every_dispatch_from_python(tmp_path: Path, chains_restored) -> None:
    generator = _generator(write_model(make_model("qwen2"), "qwen2", tmp_path / "q.gguf", {}))
    generator.generate(PROMPT, 1)
    cpu_chain.set_enabled(False)
    assert generator.decode_exec.chains.chained() == 0


# ------------------------------------------------------------------------------------------ the glue


@needs_native
def test_silu_mul_is_pytorchs_silu_then_mul_within_float_rounding() -> None:
    torch.manual_seed(0)
    gate = torch.cat([torch.randn(4000) * 6, torch.tensor([0.0, -0.0, 88.0, 88.8, -87.0, -87.5, -88.8, -100.0,
                                                           100.0, 1e-30, -1e-30, 20.0, -20.0])])
    up = torch.randn_like(gate)
    both = torch.cat([gate, up]).view(1, -1)
    out = torch.empty(gate.numel())
    assert cpu_decode_ops.silu_mul(both, out)
    want = F.silu(gate.double()) * up.double()  # the exact value, in float64 (x / (1 + exp(-x)) in float32 is 0
    torch.testing.assert_close(out.double(), want, rtol=4e-7, atol=1e-36)  # below x = -88.7, as PyTorch's)
    torch.testing.assert_close(out, F.silu(gate) * up, rtol=4e-7, atol=1e-38)


@needs_native
def test_silu_mul_keeps_pytorchs_infinities_and_nans() -> None:
    gate = torch.tensor([float("inf"), float("-inf"), float("nan"), 1.0, 2.0])
    up = torch.tensor([2.0, 2.0, 2.0, float("nan"), float("inf")])
    out = torch.empty(5)
    assert cpu_decode_ops.silu_mul(torch.cat([gate, up]).view(1, -1), out)
    torch.testing.assert_close(out, F.silu(gate) * up, equal_nan=True)


@needs_native
@pytest.mark.parametrize(("dtype", "ulp", "tiny"), [(torch.bfloat16, 2 ** -7, 0), (torch.float16, 2 ** -10, 2 ** -24)])
def test_silu_mul_in_half_rounds_where_pytorch_rounds(dtype: torch.dtype, ulp: float, tiny: float) -> None:
    """bf16 and fp16: silu rounded to the dtype, then the product rounded (PyTorch's two half ops); equal to them but
    where the exponentials' last fp32 bits put the silu on the other side of a midpoint (then one step; fp16's
    subnormal products one subnormal step)."""
    torch.manual_seed(3)
    gate, up = (torch.randn(4096) * 4).to(dtype), torch.randn(4096).to(dtype)
    out = torch.empty(4096, dtype=dtype)
    assert cpu_decode_ops.silu_mul(torch.cat([gate, up]).view(1, -1), out)
    want = F.silu(gate) * up
    assert (out == want).float().mean() > 0.99
    torch.testing.assert_close(out, want, rtol=ulp, atol=tiny)


@needs_native
def test_silu_mul_refuses_what_it_does_not_take() -> None:
    assert not cpu_decode_ops.silu_mul(torch.zeros(2, 8), torch.empty(2, 4))  # two rows: torch's code runs
    assert not cpu_decode_ops.silu_mul(torch.zeros(1, 8, dtype=torch.float64), torch.empty(4, dtype=torch.float64))
    assert not cpu_decode_ops.silu_mul(torch.zeros(1, 8), torch.empty(4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="overlaps"):
        both = torch.zeros(1, 8)
        cpu_decode_ops.silu_mul(both, both[0, 4:])


@needs_native
def test_the_add_and_copy_calls_are_exact() -> None:
    torch.manual_seed(1)
    y, a = torch.randn(3, 37), torch.randn(3, 37)
    want = y + a
    cpu_decode_ops.add_call(y, a)()
    assert torch.equal(y, want)
    src, dst = torch.randn(5, 11).to(torch.bfloat16), torch.empty(55, dtype=torch.bfloat16)
    cpu_decode_ops.copy_call(src, dst)()
    assert torch.equal(dst, src.reshape(-1))
    assert cpu_decode_ops.add_call(y, a.t().contiguous().t()) is None  # not contiguous: not a native call
    with pytest.raises(ValueError, match="overlaps"):
        cpu_decode_ops.add_call(y, y)


@needs_native
@pytest.mark.parametrize("dim, dtype", [(2, torch.float32), (-2, torch.bfloat16), (1, torch.float32)])
def test_the_cache_update_of_one_position_is_index_copy(dim: int, dtype: torch.dtype) -> None:
    torch.manual_seed(2)
    cache = torch.randn(2, 9, 9, 8).to(dtype)
    shape = list(cache.shape)
    shape[dim] = 1
    new, index = torch.randn(shape).to(dtype), torch.tensor([4])
    call = cpu_decode_ops.kv_update_call(cache, new, index, dim)
    want = cache.clone().index_copy_(dim, index, new)
    assert call() == 0
    assert torch.equal(cache, want)
    index[0] = 6  # read when the call runs, not when it was made
    assert call() == 0 and torch.equal(cache, want.index_copy_(dim, index, new))
    for outside in (9, -1, 1 << 40):
        index[0] = outside
        before = cache.clone()
        assert call() != 0  # refused, nothing written: the caller runs index_copy_, which raises
        assert torch.equal(cache, before)


@needs_native
def test_a_failed_call_stops_its_chain_there() -> None:
    cache, new, index = torch.zeros(1, 1, 4, 2), torch.ones(1, 1, 1, 2), torch.tensor([9])
    y, a = torch.zeros(3), torch.ones(3)
    calls = [cpu_decode_ops.add_call(y, a), cpu_decode_ops.kv_update_call(cache, new, index, 2),
             cpu_decode_ops.add_call(y, a)]
    table = cpu_chain._Chain(list(enumerate(calls))).table  # each call's function and block, as a chain lists them
    ns = torch.full((3,), -1, dtype=torch.int64)
    assert cpu_decode_ops.chain(table, 3, ns) == 1
    assert torch.equal(y, torch.ones(3))  # the first call made, the third not
    assert ns[0] >= 0 and ns[1] >= 0 and ns[2] == -1  # each call made timed, the one not made untouched
    index[0] = 3
    assert cpu_decode_ops.chain(table, 3) == -1
    assert torch.equal(y, torch.full((3,), 3.0)) and torch.equal(cache[0, 0, 3], torch.ones(2))
    with pytest.raises(ValueError, match="2 entries"):
        cpu_decode_ops.chain(table, 4)


@needs_native
@pytest.mark.parametrize("qtype, activations", [("q4_0", "int8"), ("q6_K", "int8"), ("q8_0", "float32")])
def test_a_gemvs_native_call_gives_the_calls_bits(qtype: str, activations: str) -> None:
    """What a chain makes of a GEMV (``native_call``, packed now, made later) is the GEMV the kernel's call makes."""
    from npu_runtime.backends import cpu_gemv, cpu_qgemv

    from .test_qgemv import random_blocks

    if cpu_qgemv._load() is None:
        pytest.skip("the quantized GEMV cannot be built here")
    k = 512
    gemv = cpu_qgemv.QGemv(torch.from_numpy(random_blocks(qtype, 300, k, seed=5)), qtype.upper(), torch.randn(300))
    x, out, want = torch.randn(1, k), torch.empty(1, 300), torch.empty(1, 300)
    gemv(x, out=want, threads=2, activations=activations)
    call = gemv.native_call(x, out, 2, activations)
    assert call is not None and call() == 0
    assert torch.equal(out, want)
    assert gemv.native_call(torch.randn(16, k), torch.empty(16, 300), 2, "float32") is None  # a prefill: tiles
    with pytest.raises(ValueError, match="overlaps"):
        gemv.native_call(x, gemv.bias.view(1, 300), 2, activations)
    dense = cpu_gemv.Gemv(torch.randn(300, k), torch.randn(300))
    residual, out, want = torch.randn(1, 300), torch.empty(1, 300), torch.empty(1, 300)
    dense(x, out=want, residual=residual, threads=1)
    call = dense.native_call(x, out, residual, 2)
    if call is not None:  # None: the GEMV kernel cannot be built here
        assert call() == 0 and torch.equal(out, want)


@pytest.mark.slow
@needs_native
def test_the_chain_profile_bench_times_every_dispatch(tmp_path: Path) -> None:
    """``bench/llm/chain_profile.py`` on a tiny GGUF file: every dispatch kind of the step in its table, each chained
    one timed (inside the C call), the contractions' bytes and rates, the floor."""
    path = write_model(make_model("qwen2"), "qwen2", tmp_path / "q.gguf", {"blk.": "Q8_0"})
    script = Path(__file__).resolve().parents[2] / "bench" / "llm" / "chain_profile.py"
    out = subprocess.run([sys.executable, str(script), str(path), "--int8-activations", "--position", "8", "--runs",
                          "3"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "22 of 31 dispatches chained" in out.stdout
    for kind in ("GEMM", "GATE_UP", "QKV_PROJ", "ATTENTION", "RMS_NORM", "ROPE_QK", "KV_UPDATE", "EMBEDDING",
                 "host ops (aten.*)"):
        assert f"| {kind} |" in out.stdout
    assert "floor" in out.stdout and "GB/s C stream read" in out.stdout
