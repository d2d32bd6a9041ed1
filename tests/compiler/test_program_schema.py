"""The program schema of ``npu_program``: the one generic dataclass<->JSON codec, state slots in the file and
in the checker, the 1.0 file format still loading, and the re-exports that keep the seeds' import paths."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import npu_compiler
import torch_ir
from npu_program import npubin
from npu_program.check import check_program
from npu_program.codec import SchemaError, from_json, to_json
from npu_program.program import CompiledProgram, Dispatch, MemoryPlan, StateSpec, TensorSpec
from npu_runtime import Device, Executor, load_weights

DATA = Path(__file__).parent / "data"


# ------------------------------------------------------------------------------------------------ codec


@dataclass
class Inner:
    n: int
    x: float = 0.5


@dataclass
class Outer:
    name: str
    flags: list[bool]
    inner: Inner
    table: dict[str, Inner] = field(default_factory=dict)
    maybe: int | None = None
    anything: Any = None
    hidden: bytes = field(default=b"", metadata={"json": False})


def test_codec_round_trips_nested_dataclasses() -> None:
    value = Outer("a", [True, False], Inner(3), {"k": Inner(1, 2.0)}, None, {"free": [1, "x"]})
    data = to_json(value)
    assert data == {"name": "a", "flags": [True, False], "inner": {"n": 3, "x": 0.5},
                    "table": {"k": {"n": 1, "x": 2.0}}, "maybe": None, "anything": {"free": [1, "x"]}}
    assert from_json(Outer, data) == value
    # a float field takes a JSON integer (JSON has one number type) and keeps it a float
    assert from_json(Inner, {"n": 1, "x": 2}).x == 2.0


@pytest.mark.parametrize(("data", "message"), [
    ({"name": "a", "flags": [], "inner": {"n": 1.0}}, r"top\.inner\.n: expected int, got float"),
    ({"name": "a", "flags": [], "inner": {"n": "1"}}, r"top\.inner\.n: expected int, got string"),
    ({"name": "a", "flags": [], "inner": {"n": True}}, r"top\.inner\.n: expected int, got bool"),
    ({"name": "a", "flags": [1], "inner": {"n": 1}}, r"top\.flags\[0\]: expected bool, got int"),
    ({"name": "a", "flags": [], "inner": {"n": 1, "x": False}}, r"top\.inner\.x: expected float, got bool"),
    ({"name": None, "flags": [], "inner": {"n": 1}}, r"top\.name: expected string, got null"),
    ({"name": "a", "flags": [], "inner": {"n": 1}, "extra": 1}, r"top: unknown field 'extra'"),
    ({"name": "a", "flags": []}, r"top lacks required field 'inner'"),
    ({"name": "a", "flags": [], "inner": {"n": 1}, "table": {"k": {"n": 2, "y": 1}}},
     r"top\.table\['k'\]: unknown field 'y'"),
    ({"name": "a", "flags": [], "inner": {"n": 1}, "maybe": 1.5}, r"top\.maybe: expected int, got float"),
    ({"name": "a", "flags": {}, "inner": {"n": 1}}, r"top\.flags: expected array, got object"),
    ([], r"top: expected object \(Outer\), got array"),
])
def test_codec_is_strict_and_names_the_field(data, message) -> None:
    with pytest.raises(SchemaError, match=message):
        from_json(Outer, data, "top")


def test_codec_refuses_json_for_a_skipped_field_and_duplicate_keys() -> None:
    with pytest.raises(SchemaError, match="unknown field 'hidden'"):
        from_json(Outer, {"name": "a", "flags": [], "inner": {"n": 1}, "hidden": "x"})
    data = to_json(stateful_program())
    assert [t["name"] for t in data["tensors"]] == ["x", "y"]  # a keyed dict is stored as a list, in order
    data["tensors"].append(dict(data["tensors"][0]))
    with pytest.raises(SchemaError, match=r"header\.tensors\[2\]: duplicate name 'x'"):
        from_json(CompiledProgram, data, "header")


def test_program_classes_have_no_hand_written_codecs() -> None:
    for cls in (TensorSpec, StateSpec, Dispatch, MemoryPlan, CompiledProgram):
        assert not hasattr(cls, "to_dict") and not hasattr(cls, "from_dict"), cls


# ------------------------------------------------------------------------------------------------ state slots


def stateful_program(**state: Any) -> CompiledProgram:
    """out = acc + x, written into the state slot acc: the state accumulates across runs."""
    x = TensorSpec("x", [4], "float32")
    y = TensorSpec("y", [4], "float32")
    slot = StateSpec("acc", [4], "float32", **state)
    return CompiledProgram(
        model_name="accumulate", target="cpu", input_specs=[x], output_specs=[y], weight_specs=[], weight_keys={},
        tensors={"x": x, "y": y},
        dispatches=[Dispatch("aten.add.Tensor", "add", ["acc", "x"], ["acc"]),
                    Dispatch("aten.mul.Tensor", "copy", ["acc", "x"], ["y"])],
        memory=MemoryPlan(arena_bytes=128, offsets={"x": 0, "y": 64}, no_reuse_bytes=128),
        state_specs=[slot])


def test_state_specs_round_trip_through_the_file(tmp_path) -> None:
    program = stateful_program(shared_key="kv.0")
    program.save(tmp_path / "s.npubin")
    loaded = CompiledProgram.load(tmp_path / "s.npubin")
    assert loaded == program
    assert loaded.state_specs == [StateSpec("acc", [4], "float32", "zeros", "kv.0")]
    assert "state: 1 slots, 16 bytes" in loaded.summary()


def test_the_checker_accepts_writes_to_state_slots_only() -> None:
    check_program(stateful_program(), kernels={"aten.add.Tensor", "aten.mul.Tensor"})
    program = stateful_program()
    program.dispatches[0].outputs = ["nowhere"]
    with pytest.raises(npubin.NpubinError, match="uses tensor 'nowhere', which has no spec"):
        check_program(program)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda p: setattr(p.state_specs[0], "shape", [1 << 40, 1 << 20]), "state slot 'acc'"),
    (lambda p: setattr(p.state_specs[0], "dtype", "float99"), "state slot 'acc'"),
    (lambda p: setattr(p.state_specs[0], "init", "random"), "initial value 'random'"),
    (lambda p: setattr(p.state_specs[0], "name", "x"), "name of another slot or tensor"),
    (lambda p: p.state_specs.append(StateSpec("acc2", [4], "float32", shared_key="acc")), "share the key"),
    (lambda p: p.state_specs.extend(StateSpec(f"s{i}", [1 << 28], "float32") for i in range(40)),
     "state slots together"),
])
def test_the_checker_refuses_bad_state_specs(edit, message) -> None:
    program = stateful_program()
    edit(program)
    with pytest.raises(npubin.NpubinError, match=message):
        check_program(program)


def test_the_checker_refuses_a_kernel_the_backend_lacks() -> None:
    with pytest.raises(npubin.NpubinError, match="names kernel 'aten.mul.Tensor'"):
        check_program(stateful_program(), kernels={"aten.add.Tensor"})


# ------------------------------------------------------------------------------------------------ old files


class Small(nn.Module):
    """The model tests/compiler/data/v1_0_small.npubin was compiled from (format 1.0, before state slots)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x))) + 1.0


def test_a_format_1_0_file_still_loads_and_runs_equal_to_eager() -> None:
    path = DATA / "v1_0_small.npubin"
    assert path.read_bytes()[8:12] == b"\x01\x00\x00\x00"  # major 1, minor 0
    program = CompiledProgram.load(path)
    assert program.state_specs == []
    model = Small()
    model.load_state_dict(load_file(DATA / "v1_0_small.safetensors"))
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    device = Device()
    weights = load_weights(DATA / "v1_0_small.safetensors", program, device)
    out = Executor(program, device).run({program.input_specs[0].name: x.numpy()}, weights=weights)
    with torch.no_grad():
        expected = model(x)
    got = torch.from_numpy(out[program.output_specs[0].name].to_numpy())
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


class Tagged(nn.Module):
    """The model tests/compiler/data/v1_3_tagged.npubin was compiled from (format 1.3, by the compiler before typed
    params): its dispatches hold the IR's tagged attributes, ``{"dtype": "float16"}``, ``{"float": "-inf"}``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h = h.masked_fill(h < -0.5, float("-inf"))
        h = torch.softmax(h, dim=-1).to(torch.float16)
        h = h.clamp(max=float("inf")).contiguous(memory_format=torch.contiguous_format)
        return (h.to(torch.float32) * 2.0).sum(dim=-1, keepdim=True)


def _run(program: CompiledProgram, weights: Path, x: torch.Tensor) -> torch.Tensor:
    device = Device()
    out = Executor(program, device).run({program.input_specs[0].name: x.numpy()},
                                        weights=load_weights(weights, program, device))
    return torch.from_numpy(out[program.output_specs[0].name].to_numpy())


def test_a_format_1_3_file_with_tagged_params_loads_upgraded_and_runs_as_before() -> None:
    """A 1.x file's params are the IR's attributes verbatim; the reader upgrades them, in one place, to the plain
    params the kernel records declare, and the program gives the numbers a fresh compile gives, bit for bit."""
    path = DATA / "v1_3_tagged.npubin"
    assert path.read_bytes()[8:12] == b"\x01\x00\x03\x00"  # major 1, minor 3
    program = CompiledProgram.load(path)
    params = {d.kernel: d.params for d in program.dispatches}
    assert params["aten.masked_fill.Scalar"] == {"value": float("-inf")}
    assert params["aten.clamp.default"] == {"min": None, "max": float("inf")}
    assert params["aten._to_copy.default"] == {"dtype": "float32", "layout": None, "device": None,
                                               "pin_memory": None, "non_blocking": False, "memory_format": None}
    assert params["GEMM"] == {"trans_a": False, "trans_b": True, "has_bias": True, "has_residual": False,
                              "activation": None, "x_int8_group": None}  # a parameter added since: its default
    # the upgraded program is the one the compiler makes today, and saves as a 2.0 file that reads back the same
    with torch.device("meta"):
        meta = Tagged()
    fresh = npu_compiler.compile(torch_ir.extract_ir(meta, (torch.randn(2, 8, device="meta"),),
                                                     model_name="v1_3_tagged"))
    assert [(d.kernel, d.params) for d in fresh.dispatches] == [(d.kernel, d.params) for d in program.dispatches]
    again = npubin.decode_npubin(npubin.encode_npubin(program))
    assert again.dispatches == program.dispatches
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    got = _run(program, DATA / "v1_3_tagged.safetensors", x)
    assert torch.equal(got, _run(fresh, DATA / "v1_3_tagged.safetensors", x))
    model = Tagged()
    model.load_state_dict(load_file(DATA / "v1_3_tagged.safetensors"))
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=1e-3, atol=1e-3)


def test_the_runtime_does_not_import_the_compiler() -> None:
    code = ("import sys\nfrom npu_runtime import Device, Executor, load_weights, State\n"
            "from npu_program.program import CompiledProgram\n"
            f"p = CompiledProgram.load({str(DATA / 'v1_0_small.npubin')!r})\n"
            "Executor(p, Device())\n"
            "print(sorted(m for m in sys.modules if m.startswith('npu_compiler')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
