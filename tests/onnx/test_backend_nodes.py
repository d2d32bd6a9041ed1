"""The ONNX backend node test cases, through import + the reference executor.

Each plain-tensor case (no sequences, optionals, maps or strings) runs and is compared with the
case's expected outputs at the ONNX backend tolerance (rtol 1e-3, atol 1e-7; integers and booleans
exact). Cases listed in ``backend_xfail.txt`` are expected to fail, each for the reason given
there; the marks are strict, so a case that starts passing must be taken off the list.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

pytest.importorskip("onnx")

from torch_ir.frontends.onnx import backend  # noqa: E402

XFAIL_FILE = Path(__file__).with_name("backend_xfail.txt")


def _expected_failures() -> dict[str, str]:
    out = {}
    for line in XFAIL_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, reason = line.partition(":")
            out[name.strip()] = reason.strip()
    return out


def _params():
    xfail = _expected_failures()
    cases = [c for c in backend.list_cases() if c.plain]
    unknown = sorted(set(xfail) - {c.name for c in cases})
    assert not unknown, f"{XFAIL_FILE.name} names cases that do not exist: {unknown[:5]}"
    for case in cases:
        reason = xfail.get(case.name)
        # random outputs could match by chance: only those marks are not strict
        marks = [pytest.mark.xfail(reason=reason, strict=not reason.startswith("random"))] if reason else []
        yield pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("case", list(_params()))
def test_node_case(case: backend.Case) -> None:
    model, inputs, expected = backend.load_data(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reference implementation warns on overflow in a few cases
        actual = backend.run_ours(model, inputs)
    problem = backend.compare(actual, expected)
    assert problem is None, f"{case.name} ({case.op}): {problem}"


def test_pass_rate_meets_target() -> None:
    """At least 90% of the plain-tensor cases are expected to pass (the issue's target)."""
    cases = [c for c in backend.list_cases() if c.plain]
    failing = set(_expected_failures())
    rate = 1 - len(failing) / len(cases)
    assert rate >= 0.90, f"only {rate:.1%} of {len(cases)} cases are expected to pass"
