"""Non-persistent buffers and compiled programs: ``load_weights`` with a model's own ``state_dict()``.

No state dict or checkpoint holds a buffer registered with ``persistent=False`` (BERT's ``position_ids``). The
program carries the IR's recipes for them, so the model's own state dict loads; without a recipe (a model built
under a bare ``torch.device("meta")``) ``load_weights`` names them as such, as the IR executor does.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import npu_compiler
import torch_ir
from npu_program.npubin import NpubinError
from npu_program.program import CompiledProgram
from npu_runtime import Device, Executor, RuntimeInputError, load_weights
from npu_tools.cli import main


class Ramp(torch.nn.Module):
    """A linear layer plus a slice of a non-persistent ``arange`` buffer of 1.2 MB: over the size the compiler
    embeds as a constant, so it stays a weight slot that ``load_weights`` must rebuild."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("table", torch.arange(300_000, dtype=torch.float32).reshape(1, -1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.table[:, :4]


def _program(build_context) -> CompiledProgram:
    with build_context:
        model = Ramp().eval()
    return npu_compiler.compile(torch_ir.extract_ir(model, (torch.randn(2, 4),)))


def test_a_large_buffer_is_rebuilt_from_the_recipe_the_program_carries(tmp_path):
    program = _program(torch_ir.build_on_meta())
    assert program.metadata["non_persistent_buffers"]["table"]["arange"] == {"start": 0, "end": 300000, "step": 1}
    program.save(tmp_path / "ramp.npubin")
    program = CompiledProgram.load(tmp_path / "ramp.npubin")
    real = Ramp().eval()
    assert "table" not in real.state_dict()
    device = Device()
    weights = load_weights(real.state_dict(), program, device)
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    (out,) = Executor(program, device).run({program.input_specs[0].name: x}, weights=weights).values()
    with torch.no_grad():
        expected = real(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out.to_numpy(), expected, rtol=1e-6, atol=1e-6)


def test_a_buffer_without_a_recipe_is_named_as_a_buffer():
    program = _program(torch.device("meta"))  # the buffer's values are unknown: no recipe
    assert program.metadata["non_persistent_buffers"] == {"table": None}
    with pytest.raises(RuntimeInputError) as caught:
        load_weights(Ramp().state_dict(), program, Device())
    message = str(caught.value)
    assert "missing non-persistent buffers (1): table (float32[1, 300000])" in message
    assert "persistent=False" in message and "build_on_meta()" in message
    assert "another model" not in message and "the model the program was compiled from" not in message
    assert "torch-ir" in caught.value.cli
    load_weights(Ramp(), program, Device())  # the module holds every buffer: the fix the message gives


def test_run_names_the_missing_buffer(tmp_path, capsys):
    program = _program(torch.device("meta"))
    program.save(tmp_path / "ramp.npubin")
    torch_ir.save_weights(Ramp().state_dict(), tmp_path / "ramp.safetensors")
    np.save(tmp_path / "x.npy", np.zeros((2, 4), np.float32))
    assert main(["run", str(tmp_path / "ramp.npubin"), "--weights", str(tmp_path / "ramp.safetensors"),
                 "--input", f"{program.input_specs[0].name}={tmp_path / 'x.npy'}"]) == 2
    err = capsys.readouterr().err
    assert "missing non-persistent buffers" in err and "extract and compile the model again" in err


@pytest.mark.parametrize(("recipes", "rule"), [
    ({"table": {"exec": "import os", "dtype": "float32", "shape": [1, 300000]}}, "exactly one of arange, fill"),
    ({"table": {"fill": 0, "dtype": "float32", "shape": [1, 4]}}, "its weight slot"),
    ({"lin.weight.x": None}, "no weight slot's key"),
    ({"table": {"arange": {"start": 0, "end": 1, "step": 0}, "dtype": "float32", "shape": [1, 300000]}},
     "must not be 0"),
    ([1, 2], "expected an object"),
])
def test_a_hostile_recipe_is_refused_when_the_file_is_loaded(tmp_path, recipes, rule):
    program = _program(torch_ir.build_on_meta())
    program.metadata["non_persistent_buffers"] = recipes
    program.save(tmp_path / "hostile.npubin")
    with pytest.raises(NpubinError, match=rule):
        CompiledProgram.load(tmp_path / "hostile.npubin")
