"""PyTorch OpInfo samples through extract, save-load and the executor, equal to eager: a fixed sample of ops.

The whole of ``op_db`` is measured by ``bench/opinfo_coverage/run.py`` (minutes); these ops, one or
more of each kind (elementwise, reductions, shape and indexing, convolution and pooling,
normalization, linear algebra, random, factory, multi-output), all pass today, so a regression in
the frontend, the IR file or the executor shows in the default suite. The harness is the bench's own.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

# torch's OpInfo database imports its test utilities, which need expecttest (a test-only package)
pytest.importorskip("expecttest", reason="torch.testing._internal needs expecttest: pip install expecttest")

ROOT = Path(__file__).resolve().parents[1]

OPS = [
    # elementwise, unary and binary, with broadcasting and scalars
    "add", "mul", "div.no_rounding_mode", "pow", "abs", "exp", "sigmoid", "nn.functional.gelu", "clamp", "where",
    # reductions and multi-output reductions
    "sum", "mean", "amax", "max.reduction_with_dim", "argmax", "cumsum", "softmax", "logsumexp",
    # shape, indexing and concatenation
    "reshape", "permute", "transpose", "cat", "stack", "index_select", "gather", "nn.functional.pad.constant",
    # convolution, pooling, normalization, linear algebra
    "nn.functional.conv2d", "nn.functional.max_pool2d", "nn.functional.layer_norm", "nn.functional.linear",
    "matmul", "bmm",
    # random (compared by shape and dtype) and uninitialized memory
    "bernoulli", "empty_like",
    # inputs written in place (random fill; batch norm's running statistics in training), ops without a
    # Meta kernel or with an argument that must stay on the CPU (extracted with CPU inputs)
    "uniform", "_native_batch_norm_legit", "geqrf", "histogram", "tensor_split",
]


def _harness():
    spec = importlib.util.spec_from_file_location("opinfo_coverage_run", ROOT / "bench" / "opinfo_coverage" / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while they are built
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_representative_opinfo_ops_run_from_the_ir_equal_to_eager():
    harness = _harness()
    infos = [o for o in harness.select_ops(OPS) if harness.op_name(o) in OPS]  # not the other variants
    assert sorted(harness.op_name(o) for o in infos) == sorted(OPS)  # every name still exists in this torch
    results = harness.run_all(infos, n_samples=1, timeout=60, progress=False)
    not_exported = [r.op for r in results if not r.exportable]
    failures = {r.op: f"{r.first_failure.stage}: {r.first_failure.error}" for r in results
                if r.exportable and not r.passed}
    assert not not_exported, f"no sample of these exports any more: {not_exported}"
    assert not failures, "\n".join(f"{op}: {why}" for op, why in failures.items())
    shape_only = {r.op for r in results if any(not s.values_compared for s in r.exported)}
    assert shape_only == {"bernoulli", "empty_like", "uniform"}  # every other op's values were compared
