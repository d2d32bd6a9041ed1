"""Messages a new user meets in the first hour (issue 26, item 9): what a file is, the closest zoo name, a
short weights summary, every kernel kind counted, and no output written before a later one is known to fail."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import npu_compiler
import torch_ir
from npu_runtime import Device, RuntimeInputError, load_weights
from npu_tools.cli import main
from torch_ir.fileio import file_kind


@pytest.mark.parametrize(("name", "writer", "kind"), [
    ("w.safetensors", lambda p: torch_ir.save_weights({"a": torch.ones(2)}, p), "a safetensors weights file"),
    ("a.npy", lambda p: np.save(p, np.zeros(3)), "a numpy array"),
    ("a.npz", lambda p: np.savez(p, a=np.zeros(3)), "a zip archive"),
])
def test_an_ir_command_given_another_kind_of_file_says_what_it_is(tmp_path, capsys, name, writer, kind):
    path = tmp_path / name
    writer(path)
    assert kind in file_kind(path.read_bytes())
    for command in ("inspect", "compile"):
        assert main([command, str(path)]) == 2
        err = capsys.readouterr().err
        assert f"is {kind}" in err and "UTF-8" not in err and len(err.splitlines()) == 1


def test_a_program_given_as_an_ir_is_named(tmp_path, capsys):
    program = tmp_path / "p.npubin"
    program.write_bytes(b"NPUBIN\0\0" + bytes(64))
    assert main(["inspect", str(program)]) == 2
    assert "is a compiled program (.npubin)" in capsys.readouterr().err


def test_a_zoo_typo_suggests_the_closest_name(capsys):
    assert main(["extract", "resnt", "-o", "x.json"]) == 2
    assert "did you mean 'resnet'?" in capsys.readouterr().err


def test_no_output_is_written_when_a_later_one_cannot_be(tmp_path, monkeypatch, capsys):
    """``extract -o r.json --save-weights /proc/x.safetensors`` wrote r.json, then failed: /proc takes no new files
    although ``os.access`` says root may write there. The directory is now probed before anything is built."""
    monkeypatch.chdir(tmp_path)
    assert main(["extract", "mlp", "-o", "r.json", "--save-weights", "/proc/x.safetensors"]) == 2
    err = capsys.readouterr().err
    assert "/proc" in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_weights_of_another_model_are_a_short_summary(tmp_path, monkeypatch):
    for name in ("resnet", "mlp"):
        assert main(["extract", name, "-o", str(tmp_path / f"{name}.json"),
                     "--save-weights", str(tmp_path / f"{name}.safetensors")]) == 0
    program = npu_compiler.compile(torch_ir.load_ir(tmp_path / "resnet.json"))
    with pytest.raises(RuntimeInputError) as info:
        load_weights(tmp_path / "mlp.safetensors", program, Device())
    message = str(info.value)
    assert "these are the weights of another model" in message and "... 39 more" in message
    assert len(message) < 900 and "TORCH_IR_FULL_ERRORS=1" in message
    monkeypatch.setenv("TORCH_IR_FULL_ERRORS", "1")
    with pytest.raises(RuntimeInputError) as info:
        load_weights(tmp_path / "mlp.safetensors", program, Device())
    full = str(info.value)
    assert "more" not in full and full.count(" (float32[") == len(program.weight_specs)


def test_the_compile_summary_counts_every_kernel_kind(tmp_path):
    assert main(["extract", "resnet", "-o", str(tmp_path / "r.json")]) == 0
    program = npu_compiler.compile(torch_ir.load_ir(tmp_path / "r.json"))
    line = next(x for x in program.summary().splitlines() if x.startswith("dispatches:"))
    kinds = program.kernel_histogram()
    listed = line.count(",") + 1
    assert listed == len(kinds) or f"… {len(kinds) - 12} more" in line
    assert sum(kinds.values()) == program.dispatch_count


def test_compile_binds_a_dynamic_batch_and_names_the_program(tmp_path, capsys):
    """An IR exported with a dynamic batch was refused with one line per node and the advice to run it on the
    CPU; ``--bind``/``--input-shape`` fix the symbols, and the refusal says so, once."""
    ir_path, out = tmp_path / "m.json", tmp_path / "m.npubin"
    assert main(["extract", "mlp", "-o", str(ir_path)]) == 0
    capsys.readouterr()
    assert main(["compile", str(ir_path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--bind batch=1" in err and "--input-shape x=1,16" in err
    assert not out.exists()
    assert main(["compile", str(ir_path), "-o", str(out), "--bind", "batch=2", "--name", "my_mlp"]) == 0
    program = npu_compiler.CompiledProgram.load(out)
    assert program.model_name == "my_mlp" and program.input_specs[0].shape == [2, 16]
    assert main(["compile", str(ir_path), "-o", str(out), "--input-shape", "x=4,16"]) == 0
    assert npu_compiler.CompiledProgram.load(out).input_specs[0].shape == [4, 16]
    for bad, rule in [(["--bind", "batch=x"], "--bind 'batch=x'"), (["--bind", "batch=1000"], "outside the range")]:
        capsys.readouterr()
        assert main(["compile", str(ir_path), "-o", str(out), *bad]) == 2
        assert rule in capsys.readouterr().err


def test_command_line_errors_speak_of_flags_not_python_arguments(tmp_path, capsys):
    """The same error raised in Python names ``weights=``; on the command line it names ``--weights``."""
    ir_path = tmp_path / "m.json"
    assert main(["extract", "convnet", "-o", str(ir_path)]) == 0
    capsys.readouterr()
    assert main(["bisect", str(ir_path)]) == 2
    err = capsys.readouterr().err
    assert "--weights FILE" in err and "weights=" not in err
    (tmp_path / "model.txt").write_text("x")
    assert main(["bisect", str(tmp_path / "model.txt")]) == 2
    err = capsys.readouterr().err
    assert "(with --weights)" in err and "weights=" not in err and "NPU_IR" not in err
    from npu_tools.debug.sources import SubjectError, load_subject

    with pytest.raises(SubjectError, match=r"with weights="):
        load_subject(str(tmp_path / "model.txt"))
