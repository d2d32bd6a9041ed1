"""A PT2E-quantized model through the whole pipeline: extracted weight-free, normalized into the integer NPU ops
(QCONV, QGEMM, DQGEMM), compiled for the CPU and run; each stage against the one before and the exported program.

The normalized ops accumulate in integers where the exported program dequantizes and convolves in float, so the
two may differ by one quantization step of the output (ONNX Runtime's fused kernels differ from its unfused ones the
same way); the compiled program runs the same arithmetic as the normalized IR, so it must equal it exactly."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchao")

from npu_compiler import compile as npu_compile  # noqa: E402
from npu_compiler.passes import normalize  # noqa: E402
from tests.compiler.test_quantized_compile import run_program  # noqa: E402
from tests.test_extract_pt2e import STATIC_CASES, _weight_free_ir, quantized  # noqa: E402
from torch_ir.executor import IRExecutor  # noqa: E402
from torch_ir.weights import exported_program_state  # noqa: E402


def _output_step(ir, weights) -> float:
    """The scale of the DEQUANTIZE that makes the graph's output (one code of it), else 0 (a float output)."""
    out = ir.graph_outputs[0].name
    node = next((n for n in ir.nodes if n.outputs[0].name == out and n.op_type == "DEQUANTIZE"), None)
    if node is None:
        return 0.0
    name = node.inputs[1].name
    value = ir.constant_values.get(name)
    return float(value) if value is not None else float(weights[ir.weight_name_mapping.get(name, name)].max())


@pytest.mark.parametrize(("model", "quantizer"), STATIC_CASES)
def test_a_pt2e_model_normalizes_into_integer_ops_and_compiles(model: str, quantizer: str) -> None:
    _, ep, args = quantized(model, quantizer)
    weights = {k: v.contiguous() for k, v in exported_program_state(ep).items()}
    normalized = normalize(_weight_free_ir(model, quantizer))
    ops = normalized.op_histogram()
    assert ops.get("QCONV", 0) + ops.get("QGEMM", 0) >= 1, ops  # the integer ops, not dequantize + float op
    torch.manual_seed(1)
    program = npu_compile(normalized, target="cpu")
    for gain in (0.5, 1.0, 3.0):
        x = torch.randn(args[0].shape) * gain
        want = ep.module()(x)
        (got,) = IRExecutor(normalized, weights).run([x])
        # a quantized output: one code; a float one (x86's last linear is weight-only): a code of its input carried
        # through one float layer, well under 1 % of the output's range
        step = _output_step(normalized, weights) * 1.0001 or 1e-2 * want.abs().max().item()
        assert (got - want).abs().max().item() <= step, (model, quantizer, gain)
        assert torch.equal(run_program(program, weights, x), got)
