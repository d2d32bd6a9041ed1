"""The toolkit's own quantizer through the pipeline: w8a8 and 16a8w (int16 activations, int64 accumulators)
normalize into the integer ops (QCONV, QGEMM), which compute within one output step of the QDQ form they came from,
and compile into a CPU program equal to the IR."""

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


@pytest.mark.parametrize("name, preset, fused", [("convnet", "w8a8", "QCONV"), ("mlp", "w8a8", "QGEMM"),
                                                 ("convnet", "16a8w", "QCONV")])
def test_integer_activations_become_integer_ops_and_compile(name: str, preset: str, fused: str) -> None:
    entry = get_model(name)
    meta, real = build_pair(entry)
    args, _ = entry.example_inputs()
    g = torch.Generator().manual_seed(1)
    calib = [tuple(torch.randn(a.shape, generator=g) for a in args) for _ in range(8)]
    qir, qw = quantize(torch_ir.extract_ir(meta, args, model_name=name), module_state(real), preset,
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
