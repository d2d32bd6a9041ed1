"""Seed 001's end to end: a small llama written in tinygrad is imported, compiled strictly, and run on
the runtime, and its logits equal tinygrad's own forward.

The model (``models.TinyLlama``): token embedding, two llama blocks (RMSNorm, rotary embeddings,
grouped-query causal attention, SiLU-gated MLP, residuals), a final RMSNorm and an output head.
``rope="half"`` rotates halves as HF's llama does, and the normalized graph holds the LLM ops
(RMS_NORM, QKV_PROJ, ROPE, the attention, the gated MLP); ``rope="pairs"`` rotates channel pairs as
tinygrad's own llama (``extra/models/llama.py``) does, which the NPU's ROPE (halves) is not: that
rotation stays elementwise arithmetic, and the q, k, v projections stay three GEMMs (see the pairs test).

Without clang, tinygrad's reference forward runs on its Python device, which emulates every kernel:
the model is small, and tinygrad's kernel optimizations are off for it (``NOOPT``: the same
arithmetic in fewer emulated instructions), to keep each forward near ten seconds.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from tinygrad.helpers import Context
from tinygrad.tensor import Tensor

from npu_compiler import compile as compile_ir
from npu_compiler.passes.pipeline import npu_histogram
from npu_runtime import Device, Executor, load_weights
from torch_ir.frontends.tinygrad import import_tinygrad
from torch_ir.ir.serialize import ir_from_dict

from ..helpers import assert_outputs_close
from .models import LLAMA_CONFIG as CONFIG
from .models import TinyLlama, realize_weights, tiny_llama_factory

LAYERS = CONFIG["n_layers"]
ROOT = Path(__file__).resolve().parents[2]


def _tokens(length: int, seed: int = 0) -> Tensor:
    return Tensor(np.random.default_rng(seed).integers(0, CONFIG["vocab"], (1, length)).astype(np.int32))


def _end_to_end(model: TinyLlama, tokens: Tensor, start_pos: int = 0):
    """Import, compile strictly, run on the runtime with the imported weights; compare with tinygrad."""
    ir, weights = import_tinygrad(model, [tokens], input_names=["tokens"], kwargs={"start_pos": start_pos})
    program = compile_ir(ir)  # strict: every node has a kernel, or this raises
    assert program.host_dispatches == []
    device = Device()
    outputs = Executor(program, device).run({"tokens": tokens.numpy()},
                                            weights=load_weights(weights, program, device))
    (spec,) = program.output_specs
    logits = outputs[spec.name].to_numpy()
    with Context(NOOPT=1):
        expected = model(tokens, start_pos=start_pos).numpy()
    assert logits.shape == (1, tokens.shape[1], CONFIG["vocab"])
    assert_outputs_close([torch.from_numpy(logits)], [torch.from_numpy(expected)])
    return program, ir_from_dict(program.ir)


def _attention_ops(hist: dict[str, int]) -> int:
    """Attentions in the normalized graph: one ATTENTION, or ATTN_SCORE then ATTN_OUTPUT."""
    return hist.get("ATTENTION", 0) + min(hist.get("ATTN_SCORE", 0), hist.get("ATTN_OUTPUT", 0))


@pytest.fixture(scope="module")
def llama() -> TinyLlama:
    return tiny_llama_factory()[0]


@pytest.mark.slow
def test_tiny_llama_compiles_whole_and_runs_equal_to_tinygrad(llama):
    program, npu_ir = _end_to_end(llama, _tokens(5))
    hist = npu_histogram(npu_ir)
    assert hist.get("RMS_NORM") == 2 * LAYERS + 1  # two per block and the final norm
    assert hist.get("QKV_PROJ") == LAYERS  # q, k, v of one input: one op (two kv heads, four q heads)
    assert hist.get("ROPE", 0) + 2 * hist.get("ROPE_QK", 0) == 2 * LAYERS  # q and k
    assert _attention_ops(hist) == LAYERS
    assert hist.get("SILU_GATE", 0) + hist.get("GATE_UP", 0) == LAYERS
    assert hist.get("GEMM", 0) >= LAYERS + 1  # the output projections (wo, w2) and the head, at least
    # what is left is the embedding (a one-hot select in tinygrad), the causal mask and head layouts
    left = {op for op in npu_ir.op_histogram() if op.startswith("aten.")}
    assert left <= {"aten.reshape.default", "aten.permute.default", "aten.ne.Tensor", "aten.where.ScalarOther",
                    "aten.where.self", "aten.sum.dim_IntList", "aten.full.default", "aten.slice.Tensor"}, left
    assert program.dispatch_count <= 40


@pytest.mark.slow
def test_tiny_llama_at_another_length_and_position_offset(llama):
    """Seven tokens at positions 3..9 (tinygrad llama's start_pos): the rotary tables are read at an offset."""
    _, npu_ir = _end_to_end(llama, _tokens(7, seed=1), start_pos=3)
    slices = [n for n in npu_ir.nodes if n.op_type == "aten.slice.Tensor"]
    assert sorted((n.attrs["start"], n.attrs["end"]) for n in slices) == [(3, 10), (3, 10)]  # cos and sin


@pytest.mark.slow
def test_tinygrads_own_rotary_pairs_compile_and_run_but_stay_arithmetic():
    """tinygrad's llama rotates (x0, x1) channel pairs; the NPU's ROPE rotates halves.

    After normalization the pair rotation is slices of a [B, T, H, D/2, 2] view, four muls, a sub
    and an add, and a cat of the two results. Its q and k projections are split by that 5-D view,
    not into [B, T, H, D] heads, so QKV_PROJ does not take them; the rest fuses as before.
    """
    model = realize_weights(TinyLlama(**CONFIG, rope="pairs"), seed=3)
    _, npu_ir = _end_to_end(model, _tokens(3, seed=2))
    hist = npu_histogram(npu_ir)
    assert "ROPE" not in hist and "ROPE_QK" not in hist and "QKV_PROJ" not in hist
    assert hist.get("RMS_NORM") == 2 * LAYERS + 1 and _attention_ops(hist) == LAYERS
    ops = npu_ir.op_histogram()
    assert ops.get("aten.cat.default") == 2 * LAYERS and ops.get("aten.sub.Tensor") == 2 * LAYERS


def test_the_docs_shell_example_runs(tmp_path, monkeypatch):
    """docs/tinygrad.md's commands, as written: import (factory), compile (strict), run on the runtime.

    The logits are compared with the imported IR run by the IR executor; the tests above compare the
    same model's runtime logits with tinygrad's."""
    import torch_ir
    from npu_tools.cli import main

    text = (ROOT / "docs" / "tinygrad.md").read_text()
    (block,) = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    commands = [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    assert [c[:2] for c in commands] == [["torch-ir", "import-tinygrad"], ["torch-ir", "compile"], ["torch-ir", "run"]]
    monkeypatch.chdir(tmp_path)
    tokens = np.array([[1, 5, 9, 2, 7]], dtype=np.int32)  # as the docs say
    np.save("tokens.npy", tokens)
    for command in commands:
        assert main(command[1:]) == 0, command
    (logits,) = np.load("logits.npz").values()
    _, weights = import_tinygrad(*tiny_llama_factory())
    (expected,) = torch_ir.IRExecutor(torch_ir.load_ir("llama.json"), {k: torch.from_numpy(v) for k, v in
                                                                       weights.items()}).run([torch.from_numpy(tokens)])
    assert_outputs_close([torch.from_numpy(logits)], [expected])
