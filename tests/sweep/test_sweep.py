"""The sweep engine and ``torch-ir sweep``: real models from the zoo, the real cost model and quantizer; expected
latencies from ``cost_program`` called here on each point's hardware, not from the engine."""

from __future__ import annotations

import csv
import shutil

import pytest

import npu_compiler
from npu_compiler.costmodel import cost_program, load_hardware
from npu_compiler.costmodel.hardware import hardware_from_dict
from npu_compiler.costmodel.hardware_template import hardware_to_dict
from npu_tools.cli import main
from npu_tools.commands.normalize import _load
from npu_tools.sweep.engine import COLUMNS, NONDETERMINISTIC_COLUMNS, ModelCache, evaluate
from npu_tools.sweep.grid import Point, SweepError, expand, parse_grid
from npu_tools.sweep.run import LocalExecutor, sweep

MODELS = ["convnet", "residual"]
GRID = {"array": [(16, 16), (32, 32)]}
PRECISIONS = ["fp16", "w8a8"]


def _table(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _deterministic(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{k: v for k, v in r.items() if k not in NONDETERMINISTIC_COLUMNS} for r in rows]


def _hardware(rows: int, cols: int):
    """edge_4tops with another array, built here from its file's fields."""
    data = hardware_to_dict(load_hardware("edge_4tops"))
    data["array"] = {"rows": rows, "cols": cols}
    return hardware_from_dict(data)


@pytest.fixture(scope="module")
def small_sweep(tmp_path_factory):
    """2 zoo models x 2 arrays x (fp16, w8a8), in this process (workers=1)."""
    out = tmp_path_factory.mktemp("sweep")
    points = expand(MODELS, ["edge_4tops"], GRID, PRECISIONS)
    path = sweep(points, out, workers=1, progress=lambda *a: None)
    return points, path


def test_every_row_costs_as_cost_program(small_sweep):
    points, path = small_sweep
    rows = {r["key"]: r for r in _table(path)}
    assert sorted(rows) == sorted(p.key for p in points) and list(_table(path)[0]) == list(COLUMNS)
    for model in MODELS:
        program = npu_compiler.compile(_load(model)[0], fallback="cpu")
        for rows_, cols in GRID["array"]:
            hw = _hardware(rows_, cols)
            for precision in PRECISIONS:
                row = rows[Point(model, "edge_4tops", (("array", (rows_, cols)),), precision).key]
                expected = cost_program(program, hw, precision=precision)
                assert row["status"] == "ok", row["reason"]
                assert float(row["latency_ms"]) == expected.latency_ms
                assert int(row["cycles"]) == expected.total_cycles
                assert int(row["dram_bytes"]) == expected.dram_bytes
                assert row["array"] == f"{rows_}x{cols}" and int(row["pes"]) == rows_ * cols
    # the quantized precision has accuracy figures (an SQNR well above 20 dB for w8a8), the float one none
    for row in rows.values():
        assert (row["sqnr_db"] != "") == (row["precision"] == "w8a8")
        if row["precision"] == "w8a8":
            assert float(row["sqnr_db"]) > 20 and 0 <= float(row["top1_agreement"]) <= 100


def test_each_model_is_extracted_compiled_and_calibrated_once(small_sweep):
    _, path = small_sweep
    rows = _table(path)
    for model in MODELS:
        mine = [r for r in rows if r["model"] == model]
        assert sum(float(r["t_extract"]) > 0 for r in mine) == 1
        assert sum(float(r["t_compile"]) > 0 for r in mine) == 1
        assert sum(float(r["t_calibrate"]) > 0 for r in mine) == 1  # one quantized precision
        assert all(float(r["t_cost"]) > 0 for r in mine)
    cache = ModelCache()
    for p in expand(MODELS, ["edge_4tops", "tpu_v1"], GRID, PRECISIONS):
        evaluate(p, cache)
    assert cache.counts == {"extract": 2, "compile": 2, "calibrate": 2}


def test_resume_skips_done_points_and_gives_the_same_table(small_sweep, tmp_path):
    points, full = small_sweep
    lines = full.read_text().splitlines(keepends=True)
    # an interrupted run: the header, three rows and half of a fourth line
    (tmp_path / "results.csv").write_text("".join(lines[:4]) + lines[4][:20])
    seen = []
    path = sweep(points, tmp_path, workers=1, progress=lambda done, total, t: seen.append(total))
    assert seen and set(seen) == {len(points) - 3}
    assert _deterministic(_table(path)) == _deterministic(_table(full))
    again = []
    sweep(points, tmp_path, workers=1, progress=lambda *a: again.append(a))
    assert again == [] and _deterministic(_table(path)) == _deterministic(_table(full))


def test_bad_points_are_failed_rows_and_the_rest_succeed(tmp_path):
    points = [Point("convnet", "edge_4tops", (("array", (0, 16)),), "w8a8"),  # rows out of range
              Point("no_such_model", "edge_4tops", (), "w8a8"),
              Point("convnet", "tpu_v1", (), "fp16"),  # tpu_v1 has no fp16 MACs
              Point("convnet", "tpu_v1", (), "w8a8"),
              Point("convnet", "edge_4tops", (("sram_kib", 512),), "fp16")]
    path = sweep(points, tmp_path, workers=1, progress=lambda *a: None)
    rows = {r["key"]: r for r in _table(path)}
    reasons = {p.key: rows[p.key]["reason"] for p in points}
    assert [rows[p.key]["status"] for p in points] == ["failed", "failed", "failed", "ok", "ok"]
    assert '"array.rows" = 0' in reasons[points[0].key] and "fix:" in reasons[points[0].key]
    assert "no_such_model" in reasons[points[1].key]
    assert "fp16" in reasons[points[2].key] and "is 0" in reasons[points[2].key]
    assert rows[points[4].key]["sram_kib"] == "512" and int(rows[points[4].key]["sram_bytes"]) == 512 * 1024


@pytest.mark.slow
def test_a_process_pool_gives_the_same_table(small_sweep, tmp_path):
    points, full = small_sweep
    path = sweep(points, tmp_path, executor=LocalExecutor(2), progress=lambda *a: None)
    assert _deterministic(_table(path)) == _deterministic(_table(full))


@pytest.mark.parametrize("item, words", [
    ("array=16", "ROWSxCOLS"), ("sram=256", "not a grid parameter"), ("sram_kib=big", "not a number"),
    ("clock_mhz", "NAME=V1,V2"),
])
def test_parse_grid_names_the_flag(item, words):
    with pytest.raises(SweepError, match="--grid") as e:
        parse_grid([item])
    assert words in str(e.value) and "fix:" in str(e.value)


def test_parse_grid_values():
    assert parse_grid(["array=16x16,32x64", "dram_gbps=8,12.5"]) == {"array": [(16, 16), (32, 64)],
                                                                     "dram_gbps": [8, 12.5]}


@pytest.mark.parametrize("argv, words", [
    (["--precision", "int3"], "--precision int3"),
    (["--grid", "array=4"], "--grid array=4"),
    (["--hw", "no_such.toml"], "--hw no_such.toml"),
    (["--workers", "0"], "--workers 0"),
])
def test_cli_flag_errors(tmp_path, capsys, argv, words):
    base = {"--models": "convnet", "--hw": "edge_4tops", "-o": str(tmp_path / "out")}
    flags = dict(base, **dict(zip(argv[::2], argv[1::2])))
    assert main(["sweep", *[x for kv in flags.items() for x in kv]]) == 2
    err = capsys.readouterr().err
    assert words in err and "fix:" in err
    assert not (tmp_path / "out").exists()


def test_cli_writes_the_table(tmp_path, capsys):
    out = tmp_path / "s"
    hw = tmp_path / "npu.toml"
    shutil.copy(load_hardware("edge_4tops").source, hw)
    assert main(["sweep", "--models", "convnet", "--hw", "tpu_v1", str(hw), "--grid", "array=8x8",
                 "--precision", "fp16,w8a8", "-o", str(out), "--workers", "1"]) == 0
    rows = _table(out / "results.csv")
    assert len(rows) == 4 and [r["status"] for r in rows].count("ok") == 3  # tpu_v1 has no fp16
    assert "4 points: 3 ok, 1 failed" in capsys.readouterr().out


class _ReasonExecutor:
    """A ``PointExecutor`` whose every point fails with a reason a hostile model file could make an exception say."""

    def map_groups(self, fn, groups):
        from npu_tools.sweep.run import failed_rows

        for group in groups:
            yield from failed_rows(group, "=HYPERLINK(\"http://x\")\nsecond line")


def test_a_failure_reason_reaches_the_table_as_plain_text(tmp_path):
    points = expand(["mlp"], ["edge_4tops"], {}, ["fp16"])
    path = sweep(points, tmp_path, executor=_ReasonExecutor(), progress=lambda *a: None)
    (row,) = list(csv.DictReader(path.open()))
    assert row["key"] == points[0].key and row["status"] == "failed"
    assert not row["reason"].startswith("=") and "\n" not in row["reason"] and "HYPERLINK" in row["reason"]
