"""torch-ir compile / partition / run / profile, as a user types them."""

from __future__ import annotations

import json

import numpy as np
import torch

from npu_program.program import CompiledProgram
from npu_tools.cli import main
from npu_tools.zoo.runner import resolve_spec


def _extract(tmp_path, model: str):
    ir, weights = tmp_path / f"{model}.json", tmp_path / f"{model}.safetensors"
    assert main(["extract", model, "-o", str(ir), "--save-weights", str(weights)]) == 0
    return ir, weights


def test_compile_run_profile_a_zoo_model(tmp_path, capsys):
    ir, weights = _extract(tmp_path, "resnet")
    program = tmp_path / "resnet.npubin"
    assert main(["compile", str(ir), "-o", str(program)]) == 0
    out = capsys.readouterr().out
    assert "dispatches:" in out and "CONV" in out and "without reuse" in out and program.exists()
    assert any(d.params.get("has_residual") for d in CompiledProgram.load(program).dispatches)  # kernel fusion ran

    spec = resolve_spec("resnet")
    x = spec.kwargs["pixel_values"]
    np.save(tmp_path / "x.npy", x.numpy())
    result = tmp_path / "out.npz"
    assert main(["run", str(program), "--weights", str(weights), "--input", f"pixel_values={tmp_path / 'x.npy'}",
                 "-o", str(result)]) == 0
    assert "top-5 per row" in capsys.readouterr().out
    with torch.no_grad():
        expected = spec.build("cpu")(pixel_values=x).logits.numpy()
    np.testing.assert_allclose(np.load(result)["output"], expected, rtol=1e-4, atol=1e-5)

    profile = tmp_path / "profile.json"
    assert main(["profile", str(program), "--weights", str(weights), "--runs", "2", "--json", str(profile)]) == 0
    table = capsys.readouterr().out
    assert "CONV" in table and "µs/dispatch" in table
    data = json.loads(profile.read_text())
    assert len(data["dispatches"]) == sum(row["count"] for row in data["by_kernel"])


def test_compile_refuses_unsupported_ops_writes_nothing_and_shows_the_placement(tmp_path, capsys):
    (tmp_path / "scan_models.py").write_text(
        "import torch\n"
        "class Scan(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 4)\n"
        "    def forward(self, x):\n"
        "        return torch.erfinv(torch.histc(self.fc(x), bins=4))\n"
        "def scan():\n"
        "    return Scan(), (torch.randn(2, 4),)\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        program = tmp_path / "scan.npubin"
        assert main(["compile", "scan_models:scan", "-o", str(program)]) == 1
        captured = capsys.readouterr()
        assert "aten.histc.default" in captured.err and "aten.erfinv" in captured.err
        assert "nothing written" in captured.err and not program.exists()
        assert "CPU nodes and why" in captured.out
        assert main(["partition", "scan_models:scan", "--json", str(tmp_path / "plan.json")]) == 0
        plan = json.loads((tmp_path / "plan.json").read_text())
        assert plan["totals"]["cpu"]["nodes"] == 2 and plan["totals"]["npu"]["nodes"] == 1
    finally:
        sys.path.remove(str(tmp_path))


def test_run_refuses_a_truncated_program_and_mismatched_weights(tmp_path, capsys):
    ir, weights = _extract(tmp_path, "convnet")
    _, other = _extract(tmp_path, "resnet")
    program = tmp_path / "convnet.npubin"
    assert main(["compile", str(ir), "-o", str(program)]) == 0
    assert main(["run", str(program), "--weights", str(other)]) == 2
    assert "missing" in capsys.readouterr().err
    program.write_bytes(program.read_bytes()[:-10])
    assert main(["run", str(program), "--weights", str(weights)]) == 2
    assert "convnet.npubin" in capsys.readouterr().err
