"""LLM prefill and decode with a KV cache, compiled and run (issue 14): greedy tokens equal transformers'
``generate``, prompts of any length up to the cache, the cache as state shared by both programs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch_ir
from npu_compiler import CompileError
from npu_compiler.llm import compile_lm
from npu_runtime import Device, RuntimeInputError, load_weights
from npu_runtime.generate import Generator, pick
from torch_ir.frontends.hf import extract_lm
from torch_ir.weights import module_state

from .checkpoints import tiny_config

pytest.importorskip("transformers")

CACHE = 160
CHUNK = 16
NEW_TOKENS = 32


def build(arch: str, dtype: torch.dtype = torch.float32, **overrides):
    """(real model, generator) for a tiny config of ``arch``, the programs compiled from a meta-device copy."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(arch, **overrides)
    torch.manual_seed(0)
    real = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).eval()
    with torch_ir.build_on_meta():  # keeps the rotary inv_freq's values: the program embeds them
        meta = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype).eval()
    programs = compile_lm(extract_lm(meta, CACHE), chunk=CHUNK)
    device = Device()
    return real, programs, Generator(programs.prefill, programs.decode,
                                     load_weights(module_state(real), programs.prefill, device), device)


@pytest.fixture(scope="module", params=["qwen2", "llama", "mistral"])
def fp32(request):
    return build(request.param)


def prompt_of(length: int, vocab: int = 300) -> list[int]:
    return torch.randint(4, vocab, (length,), generator=torch.Generator().manual_seed(length)).tolist()


def hf_generate(real, prompt: list[int], new: int = NEW_TOKENS) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = real.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                            eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("length", [1, 7, 16, 100])
def test_greedy_tokens_equal_transformers(fp32, length):
    real, _, gen = fp32
    prompt = prompt_of(length)
    assert gen.generate(prompt, NEW_TOKENS).tokens == hf_generate(real, prompt)


def test_prefill_and_decode_logits_match_the_model(fp32):
    """Logits of every step (prefill's last position, then each decode step) against the model run on the
    whole sequence without a cache."""
    real, _, gen = fp32
    prompt = prompt_of(23)  # one whole chunk, then a last chunk overlapping it
    result = gen.generate(prompt, 5, keep_logits=True)
    with torch.no_grad():
        full = real(torch.tensor([prompt + result.tokens[:-1]]), use_cache=False).logits[0]
    for step, logits in enumerate(result.logits):
        np.testing.assert_allclose(logits, full[len(prompt) - 1 + step].numpy(), rtol=1e-4, atol=1e-4)


def test_forced_logits_score_given_tokens_as_the_model_does(fp32):
    """Teacher forcing (another runner's tokens, e.g. llama.cpp's, scored by ours): the logits after the prompt
    and after each forced token, against the model on the whole sequence; then the cache is reusable."""
    real, _, gen = fp32
    prompt, forced = prompt_of(9), prompt_of(6)
    rows = gen.forced_logits(prompt, forced)
    with torch.no_grad():
        full = real(torch.tensor([prompt + forced]), use_cache=False).logits[0]
    assert rows.shape == (len(forced) + 1, full.shape[-1])
    np.testing.assert_allclose(rows, full[len(prompt) - 1:].numpy(), rtol=1e-4, atol=1e-4)
    assert gen.generate(prompt, 3).tokens == hf_generate(real, prompt, 3)
    with pytest.raises(RuntimeInputError, match="outside the vocabulary"):
        gen.forced_logits(prompt, [10 ** 9])


def test_programs_share_the_cache_as_state_written_in_place(fp32):
    _, programs, gen = fp32
    prefill, decode = programs.prefill, programs.decode
    assert [s.key for s in prefill.state_specs] == [s.key for s in decode.state_specs]
    assert len(prefill.state_specs) == 2 * programs.num_layers
    assert not {s.name for s in decode.state_specs} & {w.name for w in decode.weight_specs}
    updates = [d for d in decode.dispatches if d.kernel == "KV_UPDATE"]
    assert len(updates) == 2 * programs.num_layers
    assert all(d.inputs[0] == d.outputs[0] and d.outputs[0] in {s.name for s in decode.state_specs} for d in updates)
    assert gen.prefill_exec.state is gen.decode_exec.state
    # the cache is not in the arena: the decode arena is far smaller than the cache
    assert decode.memory.arena_bytes < decode.state_bytes


def test_a_saved_program_pair_runs_the_same(fp32, tmp_path):
    from npu_program.npubin_dynamic import load_program  # prefill.npubin holds every prompt-length bucket (format 3)

    real, programs, gen = fp32
    programs.save(tmp_path)
    prefill, decode = (load_program(tmp_path / f"{p}.npubin") for p in ("prefill", "decode"))
    device = Device()
    loaded = Generator(prefill, decode, load_weights(module_state(real), prefill, device), device)
    prompt = prompt_of(9)
    assert loaded.generate(prompt, 8).tokens == gen.generate(prompt, 8).tokens


def test_sampling_is_reproducible_and_top_k_one_is_greedy(fp32):
    _, _, gen = fp32
    prompt = prompt_of(5)
    a = gen.generate(prompt, 12, temperature=0.9, top_k=20, seed=3).tokens
    b = gen.generate(prompt, 12, temperature=0.9, top_k=20, seed=3).tokens
    assert a == b
    assert gen.generate(prompt, 12, temperature=1.0, top_k=1, seed=1).tokens == gen.generate(prompt, 12).tokens


def test_pick_samples_only_among_the_top_k():
    logits = np.array([0.0, 5.0, 4.9, -3.0, 4.8])
    rng = np.random.default_rng(0)
    seen = {pick(logits, 1.0, 3, rng) for _ in range(200)}
    assert seen == {1, 2, 4}


def test_nan_logits_are_refused_not_read_as_token_0():
    """np.argmax of NaN logits is 0: a model with a NaN rms_norm_eps used to generate token 0 for ever."""
    logits = np.full(8, np.nan, np.float32)
    for temperature in (0.0, 0.7):
        with pytest.raises(RuntimeInputError, match="NaN"):
            pick(logits, temperature, None, np.random.default_rng(0))
    finite = np.array([0.0, -np.inf, 3.0], np.float32)  # -inf is a masked token, not an error
    assert pick(finite, 0.0, None, np.random.default_rng(0)) == 2


def test_streaming_and_end_of_sequence(fp32):
    _, _, gen = fp32
    prompt = prompt_of(4)
    greedy = gen.generate(prompt, 10).tokens
    streamed: list[int] = []
    result = gen.generate(prompt, 10, eos_token_ids={greedy[3]}, on_token=streamed.append)
    assert result.stopped_by_eos and result.tokens == greedy[:greedy.index(greedy[3]) + 1] == streamed
    assert "ms/token" in result.summary()


def test_bad_requests_are_refused_with_the_fix(fp32):
    _, _, gen = fp32
    with pytest.raises(RuntimeInputError, match=r"needs a KV cache of 170 positions.*compiled with 160.*"
                                                r"--max-cache-len"):
        gen.generate(prompt_of(150), 21)
    with pytest.raises(RuntimeInputError, match=r"outside the vocabulary \[0, 320\).*tokenizer does not match"):
        gen.generate([5, 400], 3)
    with pytest.raises(RuntimeInputError, match="prompt is empty"):
        gen.generate([], 3)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_weights_half_the_bytes_and_logits_within_tolerance(dtype):
    """bf16 and fp16 end to end: the weights in the model's dtype, the logits of each step within that dtype's
    tolerance of the model run in it (bench/llm reports the first step whose token differs, if any)."""
    real, programs, gen = build("qwen2", dtype)
    fp32_bytes = sum(p.numel() * 4 for p in real.parameters())
    assert programs.decode.weight_bytes <= fp32_bytes // 2 + 1024
    name = str(dtype).removeprefix("torch.")
    assert {w.dtype for w in programs.decode.weight_specs} == {name}  # inv_freq (fp32) is embedded
    prompt = prompt_of(11)
    result = gen.generate(prompt, 16, keep_logits=True)
    with torch.no_grad():
        full = real(torch.tensor([prompt + result.tokens[:-1]]), use_cache=False).logits[0].float()
    errors = [float(np.abs(logits - full[len(prompt) - 1 + i].numpy()).max()) for i, logits in enumerate(result.logits)]
    scale = float(full.abs().max())
    assert max(errors) <= 0.05 * scale, errors  # bf16 keeps 8 bits of mantissa: ~1 % per op, a few ops deep


def test_compile_refuses_a_buffer_written_by_anything_but_a_cache_update():
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("steps", torch.zeros(1))

        def forward(self, x):
            self.steps.add_(1)
            return x * 2

    from npu_compiler import compile as compile_ir

    with torch.device("meta"):
        model = Counter()
    ir = torch_ir.extract_ir(model, (torch.randn(2, 3),))
    with pytest.raises(CompileError, match=r"writes buffer .*steps.* through aten.add.Tensor.*programs carry state "
                                           r"only as a KV cache written in place by KV_UPDATE"):
        compile_ir(ir)


def test_compile_lm_refuses_a_model_that_is_not_an_llm():
    ir = torch_ir.extract_ir(torch.nn.Linear(4, 4, device="meta"), (torch.randn(2, 4),))
    with pytest.raises(CompileError, match=r"an LLM program takes \['input_ids', 'cache_position'\].*extract_lm"):
        compile_lm(ir)
