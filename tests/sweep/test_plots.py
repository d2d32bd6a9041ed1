"""The sweep's plots and page from a hand-written results table: the Pareto fronts and heat-map cells are the ones
worked out by hand here, the PNGs are real PNGs, and every string from the table is escaped in the page."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from npu_tools.sweep import plots

COLUMNS = ["key", "model", "hw", "array", "sram_kib", "precision", "status", "reason", "latency_ms", "area_proxy",
           "sqnr_db"]


def _row(model, array, sram, prec, latency, area, sqnr="", status="ok", reason=""):
    return dict(zip(COLUMNS, [f"{model}|{array}|{sram}|{prec}", model, "tpu_v1", array, str(sram), prec, status,
                              reason, "" if latency is None else str(latency), str(area), str(sqnr)]))


@pytest.fixture
def rows():
    # resnet: latency falls with array size and SRAM; w8a8 is faster and loses accuracy
    return [
        _row("resnet", "16x16", 256, "fp16", 8.0, 100),
        _row("resnet", "16x16", 1024, "fp16", 7.0, 140),
        _row("resnet", "32x32", 256, "fp16", 4.0, 300),
        _row("resnet", "32x32", 1024, "fp16", 4.5, 340),  # worse than (32x32, 256): off the front
        _row("resnet", "16x16", 256, "w8a8", 5.0, 100, 30.0),
        _row("resnet", "16x16", 1024, "w8a8", 3.5, 140, 30.0),
        _row("resnet", "32x32", 256, "w8a8", 2.0, 300, 30.0),
        _row("resnet", "32x32", 1024, "w8a8", None, 340, status="failed",
             reason="sram_kib 1024: <script>alert(1)</script>"),
        _row("<b>evil</b>", "16x16", 256, "fp16", 1.0, 100),
        _row("<b>evil</b>", "32x32", 1024, "fp16", 0.5, 340),
    ]


def test_pareto_front_minimizes_both_coordinates():
    points = [(1.0, 5.0), (2.0, 3.0), (2.0, 4.0), (3.0, 3.5), (4.0, 1.0), (5.0, 1.0)]
    assert plots.pareto_front(points) == [0, 1, 4]


def test_latency_vs_area_front_of_a_model(rows):
    resnet = plots.ok_rows(plots.by_model(rows)["resnet"])
    front = plots.front_rows(resnet, "area_proxy", "latency_ms")
    # by hand: area 100 best 5.0 (w8a8), area 140 best 3.5, area 300 best 2.0; area 340 has no better point
    assert [(r["area_proxy"], r["latency_ms"]) for r in front] == [("100", "5.0"), ("140", "3.5"), ("300", "2.0")]


def test_accuracy_front_maximizes_accuracy(rows):
    resnet = plots.ok_rows(plots.by_model(rows)["resnet"])
    assert plots.accuracy_column(resnet) == "sqnr_db"
    front = plots.front_rows(resnet, "latency_ms", "sqnr_db", maximize_y=True)
    assert [r["latency_ms"] for r in front] == ["2.0"]  # every w8a8 point has the same SQNR: the fastest wins


def test_heat_grid_cells_and_a_failed_cell(rows):
    w8a8 = [r for r in rows if r["model"] == "resnet" and r["precision"] == "w8a8"]
    xs, ys, cells = plots.heat_grid(w8a8, "array", "sram_kib")
    assert xs == ["16x16", "32x32"] and ys == ["256", "1024"]
    assert cells == [[5.0, 2.0], [3.5, None]]


def test_axes_sort_by_value_not_text():
    # by PE count; a tie on PEs (64x64, 128x32): fewer rows first
    assert sorted(["64x64", "8x8", "16x16", "128x32"], key=plots.axis_key) == ["8x8", "16x16", "64x64", "128x32"]
    assert sorted(["1024", "256", "64"], key=plots.axis_key) == ["64", "256", "1024"]
    assert plots.varying_axes([{"array": "8x8", "sram_kib": "1"}, {"array": "8x8", "sram_kib": "2"}]) == ["sram_kib"]


def test_report_writes_pngs_and_one_escaped_page(rows, tmp_path: Path):
    pytest.importorskip("matplotlib")
    results = tmp_path / "results.csv"
    with results.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    written = plots.write_report(plots.read_results(results), tmp_path)
    names = sorted(p.name for p in written)
    assert names == ["00_resnet_heatmap.png", "00_resnet_pareto.png", "01_b_evil_b_heatmap.png",
                     "01_b_evil_b_pareto.png", "report.html"]
    for p in written:
        if p.suffix == ".png":
            assert p.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    page = (tmp_path / "report.html").read_text()
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>evil</b>" not in page and "&lt;b&gt;evil&lt;/b&gt;" in page
    assert page.count("data:image/png;base64,") == 4  # the four PNGs, inline: the page is one file
    assert "Failed points (1)" in page and "Pareto front: latency vs. area proxy" in page


def test_a_model_with_no_costed_point_gets_no_figures(rows, tmp_path: Path):
    pytest.importorskip("matplotlib")
    rows = [*rows, _row("broken", "16x16", 256, "fp16", None, 100, status="failed", reason="no such model")]
    names = [p.name for p in plots.write_report(rows, tmp_path)]
    assert not [n for n in names if "broken" in n] and "no such model" in (tmp_path / "report.html").read_text()


def test_report_without_figures_still_lists_the_fronts(rows, tmp_path: Path):
    written = plots.write_report(rows, tmp_path, png=False)
    assert [p.name for p in written] == ["report.html"]
    page = (tmp_path / "report.html").read_text()
    assert "data:image/png" not in page and "Pareto front: latency vs. SRAM" in page


def _write(rows, path: Path) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_cli_writes_the_report_beside_the_results(rows, tmp_path: Path, capsys):
    from npu_tools.cli import main

    _write(rows, tmp_path / "results.csv")
    assert main(["sweep-report", str(tmp_path), "--axes", "sram_kib,array"]) == 0
    out = capsys.readouterr().out
    assert "10 points (1 failed)" in out and (tmp_path / "report.html").is_file()
    page = (tmp_path / "report.html").read_text()
    assert "Pareto front: latency vs. area proxy" in page


@pytest.mark.parametrize(("argv", "message"), [
    (["--axes", "array"], "--axes array: two different hardware columns"),
    (["--axes", "array,banana"], "fix: pick two of array, sram_kib"),
])
def test_cli_refuses_bad_axes(rows, tmp_path: Path, capsys, argv, message):
    from npu_tools.cli import main

    _write(rows, tmp_path / "results.csv")
    assert main(["sweep-report", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "report.html").exists()


def test_cli_names_a_missing_results_file(tmp_path: Path, capsys):
    from npu_tools.cli import main

    assert main(["sweep-report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "results.csv" in err and "torch-ir sweep -o DIR" in err
