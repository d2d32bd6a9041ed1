"""Hostile hardware files: every number finite, of bounded size and within its field's physical range
(``RANGES``), the file a regular UTF-8 file of bounded size, strict and shallow. Each refusal is one
``HardwareError`` line naming the file, the field, the rule and the fix; on the command line exit 2 with nothing
written. Every value the ranges allow costs a program to finite numbers."""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler.costmodel import HardwareError, cost_program, hardware_from_dict, load_hardware
from npu_compiler.costmodel.hardware import MAX_FILE_BYTES, PRESET_DIR, RANGES
from npu_compiler.costmodel.report import cost_csv, report_html
from npu_compiler.costmodel.roofline import roofline_png, roofline_svg
from npu_tools.cli import main
from tests.hang_guard import no_hang

try:  # the standard library's from Python 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
BASE_TEXT = (PRESET_DIR / "edge_4tops.toml").read_text()
BASE: dict[str, Any] = tomllib.loads(BASE_TEXT)
DIGITS_401 = "1" + "0" * 400
DIGITS_5000 = "1" + "0" * 4999


def _write(tmp_path: Path, name: str, data: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def _toml(tmp_path: Path, old: str, new: str) -> Path:
    assert old in BASE_TEXT, old
    return _write(tmp_path, "hw.toml", BASE_TEXT.replace(old, new, 1))


def _json(tmp_path: Path, field: str, raw: str) -> Path:
    """The preset as JSON with ``field`` (dotted) set to the raw JSON text ``raw``."""
    doc = copy.deepcopy(BASE)
    _set(doc, field, "@RAW@")
    return _write(tmp_path, "hw.json", json.dumps(doc).replace('"@RAW@"', raw))


def _set(doc: dict[str, Any], field: str, value: Any) -> None:
    *tables, key = field.split(".")
    for t in tables:
        doc = doc[t]
    doc[key] = value


def _refused(path: Path, *patterns: str) -> str:
    """The one-line message of ``load_hardware(path)``, which must name the file and match every pattern."""
    with pytest.raises(HardwareError) as info:
        load_hardware(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message and len(message) < 600, message
    for pattern in patterns:
        assert re.search(pattern, message), (pattern, message)
    return message


# -- numbers ---------------------------------------------------------------------------------------------------------

TOML_NUMBERS = [
    ("clock_mhz = 1000", "clock_mhz = 1e308", r'field "clock_mhz" = 1e\+308 is outside 0\.001\.\.100000 MHz'),
    ("clock_mhz = 1000", "clock_mhz = 0.0000001", r'"clock_mhz" = 1e-07 is outside .*1 kHz to 100 GHz'),
    ("int8 = 1.0", "int8 = 5e-324", r'"macs_per_cycle\.int8" = 4\.94066e-324 is outside'),
    ("bandwidth_gbps = 17.0", "bandwidth_gbps = 5e-324", r'"dram\.bandwidth_gbps" = 4\.94066e-324 is outside'),
    ("bandwidth_gbps = 17.0", "bandwidth_gbps = -17.0", r'"dram\.bandwidth_gbps" = -17 must be positive'),
    ("bandwidth_gbps = 17.0", "bandwidth_gbps = 0", r'"dram\.bandwidth_gbps" = 0 must be positive'),
    ("latency_ns = 100", "latency_ns = -1", r'"dram\.latency_ns" = -1 must be 0 or positive'),
    ("latency_ns = 100", "latency_ns = 1e30", r'"dram\.latency_ns" = 1e\+30 is outside'),
    ("rows = 32", f"rows = {DIGITS_401}", r'"array\.rows" = a number of 401 digits is outside 1\.\.65536'),
    ("rows = 32", f"rows = {DIGITS_5000}", r'"array\.rows" = a number of 5,000 digits is outside'),
    ("rows = 32", "rows = 1_" + "0" * 200, r'"array\.rows" = a number of 201 digits'),
    ("rows = 32", "rows = 0x" + "f" * 5000, r'"array\.rows" = an integer of about 6,02\d digits is outside'),
    ("rows = 32", "rows = 65537", r'"array\.rows" = 65537 is outside 1\.\.65536'),
    ("rows = 32", "rows = 0", r'"array\.rows" = 0 is not a positive integer'),
    ("rows = 32", "rows = true", r'"array\.rows" = true must be a number .*a boolean is not one'),
    ("lanes = 64", "lanes = 64.0", r'"vector\.lanes" = 64 is not a positive integer'),
    ("clock_mhz = 1000", "clock_mhz = inf", r'"clock_mhz" = inf must be a finite number'),
    ("clock_mhz = 1000", "clock_mhz = nan", r'"clock_mhz" = nan must be a finite number'),
    ("clock_mhz = 1000", 'clock_mhz = "1000"', r'"clock_mhz" = "1000" must be a number'),
    ("clock_mhz = 1000", "clock_mhz = 1979-05-27", r'"clock_mhz" = a date .* must be a number'),
    ("clock_mhz = 1000", "clock_mhz = [1000]", r'"clock_mhz" = an array of 1 item must be a number'),
    ("weights_kib = 1024", "weights_kib = 1e13", r'"sram\.weights_kib" = 1e\+13 is outside .*a byte to a petabyte'),
    ("softmax = 0.25", "softmax = 0", r'"vector\.ops_per_cycle\.softmax" = 0 must be positive'),
    ("fp16 = 0.5", "fp16 = 1e9", r'"macs_per_cycle\.fp16" = 1e\+09 is outside 0 \(unsupported\) or 0\.001\.\.1000'),
    ('name = "edge NPU 4 TOPS"', 'name = "a\\nb"', r'"name" = "a\\nb" must be one line'),
    ('name = "edge NPU 4 TOPS"', 'name = "\\u001b[2J"', r'"name" = "\\u001b\[2J" must be one line'),
    ('name = "edge NPU 4 TOPS"', f'name = "{"x" * 300}"', r'"name" = "x{60,}\.\.\." must be one line'),
]


@pytest.mark.parametrize(("old", "new", "pattern"), TOML_NUMBERS, ids=[n[:30] for _, n, _ in TOML_NUMBERS])
def test_toml_numbers_outside_their_range_are_refused_by_field(tmp_path: Path, old: str, new: str,
                                                              pattern: str) -> None:
    message = _refused(_toml(tmp_path, old, new), pattern, r"; fix: ")
    assert message.startswith(f"hardware file {tmp_path / 'hw.toml'}: field "), message


JSON_NUMBERS = [
    ("clock_mhz", "1e308", r'field "clock_mhz" = 1e\+308 is outside'),
    ("clock_mhz", "1e400", r'"clock_mhz" = inf must be a finite number'),
    ("clock_mhz", "NaN", r'"clock_mhz" = nan must be a finite number'),
    ("clock_mhz", "-Infinity", r'"clock_mhz" = -inf must be a finite number'),
    ("clock_mhz", "true", r'"clock_mhz" = true must be a number .*a boolean is not one'),
    ("clock_mhz", "null", r'"clock_mhz" = null must be a number'),
    ("clock_mhz", "{}", r'"clock_mhz" = a table must be a number'),
    ("macs_per_cycle.int8", "5e-324", r'"macs_per_cycle\.int8" = 4\.94066e-324 is outside'),
    ("array.rows", DIGITS_401, r'"array\.rows" = a number of 401 digits is outside 1\.\.65536'),
    ("array.rows", DIGITS_5000, r'"array\.rows" = a number of 5,000 digits is outside'),
    ("array.rows", "-" + DIGITS_5000, r'"array\.rows" = a number of 5,000 digits is outside'),
    ("array.rows", "1." + "0" * 5000, r'"array\.rows" = a number of 5,001 digits is outside'),
    ("array.cols", "32.0", r'"array\.cols" = 32 is not a positive integer'),
    ("sram.weights_kib", "-5", r'"sram\.weights_kib" = -5 must be positive'),
    ("dataflow", '"row_stationary"', r'"dataflow" = "row_stationary" must be one of output_stationary'),
    ("dataflow", "[" * 500 + "]" * 500, r'"dataflow" = an array of 1 item must be one of'),
    ("dma_overlaps_compute", "1", r'"dma_overlaps_compute" = 1 must be true or false'),
]


@pytest.mark.parametrize(("field", "raw", "pattern"), JSON_NUMBERS, ids=[f"{f}={r[:12]}" for f, r, _ in JSON_NUMBERS])
def test_json_numbers_outside_their_range_are_refused_by_field(tmp_path: Path, field: str, raw: str,
                                                              pattern: str) -> None:
    _refused(_json(tmp_path, field, raw), pattern, r"; fix: ")


def test_an_unknown_key_is_named_on_one_bounded_line(tmp_path: Path) -> None:
    doc = copy.deepcopy(BASE)
    doc["array"]["x\n" * 500] = 1
    path = _write(tmp_path, "hw.json", json.dumps(doc))
    message = _refused(path, r'field "array\.x\\nx\\n.*\.\.\." is not a known key')
    assert len(message) < 400


@pytest.mark.parametrize("field", sorted(RANGES))
def test_each_range_holds_its_ends_and_refuses_past_them(field: str) -> None:
    rng = RANGES[field]
    doc = _doc_without_conflicts(field)
    for value in (rng.lo, rng.hi) + ((0,) if rng.zero else ()):
        _set(doc, field, value)
        hardware_from_dict(doc, "test")
    below = rng.lo - 1 if rng.integer else rng.lo / 2
    for value in [rng.hi * 2, -rng.lo, below] + ([] if rng.zero else [0]):
        _set(doc, field, value)
        with pytest.raises(HardwareError, match=f'field "{re.escape(field)}" = '):
            hardware_from_dict(doc, "test")


def _doc_without_conflicts(field: str) -> dict[str, Any]:
    """The preset, with a shared SRAM when ``field`` is ``sram.shared_kib``, and without its declared native dtype
    when ``field`` is a MAC rate (a native dtype whose rate is 0 is refused for that reason)."""
    doc = copy.deepcopy(BASE)
    if field == "sram.shared_kib":
        doc["sram"] = {"shared_kib": 64}
    if field.startswith("macs_per_cycle."):
        doc.pop("native_dtype", None)
    return doc


# -- every allowed value costs to finite numbers --------------------------------------------------------------------

class _ConvSoftmax(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(torch.relu(self.conv(x)).flatten(1)), -1)


@pytest.fixture(scope="module")
def program() -> npu_compiler.CompiledProgram:
    with torch.device("meta"):
        model = _ConvSoftmax()
    return npu_compiler.compile(torch_ir.extract_ir(model, (torch.empty(1, 3, 8, 8, device="meta"),)))


def _costs_finitely(program: npu_compiler.CompiledProgram, doc: dict[str, Any], png: bool = False) -> None:
    hw = hardware_from_dict(doc, "extreme")
    report = cost_program(program, hw)
    numbers = [report.latency_ms, report.fps, report.utilization, *(r.utilization for r in report.rows)]
    assert all(math.isfinite(x) for x in numbers) and report.latency_ms > 0, numbers
    assert report.total_cycles > 0
    cost_csv(report)
    report_html(report, hw, figure=roofline_svg(report, hw))
    if png:
        roofline_png(report, hw)


SPLIT_FIELDS = sorted(f for f in RANGES if f != "sram.shared_kib")


@pytest.mark.parametrize("field", SPLIT_FIELDS)
def test_each_field_at_either_end_of_its_range_costs_finitely(program, field: str) -> None:
    for value in (RANGES[field].lo, RANGES[field].hi):
        doc = copy.deepcopy(BASE)
        _set(doc, field, value)
        _costs_finitely(program, doc)


#: Fields that go to the same end together: the clock; the array's and the vector unit's sizes and rates; SRAM; DRAM.
GROUPS = {"clock_mhz": 0, "array": 1, "macs_per_cycle": 1, "vector": 1, "sram": 2, "dram": 3}


@pytest.mark.parametrize("corner", list(itertools.product((0, 1), repeat=4)), ids=str)
def test_every_corner_of_the_ranges_costs_finitely(program, corner: tuple[int, ...]) -> None:
    """Every field of a group at its low or its high end (16 corners: slow clock and fast DRAM, ...)."""
    doc = copy.deepcopy(BASE)
    for field in SPLIT_FIELDS:
        rng = RANGES[field]
        _set(doc, field, (rng.lo, rng.hi)[corner[GROUPS[field.split(".")[0]]]])
    _costs_finitely(program, doc, png=corner in ((0, 0, 0, 0), (1, 1, 1, 1)) and _have_matplotlib())


def _have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


# -- the file itself -------------------------------------------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    path = tmp_path / "hw.toml"
    os.mkfifo(path)
    with no_hang(5, "test_a_fifo_is_refused_before_it_is_opened"):
        _refused(path, r"named pipe \(FIFO\)")


def test_a_link_to_dev_zero_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "hw.json"
    path.symlink_to("/dev/zero")
    _refused(path, r"character device", r"a link to '/dev/zero'")


def test_a_directory_and_a_dangling_link_are_refused(tmp_path: Path) -> None:
    (tmp_path / "dir.toml").mkdir()
    _refused(tmp_path / "dir.toml", r"is a directory")
    (tmp_path / "gone.toml").symlink_to(tmp_path / "missing.toml")
    _refused(tmp_path / "gone.toml", r"does not exist")


def test_a_file_over_the_bound_is_refused_unread(tmp_path: Path) -> None:
    path = _write(tmp_path, "hw.toml", BASE_TEXT + "#" + "x" * MAX_FILE_BYTES + "\n")
    _refused(path, r"over the 1,048,576 bytes")


DEEP = 100_000


@pytest.mark.parametrize(("name", "text"), [
    ("hw.json", '{"name": ' + "[" * DEEP + "]" * DEEP + "}"),
    ("hw.toml", "name = " + "[" * DEEP + "]" * DEEP + "\n"),
    ("tables.toml", "name = " + "{a = " * DEEP + "1" + "}" * DEEP + "\n"),
], ids=["json_arrays", "toml_arrays", "toml_inline_tables"])
def test_deep_nesting_is_one_error_naming_the_file(tmp_path: Path, name: str, text: str) -> None:
    _refused(_write(tmp_path, name, text), r"is nested too deeply")


@pytest.mark.parametrize("suffix", ["json", "toml"])
def test_bytes_that_are_not_utf8_are_one_error(tmp_path: Path, suffix: str) -> None:
    _refused(_write(tmp_path, f"hw.{suffix}", b'name = "\xff\xfe"\n'), r"is not UTF-8 text \(byte 0xff at offset 8\)")


def test_a_duplicate_key_is_refused_in_json_as_in_toml(tmp_path: Path) -> None:
    text = json.dumps(BASE)[:-1] + ', "clock_mhz": 1e308}'
    _refused(_write(tmp_path, "hw.json", text), r'key "clock_mhz" appears twice')
    _refused(_toml(tmp_path, "clock_mhz = 1000", "clock_mhz = 1000\nclock_mhz = 1"), r"cannot be read as TOML")


def test_a_long_digit_run_in_an_inline_table_names_its_line(tmp_path: Path) -> None:
    text = BASE_TEXT.replace("[array]\nrows = 32\ncols = 64\n", f"array = {{rows = 32, cols = {DIGITS_5000}}}\n")
    assert text != BASE_TEXT
    _refused(_write(tmp_path, "hw.toml", text), r'field "cols" = a number of 5,000 digits')


@pytest.mark.parametrize("line", ["[" * 500_000, "a" * 500_000 + " ", "x = " + "y." * 250_000])
def test_locating_a_long_number_is_linear_in_a_hostile_line(tmp_path: Path, line: str) -> None:
    """The field of an over-long TOML number is looked up without backtracking patterns: a line of half a
    million brackets or letters before it costs milliseconds, not hours."""
    with no_hang(2, "test_locating_a_long_number_is_linear_in_a_hostile_line"):
        _refused(_write(tmp_path, "hw.toml", line + "\nrows = " + DIGITS_401 + "\n"), r"a number of 401 digits")
        _refused(_write(tmp_path, "hw.toml", line + DIGITS_401 + "\n"), r"a number of 401 digits")


def test_the_presets_load_and_the_json_form_is_the_same(tmp_path: Path) -> None:
    path = _write(tmp_path, "hw.json", json.dumps(BASE))
    assert load_hardware(path).clock_mhz == load_hardware("edge_4tops").clock_mhz == 1000


# -- the command line ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("old", "new", "pattern"), [TOML_NUMBERS[0], TOML_NUMBERS[2], TOML_NUMBERS[9]],
                         ids=["clock", "denormal", "digits"])
def test_the_cli_prints_one_line_exits_2_and_makes_nothing(program, tmp_path: Path, capsys, old: str, new: str,
                                                           pattern: str) -> None:
    path = tmp_path / "m.npubin"
    program.save(path)
    hw = _toml(tmp_path, old, new)
    code = main(["cost", str(path), "--hw", str(hw), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("torch-ir cost: error: hardware file "), err
    assert re.search(pattern, err)
    assert not (tmp_path / "out").exists()


# -- the docs --------------------------------------------------------------------------------------------------------

def test_the_docs_show_every_range() -> None:
    """docs/cost_model.md's table of ranges says what ``RANGES`` says."""
    text = (ROOT / "docs" / "cost_model.md").read_text()
    for field, rng in RANGES.items():
        leaf = field.rsplit(".", 1)[-1]
        rows = [line for line in text.splitlines() if line.startswith("| `") and f"{leaf}`" in line]
        assert rows, f"docs/cost_model.md has no row for {field}"
        assert any(f"{rng.lo:g}" in row and f"{rng.hi:g}" in row for row in rows), (field, rows)
