"""``CompileOptions(precision=...)``: a float model compiled to compute in bf16 / fp16 / fp32, run on the CPU backend.

The trusted reference for a bf16 program is PyTorch's own bf16 model (``model.to(torch.bfloat16)``): both compute in
bf16 and differ from the float32 model by bf16's rounding, so ours must be about as close to float32 as PyTorch's
bf16 is (within a small factor: different accumulation orders and fused ops round differently), keep its top-5
classes, and its inputs and outputs stay float32.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import npu_compiler
import torch_ir
from npu_compiler import CompileError, CompileOptions
from npu_compiler.compiled_program import CompiledProgram
from npu_compiler.passes.precision import cast_precision
from npu_compiler.precision import precision_error
from npu_runtime import Device, Executor, RuntimeInputError, load_weights
from torch_ir.weights import module_state

from ..helpers import assert_topk_match, build_pair, randomize_batch_norm

transformers = pytest.importorskip("transformers")

#: how much further from float32 our bf16/fp16 program may be than PyTorch's own model in that dtype
ORDER_FACTOR = 4.0


def _resnet() -> torch.nn.Module:
    config = transformers.ResNetConfig(embedding_size=32, hidden_sizes=[32, 64, 96, 128], depths=[1, 1, 2, 1],
                                       layer_type="basic", num_labels=100)
    return transformers.ResNetForImageClassification(config)


def _bert() -> torch.nn.Module:
    config = transformers.BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=256, num_labels=10, attn_implementation="eager")
    return transformers.BertForSequenceClassification(config)


def _image() -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))}


def _tokens() -> dict[str, torch.Tensor]:
    mask = torch.ones(1, 24, dtype=torch.long)
    mask[0, 20:] = 0
    return {"input_ids": torch.randint(0, 1000, (1, 24), generator=torch.Generator().manual_seed(1)),
            "attention_mask": mask}


def _compiled(factory, inputs: dict[str, torch.Tensor], precision: str | None, tmp_path):
    meta, real = build_pair(factory)
    randomize_batch_norm(real, seed=1)
    meta_inputs = {k: torch.empty_like(v, device="meta") for k, v in inputs.items()}
    ir = torch_ir.extract_ir(meta, (), example_kwargs=meta_inputs, model_name="m")
    path = tmp_path / f"m_{precision}.npubin"
    npu_compiler.compile(ir, options=CompileOptions(precision=precision)).save(path)
    return ir, CompiledProgram.load(path), real


def _run(program: CompiledProgram, real: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    device = Device()
    weights = load_weights(module_state(real), program, device)  # the model's float32 weights, rounded as bound
    out = Executor(program, device).run({k: v.numpy() for k, v in inputs.items()}, weights=weights)
    return torch.from_numpy(out["output"].to_numpy())


def _eager(real: torch.nn.Module, inputs: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    model = copy.deepcopy(real).to(dtype)
    cast = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        return model(**cast).logits.float()


@pytest.mark.parametrize("factory,inputs", [(_resnet, _image), (_bert, _tokens)], ids=["resnet", "bert"])
@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_program_computes_in_the_precision(factory, inputs, precision, dtype, tmp_path):
    x = inputs()
    ir, program, real = _compiled(factory, x, precision, tmp_path)
    wanted = {"bf16": "bfloat16", "fp16": "float16"}[precision]
    assert [s.dtype for s in program.output_specs] == ["float32"]  # the interface keeps its dtypes
    assert [s.dtype for s in program.input_specs] == [t.dtype for t in ir.graph_inputs]
    floats = {s.name for s in program.weight_specs if s.dtype != "int64"}  # BERT's position/token-type ids stay
    assert {s.dtype for s in program.weight_specs if s.name in floats} == {wanted}
    assert program.metadata["precision"]["dtype"] == wanted
    assert set(program.metadata["precision"]["weights"]) == floats

    ours = _run(program, real, x)
    with torch.no_grad():
        fp32 = real(**x).logits
    theirs = _eager(real, x, dtype)
    their_error = float((theirs - fp32).abs().max())
    our_error = float((ours - fp32).abs().max())
    assert 0 < our_error <= ORDER_FACTOR * their_error + 1e-6, (our_error, their_error)
    assert_topk_match(ours, fp32, k=5, atol=ORDER_FACTOR * their_error)


def test_fp32_of_a_float32_model_is_the_model(tmp_path):
    x = _image()
    _, program, real = _compiled(_resnet, x, "fp32", tmp_path)
    assert program.metadata["precision"] == {"precision": "fp32", "dtype": "float32", "weights": {}}
    with torch.no_grad():
        torch.testing.assert_close(_run(program, real, x), real(**x).logits, rtol=1e-4, atol=1e-4)


def test_fp32_of_a_bf16_model_upcasts_it(tmp_path):
    """A bf16 model compiled at fp32 computes in float32 from its bf16 weights: PyTorch's ``model.float()``."""
    meta, real = build_pair(lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                                        torch.nn.Linear(32, 8)))
    meta, real = meta.to(torch.bfloat16), real.to(torch.bfloat16)
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    ir = torch_ir.extract_ir(meta, (torch.empty_like(x, device="meta"),), model_name="mlp")
    program = npu_compiler.compile(ir, options=CompileOptions(precision="fp32"))
    assert {s.dtype for s in program.weight_specs} == {"float32"}
    assert [s.dtype for s in program.input_specs + program.output_specs] == ["bfloat16", "bfloat16"]
    device = Device()
    out = Executor(program, device).run({program.input_specs[0].name: x},
                                        weights=load_weights(module_state(real), program, device))
    got = torch.from_numpy(out["output"].to_numpy())
    with torch.no_grad():
        want = copy.deepcopy(real).float()(x.float()).to(torch.bfloat16).float()
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_unknown_precision_and_quantized_models_are_refused():
    _, real = build_pair(lambda: torch.nn.Linear(4, 4))
    ir = torch_ir.extract_ir(real, (torch.randn(1, 4),), model_name="lin", allow_real_weights=True)
    with pytest.raises(CompileError, match=r"precision='int8'.*'fp32', 'bf16', 'fp16'"):
        npu_compiler.compile(ir, options=CompileOptions(precision="int8"))
    quantized = dataclasses.replace(ir, nodes=[dataclasses.replace(n, op_type="QUANTIZE") for n in ir.nodes[:1]]
                                    + ir.nodes[1:])
    with pytest.raises(CompileError, match="quantized.*without a precision"):
        cast_precision(quantized, "bf16")


def test_weights_of_another_dtype_than_recorded_are_still_refused(tmp_path):
    x = _image()
    _, program, real = _compiled(_resnet, x, "bf16", tmp_path)
    state = {k: v.double() for k, v in module_state(real).items()}  # float64: not the dtype the program recorded
    with pytest.raises(RuntimeInputError, match="dtype float64, the program expects bfloat16"):
        load_weights(state, program, Device())
    hostile = copy.deepcopy(program)
    hostile.metadata["precision"]["weights"] = {s.name: "int64" for s in program.weight_specs}
    ints = {k: torch.zeros_like(v, dtype=torch.int64) for k, v in module_state(real).items()}
    with pytest.raises(RuntimeInputError, match="dtype int64, the program expects bfloat16"):
        load_weights(ints, hostile, Device())  # never an integer turned into values by a program's say-so


def test_precision_error_is_measured_and_kept_in_the_program(tmp_path):
    x = _image()
    ir, program, real = _compiled(_resnet, x, "bf16", tmp_path)
    error = precision_error(ir, "bf16", module_state(real), [x["pixel_values"]])
    (out,) = error.outputs
    with torch.no_grad():
        fp32 = real(**x).logits
    their_error = float((_eager(real, x, torch.bfloat16) - fp32).abs().max())
    assert 0 < out.max_abs <= ORDER_FACTOR * their_error
    assert out.rel == pytest.approx(out.max_abs / float(fp32.abs().max()), rel=1e-3)
    assert 0.99 < out.cosine <= 1.0 and out.top1 == 1.0
    assert precision_error(ir, "fp32", module_state(real), [x["pixel_values"]]).outputs[0].max_abs == 0.0


class _Positions(torch.nn.Module):
    """A value made from integers alone (``sin`` of positions) added to a linear layer's output."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + torch.sin(pos.float())[:, None]


def test_values_made_from_integers_stay_float32_until_they_meet_the_precision(tmp_path):
    meta, real = build_pair(_Positions)
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(4))
    pos = torch.tensor([3, 257, 301, 999, 1001, 4093])  # no bf16 number past 256 is odd: sin would be far off
    ir = torch_ir.extract_ir(meta, (torch.empty_like(x, device="meta"), torch.empty_like(pos, device="meta")),
                             model_name="positions")
    program = npu_compiler.compile(ir, options=CompileOptions(precision="bf16"))
    device = Device()
    out = Executor(program, device).run({"x": x.numpy(), "pos": pos.numpy()},
                                        weights=load_weights(module_state(real), program, device))
    with torch.no_grad():
        want = real(x, pos)
        lin_error = (copy.deepcopy(real.lin).to(torch.bfloat16)(x.to(torch.bfloat16)).float() - real.lin(x)).abs()
    bound = 2 * float(lin_error.max()) + 2 ** -7 * 2  # bf16 rounding of the linear layer and of the sum
    assert float((torch.from_numpy(out["output"].to_numpy()) - want).abs().max()) <= bound
    sins = [n for n in program.ir["nodes"] if "sin" in n["op_type"]]  # the embedded IR: sin still in float32
    assert sins and all(t["dtype"] == "float32" for n in sins for t in [*n["inputs"], *n["outputs"]])


def test_cli_compiles_at_a_precision_and_reports_its_error(tmp_path, capsys):
    from npu_tools.cli import main

    out = tmp_path / "residual.npubin"
    assert main(["compile", "residual", "--precision", "bf16", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "precision: bf16 (weights and activations in bfloat16" in text
    assert "error against fp32 (the model's example inputs, seeded weights):" in text
    program = CompiledProgram.load(out)
    (error,) = program.metadata["precision"]["error"]["outputs"]
    assert 0 < error["max_abs"] and error["rel"] < 0.05  # kept in the file, read back
    assert "error against fp32" in program.summary()

    ir_file = tmp_path / "residual.json"
    assert main(["extract", "residual", "-o", str(ir_file)]) == 0
    capsys.readouterr()
    assert main(["compile", str(ir_file), "--precision", "fp16", "-o", str(tmp_path / "r16.npubin")]) == 0
    assert "not measured (an IR file carries no weights: give --weights FILE" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["compile", "residual", "--precision", "int4"])
    assert exit_.value.code == 2 and "--precision: invalid choice: 'int4'" in capsys.readouterr().err


def test_cli_precision_error_fills_inputs_without_an_example(tmp_path, monkeypatch, capsys):
    """A nested keyword example (``extra={"a": ..., "b": ...}``) becomes graph inputs ``extra_a``/``extra_b`` that no
    example names: the error is measured with seeded values for them, and the summary says so (it used to pass None
    to the reference executor and fail)."""
    from npu_tools.cli import main

    (tmp_path / "nested_model.py").write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.lin = torch.nn.Linear(8, 8)\n"
        "    def forward(self, x, extra):\n"
        "        return self.lin(x) + extra['a'] * extra['b']\n"
        "def make():\n"
        "    return M(), (torch.randn(2, 8),), {'extra': {'a': torch.randn(2, 8), 'b': torch.randn(2, 8)}}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["compile", "nested_model:make", "--precision", "bf16", "-o", str(tmp_path / "m.npubin")]) == 0
    text = capsys.readouterr().out
    assert "seeded values (--seed 0) for inputs without an example" in text
    (error,) = CompiledProgram.load(tmp_path / "m.npubin").metadata["precision"]["error"]["outputs"]
    assert 0 < error["max_abs"] and error["cosine"] > 0.999
