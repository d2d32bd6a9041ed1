"""``compile(..., fallback="cpu")``: nodes without a kernel become host dispatches of one runnable program.

Real models with ops the kernel library leaves on the host (a histogram, a grid sample, a scatter to run-time
indices, a prefix scan) and a float64 model (a dtype the target lacks): strict compilation lists every such
node; with the fallback the program names each host op and why, survives a save/load round trip, and runs
equal to eager PyTorch through ``npu_runtime.Executor`` (validated, profiled, on a backend that downloads
too). A hostile program that names a file-reading or unknown op as a host dispatch is refused before
anything is allocated.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from safetensors.torch import save_file
from torch import nn

import npu_compiler
import torch_ir
from npu_compiler import CompiledProgram, CompileError, NpubinError, UnsupportedOpsError
from npu_compiler.library import is_op_supported, unsupported_reason
from npu_program import npubin
from npu_program.codec import from_json, to_json
from npu_runtime import CPUBackend, Device, Executor, RuntimeInputError, load_weights
from npu_runtime.backends.base import HostKernel
from npu_tools.cli import main as torch_ir_cli
from torch_ir.ir.serialize import ir_from_dict
from torch_ir.weights import module_state

from ..helpers import assert_outputs_close, build_pair

# -- models ----------------------------------------------------------------------------------------------------


class Histogram(nn.Module):
    """A histogram of a linear layer's output, and a prefix scan of it (both stay on the host)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)

    def forward(self, x):
        h = self.fc(x)
        return torch.histc(h, bins=6, min=-2.0, max=2.0), torch.logcumsumexp(h, dim=-1) * 0.5


class Warp(nn.Module):
    """A convolution, a grid sample of its (NHWC) output at run-time coordinates, and a second convolution
    whose residual is the host's (row-major) result: that CONV must not write over it in place."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x, grid):
        y = self.conv1(x)
        s = F.grid_sample(y, grid, align_corners=False)
        return torch.relu(self.conv2(y) + s)


class ScatterRows(nn.Module):
    """Rows written at run-time indices (``index_put``), between two linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, x, idx):
        h = self.fc(x)
        return self.out(torch.index_put(h, (idx,), torch.tanh(h[:2])))


class Float64Linear(nn.Module):
    """A float64 linear layer: the target has GEMM, but not in float64."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 4)

    def forward(self, x):
        return torch.relu(self.fc(x)) + 1.0


@dataclass
class Case:
    factory: type[nn.Module]
    # example inputs (real), made from a generator so every test sees the same numbers
    inputs: object
    # the ops that must run on the host
    host_ops: set[str]
    dtype: torch.dtype = torch.float32
    meta_kwargs: dict = field(default_factory=dict)


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


CASES = {
    "histogram": Case(Histogram, lambda g: (torch.randn(4, 8, generator=g),),
                      {"aten.histc.default", "aten.logcumsumexp.default"}),
    "warp": Case(Warp, lambda g: (torch.randn(1, 3, 6, 6, generator=g), torch.rand(1, 6, 6, 2, generator=g) * 2 - 1),
                 {"aten.grid_sampler.default"}),
    "scatter_rows": Case(ScatterRows, lambda g: (torch.randn(5, 6, generator=g), torch.tensor([3, 0])),
                         {"aten.index_put.default"}),
    # the GEMM (with the relu fused) and the add both have kernels, but not in float64
    "float64": Case(Float64Linear, lambda g: (torch.randn(3, 5, generator=g, dtype=torch.float64),),
                    {"GEMM", "aten.add.Tensor"}, dtype=torch.float64),
}


def build(case: Case, seed: int = 0) -> tuple[torch_ir.NPU_IR, nn.Module, tuple[torch.Tensor, ...]]:
    """(IR extracted on meta, the real model with seeded weights, real inputs)."""
    meta, real = build_pair(case.factory, seed)
    meta, real = meta.to(case.dtype), real.to(case.dtype)
    inputs = case.inputs(_gen())
    example = tuple(x.to("meta") for x in inputs)
    return torch_ir.extract_ir(meta, example, model_name=case.factory.__name__), real, inputs


def run(program: CompiledProgram, real: nn.Module, inputs: tuple[torch.Tensor, ...], device: Device | None = None,
        **executor_kw) -> list[torch.Tensor]:
    device = device or Device()
    weights = load_weights(module_state(real), program, device)
    names = [s.name for s in program.input_specs]
    outs = Executor(program, device, **executor_kw).run(dict(zip(names, [x.numpy() for x in inputs])),
                                                        weights=weights)
    return [torch.from_numpy(outs[s.name].to_numpy()) for s in program.output_specs]


def eager(real: nn.Module, inputs: tuple[torch.Tensor, ...]):
    with torch.no_grad():
        return real(*inputs)


def host_ops(program: CompiledProgram) -> set[str]:
    return {d.kernel for _, d in program.host_dispatches}


# -- the premise: these ops really have no kernel ---------------------------------------------------------------


@pytest.mark.parametrize("op", sorted({op for c in CASES.values() if c.dtype == torch.float32 for op in c.host_ops}))
def test_the_ops_of_these_models_have_no_kernel_on_the_cpu_target(op):
    # if one gets a kernel, pick another op that stays on the host for the model that uses it
    assert not is_op_supported(op), f"{op} now has a CPU kernel: these tests need an op that stays on the host"


# -- strict and fallback compilation ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_strict_compile_lists_every_node_the_fallback_would_run_on_the_host(name):
    case = CASES[name]
    ir, _, _ = build(case)
    with pytest.raises(UnsupportedOpsError) as info:
        npu_compiler.compile(ir)
    assert {op for _, op, _ in info.value.unsupported} == case.host_ops
    assert 'fallback="cpu"' in str(info.value)
    program = npu_compiler.compile(ir, fallback="cpu")
    # the same nodes, now host dispatches
    assert sorted(d.node for _, d in program.host_dispatches) == sorted(n for n, _, _ in info.value.unsupported)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_fallback_program_round_trips_and_runs_equal_to_eager(name, tmp_path):
    case = CASES[name]
    ir, real, inputs = build(case)
    program = npu_compiler.compile(ir, fallback="cpu")
    assert host_ops(program) == case.host_ops
    # every host dispatch says why, with the compiler's own reason for its (normalized) node
    nodes = {n.name: n for n in ir_from_dict(program.ir).nodes}
    for _, d in program.host_dispatches:
        assert d.host == unsupported_reason(nodes[d.node], "cpu") and d.host
    path = tmp_path / f"{name}.npubin"
    program.save(path)
    loaded = CompiledProgram.load(path)
    assert loaded == program
    expected = eager(real, inputs)
    assert_outputs_close(run(loaded, real, inputs), expected)
    # validation runs every dispatch's reference beside it, host dispatches included
    assert_outputs_close(run(loaded, real, inputs, validate=True), expected)


def test_host_dispatches_write_row_major_and_a_host_residual_is_not_overwritten_in_place():
    ir, real, inputs = build(CASES["warp"])
    program = npu_compiler.compile(ir, fallback="cpu")
    (index, sample), = program.host_dispatches
    assert program.tensors[sample.inputs[0]].layout == "NHWC"  # the convolution's output, read as it is
    assert program.tensors[sample.outputs[0]].layout is None
    conv_add = next(d for d in program.dispatches if d.kernel == "CONV" and d.params.get("has_residual"))
    assert conv_add.inputs[-1] == sample.outputs[0] and program.tensors[conv_add.outputs[0]].layout == "NHWC"
    assert not conv_add.params.get("inplace_residual")  # NHWC output over row-major bytes would be wrong
    assert_outputs_close(run(program, real, inputs), eager(real, inputs))


def test_placement_is_in_the_metadata_and_the_summary():
    ir, _, _ = build(CASES["histogram"])
    program = npu_compiler.compile(ir, fallback="cpu")
    placement = program.metadata["placement"]
    host = program.host_dispatches
    assert placement["fallback"] == "cpu"
    assert placement["host"]["dispatches"] == len(host) == 2
    assert placement["host"]["dispatches"] + placement["target"]["dispatches"] == program.dispatch_count
    assert placement["host"]["nodes"] + placement["target"]["nodes"] == program.metadata["normalized_nodes"]
    assert placement["target"]["flops"] > 2 * 4 * 8 * 16 - 1  # the GEMM
    assert [(h["index"], h["op"], h["reason"]) for h in placement["host_dispatches"]] == \
        [(i, d.kernel, d.host) for i, d in host]
    summary = program.summary()
    assert f"placement: 2 of {program.dispatch_count} dispatches run on the host CPU" in summary
    assert "host FLOPs" in summary
    for _, d in host:
        assert f"  {d.kernel} x1: {d.host}" in summary
    # a program without host dispatches prints no placement lines, but still carries its placement
    strict = npu_compiler.compile(_linear_ir())
    assert "placement" not in strict.summary() and strict.metadata["placement"]["host"]["dispatches"] == 0


def _linear_ir() -> torch_ir.NPU_IR:
    meta, _ = build_pair(lambda: nn.Sequential(nn.Linear(4, 3), nn.ReLU()))
    return torch_ir.extract_ir(meta, (torch.randn(2, 4, device="meta"),), model_name="linear")


def test_the_summary_survives_odd_placement_metadata():
    ir, _, _ = build(CASES["histogram"])
    program = npu_compiler.compile(ir, fallback="cpu")
    for odd in (None, "x", {"target": {"flops": "many"}, "host": {"flops": 1}}, {"target": 1}):
        program.metadata["placement"] = odd
        summary = program.summary()
        assert "dispatches run on the host CPU" in summary and "FLOPs" not in summary


# -- the file format --------------------------------------------------------------------------------------------


def _header(data: bytes) -> dict:
    _, _, _, length = struct.unpack_from("<8sHHQ", data)
    return json.loads(data[20:20 + length])


def test_the_header_carries_host_only_on_host_dispatches_and_a_1_1_file_still_loads():
    ir, _, _ = build(CASES["histogram"])
    data = npubin.encode_npubin(npu_compiler.compile(ir, fallback="cpu"))
    assert struct.unpack_from("<8sHH", data)[1:] == npubin.FORMAT_VERSION == (2, 1)
    dispatches = _header(data)["dispatches"]
    assert sorted(d["kernel"] for d in dispatches if "host" in d) == ["aten.histc.default", "aten.logcumsumexp.default"]
    assert all(d["host"] for d in dispatches if "host" in d)
    # a program without host dispatches writes no `host` key at all, and this one's params hold no value the
    # IR would tag, so its header is a 1.1 header too: a 1.1 file (the same bytes, version 1.1, checksum redone,
    # its params upgraded on read) loads as the same program
    strict = npu_compiler.compile(_linear_ir())
    data = npubin.encode_npubin(strict)
    assert all("host" not in d for d in _header(data)["dispatches"])
    body = data[:8] + struct.pack("<HH", 1, 1) + data[12:-32]
    assert npubin.decode_npubin(body + hashlib.sha256(body).digest(), "v1_1.npubin") == strict


def test_the_codec_omits_a_field_at_its_default_only_when_asked():
    @dataclass
    class Item:
        name: str
        note: str | None = field(default=None, metadata={"omit_default": True})
        kept: str | None = None

    assert to_json(Item("a")) == {"name": "a", "kept": None}
    assert to_json(Item("a", "why")) == {"name": "a", "note": "why", "kept": None}
    assert from_json(Item, {"name": "a", "kept": None}) == Item("a")
    assert from_json(Item, to_json(Item("a", "why"))) == Item("a", "why")


# -- the runtime ------------------------------------------------------------------------------------------------


class DownloadingCPU(CPUBackend):
    """The CPU backend with the generic host kernel a device backend would use (download, run, upload)."""

    def __init__(self) -> None:
        super().__init__()
        self.host_kernels = 0

    def host_kernel(self, dispatch, specs):
        self.host_kernels += 1
        return HostKernel(self, dispatch, specs)


@pytest.mark.parametrize("name", ["warp", "scatter_rows", "float64"])
def test_the_generic_host_kernel_downloads_runs_the_reference_and_uploads(name):
    case = CASES[name]
    ir, real, inputs = build(case)
    program = npu_compiler.compile(ir, fallback="cpu")
    backend = DownloadingCPU()
    got = run(program, real, inputs, Device(backend))
    assert backend.host_kernels == len(program.host_dispatches) > 0
    assert_outputs_close(got, eager(real, inputs))


def test_the_profile_marks_host_dispatches():
    ir, real, inputs = build(CASES["histogram"])
    program = npu_compiler.compile(ir, fallback="cpu")
    device = Device()
    profile = Executor(program, device).profile({"x": inputs[0].numpy()}, load_weights(module_state(real), program,
                                                                                        device), runs=2, warmup=1)
    assert [d.index for d in profile.dispatches if d.host] == [i for i, _ in program.host_dispatches]
    table = profile.table()
    assert "aten.histc.default [host]" in table and "GEMM [host]" not in table and "(2 [host]" in table
    assert sum(row["count"] for row in profile.to_dict()["by_kernel"]) == program.dispatch_count


# -- the CLI ----------------------------------------------------------------------------------------------------


def test_cli_compile_with_fallback_writes_a_program_that_runs(tmp_path, capsys):
    ir, real, inputs = build(CASES["histogram"])
    ir_path, program_path = tmp_path / "hist.json", tmp_path / "hist.npubin"
    ir.save(str(ir_path))
    assert torch_ir_cli(["compile", str(ir_path), "-o", str(program_path)]) == 1  # strict, as before
    assert not program_path.exists() and "nothing written" in capsys.readouterr().err
    assert torch_ir_cli(["compile", str(ir_path), "-o", str(program_path), "--fallback", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "placement: 2 of" in out and "aten.histc.default x1:" in out and "aten.logcumsumexp.default x1:" in out
    program = CompiledProgram.load(program_path)
    assert host_ops(program) == {"aten.histc.default", "aten.logcumsumexp.default"}

    weights, x = tmp_path / "hist.safetensors", tmp_path / "x.npy"
    save_file({k: v.contiguous() for k, v in module_state(real).items()}, str(weights))
    np.save(x, inputs[0].numpy())
    result = tmp_path / "out.npz"
    assert torch_ir_cli(["run", str(program_path), "--weights", str(weights), "--input", f"x={x}", "--validate",
                         "-o", str(result)]) == 0
    outputs = np.load(result)
    got = [torch.from_numpy(outputs[s.name]) for s in program.output_specs]
    assert_outputs_close(got, eager(real, inputs))
    assert torch_ir_cli(["profile", str(program_path), "--weights", str(weights), "--runs", "1"]) == 0
    assert "aten.histc.default [host]" in capsys.readouterr().out


# -- hostile programs -------------------------------------------------------------------------------------------


def _hostile(tmp_path, kernel: str | None = None, host: object = "keep") -> tuple[str, int]:
    """A saved fallback program whose first host dispatch is changed; returns (path, that dispatch's index)."""
    ir, _, _ = build(CASES["histogram"])
    program = npu_compiler.compile(ir, fallback="cpu")
    index, dispatch = program.host_dispatches[0]
    if kernel is not None:
        dispatch.kernel = kernel
    if host != "keep":
        dispatch.host = host
    path = tmp_path / "hostile.npubin"
    program.save(path)  # the writer does not check: a hostile file has a valid checksum too
    return str(path), index


@pytest.mark.parametrize(("op", "rule"), [
    ("aten.from_file.default", "reads or writes files"),
    ("aten.add_.Tensor", "writes to an argument"),
    ("mylib.no_such_op.default", "no implementation"),
    ("aten.no_such_op.default", "no implementation"),
    ("HOSTILE", "no implementation"),
])
def test_a_host_dispatch_naming_an_op_the_host_may_not_run_is_refused_before_anything_runs(tmp_path, monkeypatch,
                                                                                            op, rule):
    path, index = _hostile(tmp_path, op)
    program = CompiledProgram.load(path)  # the loader checks the shape of the name; the runtime checks the op
    allocated = []
    monkeypatch.setattr(CPUBackend, "allocate", lambda self, n: allocated.append(n))
    with pytest.raises(RuntimeInputError) as info:
        Executor(program, Device())
    message = str(info.value)
    assert f"dispatch {index}" in message and op in message and rule in message and "'Histogram'" in message
    assert allocated == []  # refused before the arena exists


@pytest.mark.parametrize("kernel", ["os.system", "builtins.eval", "torch.ops.aten.from_file", "../../etc/passwd",
                                    "aten.from_file.default; rm -rf /", "a" * 300, "", "aten..default"])
def test_a_host_dispatch_whose_name_is_no_op_type_is_refused_on_load(tmp_path, kernel):
    path, index = _hostile(tmp_path, kernel)
    with pytest.raises(NpubinError, match=rf"hostile.npubin: dispatch {index} is a host dispatch naming .*not an op"):
        CompiledProgram.load(path)


@pytest.mark.parametrize(("host", "match"), [("", "host must be a non-empty string"),
                                             ("x" * 5000, "host must be a non-empty string"),
                                             (None, "which target 'cpu' does not have")])
def test_a_host_field_must_be_a_bounded_reason_and_dropping_it_does_not_make_an_op_a_kernel(tmp_path, host, match):
    path, index = _hostile(tmp_path, host=host)
    with pytest.raises(NpubinError, match=rf"dispatch {index}.*{match}"):
        CompiledProgram.load(path)


def test_a_host_field_of_another_type_is_refused_by_the_schema(tmp_path):
    path, _ = _hostile(tmp_path, host=7)
    with pytest.raises(NpubinError, match=r"header\.dispatches\[\d+\]\.host: expected string"):
        CompiledProgram.load(path)


# -- what the fallback still refuses ----------------------------------------------------------------------------


def test_an_unknown_fallback_is_a_compile_error_naming_the_allowed_values():
    ir, _, _ = build(CASES["histogram"])
    with pytest.raises(CompileError, match=r"fallback='gpu'.*'cpu'"):
        npu_compiler.compile(ir, fallback="gpu")


def _with_op(op: str) -> dict:
    ir, _, _ = build(CASES["histogram"])
    data = ir.to_dict()
    for node in data["nodes"]:
        if node["op_type"] == "aten.histc.default":
            node["op_type"], node["attrs"] = op, {}
    return data


@pytest.mark.parametrize(("op", "rule"), [("aten.from_file.default", "reads or writes files"),
                                          ("mylib.no_such_op.default", "no reference implementation")])
def test_the_fallback_refuses_ops_the_host_cannot_run(op, rule):
    with pytest.raises(UnsupportedOpsError, match=rf"nor on the host \(fallback='cpu'\)(.|\n)*{rule}") as info:
        npu_compiler.compile(_with_op(op), fallback="cpu")
    assert [o for _, o, _ in info.value.unsupported] == [op]  # the logcumsumexp is fine: only the bad op is listed


def test_the_fallback_refuses_symbolic_shapes():
    meta, _ = build_pair(Histogram)
    batch = torch.export.Dim("batch", min=2, max=8)
    ir = torch_ir.extract_ir(meta, (torch.randn(4, 8, device="meta"),), dynamic_shapes={"x": {0: batch}})
    with pytest.raises(CompileError, match="symbolic input dimensions"):
        npu_compiler.compile(ir, fallback="cpu")
    program = npu_compiler.compile(ir, fallback="cpu", bind={"batch": 4})  # bound: the host runs what it can
    assert {d.kernel for _, d in program.host_dispatches} >= {"aten.histc.default"}
