"""An LLM's prefill as prompt-length buckets (dynamic shapes, item 2): a prompt of any length up to the largest
bucket runs in one call of the smallest bucket holding it, padded; longer prompts run as chunks of the largest.
Logits and greedy tokens are checked against eager transformers; old static LM directories still run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import npu_compiler
import torch_ir
from npu_compiler import CompileError
from npu_compiler.llm import LMPrograms, compile_lm
from npu_compiler.llm_prefill import PREFILL_ARENA_CAP, default_buckets
from npu_program.dynamic import DynamicProgram
from npu_program.program import CompiledProgram
from npu_runtime import Device, load_weights
from npu_runtime.generate import Generator
from torch_ir.frontends.hf import extract_lm
from torch_ir.ir import specialize
from torch_ir.weights import module_state

from ..webgpu.kernels import needs_gpu
from .checkpoints import tiny_config

pytest.importorskip("transformers")

#: A cache of 44 positions and buckets 8, 16, 32: a prompt of 40 tokens runs as 32 + 8 (padded rest), one of 42
#: as 32 + 16 shifted back (a 16-token bucket after 32 tokens would end past the cache).
CACHE = 44
BUCKETS = [8, 16, 32]
#: fp32 logits computed in another order than eager's (fused attention, blocked GEMMs): rounding only
ATOL = RTOL = 1e-4


def real_and_meta(arch: str = "qwen2"):
    from transformers import AutoModelForCausalLM

    config = tiny_config(arch)
    torch.manual_seed(0)
    real = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    with torch_ir.build_on_meta():
        meta = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    return real, meta


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def lm(request):
    real, meta = real_and_meta(request.param)
    ir = extract_lm(meta, CACHE)
    programs = compile_lm(ir, prefill_buckets=BUCKETS)
    device = Device()
    gen = Generator(programs.prefill, programs.decode, load_weights(module_state(real), programs.prefill, device),
                    device)
    return real, ir, programs, gen


def prompt_of(length: int, vocab: int = 300) -> list[int]:
    return torch.randint(4, vocab, (length,), generator=torch.Generator().manual_seed(length)).tolist()


def eager_logits(real, ids: list[int]) -> np.ndarray:
    """The model's logits at every position of ``ids``, run whole without a cache."""
    with torch.no_grad():
        return real(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()


def eager_generate(real, prompt: list[int], new: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = real.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                            eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def check_against_eager(real, gen: Generator, prompt: list[int], new: int = 3) -> None:
    """Each step's logits (the prompt's last position, then each decode step) equal eager's, and so do the
    greedy tokens."""
    result = gen.generate(prompt, new, keep_logits=True)
    full = eager_logits(real, prompt + result.tokens[:-1])
    for step, logits in enumerate(result.logits):
        np.testing.assert_allclose(logits, full[len(prompt) - 1 + step], rtol=RTOL, atol=ATOL)
    assert result.tokens == eager_generate(real, prompt, new)


def prefill_runs(gen: Generator) -> int:
    return sum(e.runs for e in gen.prefill_exec.executors.values())


# on a bucket edge, between edges, shorter than the smallest, one token, longer than the largest (padded rest and
# shifted-back rest)
@pytest.mark.slow
@pytest.mark.parametrize("length", [1, 2, 5, 8, 13, 16, 32, 40, 42])
def test_prompts_of_any_length_equal_eager(lm, length):
    real, _, _, gen = lm
    check_against_eager(real, gen, prompt_of(length))


@pytest.mark.parametrize("length", [2, 8, 9, 20, 32])
def test_a_prompt_up_to_the_largest_bucket_is_one_call_of_the_smallest_bucket_holding_it(lm, length):
    _, _, _, gen = lm
    before = prefill_runs(gen)
    result = gen.generate(prompt_of(length), 1)
    assert prefill_runs(gen) - before == 1 == result.prefill_runs
    assert gen.prefill_exec.last_variant.sizes == {"seq": min(b for b in BUCKETS if b >= length)}


def test_longer_prompts_run_as_chunks_of_the_largest_bucket(lm):
    _, _, _, gen = lm
    before = prefill_runs(gen)
    gen.generate(prompt_of(40), 1)  # 32, then the 8 left in the 8-token bucket
    assert prefill_runs(gen) - before == 2 and gen.prefill_exec.last_variant.sizes == {"seq": 8}


def test_forced_logits_with_a_padded_prompt(lm):
    """Teacher forcing reads the prompt's last position after a padded prefill, then decode steps."""
    real, _, _, gen = lm
    prompt, forced = prompt_of(11), prompt_of(4)
    rows = gen.forced_logits(prompt, forced)
    np.testing.assert_allclose(rows, eager_logits(real, prompt + forced)[len(prompt) - 1:], rtol=RTOL, atol=ATOL)


def test_one_weight_table_and_state_layout_for_every_program(lm):
    real, _, programs, _ = lm
    assert isinstance(programs.prefill, DynamicProgram) and programs.prefill_buckets == BUCKETS
    assert programs.chunk == 8 and programs.prefill_program(9).input_specs[0].shape == [1, 16]
    assert programs.prefill_program(100).input_specs[0].shape == [1, 32]  # the largest: longer prompts are chunked
    for program in programs.programs():
        assert program.weight_specs == programs.decode.weight_specs
        assert [s.key for s in program.state_specs] == [s.key for s in programs.decode.state_specs]
    # the logits of one row only, at any bucket: the vocabulary projection is not done for every prompt token
    assert all(p.output_specs[0].shape == [1, 1, real.config.vocab_size] for p in programs.programs())


def test_the_directory_round_trips(lm, tmp_path):
    real, _, programs, gen = lm
    programs.save(tmp_path)
    assert json.loads((tmp_path / "lm.json").read_text())["prefill_buckets"] == BUCKETS
    loaded = LMPrograms.load(tmp_path)
    assert isinstance(loaded.prefill, DynamicProgram) and loaded.prefill_buckets == BUCKETS
    assert (loaded.chunk, loaded.max_cache_len, loaded.num_layers) == (8, CACHE, programs.num_layers)
    device = Device()
    again = Generator(loaded.prefill, loaded.decode, load_weights(module_state(real), loaded.prefill, device), device)
    assert again.padding == gen.padding == "first"  # the row selection travels in the file
    prompt = prompt_of(13)
    assert again.generate(prompt, 6).tokens == gen.generate(prompt, 6).tokens


def test_an_old_static_directory_loads_and_runs_as_before(lm, tmp_path):
    """A directory written before buckets: a static prefill of ``chunk`` tokens computing its last row's logits
    only, and lm.json without buckets."""
    real, ir, _, _ = lm
    prefill = npu_compiler.compile(specialize(ir, {"seq": 8}))
    decode = npu_compiler.compile(specialize(ir, {"seq": 1}))
    for program, tokens in ((prefill, 8), (decode, 1)):
        program.metadata["llm"] = {"phase": "prefill" if tokens > 1 else "decode", "tokens": tokens,
                                   "max_cache_len": CACHE, "kv_bits": None}
    prefill.save(tmp_path / "prefill.npubin")
    decode.save(tmp_path / "decode.npubin")
    (tmp_path / "lm.json").write_text(json.dumps({"chunk": 8, "max_cache_len": CACHE, "num_layers": 2}))
    loaded = LMPrograms.load(tmp_path)
    assert isinstance(loaded.prefill, CompiledProgram) and loaded.prefill_buckets == [8] and loaded.chunk == 8
    device = Device()
    gen = Generator(loaded.prefill, loaded.decode, load_weights(module_state(real), loaded.prefill, device), device)
    assert gen.padding is None  # only its last row's logits: never padded at the end
    for length in (1, 5, 8, 13, 20):
        check_against_eager(real, gen, prompt_of(length))


@pytest.mark.slow
def test_a_model_computing_every_rows_logits_reads_the_last_real_row():
    """The zoo's ``llama_kv`` (no ``logits_to_keep``): padded positions continue, row n-1 is read."""
    from torch.export import Dim

    from npu_tools.zoo import build_pair

    meta, real = build_pair("llama_kv")
    seq = Dim("seq", min=1, max=16)
    ir = torch_ir.extract_ir(meta, (), example_kwargs={"input_ids": torch.ones(1, 6, dtype=torch.long),
                                                        "cache_position": torch.arange(6)},
                             dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}})
    programs = compile_lm(ir, prefill_buckets=[4, 8])
    device = Device()
    gen = Generator(programs.prefill, programs.decode, load_weights(module_state(real), programs.prefill, device),
                    device)
    assert gen.padding == "continue"
    for length in (3, 6, 11):
        prompt = prompt_of(length, vocab=128)
        result = gen.generate(prompt, 2, keep_logits=True)
        full = eager_logits(real.model, prompt + result.tokens[:-1])
        for step, logits in enumerate(result.logits):
            np.testing.assert_allclose(logits, full[length - 1 + step], rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_default_buckets_double_the_chunk_up_to_the_cache():
    assert default_buckets(16, 256) == [16, 32, 64, 128, 256]
    assert default_buckets(16, 100) == [16, 32, 64]
    _, meta = real_and_meta()
    programs = compile_lm(extract_lm(meta, 64), chunk=8)
    assert programs.prefill_buckets == [8, 16, 32, 64]
    assert max(p.arena_bytes for p in programs.programs()) <= PREFILL_ARENA_CAP


@pytest.mark.slow
def test_buckets_outside_the_cache_are_refused():
    _, meta = real_and_meta()
    ir = extract_lm(meta, 32)
    with pytest.raises(CompileError, match=r"prefill bucket 64 must be between 1 and the cache length 32"):
        compile_lm(ir, prefill_buckets=[8, 64])
    with pytest.raises(CompileError, match=r"prefill bucket 0"):
        compile_lm(ir, prefill_buckets=[0])


@pytest.mark.slow
@needs_gpu
def test_webgpu_prompts_in_one_padded_call_equal_eager():
    real, meta = real_and_meta()
    programs = compile_lm(extract_lm(meta, 32), prefill_buckets=[8, 16], target="webgpu")
    device = Device("webgpu")
    gen = Generator(programs.prefill, programs.decode, load_weights(module_state(real), programs.prefill, device),
                    device)
    for length in (5, 16, 21):  # padded, on an edge, longer than the largest bucket
        prompt = prompt_of(length)
        assert gen.generate(prompt, 4).tokens == eager_generate(real, prompt, 4)


@pytest.mark.slow
def test_cli_compiles_the_buckets_asked_for_and_costs_the_directory(tmp_path, capsys):
    from npu_tools.cli import main

    ir = tmp_path / "llama_kv.json"
    assert main(["extract", "llama_kv", "-o", str(ir)]) == 0
    out = tmp_path / "llama_lm"
    assert main(["compile", str(ir), "-o", str(out), "--prefill-buckets", "4,8,16"]) == 0
    printed = capsys.readouterr().out
    assert "prefill buckets 4,8,16" in printed and "seq=16" in printed
    assert LMPrograms.load(out).prefill_buckets == [4, 8, 16]
    assert main(["cost", str(out), "--hw", "edge_4tops"]) == 0
    assert "prefill: 4 tokens a run" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["16,x", "16,,32", "0"])
def test_cli_refuses_bad_prefill_buckets(tmp_path, capsys, flag):
    from npu_tools.cli import main

    ir = tmp_path / "llama_kv.json"
    assert main(["extract", "llama_kv", "-o", str(ir)]) == 0
    assert main(["compile", str(ir), "-o", str(tmp_path / "lm"), f"--prefill-buckets={flag}"]) != 0
    assert "--prefill-buckets" in capsys.readouterr().err
    assert not (tmp_path / "lm").exists()


def test_a_row_selection_claim_is_read_defensively():
    """A program file's metadata is untrusted: the claim that its logits are the selected prompt row counts only for
    one-row logits, and metadata of the wrong type is ignored rather than raising."""
    from npu_program.lm import ROW_AT_LARGEST_POSITION, selects_prompt_row
    from npu_program.program import TensorSpec

    class _Program:  # the two fields selects_prompt_row reads
        def __init__(self, logits_shape, metadata):
            self.output_specs, self.metadata = [TensorSpec("logits", logits_shape, "float32")], metadata
            self.input_specs = [TensorSpec("input_ids", [1, 8], "int64")]

    claim = {"llm": {"logits_row": ROW_AT_LARGEST_POSITION}}
    assert selects_prompt_row(_Program([1, 1, 32], claim))
    assert not selects_prompt_row(_Program([1, 8, 32], claim))  # every row's logits: the claim is false
    assert not selects_prompt_row(_Program([1, 1, 32], {"llm": ["logits_row"]}))
    assert not selects_prompt_row(_Program([1, 1, 32], {}))
