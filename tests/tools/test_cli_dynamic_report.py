"""``torch-ir compile --report-dynamic``, as a user types it: the table, the CSV and PNGs, and one clear error per
bad flag. The zoo's ``mhsa`` has a symbolic sequence (2..64, batch fixed at 2)."""

from __future__ import annotations

import csv
import re
import sys

import pytest

from npu_tools.cli import main
from npu_tools.commands.compile_dynamic import parse_buckets
from npu_tools.commands.dynamic_report import parse_bytes, parse_lengths
from torch_ir.errors import TorchIRError

PNG = b"\x89PNG\r\n\x1a\n"


def _lengths_file(tmp_path):
    path = tmp_path / "served.csv"
    path.write_text("# observed prompt lengths\nlength,count\n12,30\n40,50\n\n60,10\n")
    return path


def test_report_writes_the_table_the_csv_and_the_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "report"
    rc = main(["compile", "mhsa", "--report-dynamic", "seq", "--lengths", str(_lengths_file(tmp_path)),
               "--buckets", "seq=32,64", "--max-buckets", "2", "--report-dir", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "compiled seq=64" in captured.err  # progress, a line per compiled size
    assert "traffic: 90 requests, 3 distinct lengths (12..60)" in captured.out
    for name in ("given", "suggested", "upper bound"):
        assert any(line.startswith(name) for line in captured.out.splitlines()), name
    rows = list(csv.DictReader((out / "dynamic_report.csv").open()))
    sets = {r["name"]: r for r in rows if r["row"] == "set"}
    assert sets["given"]["sizes"] == "32 64"
    assert len(sets["suggested"]["sizes"].split()) <= 2
    assert sum(float(r["share_given"]) for r in rows if r["row"] == "bucket" and r["share_given"]) == pytest.approx(1)
    for name in ("lengths.png", "buckets.png", "sets.png"):
        assert (out / name).read_bytes().startswith(PNG), name
    assert not list(tmp_path.glob("*.npubin"))  # a report, no program


def test_without_matplotlib_the_csv_is_still_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # ``import matplotlib`` raises ImportError
    out = tmp_path / "report"
    assert main(["compile", "mhsa", "--report-dynamic", "seq", "--lengths", "12,40,40,60",
                 "--report-dir", str(out)]) == 0
    assert "pip install 'torch-ir[cost]'" in capsys.readouterr().out
    assert (out / "dynamic_report.csv").is_file() and not list(out.glob("*.png"))


@pytest.mark.parametrize(("flags", "message"), [
    (["--report-dynamic", "seq", "--lengths", "12,100"],
     r"--lengths: length 100 is outside the range of 'seq' .*2\.\.64"),
    (["--report-dynamic", "seq", "--lengths", "12,x"], r"--lengths '12,x': neither a comma list"),
    (["--report-dynamic", "seq"], r"--report-dynamic seq needs the observed lengths; fix: --lengths"),
    (["--lengths", "12"], r"--lengths is a flag of the dynamic-shape report; fix: add --report-dynamic"),
    (["--report-dynamic", "seq", "--lengths", "12", "--buckets", "seq=32,16,32"], r"--buckets 'seq=32,16,32': size 32"),
    (["--report-dynamic", "seq", "--lengths", "12,60", "--buckets", "seq=16,32"],
     r"--buckets seq=16,32 does not cover the observed lengths 60; fix: add a size of at least 60"),
    (["--report-dynamic", "seq", "--lengths", "12", "--buckets", "batch=1,2"], r"--buckets batch=\.\.\.: the report"),
    (["--report-dynamic", "seq", "--lengths", "12", "--memory-cap", "8XB"], r"--memory-cap '8XB'"),
    (["--report-dynamic", "seq", "--lengths", "60", "--memory-cap", "1KiB"],
     r"length 60 of seq needs .* over --memory-cap 1,024; fix: --memory-cap \d+ or more"),
    (["--report-dynamic", "seq", "--lengths", "12", "--max-buckets", "0"], r"--max-buckets 0"),
    (["--report-dynamic", "seq", "--lengths", "12", "--bind", "seq=12"], r"--bind seq=12: seq is the symbol"),
    (["--report-dynamic", "batch", "--lengths", "12"], r"no symbol 'batch' .* seq"),
    (["--report-dynamic", "seq", "--lengths", "12", "-o", "x.npubin"], r"--output: --report-dynamic writes a report"),
])
def test_bad_flags_are_one_clear_error(tmp_path, capsys, monkeypatch, flags, message):
    monkeypatch.chdir(tmp_path)
    assert main(["compile", "mhsa", *flags, "--report-dir", str(tmp_path / "r")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    err = lines[-1]  # after any progress lines ("compiled seq=..."), one error line
    assert all(line.startswith("compiled seq=") for line in lines[:-1]), lines
    assert err.startswith("torch-ir compile: error: ")
    assert re.search(message, err), err


def test_an_unbound_symbol_says_which_bind_flag(tmp_path, capsys):
    import torch
    from torch.export import Dim

    from npu_tools.zoo import get_model
    from torch_ir import extract_ir

    entry = get_model("mhsa")  # its batch made symbolic too: the report on seq needs it bound
    args, _ = entry.inputs(torch.Generator().manual_seed(0))
    ir = extract_ir(entry.build("meta"), tuple(args),
                    dynamic_shapes={"x": {0: Dim("batch", min=1, max=8), 1: Dim("seq", min=2, max=64)}})
    path = tmp_path / "mhsa.json"
    ir.save(str(path))
    assert main(["compile", str(path), "--report-dynamic", "seq", "--lengths", "12", "--report-dir",
                 str(tmp_path / "r")]) == 2
    assert "fix: --bind batch=1" in capsys.readouterr().err


def test_parse_buckets_and_sizes():
    assert parse_buckets(["seq=512,128,256", "batch=4,1"]) == {"seq": [128, 256, 512], "batch": [1, 4]}
    for bad, message in ((["seq=128,128"], "size 128 is given twice"), (["seq=1,2", "seq=4"], "given twice"),
                         (["seq"], "expected SYMBOL=S1,S2"), (["seq=1.5"], "whole numbers"),
                         (["seq=0,4"], "1 or more")):
        with pytest.raises(TorchIRError, match=message):
            parse_buckets(bad)
    assert parse_bytes("8MiB") == 8 * 2**20 and parse_bytes("1 gib") == 2**30 and parse_bytes("4096") == 4096
    with pytest.raises(TorchIRError, match="--memory-cap"):
        parse_bytes("-3")


def test_parse_lengths(tmp_path):
    assert parse_lengths("8,16,16,300") == {8: 1, 16: 2, 300: 1}
    assert parse_lengths(str(_lengths_file(tmp_path))) == {12: 30, 40: 50, 60: 10}
    plain = tmp_path / "plain.txt"
    plain.write_text("8\n16\n16\n")
    assert parse_lengths(str(plain)) == {8: 1, 16: 2}
    broken = tmp_path / "broken.txt"
    broken.write_text("8\n16,2,3\n")
    with pytest.raises(TorchIRError, match=r"broken.txt:2: expected a whole length or 'length,count'"):
        parse_lengths(str(broken))
