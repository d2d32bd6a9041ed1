"""One meaning per flag (issue 26, item 8): every subcommand's options parsed, each shared flag declared by
``npu_tools.cli_options`` (its help begins with the one meaning), old spellings working with a warning."""

from __future__ import annotations

import argparse

import pytest

from npu_tools import cli_options
from npu_tools.cli import build_parser, main


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def options_of(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: a for a in p._actions for flag in a.option_strings}


def test_every_shared_flag_has_its_one_meaning_in_every_command():
    wrong = []
    for name, p in subcommands().items():
        for flag, action in options_of(p).items():
            meaning = cli_options.MEANINGS.get(flag)
            if meaning is None or action.help == argparse.SUPPRESS:
                continue  # not a shared flag, or a deprecated alias (tested below)
            if not (action.help or "").startswith(meaning):
                wrong.append(f"{name} {flag}: {action.help!r} (the shared meaning: {meaning!r})")
    assert not wrong, "\n".join(wrong)


def test_weights_always_reads_and_output_is_a_file_or_a_directory_by_its_metavar():
    for name, p in subcommands().items():
        opts = options_of(p)
        if "--weights" in opts and opts["--weights"].help != argparse.SUPPRESS:
            assert opts["--weights"].metavar == "FILE", name
        if "--output" in opts:
            assert opts["--output"].metavar in ("FILE", "DIR"), name
            assert opts["-o"] is opts["--output"], f"{name}: -o and --output are one option"


def test_the_top_help_names_every_subcommand(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    description = text.split("positional arguments")[0]
    missing = [name for name in subcommands() if f"torch-ir {name}" not in description]
    assert not missing, f"the help's list of commands lacks {missing}"


@pytest.mark.parametrize(("argv", "dest", "value", "new"), [
    (["extract", "mlp", "--weights", "w.safetensors"], "save_weights", "w.safetensors", "--save-weights"),
    (["import-onnx", "m.onnx", "--weights", "w.safetensors"], "save_weights", "w.safetensors", "--save-weights"),
    (["bisect", "mlp", "--inputs", "x.npz"], "input", ["x.npz"], "--input"),
])
def test_old_spellings_work_and_warn(argv, dest, value, new, capsys):
    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    err = capsys.readouterr().err
    assert "deprecated" in err and new in err


def test_input_is_one_flag_for_named_arrays_and_archives(tmp_path, capsys):
    """``--input NAME=FILE.npy`` and ``--input FILE.npz`` give the same run; verify takes them too."""
    import numpy as np

    import torch_ir

    ir, weights, program = tmp_path / "m.json", tmp_path / "m.safetensors", tmp_path / "m.npubin"
    assert main(["extract", "convnet", "-o", str(ir), "--save-weights", str(weights)]) == 0
    assert main(["compile", str(ir), "-o", str(program)]) == 0
    graph_input = torch_ir.load_ir(ir).graph_inputs[0]
    name = graph_input.name
    x = np.random.default_rng(1).standard_normal([int(d) for d in graph_input.shape]).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "x.npz", **{name: x})
    outs = []
    for given in ([f"{name}={tmp_path / 'x.npy'}"], [str(tmp_path / "x.npz")]):
        out = tmp_path / f"out{len(outs)}.npz"
        assert main(["run", str(program), "--weights", str(weights), "--input", *given, "-o", str(out)]) == 0
        with np.load(out) as data:
            outs.append({k: data[k] for k in data.files})
    assert outs[0].keys() == outs[1].keys()
    for key in outs[0]:
        np.testing.assert_array_equal(outs[0][key], outs[1][key])
    capsys.readouterr()
    assert main(["verify", "convnet", "--ir", str(ir), "--weights", str(weights), "--input",
                 f"{name}={tmp_path / 'x.npy'}"]) == 0
    assert main(["run", str(program), "--weights", str(weights), "--input", f"nope={tmp_path / 'x.npy'}"]) == 2
    assert "not inputs of the model" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["zoo", "--category", "attention"], ["bisect", "mlp"], ["demo"]])
def test_an_output_directory_is_made_only_in_an_existing_parent(argv, tmp_path, capsys):
    """``-o /nonexistent/x`` used to grow the whole chain of folders; now only the last one is made."""
    missing = tmp_path / "no" / "such" / "dir"
    assert main([*argv, "-o", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "no").exists()


def test_the_readme_demo_runs_in_an_empty_directory(tmp_path, monkeypatch):
    """``torch-ir demo`` with its own default ``-o reports/demo`` makes that path whole (a fresh clone has no
    ``reports/``); only a directory the user names is made one level at most."""
    monkeypatch.chdir(tmp_path)
    assert main(["demo"]) == 0
    assert (tmp_path / "reports" / "demo").is_dir()
