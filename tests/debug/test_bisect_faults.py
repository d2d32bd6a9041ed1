"""Injected faults, one at a time: the bisector must name exactly the broken rule, kernel, converter or mapping,
and the repro it writes must reproduce it.

Each fault lives in this module (an importable place, as a user's own rule or kernel would): a faulty rewrite rule
is a module attribute, so the repro records it as ``rule_source`` and ``python repro.py`` in a fresh process
imports it and fails honestly. A faulty kernel is swapped into the kernel table of this process only (the table
names classes of ``npu_runtime.backends.cpu_kernels``); a fresh process has the right kernel, so there the repro's
faulty path *passes* (the fix, in effect), and its failing run is checked in this process by calling the script's
``main()`` with the fault in place. Frontend faults are baked into the minimal IR itself, so their repro fails in a
fresh process.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from npu_compiler.passes import pipeline
from npu_program.kernels import KERNELS
from npu_runtime.backends import cpu_kernels, cpu_transformer
from npu_tools.debug.bisect import bisect
from npu_tools.debug.sources import subject_from_torch

ROOT = Path(__file__).resolve().parents[2]
NORMALIZE = pipeline


# -- a tiny Qwen2-like model ------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """As Qwen2RMSNorm computes it: float32 variance, rsqrt, then the weight."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Block(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4, ffn: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(dim), RMSNorm(dim)
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(dim, dim) for _ in range(3))  # square: see the GEMM fault
        self.o_proj = nn.Linear(dim, dim, bias=False)
        self.gate_proj, self.up_proj = nn.Linear(dim, ffn, bias=False), nn.Linear(dim, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.input_layernorm(x)
        q, k, v = (p(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # (B, nh, T, hs)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.o_proj(a)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TinyQwen(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(layers))
        self.norm, self.lm_head = RMSNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def tiny_qwen() -> TinyQwen:
    torch.manual_seed(0)
    model = TinyQwen().eval()
    with torch.no_grad():  # norms away from 1, so a wrong weight or epsilon shows
        for m in model.modules():
            if isinstance(m, RMSNorm):
                m.weight.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def qwen_subject():
    """Extracted once for the module: the faults below act after extraction (rules, kernels)."""
    return subject_from_torch(tiny_qwen(), (torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0)),),
                              name="tiny_qwen")


# -- the faults --------------------------------------------------------------------------------------------

_TOOLKIT_RULES = {r.name: r for r in NORMALIZE.ALL_RULES}  # taken at import, before any test swaps one


def _rule(name: str):
    return _TOOLKIT_RULES[name]


def _wrong_epsilon(m):
    """rms_norm's replacement with epsilon 0.5 instead of the model's 1e-6."""
    nodes = _rule("rms_norm").replace(m)
    return None if nodes is None else [dataclasses.replace(n, attrs={**n.attrs, "eps": 0.5}) for n in nodes]


def _wrong_transpose(m):
    """linear's replacement that forgets to transpose a square weight (shapes still fit; the values do not)."""
    nodes = _rule("linear").replace(m)
    w = m["w"]
    if nodes is None or len(w.shape) != 2 or w.shape[0] != w.shape[1]:
        return nodes
    return [dataclasses.replace(n, attrs={**n.attrs, "trans_b": False}) for n in nodes]


BAD_RMS_NORM = dataclasses.replace(_rule("rms_norm"), replace=_wrong_epsilon)
BAD_LINEAR = dataclasses.replace(_rule("linear"), replace=_wrong_transpose)


def install_rule(monkeypatch: pytest.MonkeyPatch, bad) -> None:
    """Put ``bad`` in place of the rule of its name in normalize's stages and rule list (the repro looks there)."""
    def swap(rules):
        return [bad if r.name == bad.name else r for r in rules]

    monkeypatch.setattr(NORMALIZE, "STAGES", [(stage, swap(rules)) for stage, rules in NORMALIZE.STAGES])
    monkeypatch.setattr(NORMALIZE, "ALL_RULES", swap(NORMALIZE.ALL_RULES))


class OffRmsNorm(cpu_transformer.RmsNorm):
    """The CPU RMS_NORM kernel, off by 0.1."""

    def run(self, inputs, outputs):
        super().run(inputs, outputs)
        outputs[0].add_(0.1)


def install_cpu_kernel(monkeypatch: pytest.MonkeyPatch, kernel: str, cls: type) -> None:
    """Make ``cls`` the CPU implementation of ``kernel`` in the kernel table (which names cpu_kernels classes)."""
    monkeypatch.setattr(cpu_kernels, cls.__name__, cls, raising=False)
    monkeypatch.setitem(KERNELS[kernel].impls, "cpu", f"{cpu_kernels.__name__}:{cls.__name__}")


# -- running a repro -----------------------------------------------------------------------------------------

_BOTH_PATHS = """
import runpy, sys
codes = []
for args in ([], ["--reference"]):
    sys.argv = ["repro.py", *args]
    try:
        runpy.run_path("repro.py", run_name="__main__")
    except SystemExit as e:
        codes.append(e.code)
print("EXIT CODES", codes)
"""


def run_repro(repro: Path) -> tuple[int, int]:
    """Exit codes of ``python repro.py`` and ``python repro.py --reference`` in one fresh process (starting Python
    with torch twice costs seconds); this repository on the path, so a rule defined here imports."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _BOTH_PATHS], cwd=repro, env=env, capture_output=True, text=True,
                          timeout=120)
    line = [x for x in done.stdout.splitlines() if x.startswith("EXIT CODES")]
    assert line, done.stdout + done.stderr
    faulty, reference = eval(line[0].removeprefix("EXIT CODES"))  # noqa: S307 - a list of two ints we printed
    return faulty, reference


def repro_in_process(repro: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """The repro's ``main()`` in this process, where the injected fault is in place."""
    spec = importlib.util.spec_from_file_location(f"repro_{abs(hash(str(repro)))}", repro / "repro.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["repro.py", *args])
    return module.main()


# -- (a) rewrite rules ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_wrong_rms_norm_epsilon_is_named(qwen_subject, monkeypatch, tmp_path):
    install_rule(monkeypatch, BAD_RMS_NORM)
    report = bisect(qwen_subject, out_dir=tmp_path, progress=False)
    f = report.finding
    assert report.first_bad == "normalize:fuse"
    assert [r.status for r in report.stages] == ["ok", "ok", "ok", "DIVERGES"]
    assert (f.kind, f.stage, f.rule, f.rule_family, f.op) == ("rule", "normalize:fuse", "rms_norm", "llm", "RMS_NORM")
    assert f.module == "layers.0.input_layernorm"  # the first RMS norm of the model
    assert f.provenance["rules"][-1] == "rms_norm" and "rsqrt" in f.provenance["nodes"]
    assert f.root in f.group and {"rsqrt", "mean"} <= set(f.group)  # the repro holds the nodes the rule rewrote
    assert report.verdict.kind == "fault"
    assert {p.name for p in tmp_path.iterdir()} >= {"report.json", "report.md", "report.html", "error.png", "repro"}
    # the faulty rule is importable from this module: a fresh process runs it and fails; the reference passes
    assert run_repro(report.repro) == (1, 0)


def test_transposed_gemm_weight_is_named(qwen_subject, monkeypatch, tmp_path):
    install_rule(monkeypatch, BAD_LINEAR)
    report = bisect(qwen_subject, out_dir=tmp_path, progress=False)
    f = report.finding
    assert report.first_bad == "normalize:canonicalize"
    assert (f.kind, f.rule, f.rule_family, f.op) == ("rule", "linear", "gemm", "GEMM")
    assert f.application == 1  # the first square linear of the model
    assert f.module == "layers.0.q_proj" and f.provenance["rules"] == ["linear"]
    assert report.verdict.kind == "fault"
    assert repro_in_process(report.repro, monkeypatch) == 1
    assert repro_in_process(report.repro, monkeypatch, "--reference") == 0


# -- (b) a CPU kernel ----------------------------------------------------------------------------------------

def test_cpu_kernel_fault_is_named(qwen_subject, monkeypatch, tmp_path):
    install_cpu_kernel(monkeypatch, "RMS_NORM", OffRmsNorm)
    report = bisect(qwen_subject, out_dir=tmp_path, progress=False)
    f = report.finding
    assert report.first_bad == "compiled:cpu"
    assert [r.status for r in report.stages][:6] == ["ok"] * 6
    assert (f.kind, f.kernel, f.backend) == ("kernel", "RMS_NORM", "cpu")
    assert f.implementation == "npu_runtime.backends.cpu_kernels:OffRmsNorm"
    assert f.module == "layers.0.input_layernorm" and f.provenance["rules"][-1] == "rms_norm"
    assert report.verdict.kind == "fault"
    # with the fault in place the repro fails; a fresh process has the right kernel, so there it passes
    assert repro_in_process(report.repro, monkeypatch) == 1
    assert repro_in_process(report.repro, monkeypatch, "--reference") == 0


# -- (c) an ONNX converter -----------------------------------------------------------------------------------

def wrong_sigmoid(ctx, x):
    """A Sigmoid converter that emits tanh."""
    return ctx.aten("tanh", x)


def small_onnx(path: Path) -> Path:
    """x (2, 8) -> MatMul -> Add -> Sigmoid -> MatMul -> y (2, 4)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w1", (8, 8)), ("b1", (8,)), ("w2", (8, 4)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
             helper.make_node("Sigmoid", ["hb"], ["s"], name="act"),
             helper.make_node("MatMul", ["s", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.slow
def test_onnx_converter_fault_is_named(monkeypatch, tmp_path):
    pytest.importorskip("onnxruntime")
    from npu_tools.debug.sources import subject_from_onnx
    from torch_ir.frontends.onnx.converters import TABLE, Entry

    monkeypatch.setitem(TABLE, ("", "Sigmoid"), [Entry("Sigmoid", 1, wrong_sigmoid)])
    subject = subject_from_onnx(small_onnx(tmp_path / "small.onnx"))
    report = bisect(subject, out_dir=tmp_path / "out", progress=False, stages=["extracted", "normalize:cleanup"])
    f = report.finding
    assert report.first_bad == "extracted"
    assert (f.kind, f.op, f.module) == ("frontend", "aten.tanh.default", "act")  # the ONNX node's name
    assert f.converter == f"onnx:Sigmoid {__name__}.wrong_sigmoid"
    assert report.verdict.kind == "fault"
    # the wrong op is in the minimal IR itself: a fresh process reproduces it
    assert run_repro(report.repro) == (1, 0)


# -- (d) a tinygrad mapping ------------------------------------------------------------------------------------

def wrong_exp2(b, u):
    """An EXP2 mapping that emits exp (base e, not 2)."""
    return b.emit("aten.exp.default", [b.operand(u, 0)], {}, u)


def tinygrad_mlp():
    from tinygrad.tensor import Tensor

    gen = torch.Generator().manual_seed(0)
    w1, w2 = (Tensor(torch.randn(*s, generator=gen).numpy()) for s in ((8, 8), (8, 4)))

    def mlp(x):
        return (x.dot(w1).exp2() * 0.1).dot(w2)
    return mlp, [Tensor(torch.randn(2, 8, generator=gen).numpy())]


def test_tinygrad_mapping_fault_is_named(monkeypatch, tmp_path):
    from npu_tools.commands.import_tinygrad import default_device

    default_device()  # before tinygrad is imported: it reads its device from the environment then
    pytest.importorskip("tinygrad")
    from tinygrad.uop.ops import Ops

    from npu_tools.debug.sources import subject_from_tinygrad
    from torch_ir.frontends.tinygrad import mapping

    right = mapping.TABLE[Ops.EXP2]
    monkeypatch.setitem(mapping.TABLE, Ops.EXP2, dataclasses.replace(right, convert=wrong_exp2))
    model, inputs = tinygrad_mlp()
    subject = subject_from_tinygrad(model, inputs, name="tg_mlp")
    report = bisect(subject, out_dir=tmp_path, progress=False, stages=["extracted", "normalize:cleanup"])
    f = report.finding
    assert report.first_bad == "extracted"
    assert (f.kind, f.op, f.converter) == ("frontend", "aten.exp.default", "tinygrad:EXP2")
    assert report.verdict.kind == "fault"
    assert repro_in_process(report.repro, monkeypatch) == 1
    assert repro_in_process(report.repro, monkeypatch, "--reference") == 0


# -- (e) a WGSL kernel ------------------------------------------------------------------------------------------

class Squash(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x * 2.0)


def test_wgsl_kernel_fault_is_named(monkeypatch, tmp_path):
    from npu_tools.debug.stages import webgpu_problem

    problem = webgpu_problem()
    if problem is not None:
        pytest.skip(f"no WebGPU adapter: {problem}")
    record = KERNELS["aten.sigmoid.default"]
    monkeypatch.setitem(KERNELS, record.name, dataclasses.replace(record, wgsl="sigmoid_(x0) + 0.1"))
    subject = subject_from_torch(Squash(), (torch.randn(2, 8),), name="squash")
    report = bisect(subject, out_dir=tmp_path, progress=False,
                    stages=["extracted", "kernel_fusion", "compiled:cpu", "compiled:webgpu"])
    f = report.finding
    assert report.first_bad == "compiled:webgpu"
    assert (f.kind, f.kernel, f.backend) == ("kernel", "aten.sigmoid.default", "webgpu")
    assert "sigmoid_(x0) + 0.1" in f.implementation  # the WGSL expression of the record is named
    assert repro_in_process(report.repro, monkeypatch) == 1
    assert repro_in_process(report.repro, monkeypatch, "--reference") == 0
