"""The toolkit's own quantizer through the pipeline: w8a8 normalizes into the integer ops (QCONV, QGEMM), which
compute within one output step of the QDQ form they came from, and compile into a CPU program equal to the IR."""

from __future__ import annotations

import pytest
import torch

import torch_ir
from npu_compiler import compile as npu_compile
from npu_compiler.passes import normalize
from npu_compiler.quantize import quantize
from npu_tools.zoo import build_pair, get_model
from tests.compiler.test_quantized_compile import run_program
from torch_ir.executor import IRExecutor
from torch_ir.weights import module_state


@pytest.mark.parametrize("name, fused", [("convnet", "QCONV"), ("mlp", "QGEMM")])
def test_w8a8_becomes_integer_ops_and_compiles(name: str, fused: str) -> None:
    entry = get_model(name)
    meta, real = build_pair(entry)
    args, _ = entry.example_inputs()
    g = torch.Generator().manual_seed(1)
    calib = [tuple(torch.randn(a.shape, generator=g) for a in args) for _ in range(8)]
    qir, qw = quantize(torch_ir.extract_ir(meta, args, model_name=name), module_state(real), "w8a8",
                       calibration=calib)
    fused_ir = normalize(qir)
    assert fused_ir.op_histogram().get(fused, 0) >= 1, fused_ir.op_histogram()
    program = npu_compile(fused_ir, target="cpu", fallback="cpu")
    for _ in range(3):
        x = [torch.randn(a.shape, generator=g) for a in args]
        (qdq,) = IRExecutor(qir, qw).run(x)
        (integer,) = IRExecutor(fused_ir, qw).run(x)
        # one code of the last quantized layer, carried through the float head: well under 1 % of the output
        assert (integer - qdq).abs().max() <= 0.01 * qdq.abs().max()
        assert torch.equal(run_program(program, qw, x[0]), integer)
