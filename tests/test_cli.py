"""torch-ir, as a user types it: the subcommands, their files, their errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys

from npu_tools.cli import main

SUBCOMMANDS = {"demo", "extract", "inspect", "verify", "zoo", "ops", "normalize", "compile", "partition", "generate",
               "run", "profile", "cost", "bisect", "import-tinygrad", "tinygrad-docs", "import-onnx", "verify-onnx",
               "quantize", "report", "view", "sweep", "sweep-report"}


def test_help_lists_every_subcommand():
    result = subprocess.run([sys.executable, "-m", "npu_tools.cli", "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    listed = re.search(r"\{([\w,-]+)\}", result.stdout)  # argparse's usage line: {demo,extract,...}
    assert listed is not None, result.stdout
    assert set(listed.group(1).split(",")) == SUBCOMMANDS


def test_extract_inspect_verify(tmp_path, capsys):
    ir_path, weights = tmp_path / "mlp.json", tmp_path / "mlp.safetensors"
    assert main(["extract", "mlp", "-o", str(ir_path), "--save-weights", str(weights)]) == 0
    assert "aten.linear.default" in capsys.readouterr().out
    assert json.loads(ir_path.read_text())["model_name"] == "mlp"

    md = tmp_path / "mlp.md"
    assert main(["inspect", str(ir_path), "--text", "--mermaid", "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    assert "flowchart" in out and "graph mlp(" in out
    assert "```mermaid" in md.read_text()

    assert main(["verify", "mlp", "--ir", str(ir_path), "--weights", str(weights)]) == 0
    assert "PASS" in capsys.readouterr().out


def test_module_factory_spec(tmp_path, capsys):
    (tmp_path / "my_models.py").write_text(
        "import torch\n"
        "def tiny():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh()), (torch.randn(2, 3),)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        assert main(["verify", "my_models:tiny"]) == 0
        assert main(["extract", "my_models:tiny", "-o", str(tmp_path / "tiny.json")]) == 0
    finally:
        sys.path.remove(str(tmp_path))
    assert "aten.tanh.default" in capsys.readouterr().out


def test_zoo_lists_and_reports(tmp_path, capsys):
    assert main(["zoo", "--list"]) == 0
    listing = capsys.readouterr().out
    assert "convnet" in listing and "bert" in listing
    assert main(["zoo", "--category", "shared", "--output", str(tmp_path)]) == 0
    assert "| shared_linear | shared |" not in capsys.readouterr().out  # linked to its report
    summary = (tmp_path / "summary.md").read_text()
    assert "[shared_linear](shared_linear.md)" in summary and "PASSED" in summary
    assert (tmp_path / "tied_lm.md").is_file() and (tmp_path / "tied_lm.json").is_file()


def test_bad_files_give_one_line_and_status_2(tmp_path, capsys):
    bad = tmp_path / "broken.json"
    bad.write_text('{"ir_version": "1.0", "model_name": "x", "graph_inputs": [')
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("torch-ir inspect: error:") and "broken.json: not valid JSON" in err
    assert main(["inspect", str(tmp_path / "missing.json")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_unknown_model_and_bad_factory_are_named(capsys):
    assert main(["extract", "nope"]) == 2
    assert "no zoo model named 'nope'" in capsys.readouterr().err
    assert main(["verify", "no_such_module:factory"]) == 2
    assert "cannot load model factory 'no_such_module:factory'" in capsys.readouterr().err


def test_demo_runs_the_whole_pipeline(tmp_path, capsys):
    assert main(["demo", "--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for stage in ("1. extract on meta", "2. verify against eager", "3. normalize", "4. compile",
                  "5. run the program", "6. profile"):
        assert stage in out
    assert "PASSED, max abs error" in out and "equal to eager" in out and "demo PASSED" in out
    assert {p.suffix for p in tmp_path.iterdir()} == {".json", ".md", ".mmd", ".npubin", ".safetensors"}
