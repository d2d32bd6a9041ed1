"""``write_repro`` and ``sub_ir``: a repro directory runs on its own, fails on the faulty path, passes on the
reference path.

repro.py runs in a fresh Python (``sys.executable``), as a user runs it: nothing of this test process reaches
it. So a fault must be *in the code that process runs* for the faulty path to fail:

- a rule fault: the broken rule is real code in a module the repro imports (``rule_source``);
- a frontend fault: the faulty translation is the minimal IR itself (what a broken converter emits is saved
  in ir.json), and model.onnx runs the trusted ONNX node with onnxruntime;
- a kernel fault: the installed kernels are correct, so the test breaks the CPU kernel inside the repro's own
  process (a module imported before repro.py runs) and checks both directions: broken, ``python repro.py``
  exits 1 while ``--reference`` (the op's reference implementation) exits 0; unbroken, ``python repro.py``
  exits 0. A repro cannot and should not carry a fault that is not in the code it runs.

Each test's repro runs share one fresh Python (``runpy.run_path("repro.py", run_name="__main__")`` with
``sys.argv`` set, which is what ``python repro.py`` does) to keep the file fast: each new Python imports torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from onnx import helper

from npu_compiler.passes import NormalizeOptions, normalize
from npu_tools.debug.repro import ReproCase, ReproError, sub_ir, sub_weights, write_repro
from npu_tools.debug.sources import subject_from_onnx, subject_from_torch
from tests.onnx.graphs import FLOAT, make_model
from torch_ir.errors import OutputWriteError
from torch_ir.executor import IRExecutor
from torch_ir.ir import NPU_IR, check_integrity
from torch_ir.rewrite import rewrite

# Faults as real code, importable by the repro's process (tmp_path is put on its PYTHONPATH).
FAULTS = textwrap.dedent('''
    from dataclasses import replace

    from npu_compiler.passes.pipeline import ALL_RULES

    _RMS = next(r for r in ALL_RULES if r.name == "rms_norm")


    def _wrong_eps(m):
        nodes = _RMS.replace(m)
        for node in nodes if isinstance(nodes, list) else []:
            if node.op_type == "RMS_NORM":
                node.attrs = {**node.attrs, "eps": 0.5}  # the injected fault: a wrong epsilon
        return nodes


    BAD_RMS = replace(_RMS, name="rms_norm_wrong_eps", replace=_wrong_eps)


    def break_rms_kernel():
        from npu_runtime.backends import cpu_transformer

        run = cpu_transformer.RmsNorm.run

        def off_by_one(self, inputs, outputs):
            run(self, inputs, outputs)
            outputs[0].add_(1.0)

        cpu_transformer.RmsNorm.run = off_by_one
''')

# Runs ``python repro.py <argv>`` once per list in one process (runpy, as __main__, with sys.argv set); a string
# in the plan instead calls that function of faults.py (a fault injected from then on). Prints each exit code.
DRIVER = textwrap.dedent('''
    import json, runpy, sys
    for argv in json.loads(sys.argv[1]):
        if isinstance(argv, str):
            import faults
            getattr(faults, argv)()
            continue
        sys.argv = ["repro.py", *argv]
        try:
            runpy.run_path("repro.py", run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code
        print(f"EXIT {code}", flush=True)
''')


def _env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "faults.py").write_text(FAULTS)
    return {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}


def run_repro(directory: Path, tmp_path: Path, plan: list[list[str] | str]) -> tuple[list[int], str]:
    """Exit codes of the repro runs of ``plan`` (see DRIVER) in a fresh Python, and what it printed."""
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(plan)], cwd=directory, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    codes = [int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("EXIT ")]
    return codes, done.stdout


class RMSBlock(torch.nn.Module):
    """Linear then a llama-style RMS norm (the pattern the ``rms_norm`` rule fuses)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.weight = torch.nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))


def node_values(ir: NPU_IR, weights: object, inputs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    values = dict(zip((t.name for t in ir.graph_inputs), inputs))
    IRExecutor(ir, weights).run_traced(inputs, lambda n, o: values.update({m.name: v for m, v in zip(n.outputs, o)}))
    return values


def case_for(kind: str, title: str, ir: NPU_IR, nodes: list[str], weights: object, values: dict, **kw: object,
             ) -> ReproCase:
    small = sub_ir(ir, nodes, name=nodes[-1])
    return ReproCase(kind, title, small, sub_weights(small, weights),
                     {t.name: values[t.name] for t in small.graph_inputs},
                     {t.name: values[t.name] for t in small.graph_outputs}, **kw)


def test_sub_ir_cuts_inputs_outputs_and_weights() -> None:
    torch.manual_seed(0)
    subject = subject_from_torch(RMSBlock(), (torch.randn(2, 3, 8),))
    ir = subject.ir
    names = [n.name for n in ir.nodes]  # linear, pow_1, mean, add, rsqrt, mul, mul_1
    small = sub_ir(ir, names[1:5], name="middle")
    check_integrity(small)
    assert [t.name for t in small.graph_inputs] == [names[0]]  # what the first kept node reads
    assert [t.name for t in small.graph_outputs] == [names[4]]  # read by mul, outside the group
    assert small.weights == [] and small.metadata["repro_of"]["nodes"] == names[1:5]
    head = sub_ir(ir, names[:1], name="head")
    assert [t.name for t in head.graph_inputs] == ["x"]
    assert set(head.weight_name_mapping.values()) == {"proj.weight", "proj.bias"}
    assert set(sub_weights(head, subject.weights)) == {"proj.weight", "proj.bias"}
    values = node_values(ir, subject.weights, subject.inputs)
    (out,) = IRExecutor(small, {}).run([values[names[0]]])
    torch.testing.assert_close(out, values[names[4]])
    assert ir.graph_inputs[0].role == "input" and ir.nodes[0].outputs[0].role != "input"  # the source is untouched
    with pytest.raises(ReproError, match="no node named"):
        sub_ir(ir, ["nope"], name="x")


@pytest.mark.slow
def test_rule_repro(tmp_path: Path) -> None:
    """The wrong-epsilon rule (real code in faults.py, imported by the repro) reproduces."""
    torch.manual_seed(0)
    subject = subject_from_torch(RMSBlock(), (torch.randn(2, 3, 8),))
    before = normalize(subject.ir, NormalizeOptions(disabled_rules={"rms_norm"}))
    _env(tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        import faults  # the same module the repro imports
    finally:
        sys.path.remove(str(tmp_path))
    after = rewrite(before, [faults.BAD_RMS])
    (_, root), = after.log
    gone = {n.name for n in before.nodes} - {n.name for n in after.ir.nodes} | {root}
    values = node_values(before, subject.weights, subject.inputs)
    case = case_for("rule", f"rule rms_norm_wrong_eps makes {root} differ", before,
                    [n.name for n in before.nodes if n.name in gone], subject.weights, values,
                    rule="rms_norm_wrong_eps", rule_source="faults:BAD_RMS", trusted="the IR before the rule")
    out = write_repro(tmp_path / "repro", case)
    assert {p.name for p in out.iterdir()} == {"ir.json", "weights.safetensors", "inputs.npz", "expected.npz",
                                               "case.json", "README.md", "repro.py"}
    codes, text = run_repro(out, tmp_path, [[], ["--reference"]])
    assert codes == [1, 0], text
    assert "RMS_NORM" in text and "DIFFERS" in text and "MATCHES" in text


@pytest.mark.slow
def test_kernel_repro_bfloat16(tmp_path: Path) -> None:
    """A broken CPU RMS_NORM kernel: broken, the faulty path exits 1 and the reference path 0; unbroken, the
    faulty path passes too, since the repro runs the installed kernel. bfloat16 survives the npz round trip."""
    torch.manual_seed(0)
    subject = subject_from_torch(RMSBlock().to(torch.bfloat16), (torch.randn(2, 3, 8, dtype=torch.bfloat16),))
    ir = normalize(subject.ir)
    (rms,) = [n.name for n in ir.nodes if n.op_type == "RMS_NORM"]
    values = node_values(ir, subject.weights, subject.inputs)
    case = case_for("kernel", f"kernel RMS_NORM (cpu) makes {rms} differ", ir, [rms], subject.weights, values,
                    backend="cpu", trusted="the normalized IR's reference execution")
    out = write_repro(tmp_path / "repro", case)
    manifest = json.loads((out / "case.json").read_text())
    assert [e["dtype"] for e in manifest["inputs"]] == ["bfloat16"] and manifest["inputs"][0]["stored"] == "float32"
    assert "npz has no bfloat16" in (out / "README.md").read_text()
    # unbroken first (the installed kernel: the faulty path matches), then broken
    codes, text = run_repro(out, tmp_path, [[], "break_rms_kernel", [], ["--reference"]])
    assert codes == [0, 1, 0], text
    assert "DIFFERS" in text and "dispatch RMS_NORM" in text


@pytest.mark.slow
def test_onnx_frontend_repro_runs_the_onnx_node(tmp_path: Path) -> None:
    """A converter that turned Relu into abs: the minimal IR holds the faulty translation, model.onnx the
    trusted Relu node, which onnxruntime runs on the reference path."""
    rng = np.random.default_rng(0)
    proto = make_model([helper.make_node("Gemm", ["x", "w"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["r"]),
                        helper.make_node("Neg", ["r"], ["y"])],
                       [("x", FLOAT, [3, 4])], [("y", FLOAT, [3, 5])],
                       {"w": rng.standard_normal((5, 4)).astype(np.float32)})
    subject = subject_from_onnx(proto)
    trusted = subject.trusted_values()
    (relu,) = [n for n in subject.ir.nodes if n.outputs[0].name == "r"]
    case = case_for("frontend", "ONNX Relu becomes r wrongly", subject.ir, [relu.name], subject.weights, trusted,
                    onnx_model=proto, trusted="onnxruntime", details="Injected: the converter emitted `abs`.")
    case.ir.nodes[0].op_type = "aten.abs.default"  # what the broken converter emitted, saved in ir.json
    out = write_repro(tmp_path / "repro", case)
    assert (out / "model.onnx").is_file() and not (out / "weights.safetensors").exists()
    readme = (out / "README.md").read_text()
    assert "ONNX Relu becomes r wrongly" in readme and "Injected: the converter" in readme and "model.onnx" in readme
    codes, text = run_repro(out, tmp_path, [[], ["--reference"]])
    assert codes == [1, 0], text


def test_refusals_and_overwrite(tmp_path: Path) -> None:
    torch.manual_seed(0)
    subject = subject_from_torch(RMSBlock(), (torch.randn(2, 3, 8),))
    values = node_values(subject.ir, subject.weights, subject.inputs)
    first = subject.ir.nodes[0].name
    case = case_for("frontend", "linear differs", subject.ir, [first], subject.weights, values)
    out = write_repro(tmp_path / "repro", case)
    assert (out / "weights.safetensors").is_file()
    with pytest.raises(OutputWriteError, match="not empty.*overwrite=True"):
        write_repro(out, case)
    second = case_for("frontend", "rsqrt differs", subject.ir, [subject.ir.nodes[4].name], subject.weights, values)
    write_repro(out, second, overwrite=True)
    assert not (out / "weights.safetensors").exists()  # the earlier case's file is not left behind
    assert "rsqrt differs" in (out / "README.md").read_text()
    for bad, match in [({"kind": "compiler"}, "kind 'compiler'"), ({"kind": "rule", "rule": "no_such_rule"},
                       "rule_source"), ({"kind": "kernel"}, "backend="), ({"title": "two\nlines"}, "one line"),
                       ({"inputs": {}}, "no value for")]:
        broken = ReproCase(**{**case.__dict__, **bad})
        with pytest.raises(ReproError, match=match):
            write_repro(tmp_path / "never", broken)
    assert not (tmp_path / "never").exists()  # refused before anything is written
