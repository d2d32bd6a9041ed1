"""The HTML report as a file: one self-contained page, its embedded data, escaping, the memory timeline, the size
of an 80-layer model's page, and ``torch-ir report``. (What the page draws: test_report_browser.py.)"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from npu_program.memory_check import check_plan, lifetimes
from npu_tools.cli import main
from npu_tools.view.report import embed_json, report_data, write_report
from torch_ir.errors import OutputWriteError

from .conftest import HOSTILE, HOSTILE_MODULE

DATA_RE = re.compile(r'<script type="application/json" id="report-data">(.*?)</script>', re.S)


def embedded(page: str) -> dict:
    blocks = DATA_RE.findall(page)
    assert len(blocks) == 1, "one data block"
    return json.loads(blocks[0])


def test_the_page_is_one_file_that_fetches_nothing(llama_run):
    page = llama_run.page.read_text()
    assert not re.search(r"<(link|img|iframe|object|embed)\b", page, re.I)
    assert not re.search(r"\b(src|href)\s*=", page, re.I)
    assert not re.search(r"@import|url\(|fetch\(|XMLHttpRequest|import\(", page)
    # the only URL is the SVG namespace name, which is a name, never loaded
    assert set(re.findall(r"https?://[^\s\"']+", page)) == {"http://www.w3.org/2000/svg"}
    assert page.count("<script") == 2  # the data and the code, both inline


def test_the_embedded_data_round_trips(llama_run):
    data = embedded(llama_run.page.read_text())
    assert data == json.loads(json.dumps(report_data(llama_run.graphs, llama_run.overlays, llama_run.program)))
    stages = {s["stage"]: s for s in data["stages"]}
    assert list(stages) == ["extracted", "normalized", "fused", "compiled"]
    for graph in llama_run.graphs:
        nodes = stages[graph.stage]["nodes"]
        assert [n["id"] for n in nodes] == [n.id for n in graph.nodes]
        for node, entry in zip(graph.nodes, nodes):  # edges as indices, sources where not the node itself
            assert sorted(nodes[i]["id"] for i in entry["in"]) == sorted(node.inputs)
            assert entry.get("src", [entry["id"]]) == node.sources
    # the cost overlay on the compiled stage is the cost model's cycles per dispatch
    cycles = next(o for o in data["overlays"] if o["name"] == "cycles")
    rows = {f"d{r.index}": r.cycles for r in llama_run.cost.rows}
    assert {n["id"]: v for n, v in zip(stages["compiled"]["nodes"], cycles["values"]["compiled"])
            if v is not None} == rows


def test_a_hostile_name_is_only_ever_escaped(hostile_run):
    page = hostile_run.page.read_text()
    for text in (HOSTILE, HOSTILE_MODULE, "<img", "alert(1)</"):
        assert text not in page
    assert page.count("<script") == page.count("</script") == 2  # the data and the code: no third element
    assert f"<title>{html.escape(HOSTILE, quote=True)}</title>" in page
    data = embedded(page)  # the names are there, as data
    extracted = data["stages"][0]["nodes"]
    assert extracted[0]["id"] == HOSTILE and extracted[0]["ns"] == HOSTILE_MODULE
    assert any(HOSTILE in n.get("src", [n["id"]]) for s in data["stages"][1:] for n in s["nodes"])


def test_embed_json_escapes_what_could_end_the_script():
    text = embed_json({"a": "</script><!--&\u2028"})
    assert not set(text) & {"<", ">", "&", "\u2028"}
    assert json.loads(text) == {"a": "</script><!--&\u2028"}


def test_the_memory_timeline_is_the_plan(llama_run):
    program = llama_run.program
    memory = embedded(llama_run.page.read_text())["memory"]
    assert memory["arena_bytes"] == program.memory.arena_bytes
    assert memory["steps"] == len(program.dispatches)
    tensors = {name: (offset, nbytes, first, last) for name, offset, nbytes, first, last in memory["tensors"]}
    assert tensors and set(tensors) <= set(program.memory.offsets)
    for name, (offset, nbytes, first, last) in tensors.items():
        assert offset == program.memory.offsets[name]
        assert nbytes == program.tensors[name].nbytes
        assert -1 <= first <= last <= len(program.dispatches)
    # the rectangles are the lifetimes the plan was checked against: redrawn from them, the plan still holds
    sizes = {n: program.tensors[n].nbytes for n in program.memory.offsets}
    lives = lifetimes([(d.inputs, d.outputs) for d in program.dispatches], sizes,
                      live_in=[*(s.name for s in program.input_specs), *program.bind_outputs],
                      live_out=[*(s.name for s in program.output_specs), *program.bind_outputs],
                      aliases=program.memory.aliases)
    assert {life.name: (life.first, life.last) for life in lives} == {n: t[2:] for n, t in tensors.items()}
    check_plan(lives, program.memory.offsets, program.memory.arena_bytes, alignment=program.memory.alignment)


def test_the_70b_shaped_page_stays_small(llama70b_run):
    page = llama70b_run.page.read_text()
    size = len(page.encode())
    assert size < 6 * 2**20, f"{size / 2**20:.1f} MB"
    data = embedded(page)
    assert len(data["stages"][0]["nodes"]) > 4000  # every node is in it: nothing was dropped to fit
    blocks = {n["ns"].split(".")[2] for n in data["stages"][0]["nodes"] if n["ns"].startswith("model.layers.")}
    assert len(blocks) == 80


def test_a_report_is_written_whole_or_not_at_all(llama_run, tmp_path):
    target = tmp_path / "missing" / "r.html"
    with pytest.raises(OutputWriteError, match="r.html"):
        write_report(target, llama_run.graphs, llama_run.overlays)
    assert not target.parent.exists()


def test_cli_report_with_verification(tmp_path, capsys):
    out = tmp_path / "convnet.html"
    assert main(["report", "convnet", "-o", str(out), "--verify", "--profile"]) == 0
    page = out.read_text()
    assert 'id="verdict">PASS<' in page and "max abs error" in page
    assert "<h3>By kernel</h3>" in page
    data = embedded(page)
    names = [o["name"] for o in data["overlays"]]
    assert names[:4] == ["cycles", "DRAM bytes", "bound", "placement"] and len(names) == 6
    error, time = data["overlays"][4:]  # the verifier's error per node and the measured time per dispatch
    errors = [v for v in error["values"]["extracted"] if v is not None]  # one per node of the stage, in order
    assert len(error["values"]["extracted"]) == len(_stage(data, "extracted")["nodes"]) and errors
    assert all(0 <= v < 1e-3 for v in errors)
    times = time["values"]["compiled"]
    assert len(times) == len(_stage(data, "compiled")["nodes"]) and all(t is not None and t > 0 for t in times)
    assert f"wrote {out}" in capsys.readouterr().out


def _stage(data: dict, name: str) -> dict:
    return next(g for g in data["stages"] if g["stage"] == name)


def test_cli_report_of_an_ir_file_and_bad_flags(tmp_path, capsys):
    from tests.view.conftest import zoo_ir

    ir_file = tmp_path / "mlp.json"
    zoo_ir("mlp").save(ir_file)
    assert main(["report", str(ir_file), "-o", str(tmp_path / "mlp.html")]) == 2  # a dynamic batch
    err = capsys.readouterr().err
    assert "symbolic" in err and "fix:" in err and "--bind batch=1" in err and not (tmp_path / "mlp.html").exists()
    assert main(["report", str(ir_file), "-o", str(tmp_path / "mlp.html"), "--bind", "batch=2"]) == 0
    memory = embedded((tmp_path / "mlp.html").read_text())["memory"]
    assert memory["tensors"] and memory["arena_bytes"] > 0
    capsys.readouterr()
    assert main(["report", str(ir_file), "-o", str(tmp_path / "x.html"), "--verify"]) == 2
    err = capsys.readouterr().err
    assert "--verify" in err and "fix:" in err and not (tmp_path / "x.html").exists()
    assert main(["report", str(ir_file), "-o", str(tmp_path / "x.html"), "--hw", "no_such_npu"]) == 2
    assert "no_such_npu" in capsys.readouterr().err and not (tmp_path / "x.html").exists()


def test_cli_report_of_an_onnx_file(tmp_path: Path):
    pytest.importorskip("onnx")
    from tests.onnx.graphs import reshape_by_shape_model

    path = tmp_path / "conv.onnx"
    path.write_bytes(reshape_by_shape_model(batch=1).SerializeToString())
    assert main(["report", str(path), "-o", str(tmp_path / "conv.html")]) == 0
    data = embedded((tmp_path / "conv.html").read_text())
    assert [s["stage"] for s in data["stages"]] == ["extracted", "normalized", "fused", "compiled"]
    assert any(n["op"].startswith("aten.convolution") or "conv" in n["op"].lower() for n in data["stages"][0]["nodes"])
