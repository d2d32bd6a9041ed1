"""bisect on a healthy model, on drift (every GEMM rounded to bfloat16), and through the command line."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from npu_runtime.backends import cpu_kernels
from npu_tools.cli import main
from npu_tools.debug.bisect import bisect
from npu_tools.debug.sources import subject_from_torch
from npu_tools.debug.stages import STAGE_NAMES

from .test_bisect_faults import install_cpu_kernel, qwen_subject  # noqa: F401 - a fixture

NO_GPU = [s for s in STAGE_NAMES if s != "compiled:webgpu"]  # the WebGPU stage has a test of its own (slow shaders)


def test_healthy_model_passes_every_stage(qwen_subject, tmp_path):  # noqa: F811 - the fixture
    report = bisect(qwen_subject, stages=NO_GPU, out_dir=tmp_path, progress=False)
    assert report.ok and report.first_bad is None and report.finding is None and report.repro is None
    assert [r.name for r in report.stages] == NO_GPU and all(r.status == "ok" for r in report.stages)
    assert "no stage diverges" in report.summary()
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["ok"] is True and [s["name"] for s in data["stages"]] == NO_GPU


class Deep(nn.Module):
    """Sixteen residual tanh layers: rounding error adds up layer by layer, nothing jumps."""

    def __init__(self, dim: int = 32, layers: int = 16) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return x


class Bf16Gemm(cpu_kernels.Gemm):
    """The CPU GEMM with its result rounded to bfloat16, as a bf16 accumulator would leave it."""

    def run(self, inputs, outputs):
        super().run(inputs, outputs)
        outputs[0].copy_(outputs[0].bfloat16().float())


@pytest.fixture(scope="module")
def deep_subject():
    torch.manual_seed(0)
    return subject_from_torch(Deep().eval(), (torch.randn(4, 32),), name="deep")


def test_drift_is_told_from_a_fault(deep_subject, monkeypatch, tmp_path):
    install_cpu_kernel(monkeypatch, "GEMM", Bf16Gemm)
    report = bisect(deep_subject, rtol=5e-3, atol=5e-3, out_dir=tmp_path, progress=False,
                    stages=["extracted", "kernel_fusion", "compiled:cpu"])
    assert report.first_bad == "compiled:cpu"
    v = report.verdict
    assert v.kind == "drift" and v.jump is None and report.finding.kind == "drift"
    # every GEMM adds about one bf16 rounding (2e-3) and nothing is ten times its inputs' error
    assert all(e.error < 10 * max(e.input_error, 1e-6) or e.ok for e in v.series)
    assert len(v.layers) == 17 and v.layers[0][0] == "layers.0"  # per layer: layers.0 ... layers.15 and the top
    assert report.repro is None  # no single node to cut out
    assert (tmp_path / "error.png").exists() or (tmp_path / "error.svg").exists()
    assert "drift" in report.summary()


def test_cli_exit_codes(monkeypatch, tmp_path, capsys):
    spec = "tests.debug.test_bisect:deep_factory"
    install_cpu_kernel(monkeypatch, "GEMM", Bf16Gemm)
    out = tmp_path / "out"
    code = main(["bisect", spec, "--stage", "extracted", "--stage", "compiled:cpu", "-o", str(out)])
    captured = capsys.readouterr()
    assert code == 1, captured.err
    assert "first stage that diverges: compiled:cpu" in captured.out
    assert "[bisect] extracted" in captured.err and "[bisect] compiled:cpu" in captured.err  # progress lines
    assert (out / "report.html").exists()
    code = main(["bisect", spec, "--stage", "extracted", "--rtol", "1e-2", "--atol", "1e-2"])
    assert code == 0 and "no stage diverges" in capsys.readouterr().out
    assert main(["bisect", "no_such_model_anywhere"]) == 2
    assert "no_such_model_anywhere" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse refuses a stage that does not exist
        main(["bisect", spec, "--stage", "no_such_stage"])
    assert exit_info.value.code == 2


def deep_factory():
    """The CLI's ``module:factory`` form: (model, args)."""
    torch.manual_seed(0)
    return Deep(layers=4).eval(), (torch.randn(4, 32),)


def test_stage_irs_are_normalize_stopped_after_each_stage(qwen_subject):  # noqa: F811 - the fixture
    """The pipeline builds each normalize stage from the previous one (fast probing); the nodes must be those of
    ``normalize(ir, NormalizeOptions(stop_after=...))``, for a whole stage and part way through one."""
    from npu_compiler.passes import pipeline as normalize
    from npu_tools.debug.stages import Pipeline

    pipe = Pipeline(qwen_subject)
    for stage, n in (("canonicalize", None), ("fuse", 7), ("late_fuse", None)):
        ours = pipe.ir(f"normalize:{stage}", n)
        theirs = normalize.normalize(qwen_subject.ir, normalize.NormalizeOptions(stop_after=(stage, n)))
        assert [str(a) for a in ours.nodes] == [str(b) for b in theirs.nodes], stage
        assert [a.provenance for a in ours.nodes] == [b.provenance for b in theirs.nodes], stage
    log = theirs.metadata["normalize"]["stages"][-1]["log"]
    assert pipe.log("normalize:late_fuse") == [tuple(x) for x in log]
