"""The ONNX backend node test cases: generated once from ``onnx.backend.test.case.node``, cached,
and run through import + the reference executor (or through onnxruntime, for comparison).

The ``onnx`` wheel carries the case definitions but not always their data, so ``ensure_cases``
generates the data (seeded) in ONNX's own layout, ``<case>/model.onnx`` and
``<case>/test_data_set_0/{input,output}_<i>.pb``, under ``$TORCH_IR_CACHE`` (default
``~/.cache/torch_ir``) / ``onnx_node_cases/<onnx version>``, outside the repository.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ...fileio import atomic_write

TOLERANCE = (1e-3, 1e-7)  # rtol, atol of the ONNX backend tests; integers and booleans exact
_NON_TENSOR = ("sequence_type", "optional_type", "map_type", "sparse_tensor_type")


@dataclass
class Case:
    name: str
    path: Path
    op: str  # the op under test
    plain: bool  # inputs and outputs are plain tensors (no sequence, optional, map, string)


def cache_dir() -> Path:
    root = Path(os.environ.get("TORCH_IR_CACHE", Path.home() / ".cache" / "torch_ir"))
    return root / "onnx_node_cases" / onnx.__version__


def ensure_cases(seed: int = 0) -> Path:
    """Generate the node cases' data once (seeded); returns the cache directory."""
    root = cache_dir()
    if (root / "DONE").is_file():
        return root
    from onnx.backend.test.case.node import collect_testcases

    np.random.seed(seed)  # the definitions draw their inputs from numpy's global generator
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    for case in cases:
        _write_case(root / case.name, case.model, case.data_sets[0])
    atomic_write(root / "DONE", f"{len(cases)} cases, seed {seed}\n", what="ONNX node-test cache marker")
    return root


def _write_case(path: Path, model: onnx.ModelProto, data: tuple) -> None:
    data_dir = path / "test_data_set_0"
    data_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(path / "model.onnx", model.SerializeToString(), what="ONNX node-test model")
    for kind, values, infos in (("input", data[0], model.graph.input), ("output", data[1], model.graph.output)):
        for i, (value, info) in enumerate(zip(values, infos)):
            if not _is_plain(info) or isinstance(value, (list, dict)) or value is None:
                continue  # kept out of the coverage: nothing to write in tensor form
            proto = value if isinstance(value, onnx.TensorProto) else numpy_helper.from_array(np.asarray(value),
                                                                                            info.name)
            atomic_write(data_dir / f"{kind}_{i}.pb", proto.SerializeToString(), what="ONNX node-test data")


def _is_plain(info: onnx.ValueInfoProto) -> bool:
    t = info.type
    if any(t.HasField(f) for f in _NON_TENSOR) or not t.HasField("tensor_type"):
        return False
    return t.tensor_type.elem_type != onnx.TensorProto.STRING


def list_cases(root: Path | None = None) -> list[Case]:
    """Every cached case, with the op it tests and whether it is plain-tensor."""
    root = root or ensure_cases()
    models = {p.name: onnx.load(str(p / "model.onnx"), load_external_data=False)
              for p in sorted(root.iterdir()) if p.is_dir()}
    ops = {name: _op_under_test(m) for name, m in models.items()}
    out = []
    for name, model in models.items():
        twin = re.sub(r"_expanded(_ver\d+)?$", "", name)
        op = ops.get(twin, ops[name]) if twin != name else ops[name]
        plain = all(_is_plain(v) for v in [*model.graph.input, *model.graph.output])
        out.append(Case(name, root / name, op, plain))
    return out


def _op_under_test(model: onnx.ModelProto) -> str:
    ops = [n.op_type for n in model.graph.node if n.op_type != "Constant"] or ["Constant"]
    return ops[-1]


def load_data(case: Case) -> tuple[onnx.ModelProto, list[np.ndarray], list[np.ndarray]]:
    model = onnx.load(str(case.path / "model.onnx"))
    data = case.path / "test_data_set_0"

    def read(kind: str, n: int) -> list[np.ndarray]:
        return [numpy_helper.to_array(onnx.load_tensor(str(data / f"{kind}_{i}.pb"))) for i in range(n)]
    return model, read("input", len(model.graph.input)), read("output", len(model.graph.output))


def run_ours(model: onnx.ModelProto, inputs: list[np.ndarray], *, reference_fallback: bool = True) -> list:
    """Import ``model`` and run it with the reference executor; outputs as torch tensors."""
    from ...executor import IRExecutor
    from . import import_onnx
    from .dtypes import to_torch

    ir, weights = import_onnx(model, reference_fallback=reference_fallback)
    tensors = [to_torch(x, meta.dtype) for x, meta in zip(inputs, ir.graph_inputs)]
    return IRExecutor(ir, weights).run(tensors)


def run_onnxruntime(model: onnx.ModelProto, inputs: list[np.ndarray]) -> list:
    """The outputs onnxruntime computes for ``model``, as torch tensors."""
    import onnxruntime as ort

    from .context import np_dtype_name
    from .dtypes import to_torch

    model = onnx.ModelProto.FromString(model.SerializeToString())
    model.ir_version = min(model.ir_version, 10)  # onnxruntime may lag the newest IR version
    ort.set_default_logger_severity(4)  # failures are reported by the caller, not logged
    options = ort.SessionOptions()
    options.log_severity_level = 4
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {i.name: x for i, x in zip(model.graph.input, inputs)}
    return [to_torch(np.asarray(y), np_dtype_name(np.asarray(y))) for y in session.run(None, feeds)]


def compare(actual: list, expected: list[np.ndarray]) -> str | None:
    """None when every output matches within the ONNX backend tolerance, else what differs."""
    from ...verify import compare_tensors
    from .context import np_dtype_name
    from .dtypes import to_torch

    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        e = to_torch(e, np_dtype_name(e))
        d = compare_tensors(f"output {i}", a, e, *TOLERANCE)
        if not d.ok:
            return (f"output {i}: max abs err {d.max_abs:.3g}, {d.mismatched}/{d.numel} mismatched"
                    + (f", {d.note}" if d.note else ""))
    return None


def inline_inputs(model: onnx.ModelProto, inputs: list[np.ndarray], keep: int = 1
                  ) -> tuple[onnx.ModelProto, list[np.ndarray]]:
    """The model with every graph input after the first ``keep`` turned into an initializer.

    Backend cases feed an op's parameters (Resize's scales, Pad's pads, ReduceSum's axes) as graph
    inputs; exported models carry them as constants. Inlining them tests the converters on the
    form real models have.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    model.ir_version = max(model.ir_version, 4)  # before IR 4 every initializer had to be a graph input too
    graph = model.graph
    moved = list(graph.input)[keep:]
    for info, value in zip(moved, inputs[keep:]):
        graph.initializer.append(numpy_helper.from_array(np.asarray(value), info.name))
        graph.input.remove(info)
    return model, inputs[:keep]
