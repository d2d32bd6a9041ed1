"""verify_onnx (against onnxruntime, with localization) and the import-onnx / verify-onnx commands."""

from __future__ import annotations

import argparse
import json

import onnx
import pytest
import torch

pytest.importorskip("onnxruntime")

from npu_tools.commands.import_onnx import add_parser, parse_input_shapes  # noqa: E402
from tests.onnx.graphs import reshape_by_shape_model  # noqa: E402
from torch_ir.frontends.onnx import import_onnx  # noqa: E402
from torch_ir.frontends.onnx.verify import verify_onnx  # noqa: E402


def test_verify_passes_an_honest_import() -> None:
    model = reshape_by_shape_model()
    ir, weights = import_onnx(model)
    ok, report = verify_onnx(ir, weights, model, [torch.randn(2, 3, 8, 8)])
    assert ok, report


def test_verify_names_the_first_node_that_diverges() -> None:
    model = reshape_by_shape_model()
    ir, weights = import_onnx(model)
    relu = next(n for n in ir.nodes if n.op_type == "aten.relu.default")
    relu.op_type = "aten.sigmoid.default"  # a wrong translation
    ok, report = verify_onnx(ir, weights, model, [torch.randn(2, 3, 8, 8)])
    assert not ok
    assert report.localization.node == relu.name and report.localization.diverging == 2  # relu, then reshape
    assert relu.name in str(report)


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_import_then_verify_from_the_command_line(tmp_path, capsys) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(reshape_by_shape_model(batch="N"), str(path))
    out = tmp_path / "m.json"
    assert _cli(["import-onnx", str(path), "-o", str(out), "--input-shape", "x=2,3,8,8"]) == 0
    printed = capsys.readouterr().out
    assert "aten.convolution.default" in printed and f"wrote {out}" in printed
    assert json.loads(out.read_text())["graph_inputs"][0]["shape"] == [2, 3, 8, 8]
    assert (tmp_path / "m.safetensors").is_file()
    assert _cli(["verify-onnx", str(path), "--ir", str(out), "--weights", str(tmp_path / "m.safetensors")]) == 0
    assert "PASS" in capsys.readouterr().out


def test_verify_asks_for_shapes_of_symbolic_inputs(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(reshape_by_shape_model(batch="N"), str(path))
    with pytest.raises(ValueError, match="--input-shape x=1,3,8,8"):
        _cli(["verify-onnx", str(path)])


def test_parse_input_shapes_keeps_names_as_symbols() -> None:
    assert parse_input_shapes(["ids=batch,8"]) == {"ids": ["batch", 8]}
    with pytest.raises(ValueError, match="NAME=D0,D1"):
        parse_input_shapes(["ids"])


def test_onnx_doc_is_generated_from_the_converter_table() -> None:
    from pathlib import Path

    from torch_ir.frontends.onnx.docs import onnx_markdown

    doc = Path(__file__).resolve().parents[2] / "docs" / "onnx.md"
    assert doc.read_text() == onnx_markdown(), (
        "docs/onnx.md is stale: run `python -m torch_ir.frontends.onnx.docs > docs/onnx.md`")
