"""Model Explorer files of every stage (npu_tools.view.explorer), the overlays people ask for
(npu_tools.view.overlay_sources) and ``torch-ir view``; the files are checked against the real package's schema."""

from __future__ import annotations

import json
import sys
import time

import pytest

from npu_tools.cli import main
from npu_tools.view.explorer import (
    GRAPHS_FILE,
    graph_collection,
    namespace_path,
    node_data_json,
    sync_mapping,
    write_explorer,
)
from npu_tools.view.overlay_sources import (
    NPU,
    bisect_overlay,
    cost_overlays,
    error_overlay,
    placement_overlay,
    sqnr_overlay,
)
from npu_tools.view.overlays import carry
from npu_tools.view.stages import GraphNode, StageGraph, pipeline_graphs
from torch_ir.verify.drift import NodeError

HOSTILE = "<script>alert(1)</script>"


def node(id_: str, sources: list[str], inputs: list[str] = (), namespace: str = "") -> GraphNode:
    return GraphNode(id_, "aten.op.default", namespace, list(inputs), [(f"{id_}_out", [2, 3], "float32")],
                     sources=sources)


TINY = [
    StageGraph("extracted", [node("matmul", ["matmul"], namespace="layers.0.mlp"),
                             node("add", ["add"], ["matmul"], "layers.0.mlp"),
                             node("relu", ["relu"], ["add"], "layers.0")]),
    StageGraph("compiled", [node("d0", ["matmul", "add"], namespace="layers.0.mlp"),
                            node("d1", ["relu"], ["d0"], "layers.0")]),
]


def _zoo(name: str):
    from npu_tools.zoo.runner import resolve_spec

    spec = resolve_spec(name)
    return pipeline_graphs(spec.extract(spec.build("meta")))


@pytest.fixture(scope="module")
def bert():
    return _zoo("bert")


@pytest.fixture(scope="module")
def llama():
    return _zoo("llama")


def test_namespaces_keep_a_block_index_on_its_block():
    assert namespace_path("model.layers.3.self_attn") == "model/layers.3/self_attn"
    assert namespace_path("encoder.layer.10.output.dense") == "encoder/layer.10/output/dense"
    assert namespace_path("model.layers.3") == "model/layers.3"
    assert namespace_path("embeddings.LayerNorm") == "embeddings/LayerNorm" and namespace_path("") == ""


@pytest.mark.parametrize("model, block", [("bert", "encoder/layer.{}"), ("llama", "model/layers.{}")])
def test_every_stage_of_a_zoo_model_folds_into_its_blocks_with_its_edges(model, block, request):
    graphs, program = request.getfixturevalue(model)
    collection = graph_collection(graphs, model)
    assert [g["id"] for g in collection["graphs"]] == ["extracted", "normalized", "fused", "compiled"]
    for stage, graph in zip(graphs, collection["graphs"]):
        ids = {n["id"] for n in graph["nodes"]}
        assert len(ids) == len(stage.nodes)
        edges = [e for n in graph["nodes"] for e in n["incomingEdges"]]
        assert len(edges) == sum(len(n.inputs) for n in stage.nodes) > 0
        assert all(e["sourceNodeId"] in ids for e in edges)
        # two layers, each its own group, in every stage (the compiled one too: a dispatch keeps its module)
        for layer in (0, 1):
            prefix = block.format(layer)
            assert any(n["namespace"] == prefix or n["namespace"].startswith(prefix + "/") for n in graph["nodes"])
        assert not any("layers/0" in n["namespace"] or "layer/0" in n["namespace"] for n in graph["nodes"])
    assert len(collection["graphs"][3]["nodes"]) == len(program.dispatches)


@pytest.mark.parametrize("model", ["bert", "llama"])
def test_each_dispatch_links_to_extracted_nodes_that_exist(model, request):
    graphs, _ = request.getfixturevalue(model)
    extracted, compiled = graphs[0], graphs[-1]
    names = {n.id for n in extracted.nodes}
    compiled_json = graph_collection(graphs, model)["graphs"][3]
    for dispatch, as_json in zip(compiled.nodes, compiled_json["nodes"]):
        assert dispatch.sources and set(dispatch.sources) <= names, dispatch
        shown = {a["key"]: a["value"] for a in as_json["attrs"]}
        assert shown["sources"].split(", ") == dispatch.sources
    mapping = sync_mapping(extracted, compiled)["mappingEntries"]
    left_of = {r: set(e["leftNodeIds"]) for e in mapping for r in e["rightNodeIds"]}
    for dispatch in compiled.nodes:  # its group on the left holds every extracted node it computes
        assert set(dispatch.sources) <= left_of[dispatch.id]
    assert len({r for e in mapping for r in e["rightNodeIds"]}) == len(compiled.nodes)


def test_overlays_are_carried_to_every_stage_and_written_as_node_data(tmp_path):
    cycles = carry("cycles", {"d0": 100, "d1": 10}, "compiled", TINY, unit="cycles")
    placement = carry("placement", {"d0": NPU, "d1": "CPU: no kernel"}, "compiled", TINY, reduce="join")
    files = write_explorer(TINY, tmp_path, [cycles, placement], label="tiny")
    assert [f.relative_to(tmp_path).as_posix() for f in files] == [
        "graphs.json", "overlays/cycles.json", "overlays/placement.json", "sync/extracted__compiled.json"]
    data = json.loads((tmp_path / "overlays" / "cycles.json").read_text())
    assert {k: v["value"] for k, v in data["extracted"]["results"].items()} == {"matmul": 100, "add": 100, "relu": 10}
    assert {k: v["value"] for k, v in data["compiled"]["results"].items()} == {"d0": 100, "d1": 10}
    assert data["compiled"]["gradient"][0]["stop"] == 0 and data["compiled"]["gradient"][-1]["stop"] == 1
    text = json.loads((tmp_path / "overlays" / "placement.json").read_text())["extracted"]["results"]
    assert text["matmul"]["value"] == NPU and text["relu"]["value"] == "CPU: no kernel"
    assert text["matmul"]["bgColor"] != text["relu"]["bgColor"]  # one colour per placement


def test_a_non_finite_value_is_left_out_not_written_as_invalid_json():
    overlay = carry("error", {"d0": float("nan"), "d1": 0.5}, "compiled", TINY, reduce="max")
    assert node_data_json(overlay)["compiled"]["results"] == {"d1": {"value": 0.5}}


def test_the_cost_overlay_adds_up_to_the_cost_report(bert):
    from npu_compiler.costmodel import cost_program, load_hardware

    graphs, program = bert
    report = cost_program(program, load_hardware("edge_4tops"))
    cycles, dram, bound = cost_overlays(report, graphs)
    assert sum(cycles.on("compiled").values()) == report.total_cycles > 0
    assert sum(dram.on("compiled").values()) == sum(r.dram_bytes for r in report.rows)
    assert set(bound.on("compiled").values()) <= {r.bound for r in report.rows}
    # every extracted node a costed dispatch computes shows a value, none more than the whole
    assert cycles.on("extracted") and max(cycles.on("extracted").values()) <= report.total_cycles
    placement = placement_overlay(program, graphs)
    assert set(placement.on("compiled")) == {f"d{i}" for i in range(len(program.dispatches))}


def test_the_verifier_error_and_bisect_finding_land_on_the_nodes_they_name():
    series = [NodeError(0, "matmul", "op", None, 1e-6, 0.0, True, "t"),
              NodeError(2, "relu", "op", None, 0.5, 1e-6, False, "t")]
    error = error_overlay(series, TINY)
    assert error.on("compiled") == {"d0": 1e-6, "d1": 0.5}
    finding = {"finding": {"kind": "kernel", "stage": "compiled:cpu", "dispatch": 1, "node": "relu"}}
    marked = bisect_overlay(finding, TINY)
    assert list(marked.on("compiled")) == ["d1"] and list(marked.on("extracted")) == ["relu"]
    by_provenance = bisect_overlay({"finding": {"kind": "rule", "stage": "normalize:fuse", "node": "gemm_3",
                                                "provenance": {"nodes": ["matmul", "add"]}}}, TINY)
    assert set(by_provenance.on("extracted")) == {"matmul", "add"} and list(by_provenance.on("compiled")) == ["d0"]
    assert bisect_overlay({"finding": None}, TINY).on("extracted") == {}


def test_the_per_layer_sqnr_of_a_quantized_ir_shows_the_worst_on_what_it_computes():
    from types import SimpleNamespace

    from npu_compiler.passes import normalize
    from npu_compiler.quantize.report.compare import LayerAccuracy
    from npu_tools.zoo.runner import resolve_spec

    spec = resolve_spec("llama")
    ir = spec.extract(spec.build("meta"))
    graphs, _ = pipeline_graphs(ir)
    quantized = normalize(ir)  # stands for the quantized IR: its nodes have provenance as a quantized one does
    first, second, exact = [n for n in quantized.nodes if n.op_type == "GEMM"][:3]
    layers = [LayerAccuracy(0, first.name, "GEMM", None, "t0", 30.0, 1.0, 0.0, float("inf"), 0.0),
              LayerAccuracy(1, second.name, "GEMM", None, "t1", 20.0, 1.0, 0.0, 30.0, 0.0),
              LayerAccuracy(2, exact.name, "GEMM", None, "t2", float("inf"), 1.0, 0.0, 20.0, 0.0)]
    overlay = sqnr_overlay(SimpleNamespace(layers=layers), quantized, graphs)
    assert overlay.on("normalized") == {first.name: 30.0, second.name: 20.0}  # the exact layer shows nothing
    sources = {n.id: n.sources for n in graphs[0].nodes}
    assert all(sources[k] for k in overlay.on("extracted"))
    assert set(overlay.on("compiled").values()) <= {30.0, 20.0} and overlay.on("compiled")


def test_torch_ir_view_verify_and_profile_overlay_the_error_and_the_time(tmp_path, capsys):
    out = tmp_path / "v"
    assert main(["view", "bert", "-o", str(out), "--no-server", "--verify", "--profile"]) == 0
    error = json.loads((out / "overlays" / "error.json").read_text())
    extracted = [r["value"] for r in error["extracted"]["results"].values()]
    assert len(extracted) > 50 and max(extracted) < 1e-3  # the IR computes what eager BERT computes
    time_us = json.loads((out / "overlays" / "time_us.json").read_text())
    assert all(r["value"] >= 0 for r in time_us["compiled"]["results"].values())
    assert len(time_us["compiled"]["results"]) == 30


def test_the_files_load_into_model_explorers_own_dataclasses(tmp_path, bert):
    dacite = pytest.importorskip("dacite", reason="the `view` extra (ai-edge-model-explorer) is not installed")
    graph_builder = pytest.importorskip("model_explorer.graph_builder")
    node_data_builder = pytest.importorskip("model_explorer.node_data_builder")
    from model_explorer.utils import convert_adapter_response

    graphs, program = bert
    overlays = [carry("cycles", {"d0": 3.0}, "compiled", graphs), placement_overlay(program, graphs)]
    write_explorer(graphs, tmp_path, overlays, label="bert")
    data = json.loads((tmp_path / GRAPHS_FILE).read_text())
    strict = dacite.Config(strict=True)
    collection = dacite.from_dict(graph_builder.GraphCollection, data, config=strict)
    assert [g.id for g in collection.graphs] == ["extracted", "normalized", "fused", "compiled"]
    # what the package's server would send the browser for it keeps every field we wrote
    sent = convert_adapter_response({"graphCollections": [collection]})["graphCollections"][0]
    assert sent["graphs"][3]["nodes"][0]["incomingEdges"] == data["graphs"][3]["nodes"][0]["incomingEdges"]
    numbers = json.loads((tmp_path / "overlays" / "cycles.json").read_text())
    for graph_data in numbers.values():
        dacite.from_dict(node_data_builder.GraphNodeData, graph_data, config=strict)
    # text values (placement) are Model Explorer's string node data: its Python dataclass types values as numbers,
    # so only the fields are checked strictly here; the browser test shows them coloured
    text = json.loads((tmp_path / "overlays" / "placement.json").read_text())
    for graph_data in text.values():
        dacite.from_dict(node_data_builder.GraphNodeData, graph_data, config=dacite.Config(strict=True,
                                                                                          check_types=False))


def test_a_hostile_node_name_survives_as_data(tmp_path):
    graphs = [StageGraph("extracted", [GraphNode(HOSTILE, HOSTILE, f"{HOSTILE}.0", [], [(HOSTILE, [1], "float32")],
                                                 {HOSTILE: HOSTILE}, [HOSTILE])])]
    overlay = carry(HOSTILE, {HOSTILE: HOSTILE}, "extracted", graphs)
    write_explorer(graphs, tmp_path, [overlay])
    node_json = json.loads((tmp_path / GRAPHS_FILE).read_text())["graphs"][0]["nodes"][0]
    assert node_json["id"] == node_json["label"] == HOSTILE
    assert {"key": HOSTILE, "value": HOSTILE} in node_json["attrs"]
    (written,) = (tmp_path / "overlays").iterdir()
    assert written.name == "script_alert_1_script.json"  # a name made of the overlay's, not a path from it
    assert json.loads(written.read_text())["extracted"]["results"] == {HOSTILE: {"value": HOSTILE,
                                                                                 "bgColor": "#a6dba0"}}


@pytest.mark.slow
def test_the_70b_shaped_model_stays_a_few_mb_and_is_built_in_seconds(llama70b_run, tmp_path):
    started = time.perf_counter()
    graphs, program = pipeline_graphs(llama70b_run.ir)
    files = write_explorer(graphs, tmp_path, [placement_overlay(program, graphs)], label="llama3-70b")
    seconds = time.perf_counter() - started
    assert seconds < 30, f"normalize, compile and the Model Explorer files of 80 layers took {seconds:.1f} s"
    size = (tmp_path / GRAPHS_FILE).stat().st_size
    assert size < 5 * 2**20, f"graphs.json of 80 layers is {size / 2**20:.1f} MB"
    namespaces = {n["namespace"].split("/")[1] for n in json.loads(files[0].read_text())["graphs"][0]["nodes"]
                  if n["namespace"].startswith("model/layers.")}
    assert namespaces == {f"layers.{i}" for i in range(80)}  # folded: one group per layer


def test_torch_ir_view_writes_the_files_without_a_server(tmp_path, capsys):
    out = tmp_path / "view"
    assert main(["view", "bert", "-o", str(out), "--no-server"]) == 0
    printed = capsys.readouterr().out
    assert "extracted (94 nodes)" in printed and "cycles, DRAM bytes, bound, placement" in printed
    assert sorted(p.name for p in (out / "overlays").iterdir()) == [
        "bound.json", "cycles.json", "dram_bytes.json", "placement.json"]
    assert len(list((out / "sync").iterdir())) == 4


def test_torch_ir_view_of_a_program_shows_its_embedded_normalized_ir(tmp_path, capsys, bert):
    _, program = bert
    program.save(tmp_path / "bert.npubin")
    assert main(["view", str(tmp_path / "bert.npubin"), "-o", str(tmp_path / "v"), "--no-server"]) == 0
    graphs = json.loads((tmp_path / "v" / GRAPHS_FILE).read_text())["graphs"]
    assert [g["id"] for g in graphs] == ["normalized", "compiled"]


def test_without_model_explorer_the_command_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "model_explorer", None)  # an import of it fails, as when not installed
    assert main(["view", "mlp", "-o", str(tmp_path / "v")]) == 0
    captured = capsys.readouterr()
    assert "pip install 'torch-ir[view]'" in captured.err and "graphs.json" in captured.err
    # mlp has a symbolic batch: no program is planned for it, and the IR stages are shown all the same
    assert "no compiled stage" in captured.out and "symbolic input dimensions" in captured.out
    graphs = json.loads((tmp_path / "v" / GRAPHS_FILE).read_text())["graphs"]
    assert [g["id"] for g in graphs] == ["extracted", "normalized", "fused"]


@pytest.mark.parametrize("argv, message", [
    (["--port", "0"], "--port 0: a port is 1 to 65535"),
    (["--hw", "no_such_npu"], "no_such_npu"),
    (["--bisect-report", "/nonexistent/report.json"], "bisect report"),
])
def test_bad_flags_are_refused_before_any_work(tmp_path, capsys, argv, message):
    assert main(["view", "bert", "-o", str(tmp_path / "v"), "--no-server", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "v").exists()
