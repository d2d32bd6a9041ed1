"""bisect on a quantized model: one QCONV whose requantize is wrong (its kernel computes with a y_scale 1% off, as a
kernel that mis-rounds its multiplier would) is named, dispatch and node, with the integer codes compared exactly: a
one-step difference in a uint8 tensor is a difference (``torch_ir.verify.tolerance``: integers are exact whatever
tolerance is asked for)."""

from __future__ import annotations

import torch

import npu_compiler
from npu_runtime.backends import cpu_kernels
from npu_tools.debug.bisect import bisect
from npu_tools.debug.subject_ir import subject_from_ir
from torch_ir.verify.tolerance import tolerance_for

from ..compiler.quantized_models import qconv_model
from .test_bisect_faults import install_cpu_kernel, repro_in_process

FAULTY_NODE = "conv2"


class OffRequantQconv(cpu_kernels.Reference):
    """QCONV's reference, except that for one node the requantize reads a y_scale 1% too large."""

    @classmethod
    def accepts(cls, dispatch, specs, weight_names) -> bool:
        return True

    def __init__(self, dispatch, specs) -> None:
        super().__init__(dispatch, specs)
        self.y_scale = len(dispatch.inputs) - 2 if dispatch.node == FAULTY_NODE else None

    def run(self, inputs, outputs) -> None:
        if self.y_scale is not None:
            inputs = list(inputs)
            inputs[self.y_scale] = inputs[self.y_scale] * 1.01
        super().run(inputs, outputs)


def test_integer_tensors_are_compared_exactly_whatever_the_tolerance():
    assert tolerance_for(torch.uint8, rtol=0.1, atol=1.0) == (0.0, 0.0)
    assert tolerance_for(torch.int32) == (0.0, 0.0)


def test_a_wrong_requantize_is_named_by_dispatch_and_node(monkeypatch, tmp_path):
    install_cpu_kernel(monkeypatch, "QCONV", OffRequantQconv)
    ir, weights, x = qconv_model()
    report = bisect(subject_from_ir(ir, weights, [x]), out_dir=tmp_path, progress=False,
                    stages=["extracted", "kernel_fusion", "compiled:cpu"])
    f = report.finding
    assert report.first_bad == "compiled:cpu"
    assert [r.status for r in report.stages] == ["ok", "ok", "DIVERGES"]
    assert (f.kind, f.node, f.op, f.kernel, f.backend) == ("kernel", FAULTY_NODE, "QCONV", "QCONV", "cpu")
    assert f.dispatch == [d.node for d in npu_compiler.compile(ir).dispatches].index(FAULTY_NODE)
    assert f.implementation.endswith(":OffRequantQconv")
    (inp,), (out,) = f.inputs, f.outputs
    assert (inp.name, inp.ok, out.name, out.ok) == ("q1", True, "q2", False)  # right inputs, wrong codes
    assert out.dtype in ("uint8", "torch.uint8") and out.max_abs == 1.0  # one code step
    assert report.verdict.kind == "fault"
    # the repro of the node fails with the fault in place and passes against the reference
    assert repro_in_process(report.repro, monkeypatch) == 1
    assert repro_in_process(report.repro, monkeypatch, "--reference") == 0


def test_the_quantized_model_bisects_clean_without_a_fault():
    ir, weights, x = qconv_model()
    report = bisect(subject_from_ir(ir, weights, [x]), progress=False, stages=["extracted", "compiled:cpu"])
    assert report.first_bad is None and all(r.ok for r in report.stages)
