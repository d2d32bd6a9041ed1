"""Runs of the pipeline the viewer tests draw: a small llama (two blocks), a model with hostile names, and the
80-layer Llama-3-70B-shaped model on the meta device (extracted once per session: ~20 s)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from npu_tools.view.overlay_sources import pipeline_overlays
from npu_tools.view.report import write_report
from npu_tools.view.stages import pipeline_graphs
from torch_ir.ir.core import Provenance, provenance_of

HOSTILE = "<script>alert(1)</script>"
HOSTILE_MODULE = "<img src=x onerror=alert(2)>.0"  # a block (it has a numeric part): drawn as a folded box
#: Where the browser tests keep their screenshots (git-ignored).
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "view"
LLAMA_70B = dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                 intermediate_size=28672, vocab_size=128256, rope_theta=500000.0, use_cache=False)


@dataclass
class Run:
    ir: object
    graphs: list
    program: object
    cost: object
    overlays: list
    page: Path


def run_pipeline(ir, out: Path, title: str = "report", verification=None) -> Run:
    from npu_compiler.costmodel import cost_program, load_hardware

    graphs, program = pipeline_graphs(ir)
    hw = load_hardware("edge_4tops")
    cost = cost_program(program, hw, dtype=hw.native_dtype)
    overlays = pipeline_overlays(graphs, program, cost)
    write_report(out, graphs, overlays, program=program, cost=cost, verification=verification, title=title)
    return Run(ir, graphs, program, cost, overlays, out)


def zoo_ir(name: str):
    from npu_tools.zoo.runner import resolve_spec

    spec = resolve_spec(name)
    return spec.extract(spec.build("meta"))


@pytest.fixture(scope="session")
def llama_run(tmp_path_factory) -> Run:
    return run_pipeline(zoo_ir("llama"), tmp_path_factory.mktemp("report") / "llama.html", title="llama")


def hostile_ir():
    """convnet with its first node named ``HOSTILE`` and the module path of its first two nodes (a conv and its
    batch norm) ``HOSTILE_MODULE``."""
    ir = zoo_ir("convnet")
    first = ir.nodes[0]
    for node in ir.nodes[:2]:
        prov = provenance_of(node)
        node.provenance = Provenance(list(prov.nodes), HOSTILE_MODULE, prov.origin, list(prov.rules))
    prov = provenance_of(first)
    first.name = HOSTILE
    first.provenance = Provenance([HOSTILE], prov.module, prov.origin, list(prov.rules))
    return ir


@pytest.fixture(scope="session")
def hostile_run(tmp_path_factory) -> Run:
    return run_pipeline(hostile_ir(), tmp_path_factory.mktemp("report") / "hostile.html", title=HOSTILE)


@pytest.fixture(scope="session")
def llama70b_run(tmp_path_factory) -> Run:
    """The 80-layer Llama-3-70B shape (hidden 8192, 64 heads), built on meta: nothing allocated."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch_ir

    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_70B)).eval()
    kwargs = {"input_ids": torch.zeros(1, 16, dtype=torch.long, device="meta")}
    ir = torch_ir.extract_ir(model, (), model_name="llama3-70b", example_kwargs=kwargs)
    return run_pipeline(ir, tmp_path_factory.mktemp("report") / "llama70b.html", title="llama3-70b")
