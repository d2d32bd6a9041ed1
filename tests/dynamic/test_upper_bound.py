"""compile(ir, dynamic=UpperBound()): one program planned for the upper bound, every dispatch sized at run time
(issue 31, item 1's second way), run equal to eager on CPU and WebGPU at sizes across the range, and every
refusal: sizes the scheme cannot derive are never approximated."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.export import Dim

import torch_ir
from npu_compiler import CompileError, UpperBound, compile, load_program
from npu_program.npubin import NpubinError
from npu_program.template import instantiate
from npu_runtime import Device, Executor, RuntimeInputError, load_weights
from torch_ir.weights import module_state

from ..webgpu.kernels import needs_gpu
from .models import bert, bert_inputs, vit
from .test_compile_dynamic import _rewrite_header
from .test_run_dynamic import close

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def bert_upper(tmp_path_factory):
    model, ir = bert(seq=(8, 512), batch=(1, 4))
    path = tmp_path_factory.mktemp("ub") / "bert.npubin"
    compile(ir, dynamic=UpperBound()).save(path)
    return model, load_program(path), path


def test_one_variant_at_the_top_with_its_sizes_as_expressions(bert_upper):
    _, program, _ = bert_upper
    assert len(program.variants) == 1 and program.variants[0].sizes == {"batch": 4, "seq": 512}
    assert not any(p.allowed for p in program.padding.values())
    template = program.template
    assert template.shapes["add_1"] == ["batch", "seq", 64]  # a residual sum, [batch, seq, hidden]
    assert any(p.expr == "seq" and p.path == ["end"] for p in template.params)  # the position-ids slice
    small = instantiate(program.variants[0].program, template, {"batch": 1, "seq": 8})
    assert small.memory.arena_bytes == program.arena_bytes  # the upper bound's plan, reused
    assert small.tensors["add_1"].shape == [1, 8, 64] and small.input_specs[0].shape == [1, 8]


@pytest.mark.parametrize(("batch", "seq"), [(1, 8), (2, 9), (3, 100), (4, 511), (4, 512), (1, 512)])
def test_sizes_across_the_range_equal_eager_without_padding(bert_upper, batch, seq):
    model, program, _ = bert_upper
    executor = Executor(program)
    inputs = bert_inputs(batch, seq, seed=seq)
    outputs = executor.run({k: v.numpy() for k, v in inputs.items()}, weights=module_state(model))
    assert executor.last_variant.sizes == {"batch": batch, "seq": seq}  # run at its own size
    with torch.no_grad():
        ref = model(**inputs)
    close(outputs["output_0"].to_numpy(), ref.last_hidden_state)
    close(outputs["output_1"].to_numpy(), ref.pooler_output)


def test_sizes_outside_the_range_are_refused(bert_upper):
    model, program, _ = bert_upper
    with pytest.raises(RuntimeInputError, match="seq=513.*outside every bucket"):
        Executor(program).run({"input_ids": np.ones((1, 513), np.int64),
                               "attention_mask": np.ones((1, 513), np.int64)}, weights=module_state(model))


def test_vit_batch_upper_bound_equals_eager():
    model, ir = vit()
    program = compile(ir, dynamic=UpperBound())
    executor = Executor(program)
    for batch in (1, 2, 7, 16):
        x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch))
        out = executor.run({"pixel_values": x.numpy()}, weights=module_state(model))["output"].to_numpy()
        with torch.no_grad():
            close(out, model(pixel_values=x).logits)


@needs_gpu
def test_bert_upper_bound_on_webgpu_equals_eager():
    model, ir = bert(seq=(8, 128), batch=(1, 4))
    program = compile(ir, target="webgpu", dynamic=UpperBound())
    device = Device("webgpu")
    executor = Executor(program, device)
    weights = load_weights(module_state(model), program, device)
    for batch, seq in ((1, 8), (2, 77), (2, 128)):
        inputs = bert_inputs(batch, seq, seed=seq)
        outputs = executor.run({k: v.numpy() for k, v in inputs.items()}, weights=weights)
        with torch.no_grad():
            ref = model(**inputs)
        close(outputs["output_0"].to_numpy(), ref.last_hidden_state)


class StridedConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def test_a_size_that_is_no_polynomial_is_refused_not_approximated():
    ir = torch_ir.extract_ir(StridedConv(), (torch.randn(1, 3, 16, 16),), allow_real_weights=True,
                             dynamic_shapes={"x": {2: Dim("h", min=8, max=64)}})
    with pytest.raises(CompileError, match="not an integer polynomial.*compile it with --buckets instead"):
        compile(ir, dynamic=UpperBound())


def test_an_unbounded_symbol_needs_a_range():
    ir = torch_ir.extract_ir(torch.nn.Linear(4, 4), (torch.randn(2, 4),), allow_real_weights=True,
                             dynamic_shapes={"input": {0: Dim("batch")}})
    with pytest.raises(CompileError, match=r"no upper bound.*--range batch=LO:HI"):
        compile(ir, dynamic=UpperBound())
    program = compile(ir, dynamic=UpperBound({"batch": (1, 32)}))
    assert program.variants[0].sizes == {"batch": 32}


@pytest.mark.parametrize(("edit", "message"), [
    (lambda h: h["template"]["params"][0].update(path=["nowhere"]), "does not lead to a value"),
    (lambda h: h["template"]["params"][0].update(expr="seq + 1"), "does not give the program's own sizes"),
    (lambda h: h["template"]["shapes"]["add_1"].__setitem__(1, "exec('x')"), "not an allowed function"),
    (lambda h: h["template"]["shapes"].update(ghost=["seq"]), "which the program lacks"),
])
def test_a_forged_template_is_refused(bert_upper, tmp_path, edit, message):
    _, _, path = bert_upper
    forged = tmp_path / "forged.npubin"
    forged.write_bytes(_rewrite_header(path.read_bytes(), edit))
    with pytest.raises(NpubinError, match=message):
        load_program(forged)
