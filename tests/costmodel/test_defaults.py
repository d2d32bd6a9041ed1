"""The cost model's defaults (issue 26, item 10): costing at the hardware's native dtype unless ``--dtype`` says
otherwise, ``--hw-template``, and report files a reader can navigate (labelled roofline points, block subtotals,
sortable tables, the CSV's columns equal to the HTML table's)."""

from __future__ import annotations

import csv
import dataclasses
import io
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler.costmodel import CSV_COLUMNS, CostReport, HardwareError, cost_program
from npu_compiler.costmodel import hardware as hardware_module
from npu_compiler.costmodel.hardware import RANGES, hardware_from_dict, load_hardware, presets
from npu_compiler.costmodel.hardware_template import TEMPLATE_EXAMPLE, hardware_template, hardware_to_dict
from npu_compiler.costmodel.report import SORT_SCRIPT, block_of, cost_csv, report_html
from npu_compiler.costmodel.roofline import roofline_labels, roofline_points, roofline_svg
from npu_tools.cli import main

from .test_costmodel import TOY

NATIVE_NOTE = "costed at int8, the hardware's native precision; --dtype to change"


class Blocks(nn.Module):
    """A stem, two identical blocks ``layers.0`` and ``layers.1`` of two linears each, and a head: float32."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(16, 32)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)) for _ in range(2))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.layers:
            x = x + block(x)
        return self.head(x)


@pytest.fixture(scope="module")
def program() -> npu_compiler.CompiledProgram:
    with torch.device("meta"):
        model = Blocks()
    return npu_compiler.compile(torch_ir.extract_ir(model, (torch.empty(8, 16, device="meta"),)))


@pytest.fixture(scope="module")
def npubin(program: npu_compiler.CompiledProgram, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("program") / "blocks.npubin"
    program.save(path)
    return path


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# -- (a) the hardware's native dtype --------------------------------------------------------------------------------

def test_an_int8_only_preset_costs_a_float_program_at_int8_and_says_so(npubin: Path, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    hw = load_hardware("ethos_u55_256")
    assert [d for d, rate in hw.macs_per_cycle.items() if rate] == ["int8"] and hw.native_dtype == "int8"
    assert main(["cost", str(npubin), "--hw", "ethos_u55_256", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1] == NATIVE_NOTE  # under the first line of the summary
    assert "unsupported" not in out  # nothing costed "at the slowest supported rate"
    assert {row["dtype"] for row in _csv(tmp_path / "cost.csv")} == {"int8"}
    assert f"<td>precision</td><td>{NATIVE_NOTE.replace(chr(39), '&#x27;')}</td>" in \
        (tmp_path / "report.html").read_text()


def test_dtype_still_overrides_the_native_one(npubin: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", str(npubin), "--hw", "edge_4tops", "--dtype", "fp16", "-o", str(tmp_path / "fp16")]) == 0
    assert "costed at fp16 (--dtype fp16)" in capsys.readouterr().out
    assert {row["dtype"] for row in _csv(tmp_path / "fp16" / "cost.csv")} == {"fp16"}
    # "compiled": each dispatch's own dtype, as before (float32 on an int8-only part: flagged)
    assert main(["cost", str(npubin), "--hw", "ethos_u55_256", "--dtype", "compiled"]) == 0
    out = capsys.readouterr().out
    assert "costed at each dispatch's own dtype (--dtype compiled)" in out
    assert "fp32 is unsupported by Arm Ethos-U55-256: costed at the slowest supported rate" in out
    assert main(["cost", str(npubin), "--hw", "edge_4tops", "--dtype", "int64"]) == 2
    assert "--dtype int64: cannot be costed; fix: give int4, int8, fp8, int16, fp16, bf16, fp32" in \
        capsys.readouterr().err


def test_the_native_dtype_is_the_fastest_rate_unless_declared() -> None:
    def hw(rates: dict[str, float], **top: object) -> hardware_module.Hardware:
        return hardware_from_dict({**TOY, "macs_per_cycle": rates, **top}, "toy")

    assert hw({"int8": 1, "fp16": 0.5, "bf16": 0, "fp32": 0}).native_dtype == "int8"
    assert hw({"int8": 1, "fp16": 2, "bf16": 0, "fp32": 0}).native_dtype == "fp16"
    assert hw({"int8": 0, "fp16": 0, "bf16": 1, "fp32": 1}).native_dtype == "bf16"  # a tie: the narrower
    assert hw({"int8": 2, "fp16": 1, "bf16": 0, "fp32": 0}, native_dtype="fp16").native_dtype == "fp16"
    with pytest.raises(HardwareError, match=r'field "native_dtype" = "fp32" has no MAC rate'):
        hw({"int8": 1, "fp16": 0, "bf16": 0, "fp32": 0}, native_dtype="fp32")
    with pytest.raises(HardwareError, match=r'field "native_dtype" = "int2" must be one of int4, int8, fp8, int16'):
        hw({"int8": 1, "fp16": 0, "bf16": 0, "fp32": 0}, native_dtype="int2")
    with pytest.raises(HardwareError, match=r'field "native_dtype" = "int4" names a width the file gives no rate'):
        hw({"int8": 1, "fp16": 0, "bf16": 0, "fp32": 0}, native_dtype="int4")  # a derived rate is not declared
    assert all(load_hardware(p).native_dtype == "int8" for p in presets())


# -- (b) the hardware template ----------------------------------------------------------------------------------------

def test_the_template_loads_as_the_example_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["cost", "--hw-template"]) == 0
    assert "wrote my_npu.toml" in capsys.readouterr().out
    loaded = load_hardware(tmp_path / "my_npu.toml")
    example = load_hardware(TEMPLATE_EXAMPLE)
    assert loaded == dataclasses.replace(example, name="my-npu", source=loaded.source)


def test_the_template_comments_every_field_with_its_unit_and_range() -> None:
    lines = hardware_template().splitlines()
    for name, rng in RANGES.items():
        key = name.rsplit(".", 1)[-1]
        (line,) = [line for line in lines if re.match(rf"(# )?{key} = ", line)]
        value, comment = line.lstrip("# ").split("#", 1)
        assert f"{rng.lo:g} to {rng.hi:g} {rng.unit}" in comment, line
        assert rng.holds(float(value.split("=")[1])), line  # the example value is in range
        if rng.zero:
            assert f"0: {rng.zero}" in comment
    for optional in ("dma_overlaps_compute =", "native_dtype =", "[kernels]", "supported ="):
        assert any(re.match(rf"(# )?{re.escape(optional)}", line) for line in lines), optional


@pytest.mark.parametrize("preset", presets())
def test_every_preset_round_trips_through_the_template(preset: str, tmp_path: Path) -> None:
    hw = load_hardware(preset)
    path = tmp_path / f"{preset}.toml"
    path.write_text(hardware_template(hw))
    assert load_hardware(path) == dataclasses.replace(hw, source=str(path))
    assert hardware_from_dict(hardware_to_dict(hw), hw.source) == hw


def test_a_template_keeps_a_declared_kernel_list_and_a_derived_native_dtype(tmp_path: Path) -> None:
    hw = hardware_from_dict({**TOY, "kernels": {"supported": ["GEMM", "movement"]}}, "toy")
    assert hw.declared_native_dtype is None
    path = tmp_path / "toy.toml"
    path.write_text(hardware_template(hw))
    text = path.read_text()
    assert 'supported = ["GEMM", "movement"]' in text and '# native_dtype = "int8"' in text
    assert load_hardware(path) == dataclasses.replace(hw, source=str(path))


def test_an_older_files_conv_add_reads_as_the_conv_it_is_now() -> None:
    """A hardware file written when the residual add was a kernel of its own (CONV_ADD) still loads."""
    hw = hardware_from_dict({**TOY, "kernels": {"supported": ["GEMM", "CONV_ADD", "CONV"]}}, "toy")
    assert hw.kernels == ("GEMM", "CONV") and hw.kernel_names() == {"GEMM", "CONV"}


def test_the_template_is_not_written_over_a_file_unless_told(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "npu.toml"
    path.write_text("# mine\n")

    def refused(*argv: str) -> str:
        assert main(["cost", *argv]) == 2
        return capsys.readouterr().err

    assert "npu.toml: exists; fix: give another file name, or --force to replace it" in refused(
        "--hw-template", str(path))
    assert path.read_text() == "# mine\n"
    assert main(["cost", "--hw-template", str(path), "--force"]) == 0
    assert load_hardware(path).name == "my-npu"
    capsys.readouterr()
    assert main(["cost", "--hw-template", "-"]) == 0
    assert capsys.readouterr().out == hardware_template()
    assert "the template is TOML" in refused("--hw-template", str(tmp_path / "npu.json"))
    assert "costs nothing" in refused("resnet", "--hw-template", str(tmp_path / "other.toml"))
    assert not (tmp_path / "other.toml").exists()
    assert "--hw missing" in refused("resnet")


# -- (c) the report files ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def report(program: npu_compiler.CompiledProgram) -> CostReport:
    return cost_program(program, load_hardware("edge_4tops"), dtype="int8")


def test_block_of_a_module_path() -> None:
    assert block_of("model.layers.3.mlp.down_proj") == "model.layers.3"
    assert block_of("layer1.0.conv1") == "layer1.0"
    assert block_of("layers.1") == "layers.1"
    assert block_of("encoder.embeddings") is None


def _cells(row: str) -> list[str]:
    return re.findall(r"<td[^>]*>([^<]*)</td>", row)


def test_the_layer_table_has_block_subtotals(report: CostReport) -> None:
    html = report_html(report, report.hardware, figure="")
    layers = html[html.index("<h2>Per layer</h2>"):html.index("<h2>Per dispatch</h2>")]
    subtotals = re.findall(r'<tr class="subtotal">.*?</tr>', layers)
    blocks = {block: sorted({r.layer for r in report.rows if block_of(r.layer) == block})
              for block in ("layers.0", "layers.1")}
    assert all(len(names) >= 2 for names in blocks.values()), blocks
    assert [_cells(row)[0] for row in subtotals] == [f"{block} (block subtotal, {len(names)} layers)"
                                                     for block, names in blocks.items()]
    for block, row in zip(blocks, subtotals):
        cycles = sum(r.cycles for r in report.rows if block_of(r.layer) == block)
        dram = sum(r.dram_bytes for r in report.rows if block_of(r.layer) == block)
        assert f'data-v="{cycles}"' in row and f'data-v="{dram}"' in row
    # a block is one <tbody>: its layers, then its subtotal last (what the sort script keeps together); a layer
    # outside any block (stem, head) is a <tbody> of its own
    bodies = re.findall(r"<tbody>(.*?)</tbody>", layers, re.S)
    assert [body.count("<tr") for body in bodies] == [1, 3, 3, 1]
    assert all(re.search(r'<tr class="subtotal">[^\n]*</tr>$', body) for body in bodies[1:3])


def test_the_tables_sort_with_one_inline_script(report: CostReport) -> None:
    html = report_html(report, report.hardware, figure="")
    assert html.count("<script") == 1 and SORT_SCRIPT in html
    assert "<script>" in SORT_SCRIPT and " src=" not in SORT_SCRIPT  # inline: the page stays one file
    assert "http" not in SORT_SCRIPT and "innerHTML" not in SORT_SCRIPT  # no network, no markup built from names
    assert html.count('<table class="sortable">') == 2


def test_the_csv_has_the_columns_of_the_html_dispatch_table(report: CostReport) -> None:
    html = report_html(report, report.hardware, figure="")
    table = html[html.index("<h2>Per dispatch</h2>"):]
    table = table[:table.index("</table>")]
    header = re.findall(r'<th data-col="([^"]*)"', table)
    rows = list(csv.reader(io.StringIO(cost_csv(report))))
    assert rows[0] == header == list(CSV_COLUMNS)
    html_rows = re.findall(r"<tr id=\"dispatch-\d+\">(.*?)</tr>", table)
    assert len(html_rows) == len(rows) - 1 == len(report.rows)
    for csv_row, html_row in zip(rows[1:], html_rows):
        cells = re.findall(r'<td( class="n" data-v="([^"]*)")?>([^<]*)</td>', html_row)
        assert len(cells) == len(CSV_COLUMNS)
        assert [v if number else text for number, v, text in cells] == csv_row


def test_the_roofline_names_its_costliest_points(report: CostReport) -> None:
    hw = report.hardware
    labels = roofline_labels(report, hw)
    assert labels and len(labels) <= 5
    heaviest = max(roofline_points(report, hw), key=lambda p: p[0].cycles)[0]
    assert labels[0][0].startswith(heaviest.layer)
    # the same layer of both blocks lands on one spot: named once, with the other counted
    assert any(label.endswith("(+1 alike)") for label, _, _ in labels), labels
    svg = roofline_svg(report, hw)
    assert re.findall(r'<text class="label"[^>]*>([^<]*)</text>', svg) == [label for label, _, _ in labels]


def test_the_png_annotates_the_labels_and_the_page_names_every_point_on_hover(report: CostReport) -> None:
    pytest.importorskip("matplotlib")
    from npu_compiler.costmodel.roofline import roofline_figure, roofline_png

    hw = report.hardware
    texts = [t.get_text() for t in roofline_figure(report, hw).axes[0].texts]
    assert texts == [label for label, _, _ in roofline_labels(report, hw)]
    page = report_html(report, hw)
    areas = re.findall(r'<area shape="circle" coords="(\d+),(\d+),5" href="#dispatch-(\d+)" title="([^"]*)"', page)
    points = roofline_points(report, hw)
    assert len(areas) == len(points)
    for (x, y, index, title), (r, _, _) in zip(areas, points):
        assert int(index) == r.index and f'id="dispatch-{r.index}"' in page
        assert title.startswith(f"{r.layer}: {r.name} ({r.kernel})")
        assert 0 <= int(x) <= 880 and 0 <= int(y) <= 583  # inside the 8 x 5.3 inch figure at 110 dpi
    hostile = dataclasses.replace(report, rows=[dataclasses.replace(r, layer=r"$\undefinedmacro{x}$ <b>")
                                                for r in report.rows])
    assert roofline_png(hostile, hw).startswith(b"\x89PNG")  # a layer name is text, never mathtext
