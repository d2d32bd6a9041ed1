"""``load_lm`` / ``torch-ir generate`` on a GGUF file: tiny seeded Llama and Qwen2 checkpoints written as llama.cpp
writes them (F32, and Q8_0/Q4_0/Q5_0/k-quant layers), compiled into prefill and decode programs; their greedy tokens
equal transformers' on the same weights (the file's, dequantized by the gguf package's rules)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from npu_runtime import Device, load_weights
from npu_runtime.generate import Generator
from npu_tools.cli import main
from npu_tools.lm_source import load_lm
from torch_ir.frontends.gguf import hf_name, hf_state_dict, read_gguf, spec_block

from ..webgpu.kernels import needs_gpu
from .test_config import make_model, write_model

PROMPT = [5, 17, 33, 2, 9, 71]


def _hf_greedy(model, prompt: list[int], new: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


MIXED = {"token_embd": "Q8_0", "attn_q": "Q4_0", "attn_k": "Q8_0", "attn_v": "Q4_0", "attn_output": "Q8_0",
         "ffn_gate": "Q8_0", "ffn_up": "Q4_0", "ffn_down": "Q4_0"}


#: A Q4_K_M-like file: k-quants where rows are whole 256-weight super-blocks (hidden 256), Q6_K for V and down.
K_QUANTS = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K", "ffn_gate": "Q4_K",
            "ffn_up": "Q4_K", "ffn_down": "Q6_K"}


@pytest.mark.slow
@pytest.mark.parametrize("arch, quant, sizes", [("qwen2", {}, {}), ("llama", {}, {}),
                                                ("qwen2", {"attn_": "Q8_0", "ffn_": "Q4_0"}, {}), ("llama", MIXED, {}),
                                                ("qwen2", {"attn_": "Q5_0", "ffn_": "Q5_0"}, {}),
                                                ("qwen2", K_QUANTS, {"hidden_size": 256, "intermediate_size": 512})])
def test_greedy_tokens_equal_transformers_on_the_files_weights(tmp_path: Path, arch: str, quant: dict,
                                                               sizes: dict) -> None:
    path = write_model(make_model(arch, **sizes), arch, tmp_path / f"{arch}.gguf", quant)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lm = load_lm(path, max_cache_len=64)
    assert not any("dequantized" in str(w.message) for w in caught)  # Q8_0/Q4_0 stay blocks
    layouts = {lm.programs.decode.weight_keys[s.name]: s.quant.block
               for s in lm.programs.decode.weight_specs if s.quant is not None}
    f = read_gguf(path)
    want = {hf_name(n): spec_block(info.type) for n, info in f.tensors.items() if info.type.name != "F32"}
    assert layouts == want  # every Q8_0/Q4_0 tensor of the file is a block-quantized slot, nothing else
    assert all(lm.weights[k].dtype == torch.uint8 for k in want)
    reference = make_model(arch, **sizes)  # the float model with the file's weights, as gguf dequantizes them
    state = hf_state_dict(read_gguf(path))
    missing, unexpected = reference.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # a tied head is the embedding
    device = Device()
    generator = Generator(lm.programs.prefill, lm.programs.decode,
                          load_weights(lm.weights, lm.programs.prefill, device), device)
    assert generator.generate(PROMPT, 32).tokens == _hf_greedy(reference.eval(), PROMPT, 32)


@pytest.mark.slow
@needs_gpu
def test_on_webgpu_the_linear_weights_stay_blocks_and_the_tokens_are_the_cpus(tmp_path: Path) -> None:
    """WebGPU reads blocks as the weights of its contractions only: the Q8_0 embedding (tied to the LM head) is
    dequantized when loaded, the rest stays blocks, and the greedy tokens are the CPU backend's."""
    path = write_model(make_model("qwen2"), "qwen2", tmp_path / "q.gguf", {"token_embd": "Q8_0", "blk.": "Q4_0"})
    lm = load_lm(path, max_cache_len=32, target="webgpu")
    kept = {lm.programs.decode.weight_keys[s.name]: s.quant.block for s in lm.programs.decode.weight_specs if s.quant}
    assert kept and all(k.endswith("proj.weight") and v == "q4_0" for k, v in kept.items())
    assert lm.weights["model.embed_tokens.weight"].dtype == torch.float32
    device = Device("webgpu")
    gpu = Generator(lm.programs.prefill, lm.programs.decode, load_weights(lm.weights, lm.programs.prefill, device),
                    device)
    cpu_lm = load_lm(path, max_cache_len=32)
    cpu = Generator(cpu_lm.programs.prefill, cpu_lm.programs.decode,
                    load_weights(cpu_lm.weights, cpu_lm.programs.prefill, Device()), Device())
    assert gpu.generate(PROMPT, 8).tokens == cpu.generate(PROMPT, 8).tokens


@pytest.mark.slow
def test_generate_command_takes_a_gguf_file(tmp_path: Path, capsys) -> None:
    path = write_model(make_model("qwen2"), "qwen2", tmp_path / "tiny.gguf", {})
    assert main(["generate", str(path), "--prompt-ids", "5,17,33", "--max-new-tokens", "4",
                 "--max-cache-len", "32"]) == 0
    assert "tiny" in capsys.readouterr().err


def test_a_tokenizer_not_built_yet_is_an_error_at_encode_not_at_load() -> None:
    from npu_tools.lm_gguf import GGUFTokenizer
    from torch_ir.errors import TorchIRError

    tok = GGUFTokenizer(unsupported="f.gguf: tokenizer.ggml.model 'rwkv': it is not known")
    with pytest.raises(TorchIRError, match=r"'rwkv'.*give the prompt as token ids \(--prompt-ids\)"):
        tok.encode("hello")


def test_extract_and_verify_take_a_gguf_file(tmp_path: Path, capsys) -> None:
    """A GGUF file is a model argument like a checkpoint: extracted weight-free, verified against transformers
    running the file's (dequantized) weights."""
    path = write_model(make_model("llama"), "llama", tmp_path / "m.gguf", {"ffn_": "Q8_0"})
    assert main(["extract", str(path), "-o", str(tmp_path / "ir.json")]) == 0
    assert (tmp_path / "ir.json").is_file()
    assert main(["verify", str(path)]) == 0
    assert "PASS" in capsys.readouterr().out


@pytest.mark.slow
def test_int8_activations_mark_the_block_layers_and_stay_close_to_float_x(tmp_path: Path) -> None:
    """``int8_activations``: every contraction reading blocks rounds x to int8 groups of 32 (llama.cpp's dot
    products); the next-token distributions stay within a small KLD of float x on the same blocks."""
    from npu_compiler import CompileError

    path = write_model(make_model("qwen2"), "qwen2", tmp_path / "q.gguf", {"blk.": "Q4_0"})
    runs = {}
    for int8 in (False, True):
        lm = load_lm(path, max_cache_len=48, int8_activations=int8)
        marked = [d.kernel for d in lm.programs.decode.dispatches if d.params.get("x_int8_group") == 32]
        assert sorted(set(marked)) == (["GATE_UP", "GEMM", "QKV_PROJ"] if int8 else [])
        assert marked.count("GEMM") == (4 if int8 else 0)  # o_proj and down_proj of 2 layers; not the float head
        device = Device()
        runs[int8] = Generator(lm.programs.prefill, lm.programs.decode,
                               load_weights(lm.weights, lm.programs.prefill, device), device)
    forced = runs[False].generate(PROMPT, 16).tokens
    p, q = (torch.from_numpy(runs[k].forced_logits(PROMPT, forced)).double().log_softmax(-1) for k in (False, True))
    kld = (p.exp() * (p - q)).sum(-1)
    assert 0 < kld.mean() < 1e-3
    with pytest.raises(CompileError, match="int8 activations run on the cpu backend, not 'webgpu'"):
        load_lm(path, max_cache_len=32, target="webgpu", int8_activations=True)
    float_file = write_model(make_model("qwen2"), "qwen2", tmp_path / "f.gguf", {})
    with pytest.raises(CompileError, match="int8 activations are for block-quantized weights"):
        load_lm(float_file, max_cache_len=32, int8_activations=True)


@pytest.mark.slow
@pytest.mark.parametrize("quant, sizes", [({"blk.1.ffn_": "Q5_0", "blk.1.": "Q8_0", "blk.": "Q4_0"}, {}),
                                          (K_QUANTS, {"hidden_size": 256, "intermediate_size": 512})])
def test_int8_prefill_rows_on_the_integer_kernel_keep_the_logits(tmp_path: Path, monkeypatch, quant: dict,
                                                                 sizes: dict) -> None:
    """A prompt of more rows than ``cpu_qgemv.PREFILL_ROWS`` with int8 activations: its prefill through the integer
    kernel (several rows of x per pass over the blocks) gives the logits of the float path on the int8-rounded x
    (how every prefill ran before; the same products summed in another order), prompt and decode steps alike, to
    within fp32 rounding: far inside the KLD the int8 decode path is held to against float x (1e-3)."""
    from npu_runtime.backends import cpu_blocks, cpu_qgemv

    path = write_model(make_model("qwen2", **sizes), "qwen2", tmp_path / "q.gguf", quant)
    lm = load_lm(path, max_cache_len=64, int8_activations=True)
    device = Device()
    run = Generator(lm.programs.prefill, lm.programs.decode, load_weights(lm.weights, lm.programs.prefill, device),
                    device)
    prompt = [(7 * i + 3) % 96 for i in range(cpu_qgemv.PREFILL_ROWS + 9)]
    logits = {}
    for how in ("rounded", "native"):
        monkeypatch.setattr(cpu_blocks, "INT8_PREFILL", how)
        logits[how] = torch.from_numpy(run.forced_logits(prompt, [5, 17, 33])).double()
    p, q = (logits[k].log_softmax(-1) for k in ("rounded", "native"))
    scale, diff = logits["rounded"].abs().max(), (logits["native"] - logits["rounded"]).abs().max()
    assert 0 < diff <= 1e-4 * scale  # not 0: the two paths did run
    assert (p.exp() * (p - q)).sum(-1).max() < 1e-6
    print(f"int8 prefill, integer kernel vs rounded x: max |d logit| {diff / scale:.2e} of the largest")


@pytest.mark.slow
def test_generate_int8_activations_flag(tmp_path: Path, capsys) -> None:
    path = write_model(make_model("qwen2"), "qwen2", tmp_path / "q4.gguf", {"blk.": "Q4_0"})
    assert main(["generate", str(path), "--prompt-ids", "5,17,33", "--max-new-tokens", "4", "--max-cache-len", "32",
                 "--int8-activations"]) == 0
    assert "int8 activations" in capsys.readouterr().err
    assert main(["generate", "qwen2", "--prompt-ids", "5,17", "--int8-activations"]) != 0
    assert "--int8-activations is for a GGUF file" in capsys.readouterr().err


@pytest.mark.slow
def test_the_cost_model_reads_block_weights_at_their_stored_bytes(tmp_path: Path) -> None:
    """A Q4_0 layer costs 18 bytes per 32 weights in DRAM, not 4 per weight: the decode step's DRAM bytes drop by
    exactly the difference over the file's Q4_0 tensors; int8 activations compute at the int8 rate."""
    from npu_compiler.costmodel import cost_lm, load_hardware

    hw = load_hardware("tpu_v1")
    model = make_model("qwen2")
    costs = {}
    for name, quant, int8 in (("f", {}, False), ("q", {"blk.": "Q4_0"}, False), ("q", {"blk.": "Q4_0"}, True)):
        lm = load_lm(write_model(model, "qwen2", tmp_path / f"{name}.gguf", quant), max_cache_len=32,
                     int8_activations=int8)
        costs[name, int8] = cost_lm(lm.programs.prefill, lm.programs.decode, hw).decode
    f = read_gguf(tmp_path / "q.gguf")
    saved = sum(info.nbytes // 18 * 32 * 4 - info.nbytes for info in f.tensors.values() if info.type.name == "Q4_0")
    assert costs["f", False].dram_bytes - costs["q", False].dram_bytes == saved
    widths = {(r.kernel, r.dtype) for r in costs["q", True].rows if r.kernel in ("GEMM", "QKV_PROJ", "GATE_UP")}
    assert widths == {("GEMM", "int8"), ("QKV_PROJ", "int8"), ("GATE_UP", "int8"), ("GEMM", "fp32")}  # fp32: the head
