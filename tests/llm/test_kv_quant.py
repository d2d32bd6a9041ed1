"""An int8 KV cache (issue 29, item 4): ``compile_lm(..., kv_bits=8)`` holds each cache as int8 codes with one float32
scale per head and position. The codes and scales equal ``torch_ir.quant.numerics`` bit for bit; generation stays
close to the float cache's (KLD of the next-token distributions); the reference executor runs the same IR; the cost
model counts the cache's bytes as held; the command line refuses another width."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from npu_compiler import CompileError
from npu_compiler.costmodel import cost_lm, load_hardware
from npu_compiler.kvcache import quantize_kv_cache
from npu_compiler.llm import compile_lm, sequence_symbol
from npu_compiler.passes import normalize
from npu_program.program import Dispatch, TensorSpec
from npu_runtime import Device, load_weights
from npu_runtime.backends.cpu_kvcache import KvqUpdate
from npu_runtime.generate import Generator
from torch_ir import IRExecutor
from torch_ir.frontends.hf import extract_lm
from torch_ir.ir import specialize
from torch_ir.quant import numerics as qn
from torch_ir.weights import module_state

pytest.importorskip("transformers")

CACHE, CHUNK, STEPS = 64, 8, 32
PROMPT = [5, 17, 42, 7, 9, 11, 3, 60, 2, 33]


def expected_rows(x: torch.Tensor, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Each vector along the last dim on its own, through numerics' per-tensor path: scale = float32 max|x| over
    the code type's largest value, codes = numerics.quantize(x, scale); an all-zero vector: codes 0, scale 0."""
    qmax = {"int8": 127.0, "float8_e4m3fn": 448.0}[dtype]
    rows = x.reshape(-1, x.shape[-1]).float()
    codes, scales = [], []
    for r in rows:
        s = r.abs().max() / torch.tensor(qmax, dtype=torch.float32)
        codes.append(qn.quantize(r, s if s > 0 else torch.tensor(1.0), None, dtype=dtype))
        scales.append(s)
    return torch.stack(codes).reshape(x.shape), torch.stack(scales).reshape(x.shape[:-1])


@pytest.mark.parametrize(("code", "dtype"), [("int8", torch.float32), ("int8", torch.bfloat16),
                                             ("float8_e4m3fn", torch.float32)])
def test_the_kernel_writes_numerics_codes_and_scales_bit_for_bit(code, dtype):
    gen = torch.Generator().manual_seed(0)
    new = (torch.randn(1, 2, 3, 16, generator=gen) * torch.tensor([0.01, 30.0]).view(1, 2, 1, 1)).to(dtype)
    new[0, 1, 2] = 0  # an all-zero vector
    new[0, 0, 0, 5] = -new[0, 0, 0].abs().max() * 1.5  # the extreme negative: code -127 (int8)
    codes = torch.zeros(1, 2, 8, 16, dtype=qn.storage_dtype(code))
    scales = torch.zeros(1, 2, 8)
    pos = torch.tensor([6, 1, 3])
    specs = {"c": TensorSpec("c", [1, 2, 8, 16], code), "s": TensorSpec("s", [1, 2, 8], "float32"),
             "n": TensorSpec("n", [1, 2, 3, 16], str(dtype).removeprefix("torch.")), "p": TensorSpec("p", [3], "int64")}
    d = Dispatch("KVQ_UPDATE", "w", ["c", "s", "n", "p"], ["c", "s"], {"dim": 2})
    assert KvqUpdate.accepts(d, specs, set())
    KvqUpdate(d, specs).run([codes, scales, new, pos], [codes, scales])
    want_codes, want_scales = expected_rows(new, code)
    assert torch.equal(codes[:, :, pos].view(torch.uint8), want_codes.view(torch.uint8))
    assert torch.equal(scales[:, :, pos], want_scales)
    untouched = [i for i in range(8) if i not in pos.tolist()]
    assert not codes[:, :, untouched].view(torch.uint8).any() and not scales[:, :, untouched].any()
    if code == "int8":  # symmetric: the largest magnitude of each nonzero vector is code ±127, no -128
        peak = codes[:, :, pos].abs().amax(-1)
        assert set(peak.flatten().tolist()) == {0, 127} and codes.min() >= -127
    # every element within half a step of its value (round to nearest): int8's step is the scale; e4m3's is 2**-3
    # of the value (3 mantissa bits), 2**-9 of the scale among the subnormals
    x, scale = new.float(), scales[:, :, pos, None]
    back = codes[:, :, pos].float() * scale
    half = scale / 2 if code == "int8" else x.abs() * 2.0 ** -4 + scale * 2.0 ** -10
    assert bool(((back - x).abs() <= half * (1 + 1e-6)).all())


@pytest.fixture(scope="module")
def zoo_qwen2():
    """The zoo's qwen2 (seeded random weights), its weights and biases but the norms' scaled by 10: at the zoo's
    init (std 0.02) the next-token distributions are nearly uniform (entropy 4.84 of ln 128 = 4.85), so any cache
    error vanishes in them; scaled, they are peaked (entropy about 3.7) and a cache error shows in the KLD."""
    from npu_tools.lm_source import _zoo_lm

    meta, real = _zoo_lm("qwen2")
    ir = extract_lm(meta, CACHE, name="qwen2")
    weights = {k: v * 10 if k.endswith((".weight", ".bias")) and "norm" not in k else v  # not rotary inv_freq
               for k, v in module_state(real).items()}
    return ir, weights


def generator(ir, weights, kv_bits):
    programs = compile_lm(ir, chunk=CHUNK, kv_bits=kv_bits)
    device = Device()
    return programs, Generator(programs.prefill, programs.decode, load_weights(weights, programs.prefill, device),
                               device)


def log_softmax(logits: np.ndarray) -> torch.Tensor:
    return torch.log_softmax(torch.as_tensor(logits, dtype=torch.float64), -1)


@pytest.mark.slow
def test_int8_cache_generation_stays_close_to_the_float_cache(zoo_qwen2):
    """32 steps teacher-forced on the float cache's greedy tokens (so both see the same context): the KLD of each
    step's next-token distribution, int8 cache against float cache. Measured: mean 2.5e-4, max 1.2e-3, every
    top-1 equal. The bound, mean < 1e-2 (the issue's), is 40x that: an int8 code is within 1/254 of its vector's
    largest magnitude, so the scores move by about 0.4 % of |q|·|k|; a broken scale (a factor off) or a code off
    by one bit pattern moves whole distributions (KLD of order 0.1 to 1)."""
    ir, weights = zoo_qwen2
    _, floating = generator(ir, weights, None)
    _, quantized = generator(ir, weights, 8)
    ref = floating.generate(PROMPT, STEPS, keep_logits=True)
    klds, same = [], 0
    for i in range(STEPS):
        step = quantized.generate(PROMPT + ref.tokens[:i], 1, keep_logits=True)
        p, q = log_softmax(ref.logits[i]), log_softmax(step.logits[0])
        klds.append(float((p.exp() * (p - q)).sum()))
        same += step.tokens[0] == ref.tokens[i]
    assert 0 < np.mean(klds) < 1e-2, klds  # above 0: the cache really is quantized
    assert same >= STEPS - 2, f"top-1 equal in {same} of {STEPS} steps"
    free = quantized.generate(PROMPT, STEPS).tokens  # free-running greedy: the same tokens, mostly
    assert sum(a == b for a, b in zip(free, ref.tokens)) >= STEPS * 3 // 4


def test_reference_executor_runs_the_same_quantized_ir(zoo_qwen2):
    """The decode phase's rewritten IR run by IRExecutor (the ops' references: numerics' dequantize, ATTENTION's
    reference) against the compiled decode program on the CPU backend, step by step from an empty cache. fp32
    throughout; the kernel folds the scales into the scores, the reference into the cache, so the logits agree
    to float32 rounding (1e-4 of logits of order 10)."""
    ir, weights = zoo_qwen2
    programs, gen = generator(ir, weights, 8)
    decode_ir = quantize_kv_cache(normalize(specialize(ir, {sequence_symbol(ir): 1})), 8)
    state = dict(weights)
    for w in decode_ir.weights:
        key = decode_ir.weight_name_mapping.get(w.name, w.name)
        if key.endswith((".codes", ".scales")):
            state[key] = torch.zeros(w.shape, dtype=qn.storage_dtype(w.dtype))
    reference = IRExecutor(decode_ir, state)
    result = gen.generate(PROMPT[:1], 6, keep_logits=True)
    tokens = [PROMPT[0], *result.tokens[:-1]]
    for position, (token, logits) in enumerate(zip(tokens, result.logits)):
        (want,) = reference.run({"input_ids": torch.tensor([[token]]), "cache_position": torch.tensor([position])})
        np.testing.assert_allclose(logits, want.reshape(-1).numpy(), rtol=1e-4, atol=1e-4)
    assert {d.kernel for d in programs.decode.dispatches} >= {"KVQ_UPDATE", "KVQ_ATTENTION"}
    assert "KVQ_DEQUANTIZE" not in {d.kernel for d in programs.decode.dispatches}  # the fused path reads codes
    assert programs.num_layers == 2


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cost_model_counts_the_cache_as_held(zoo_qwen2, dtype):
    """int8 codes (1 byte) plus a float32 scale per head and position (4 bytes per D = 16 codes here): a quarter of
    the fp32 cache plus the scales, half of the bf16 one plus the scales. Exact bytes from the shapes."""
    from npu_tools.lm_source import _zoo_lm

    ir = zoo_qwen2[0] if dtype == torch.float32 else extract_lm(_zoo_lm("qwen2")[0].to(dtype), CACHE, name="qwen2")
    hw = load_hardware("edge_4tops")
    caches, heads, dim = 4, 2, 16  # k and v of 2 layers; Hkv 2, D 16
    per_cache = heads * CACHE * dim
    full = compile_lm(ir, chunk=CHUNK)
    quant = compile_lm(ir, chunk=CHUNK, kv_bits=8)
    float_cost, int8_cost = cost_lm(full.prefill, full.decode, hw), cost_lm(quant.prefill, quant.decode, hw)
    width = torch.empty((), dtype=dtype).element_size()
    assert float_cost.kv_cache_bytes == caches * per_cache * width
    assert int8_cost.kv_cache_bytes == caches * (per_cache + heads * CACHE * 4)
    assert int8_cost.decode.cache_dtypes == "int8 + float32"
    assert f"KV cache: {int8_cost.kv_cache_bytes:,} bytes (int8 + float32)" in int8_cost.summary()
    # the decode step's attention reads the codes and scales: fewer DRAM bytes than over the float cache
    reads = {name: sum(r.dram_bytes for r in cost.decode.rows if "ATTENTION" in r.kernel)
             for name, cost in (("float", float_cost), ("int8", int8_cost))}
    assert reads["int8"] < reads["float"]


def test_unsupported_widths_are_refused_with_the_fix(zoo_qwen2, capsys):
    ir, _ = zoo_qwen2
    with pytest.raises(CompileError, match=r"kv_bits=4: a KV cache is quantized to 8 bits"):
        compile_lm(ir, chunk=CHUNK, kv_bits=4)
    from npu_tools.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["generate", "qwen2", "--prompt-ids", "1,2", "--kv-bits", "4"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--kv-bits" in err and "quantized to 8 bits only" in err and "leave --kv-bits out" in err


@pytest.mark.slow
def test_generate_command_with_an_int8_cache(capsys):
    from npu_tools.cli import main

    assert main(["generate", "qwen2", "--prompt-ids", "5,17,42", "--max-new-tokens", "4", "--kv-bits", "8",
                 "--max-cache-len", "32", "--chunk", "4"]) == 0
    out = capsys.readouterr().out
    assert "new ids: " in out and len(out.split("new ids: ")[1].strip().split(",")) == 4


def test_webgpu_without_the_kernels_refuses_at_compile_time(zoo_qwen2):
    """A target with no KVQ kernels names them at compile time (strict), never runs a float kernel on codes."""
    from npu_compiler.library import get_target

    ir, _ = zoo_qwen2
    with pytest.raises(CompileError, match=r"KVQ_UPDATE"):
        compile_lm(ir, chunk=CHUNK, kv_bits=8, target=get_target("webgpu"))


def test_webgpu_runs_the_int8_cache_on_the_host_with_fallback(zoo_qwen2):
    """``fallback="cpu"``: the KVQ dispatches run on the host inside the WebGPU program, the same tokens as the CPU
    backend's (the rest of the program in WGSL, fp32)."""
    from npu_runtime.backends.webgpu import adapter_problem

    if adapter_problem():
        pytest.skip(f"no WebGPU adapter: {adapter_problem()}")
    ir, weights = zoo_qwen2
    on_gpu = compile_lm(ir, chunk=CHUNK, kv_bits=8, target="webgpu", fallback="cpu")
    assert {d.kernel for d in on_gpu.decode.dispatches if d.host} >= {"KVQ_UPDATE", "KVQ_ATTENTION"}
    _, cpu = generator(ir, weights, 8)
    device = Device("webgpu")
    gpu = Generator(on_gpu.prefill, on_gpu.decode, load_weights(weights, on_gpu.prefill, device), device)
    assert gpu.generate(PROMPT, 6).tokens == cpu.generate(PROMPT, 6).tokens


def test_unfused_attention_reads_the_dequantized_cache(zoo_qwen2):
    """Without the attention fusion, ATTN_SCORE and ATTN_OUTPUT read the cache through KVQ_DEQUANTIZE (codes ·
    scales, the float cache rebuilt): the same logits as KVQ_ATTENTION's to float32 rounding."""
    from npu_compiler.llm import unfused_options

    ir, weights = zoo_qwen2
    programs, fused = generator(ir, weights, 8)
    unfused_programs = compile_lm(ir, chunk=CHUNK, kv_bits=8, options=unfused_options())
    kernels = {d.kernel for d in unfused_programs.decode.dispatches}
    assert {"KVQ_UPDATE", "KVQ_DEQUANTIZE", "ATTN_SCORE", "ATTN_OUTPUT"} <= kernels and "KVQ_ATTENTION" not in kernels
    device = Device()
    unfused = Generator(unfused_programs.prefill, unfused_programs.decode,
                        load_weights(weights, unfused_programs.prefill, device), device)
    a, b = fused.generate(PROMPT, 6, keep_logits=True), unfused.generate(PROMPT, 6, keep_logits=True)
    assert a.tokens == b.tokens
    np.testing.assert_allclose(np.stack(a.logits), np.stack(b.logits), rtol=1e-4, atol=1e-4)


def test_a_saved_int8_program_pair_runs_the_same(zoo_qwen2, tmp_path):
    """The .npubin files carry the int8 and float32 state slots and the KVQ dispatches as any others."""
    from npu_program.npubin_dynamic import load_program  # prefill.npubin holds every prompt-length bucket (format 3)

    ir, weights = zoo_qwen2
    programs, gen = generator(ir, weights, 8)
    programs.save(tmp_path)
    prefill, decode = (load_program(tmp_path / f"{phase}.npubin") for phase in ("prefill", "decode"))
    assert decode.metadata["llm"]["kv_bits"] == 8
    assert sorted({s.dtype for s in decode.state_specs}) == ["float32", "int8"]
    device = Device()
    loaded = Generator(prefill, decode, load_weights(weights, prefill, device), device)
    assert loaded.generate(PROMPT, 6).tokens == gen.generate(PROMPT, 6).tokens


@pytest.mark.slow
def test_compile_and_cost_commands_take_kv_bits(tmp_path, capsys):
    """``--kv-bits 8`` means the same in compile and cost as in generate: the programs hold an int8 cache."""
    from npu_program.program import CompiledProgram
    from npu_tools.cli import main

    out = tmp_path / "lm"
    assert main(["compile", "llama_kv", "--kv-bits", "8", "-o", str(out)]) == 0
    decode = CompiledProgram.load(out / "decode.npubin")
    assert decode.metadata["llm"]["kv_bits"] == 8 and "KVQ_ATTENTION" in decode.kernel_histogram()
    capsys.readouterr()
    assert main(["cost", "llama_kv", "--hw", "edge_4tops", "--kv-bits", "8"]) == 0
    assert "(int8 + float32)" in capsys.readouterr().out  # the cache's bytes, codes and scales
    assert main(["cost", str(out / "decode.npubin"), "--hw", "edge_4tops", "--kv-bits", "8"]) == 2
    assert "is compiled already" in capsys.readouterr().err
    assert main(["compile", "mlp", "--kv-bits", "8", "-o", str(tmp_path / "mlp.npubin")]) == 2
    assert "has no KV cache" in capsys.readouterr().err
