"""Hostile or malformed weights files and model specs: clear errors, no code run, nothing else read.

Real torch and safetensors files throughout.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

import npu_compiler
import torch_ir
from npu_runtime import Device, load_weights
from npu_runtime.device import RuntimeInputError
from npu_tools.cli import main
from npu_tools.zoo.runner import resolve_spec
from torch_ir.errors import ExtractionError, WeightsMismatchError
from torch_ir.weights import load_state_dict, match_weights, module_state, save_weights

FLOAT8 = getattr(torch, "float8_e4m3fn", None)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x))


@pytest.fixture(scope="module")
def tiny():
    with torch.device("meta"):
        meta = Tiny().eval()
    ir = torch_ir.extract_ir(meta, (torch.randn(2, 4, device="meta"),), model_name="Tiny")
    torch.manual_seed(0)
    return ir, module_state(Tiny().eval()), npu_compiler.compile(ir, target="cpu")


# ------------------------------------------------------------------------------------------ dtypes numpy lacks


@pytest.mark.skipif(FLOAT8 is None, reason="this torch has no float8")
def test_float8_under_an_unused_key_loads(tiny, tmp_path):
    _, state, program = tiny
    path = tmp_path / "w.safetensors"
    save_weights({**state, "extra.scale_f8": torch.ones(8).to(FLOAT8), "extra.u16": torch.ones(2, dtype=torch.uint16)},
                 path)
    weights = load_weights(path, program, Device())
    assert {"extra.scale_f8", "extra.u16"} <= set(weights.unused)
    for slot, key in program.weight_keys.items():
        assert torch.equal(torch.from_numpy(weights[slot].to_numpy()), state[key])
    # the same from a dict
    assert "extra.scale_f8" in load_weights({**state, "extra.scale_f8": torch.ones(8).to(FLOAT8)}, program).unused


@pytest.mark.skipif(FLOAT8 is None, reason="this torch has no float8")
def test_float8_under_a_used_key_is_a_dtype_mismatch(tiny, tmp_path):
    _, state, program = tiny
    path = tmp_path / "w.safetensors"
    save_weights({**state, "fc.weight": state["fc.weight"].to(FLOAT8)}, path)
    with pytest.raises(RuntimeInputError, match="fc.weight: dtype float8_e4m3fn, the program expects float32") as info:
        load_weights(path, program)
    assert str(path) in str(info.value)
    with pytest.raises(WeightsMismatchError, match="fc.weight: dtype float8_e4m3fn, IR expects float32"):
        match_weights(tiny[0], path)


# ------------------------------------------------------------------------------------------ .pt files


@pytest.mark.parametrize("content, kind", [
    ([torch.ones(2), torch.zeros(3)], "a list"),
    (torch.ones(3), "a Tensor"),
    ((torch.ones(2),), "a tuple"),
    (7, "an int"),
])
def test_pt_file_that_is_not_a_state_dict(tiny, tmp_path, content, kind):
    path = tmp_path / "w.pt"
    torch.save(content, path)
    expected = f"{path} holds {kind}, not a state dict (a mapping of names to tensors); save with torch.save"
    with pytest.raises(WeightsMismatchError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_state_dict(path)
    with pytest.raises(RuntimeInputError, match=f"{path} holds {kind}, not a state dict") as info:
        load_weights(path, tiny[2])
    assert "PathLike" not in str(info.value) and "\n" not in str(info.value)


def test_pt_state_dict_with_non_tensor_values(tiny, tmp_path):
    path = tmp_path / "w.pt"
    torch.save({"fc.weight": torch.ones(3, 4), "fc.bias": [1.0, 2.0, 3.0], "step": 5}, path)
    with pytest.raises(WeightsMismatchError, match=r"holds 2 value\(s\) that are not tensors: 'fc.bias' \(a list\), "
                                                   r"'step' \(an int\); a state dict maps names to tensors"):
        load_state_dict(path)
    with pytest.raises(RuntimeInputError, match="not tensors"):
        load_weights(path, tiny[2])
    with pytest.raises(WeightsMismatchError, match=r"weights dict holds 1 value\(s\) that are not tensors"):
        load_state_dict({"a": "not a tensor"})


def test_pt_state_dict_with_non_string_keys(tmp_path):
    path = tmp_path / "w.pt"
    torch.save({0: torch.ones(2)}, path)
    with pytest.raises(WeightsMismatchError, match="key.* that are not names"):
        load_state_dict(path)


def test_weights_path_that_is_a_directory(tiny, tmp_path):
    folder = tmp_path / "w.safetensors"
    folder.mkdir()
    with pytest.raises(WeightsMismatchError, match="is a directory; a weights file is expected"):
        load_state_dict(folder)
    with pytest.raises(RuntimeInputError, match=f"weights path '{folder}' is a directory; a weights file is expected"):
        load_weights(folder, tiny[2])
    with pytest.raises(RuntimeInputError, match="does not exist"):
        load_weights(tmp_path / "missing.safetensors", tiny[2])


def test_not_a_safetensors_file(tiny, tmp_path):
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"\xff" * 64)
    with pytest.raises(RuntimeInputError, match=f"{path}: not a readable safetensors file"):
        load_weights(path, tiny[2])


MARKER_NAME = "pickle_ran_code"


def _side_effect(path: str) -> dict:
    Path(path).write_text("ran")
    return {}


class Exploit:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (_side_effect, (self.marker,))


def test_pt_with_code_in_its_pickle_is_refused_and_never_run(tmp_path):
    marker = tmp_path / MARKER_NAME
    path = tmp_path / "w.pt"
    with open(path, "wb") as f:
        torch.save({"fc.weight": torch.ones(2), "x": Exploit(marker)}, f, pickle_protocol=pickle.DEFAULT_PROTOCOL)
    with pytest.raises(WeightsMismatchError, match="weights_only=True"):
        load_state_dict(path)
    assert not marker.exists()


# ------------------------------------------------------------------------------------------ model specs


def junk_factory():
    return 42


def model_only_factory():
    return Tiny()


def bad_args_factory():
    return Tiny(), torch.randn(2, 4)


def bad_kwargs_factory():
    return Tiny(), (torch.randn(2, 4),), ["not", "a", "dict"]


def raising_factory():
    raise RuntimeError("weights server unreachable")


def exiting_factory():
    raise SystemExit(0)


NOT_CALLABLE = {"a": 1}
HERE = "tests.test_weights_hostile"


@pytest.mark.parametrize("spec, message", [
    (f"{HERE}:junk_factory", f"factory '{HERE}:junk_factory' returned an int (42); expected (model: torch.nn.Module"),
    (f"{HERE}:model_only_factory", "returned a Tiny (Tiny("),
    (f"{HERE}:bad_args_factory", "returned a 2-tuple whose args is a Tensor"),
    (f"{HERE}:bad_kwargs_factory", "returned a 3-tuple whose kwargs is a list"),
    (f"{HERE}:raising_factory", "raised RuntimeError('weights server unreachable')"),
    (f"{HERE}:exiting_factory", f"factory '{HERE}:exiting_factory' raised SystemExit(0)"),
    ("builtins:exit", "factory 'builtins:exit' raised SystemExit(None)"),
    (f"{HERE}:NOT_CALLABLE", "'NOT_CALLABLE' is a dict ({'a': 1}), not callable"),
    ("math:pi", "'pi' is a float (3.14"),
    (f"{HERE}:nothing", "has no attribute 'nothing'"),
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("justaname:", "a spec is 'package.module:factory'"),
])
def test_bad_spec_is_one_line_and_status_2(spec, message, capsys):
    with pytest.raises(ExtractionError) as info:
        resolve_spec(spec)
    assert message in str(info.value) and spec in str(info.value)
    assert main(["extract", spec]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torch-ir extract: error:") and message in err
    assert len(err.strip().splitlines()) == 1, err


def test_help_warns_that_a_spec_runs_code(capsys):
    with pytest.raises(SystemExit):
        main(["extract", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "runs its code" in out and "only use specs you trust" in out


def test_good_spec_still_works():
    spec = resolve_spec("tests.test_writers:tiny_factory")
    assert spec.name == "tiny_factory" and len(spec.args) == 1 and spec.kwargs == {}
    assert isinstance(spec.build("meta"), nn.Module)
