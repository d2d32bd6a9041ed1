"""An LLM costed per phase: prefill (chunk tokens a run) and decode (one token), with tokens/s, from the API and
from ``torch-ir cost`` on the directory ``torch-ir compile`` writes for an LLM and on an LLM IR."""

from __future__ import annotations

import pytest

import torch_ir
from npu_compiler.costmodel import CostModelError, cost_lm, load_hardware

from ..llm.checkpoints import tiny_config
from .test_reports import run_cli

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llm():
    from transformers import AutoModelForCausalLM

    from npu_compiler.llm import compile_lm
    from torch_ir.frontends.hf import extract_lm

    with torch_ir.build_on_meta():
        meta = AutoModelForCausalLM.from_config(tiny_config("qwen2"), attn_implementation="sdpa").eval()
    ir = extract_lm(meta, 32, name="tiny_qwen2")
    return ir, compile_lm(ir, chunk=8)


def test_phases_and_their_rates(llm):
    _, programs = llm
    cost = cost_lm(programs.prefill, programs.decode, load_hardware("edge_4tops"))
    assert cost.chunk == 8
    assert cost.decode_tokens_per_s == pytest.approx(1e3 / cost.decode.latency_ms)
    assert cost.prefill_tokens_per_s == pytest.approx(8 / (cost.prefill.latency_ms / 1e3))
    # a run of one token multiplies less than a run of eight
    assert cost.decode.macs < cost.prefill.macs
    assert "tokens/s" in cost.summary()
    with pytest.raises(CostModelError, match="one"):
        cost_lm(programs.decode, programs.prefill, load_hardware("edge_4tops"))


def test_cli_on_an_llm_directory_and_ir(llm, tmp_path, capsys):
    ir, programs = llm
    programs.save(tmp_path / "lm")
    assert run_cli("cost", str(tmp_path / "lm"), "--hw", "tpu_v1", "-o", str(tmp_path / "out")) == 0
    out = capsys.readouterr().out
    assert "prefill: 8 tokens a run" in out and "ms/token" in out
    for phase in ("prefill", "decode"):
        assert (tmp_path / "out" / phase / "report.html").is_file()
    ir.save(tmp_path / "lm.json")
    assert run_cli("cost", str(tmp_path / "lm.json"), "--hw", "tpu_v1", "--dtype", "int8") == 0
    assert "tokens/s" in capsys.readouterr().out
