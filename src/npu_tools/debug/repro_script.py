"""``repro.py``: the script a repro directory runs (see ``npu_tools.debug.repro``), written as it is.

It imports only the installed toolkit (torch_ir, npu_compiler, npu_runtime), torch and numpy (and onnxruntime
for an ONNX reference); ``python repro.py`` runs the faulty path, ``--reference`` the reference path.
"""

SCRIPT = '''\
#!/usr/bin/env python
"""Standalone repro of one numerical fault; README.md says what is wrong.

    python repro.py              # the faulty path: exit 1 when it differs from expected.npz
    python repro.py --reference  # the reference path: exit 0 when it matches

Needs only the installed toolkit (torch_ir, npu_compiler, npu_runtime), torch and numpy.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from torch_ir.arrays import load_arrays as read_npz
from torch_ir.executor import IRExecutor
from torch_ir.ir import load_ir
from torch_ir.ops.values import dtype_from_name
from torch_ir.verify.compare import TABLE_HEADER, compare_tensors
from torch_ir.weights import load_state_dict

HERE = Path(__file__).resolve().parent


class CannotRunError(Exception):
    """The path cannot run here (no GPU adapter, onnxruntime missing): exit 2."""


def load_arrays(file, entries):
    """The tensors of an npz file in graph order, in their own dtype (bfloat16 was stored as float32); read by
    the toolkit's reader (numeric arrays only, sized before they are decompressed)."""
    data = read_npz(HERE / file, f"repro {file}")
    return [torch.from_numpy(data[e["key"]]).to(dtype_from_name(e["dtype"])) for e in entries]


def ir_reference(ir, weights, inputs):
    return IRExecutor(ir, weights).run(inputs)


def find_rules(case):
    """The rule(s) of that name: the toolkit's, or imported from case["rule_source"]."""
    if case.get("rule_source"):
        import importlib

        module, _, attr = case["rule_source"].partition(":")
        found = getattr(importlib.import_module(module), attr)
        rules = list(found) if isinstance(found, (list, tuple)) else [found]
    else:
        from npu_compiler.passes.kernel_fusion import KERNEL_FUSION_RULES
        from npu_compiler.passes.pipeline import ALL_RULES

        rules = [*ALL_RULES, *KERNEL_FUSION_RULES]
    rules = [r for r in rules if r.name == case["rule"]]
    if not rules:
        raise CannotRunError(f"no rewrite rule named {case['rule']!r} in this installation")
    return rules


def rule_applied(ir, weights, inputs, case):
    from torch_ir.rewrite import rewrite

    result = rewrite(ir, find_rules(case))
    if not result.changed:
        print(f"note: rule {case['rule']!r} did not apply to the minimal IR (the fault is elsewhere, or the rule "
              "now checks what it did not)")
    else:
        print(f"rule {case['rule']!r} applied {sum(result.applied.values())} time(s):")
        for node in result.ir.nodes:
            print(f"  {node}")
    return IRExecutor(result.ir, weights).run(inputs)


def compiled(ir, weights, inputs, case):
    import npu_compiler
    from npu_runtime import Device, Executor, NoAdapterError, load_weights

    options = npu_compiler.CompileOptions(normalize=False, fuse=False, public_output_names=False)
    program = npu_compiler.compile(ir, target=case["backend"], options=options, fallback="cpu")
    for d in program.dispatches:
        print(f"  dispatch {d.kernel} ({d.node})" + (f" on the host: {d.host}" if d.host else ""))
    try:
        device = Device(case["backend"])
    except NoAdapterError as e:
        raise CannotRunError(f"no {case['backend']} adapter here: {e}") from None
    executor = Executor(program, device)
    feeds = {spec.name: x for spec, x in zip(program.input_specs, inputs)}
    outs = executor.run(feeds, weights=load_weights(weights, program, device))
    by_name = {spec.name: torch.from_numpy(np.ascontiguousarray(outs[spec.name].to_numpy()))
               for spec in program.output_specs}
    # the runtime widens bfloat16 to float32 on the way out (numpy has none): back to the IR's dtype
    return [by_name[t.name].to(dtype_from_name(t.dtype)) for t in ir.graph_outputs]


def onnx_reference(ir, inputs, expected):
    if not (HERE / "model.onnx").exists():
        print("note: no standalone trusted model here; expected.npz holds the trusted framework's values")
        return expected
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise CannotRunError(f"the ONNX reference needs onnxruntime ({e})") from None
    session = ort.InferenceSession(str(HERE / "model.onnx"), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    feeds = {t.name: x.float().numpy() if x.dtype == torch.bfloat16 else x.numpy()
             for t, x in zip(ir.graph_inputs, inputs) if t.name in wanted}
    values = session.run([t.name for t in ir.graph_outputs], feeds)
    return [torch.from_numpy(np.asarray(v)) for v in values]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", action="store_true", help="run the reference path instead of the faulty one")
    args = parser.parse_args()
    case = json.loads((HERE / "case.json").read_text())
    ir = load_ir(HERE / "ir.json")
    weights = load_state_dict(HERE / "weights.safetensors") if (HERE / "weights.safetensors").exists() else {}
    inputs = load_arrays("inputs.npz", case["inputs"])
    expected = load_arrays("expected.npz", case["outputs"])
    kind = case["kind"]
    path = "reference" if args.reference else "faulty"
    print(f"{case['title']}\\n{path} path of a {kind} repro")
    try:
        if args.reference:
            actual = onnx_reference(ir, inputs, expected) if kind == "frontend" else ir_reference(ir, weights, inputs)
        elif kind == "rule":
            actual = rule_applied(ir, weights, inputs, case)
        elif kind in ("kernel", "lowering"):
            actual = compiled(ir, weights, inputs, case)
        else:
            actual = ir_reference(ir, weights, inputs)
    except CannotRunError as e:
        print(f"cannot run the {path} path here: {e}")
        return 2
    diffs = [compare_tensors(e["name"], a, x, case["rtol"], case["atol"])
             for e, a, x in zip(case["outputs"], actual, expected)]
    rows = [TABLE_HEADER] + [d.cells() for d in diffs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    bad = [d.name for d in diffs if not d.ok]
    if bad:
        print(f"DIFFERS: {len(bad)} of {len(diffs)} output(s) differ from expected.npz: {', '.join(bad)}")
        return 1
    print(f"MATCHES: every output matches expected.npz within tolerance ({path} path)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''
