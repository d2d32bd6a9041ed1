"""Cost-model report files (``cost.csv``, ``roofline.png`` or its SVG fallback, ``report.html``) and the ``cost``
subcommand."""

from __future__ import annotations

import argparse
import base64
import csv
import dataclasses
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler.costmodel import CSV_COLUMNS, HardwareError, cost_program, load_hardware
from npu_compiler.costmodel import report as report_module
from npu_compiler.costmodel.report import write_reports
from npu_compiler.costmodel.roofline import roofline_points
from npu_tools.commands.cost import add_parser
from torch_ir.errors import OutputWriteError

PRESET = "edge_4tops"
SVG_NS = "{http://www.w3.org/2000/svg}"


class ConvLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


@pytest.fixture(scope="module")
def ir() -> torch_ir.NPU_IR:
    with torch.device("meta"):
        model = ConvLinear()
    return torch_ir.extract_ir(model, (torch.empty(1, 3, 8, 8, device="meta"),))


@pytest.fixture(scope="module")
def program(ir: torch_ir.NPU_IR) -> npu_compiler.CompiledProgram:
    return npu_compiler.compile(ir)


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_write_reports_png(program: npu_compiler.CompiledProgram, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from PIL import Image

    hw = load_hardware(PRESET)
    report = cost_program(program, hw)
    paths = write_reports(report, hw, tmp_path)
    assert [p.name for p in paths] == ["cost.csv", "roofline.png", "report.html"]
    png = (tmp_path / "roofline.png").read_bytes()
    assert png.startswith(PNG_MAGIC)
    with Image.open(tmp_path / "roofline.png") as image:
        assert image.size[0] > 400 and image.size[1] > 300
    html = (tmp_path / "report.html").read_text()
    inline = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(inline) == 1 and base64.b64decode(inline[0]) == png  # the page carries the same plot, no link
    assert "<svg" not in html and 'src="roofline' not in html
    assert f"{report.latency_ms:.3f} ms" in html


def test_png_takes_hostile_names_as_text(program: npu_compiler.CompiledProgram, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    hw = load_hardware(PRESET)
    report = cost_program(program, hw)
    report.model_name = r"$\undefinedmacro{x}$ <b>"  # mathtext that would not parse, and markup
    write_reports(report, hw, tmp_path)
    assert (tmp_path / "roofline.png").read_bytes().startswith(PNG_MAGIC)
    assert "<b>" not in (tmp_path / "report.html").read_text()


def test_write_reports(program: npu_compiler.CompiledProgram, tmp_path: Path) -> None:
    """The SVG fallback (what is written without matplotlib)."""
    hw = load_hardware(PRESET)
    report = cost_program(program, hw)
    assert report.rows
    paths = write_reports(report, hw, tmp_path, png=False)
    assert [p.name for p in paths] == ["cost.csv", "roofline.svg", "report.html"]

    with open(tmp_path / "cost.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == CSV_COLUMNS
        rows = list(reader)
    assert [r["name"] for r in rows] == [r.name for r in report.rows]

    root = ET.parse(tmp_path / "roofline.svg").getroot()
    assert root.tag == SVG_NS + "svg"
    plotted = [r for r in report.rows if r.flops > 0 and r.dram_bytes > 0]
    assert plotted and len(roofline_points(report, hw)) == len(plotted)
    assert len(root.findall(f".//{SVG_NS}circle")) == len(plotted)

    html = (tmp_path / "report.html").read_text()
    assert f"{report.latency_ms:.3f} ms" in html
    assert "<svg" in html
    assert html.count("<html") == 1
    for r in report.rows:
        assert r.name in html


def test_untrusted_names_are_escaped(program: npu_compiler.CompiledProgram, tmp_path: Path) -> None:
    hw = load_hardware(PRESET)
    report = cost_program(program, hw)
    evil = "<script>alert(1)</script>"
    report.rows[0] = dataclasses.replace(report.rows[0], name=evil, layer=evil, kernel=evil)
    report.model_name = evil
    write_reports(report, hw, tmp_path, png=False)
    for name in ("roofline.svg", "report.html"):
        text = (tmp_path / name).read_text()
        if name == "report.html":  # the page's one script is the table sorter, which builds no markup
            assert text.count(report_module.SORT_SCRIPT) == 1
            text = text.replace(report_module.SORT_SCRIPT, "")
        assert "<script" not in text
        assert "&lt;script&gt;" in text
    ET.parse(tmp_path / "roofline.svg")  # still well-formed XML
    assert evil in (tmp_path / "cost.csv").read_text()  # CSV is data, not markup


def test_write_reports_missing_dir_writes_nothing(program: npu_compiler.CompiledProgram, tmp_path: Path) -> None:
    hw = load_hardware(PRESET)
    with pytest.raises(OutputWriteError):
        write_reports(cost_program(program, hw), hw, tmp_path / "missing")
    assert not (tmp_path / "missing").exists()


# -- the command line -----------------------------------------------------------------------------------------------

def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="torch-ir")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_cli_on_npubin(program: npu_compiler.CompiledProgram, tmp_path: Path,
                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.npubin"
    program.save(path)
    out = tmp_path / "out"
    out.mkdir()
    assert run_cli("cost", str(path), "--hw", PRESET, "--dtype", "int8", "-o", str(out), "--top", "2") == 0
    text = capsys.readouterr().out
    assert "cycles:" in text and "heaviest dispatches:" in text
    for name in report_module.report_files():
        assert (out / name).is_file()
        assert f"wrote {out / name}" in text


def test_cli_without_matplotlib_falls_back_to_svg_and_says_so_once(
        program: npu_compiler.CompiledProgram, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report_module, "have_matplotlib", lambda: False)
    path = tmp_path / "model.npubin"
    program.save(path)
    assert run_cli("cost", str(path), "--hw", PRESET, "-o", str(tmp_path / "out")) == 0
    text = capsys.readouterr().out
    assert text.count("matplotlib is not installed") == 1
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cost.csv", "report.html", "roofline.svg"]
    assert "<svg" in (tmp_path / "out" / "report.html").read_text()


def test_cli_on_ir_json(ir: torch_ir.NPU_IR, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "model.json"
    ir.save(str(path))
    assert run_cli("cost", str(path), "--hw", PRESET, "-o", str(tmp_path)) == 0
    assert "cycles:" in capsys.readouterr().out
    assert (tmp_path / "report.html").is_file()


def test_cli_bad_hw(program: npu_compiler.CompiledProgram, tmp_path: Path) -> None:
    path = tmp_path / "model.npubin"
    program.save(path)
    with pytest.raises(HardwareError, match="no-such-npu.*no such hardware file or preset"):
        run_cli("cost", str(path), "--hw", "no-such-npu")


def test_cli_errors_are_clear(program: npu_compiler.CompiledProgram, tmp_path: Path) -> None:
    from npu_tools.cli import error_line
    from torch_ir.errors import TorchIRError

    path = tmp_path / "model.npubin"
    program.save(path)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(OutputWriteError):  # a directory that cannot be made: refused before costing
        run_cli("cost", str(path), "--hw", PRESET, "-o", str(tmp_path / "a_file" / "reports"))
    with pytest.raises(OutputWriteError, match="does not exist"):  # never a chain of missing folders
        run_cli("cost", str(path), "--hw", PRESET, "-o", str(tmp_path / "new" / "reports"))
    assert not (tmp_path / "new").exists()
    run_cli("cost", str(path), "--hw", PRESET, "-o", str(tmp_path / "new"))  # made in an existing parent
    assert (tmp_path / "new" / "report.html").is_file()
    with pytest.raises(TorchIRError) as e:
        run_cli("cost", str(tmp_path / "absent.npubin"), "--hw", PRESET)
    assert error_line(e.value)[0] == 2
    with pytest.raises(TorchIRError, match="dtype"):
        run_cli("cost", str(path), "--hw", PRESET, "--dtype", "int64")
