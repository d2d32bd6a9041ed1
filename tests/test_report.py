"""Statistics, the Mermaid drawing and the Markdown page, checked against the torch model itself."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch

import torch_ir
from torch_ir.frontends.torch_export import _needs_functionalization
from torch_ir.ops import unregister_op
from torch_ir.report import ir_statistics, markdown_report, to_mermaid
from torch_ir.report.mermaid import escape, short_op
from torch_ir.report.stats import human_bytes
from torch_ir.verify import verify_ir

NODE_BOX = re.compile(r'^    (n_?\w+)\["', re.M)


class Block(torch.nn.Module):
    """Conv, batch norm (buffers), ReLU, linear; and a step counter written back in place."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 8 * 8, 10)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps.add_(1)
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc(h.flatten(1))


def extract(model_cls=Block, x=None, **kw):
    x = torch.randn(2, 3, 8, 8) if x is None else x
    with torch.device("meta"):
        meta = model_cls()
    torch.manual_seed(0)
    return torch_ir.extract_ir(meta, (x,), **kw), model_cls().eval(), x


@pytest.fixture(scope="module")
def block():
    return extract()


# -- statistics ------------------------------------------------------------------------------------

def test_counts_match_the_torch_model(block):
    ir, model, _ = block
    stats = ir_statistics(ir)
    assert stats.parameter_count == sum(p.numel() for p in model.parameters())
    assert stats.buffer_count == sum(b.numel() for b in model.buffers())
    stored = [*model.parameters(), *model.buffers()]
    expected = Counter()
    for t in stored:
        expected[str(t.dtype).removeprefix("torch.")] += t.numel() * t.element_size()
    assert stats.weight_bytes == dict(expected)
    assert stats.num_weights == len(stored)
    assert (stats.num_inputs, stats.num_outputs, stats.num_mutations) == (1, 1, 1)


def exported(model, x):
    """torch.export's graph of the real model, functionalized when the frontend would (in-place ops)."""
    with torch.no_grad():
        ep = torch.export.export(model, (x,))
    return ep.run_decompositions({}) if _needs_functionalization(ep) else ep


def op_nodes(ep):
    return [n for n in ep.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)]


def test_histogram_matches_the_exported_graph(block):
    ir, model, x = block
    ops = Counter(str(n.target) for n in op_nodes(exported(model, x)))
    stats = ir_statistics(ir)
    assert stats.op_histogram == dict(ops)
    assert stats.node_count == sum(ops.values())


class Mlp(torch.nn.Sequential):
    def __init__(self):
        super().__init__(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))


def test_activation_bytes_match_what_the_executor_produces():
    # not Block: batch norm's saved statistics are declared [C] by the meta kernel extraction uses
    # but come back empty from the CPU kernel in inference, so they would count differently
    ir, model, x = extract(Mlp, torch.randn(5, 6))
    produced = Counter()

    def count(node, outputs):
        for t in outputs:
            produced[str(t.dtype).removeprefix("torch.")] += t.numel() * t.element_size()

    torch_ir.IRExecutor(ir, model).run_traced([x], count)
    assert ir_statistics(ir).activation_bytes == dict(produced)


def test_symbolic_tensors_are_counted_not_sized():
    batch = torch.export.Dim("batch", min=2, max=16)
    ir, _, _ = extract(dynamic_shapes=({0: batch},))
    stats = ir_statistics(ir)
    assert stats.num_symbols == 1
    assert stats.symbolic_tensors == sum(1 for n in ir.nodes for t in n.outputs if not t.is_static)
    assert stats.symbolic_tensors > 0


def test_text_rendering(block):
    ir, model, _ = block
    text = str(ir_statistics(ir))
    assert f"{sum(p.numel() for p in model.parameters()):,}" in text
    for op in ir.op_histogram():
        assert op in text


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 1023, 1536, 3 * 2**20)] == ["0 B", "1023 B", "1.5 KiB", "3.0 MiB"]


# -- mermaid ---------------------------------------------------------------------------------------

def test_one_box_per_node_and_every_dependency_drawn(block):
    ir, _, _ = block
    chart = to_mermaid(ir)
    assert chart.startswith("flowchart TD\n")
    assert NODE_BOX.findall(chart) == [f"n_{n.name}" for n in ir.nodes]
    producer = {t.name: n.name for n in ir.nodes for t in n.outputs}
    for node in ir.nodes:
        for t in node.inputs:
            if t.name in producer:
                assert f"n_{producer[t.name]} --> n_{node.name}" in chart


def test_weights_are_collapsed_and_the_mutation_is_dashed(block):
    ir, _, _ = block
    chart = to_mermaid(ir)
    kept = set(ir.mutations)
    assert not any(f"_{w.name}[" in chart for w in ir.weights if w.name not in kept)
    conv = next(n for n in ir.nodes if n.op_type.startswith("aten.conv2d"))
    assert f'n_{conv.name}["conv2d<br/>[2,4,8,8] +2 weights"]' in chart
    (buffer, value), = ir.mutations.items()
    assert f"n_{value} -.->|writes| buf_{buffer}" in chart


def test_large_graphs_are_truncated_with_a_note(block):
    ir, _, _ = block
    chart = to_mermaid(ir, max_nodes=2)
    assert len(NODE_BOX.findall(chart)) == 2
    assert f"{len(ir.nodes) - 2} more nodes not shown" in chart
    assert "more --> out0" in chart


def test_labels_are_escaped():
    text = 'a"b<c>|d#e&`'
    escaped = escape(text)
    assert not set('"<>|`') & set(escaped)
    assert escaped.count("#") == len([c for c in text if c in '"<>|#&`'])


def test_odd_names_get_safe_ids():
    ir, _, _ = extract()
    ir.nodes[0].name = "end"  # a Mermaid keyword
    ir.nodes[1].name = "x.y z"  # not an identifier
    ir.nodes[1].op_type = 'my_ns.od"d.default'
    chart = to_mermaid(ir)
    assert "    n_end[" in chart
    assert "    n1[" in chart and 'od#34;d' in chart
    for line in chart.splitlines():
        assert line.count('"') in (0, 2), line


def test_short_op_names():
    assert short_op("aten.relu.default") == "relu"
    assert short_op("my_ns.scaled_add.default") == "my_ns.scaled_add"
    assert short_op("weird") == "weird"


# -- markdown --------------------------------------------------------------------------------------

def test_markdown_sections(block):
    ir, _, _ = block
    md = markdown_report(ir)
    headings = re.findall(r"^#+ (.*)$", md, re.M)
    assert headings == [f"IR report: {ir.model_name}", "Inputs", "Outputs", "Statistics", "Op histogram", "Graph"]
    assert "Producer: name torch_ir" in md
    assert "```mermaid\nflowchart TD\n" in md
    for t in [*ir.graph_inputs, *ir.graph_outputs]:
        assert f"| {t.name} | " in md
    for op, count in ir.op_histogram().items():
        assert f"| {op} | {count} |" in md


def test_markdown_with_symbols_and_escaping():
    batch = torch.export.Dim("batch", min=2, max=16)
    ir, _, _ = extract(dynamic_shapes=({0: batch},))
    ir.model_name = "a|b"
    md = markdown_report(ir)
    assert "# IR report: a\\|b" in md
    assert "## Symbols" in md and "| 2 | 16 |" in md


def test_markdown_includes_a_failed_verification_and_highlights_its_node():
    ir, model, x = extract()
    torch_ir.register_op("aten.relu.default", override=True)(lambda t: t.abs())
    try:
        ok, report = verify_ir(ir, None, model, (x,))
    finally:
        unregister_op("aten.relu.default")
    assert not ok
    md = markdown_report(ir, verification=report)
    assert md.rstrip().endswith(report.to_markdown().rstrip())
    relu = report.localization.node
    assert f"style n_{relu} fill:" in md
