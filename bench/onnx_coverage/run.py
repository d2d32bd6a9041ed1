"""ONNX backend node-test coverage: our importer + reference executor next to onnxruntime.

    python bench/onnx_coverage/run.py                       # overall and per-op table
    python bench/onnx_coverage/run.py --markdown out.md     # also write it as Markdown
    python bench/onnx_coverage/run.py --write-xfail tests/onnx/backend_xfail.txt

Every plain-tensor case (no sequences, optionals, maps or strings) of ``onnx.backend.test.case.node``
is run four ways on the same cached data (see ``torch_ir.frontends.onnx.backend``): imported with
ONNX ops kept where no ATen translation exists (the default); imported with ATen only
(``reference_fallback=False``); the same with every input after the first made a constant, the
form exported models have (Resize's scales, Pad's pads are inputs in the cases); and by
onnxruntime. All are compared with the case's expected outputs at the backend tolerance
(rtol 1e-3, atol 1e-7; integers and booleans exact).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

from tqdm import tqdm

from torch_ir.frontends.onnx import backend

MODES = ("ours", "aten only", "aten only, inlined", "onnxruntime")


def run_case(case: backend.Case, modes: tuple[str, ...]) -> dict[str, str | None]:
    """mode -> None when the case passes, else why it fails."""
    model, inputs, expected = backend.load_data(case)
    runners = {"ours": lambda: backend.run_ours(model, inputs),
               "aten only": lambda: backend.run_ours(model, inputs, reference_fallback=False),
               "aten only, inlined": lambda: backend.run_ours(*backend.inline_inputs(model, inputs),
                                                              reference_fallback=False),
               "onnxruntime": lambda: backend.run_onnxruntime(model, inputs)}
    out = {}
    for mode in modes:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out[mode] = backend.compare(runners[mode](), expected)
        except Exception as e:  # noqa: BLE001 - a failure of any kind is one row of the table
            out[mode] = f"{type(e).__name__}: {e}"
    return out


def table(cases: list[backend.Case], results: dict[str, dict[str, str | None]], modes: tuple[str, ...]) -> str:
    per_op: dict[str, list[int]] = defaultdict(lambda: [0] * (len(modes) + 1))
    for case in cases:
        row = per_op[case.op]
        row[0] += 1
        for i, mode in enumerate(modes):
            row[i + 1] += results[case.name][mode] is None
    total = [sum(r[i] for r in per_op.values()) for i in range(len(modes) + 1)]
    lines = ["| op | cases | " + " | ".join(modes) + " |", "|---|---:|" + "---:|" * len(modes)]
    lines.append("| **all** | " + " | ".join(f"**{_cell(v, total[0])}**" if i else f"**{v}**"
                                              for i, v in enumerate(total)) + " |")
    for op, row in sorted(per_op.items()):
        lines.append(f"| {op} | " + " | ".join(_cell(v, row[0]) if i else str(v) for i, v in enumerate(row)) + " |")
    return "\n".join(lines)


def _cell(passed: int, total: int) -> str:
    return f"{passed} ({100 * passed / total:.0f}%)"


#: failure message pattern -> the reason written to the expected-failure list
REASONS = [
    (r"element type (\w+)", "ONNX element type {0} has no torch dtype"),
    (r"::(Scan|Loop|If) ", "control flow ({0}): subgraph attributes have no IR form yet"),
    (r"FlexAttention", "FlexAttention takes subgraph attributes, which have no IR form yet"),
    (r"ImageDecoder", "ImageDecoder: onnx.reference needs an image library (PIL) to decode"),
    (r"axes must be known|rank of|no tensor type",
     "a shape argument is a run-time input and ONNX shape inference cannot type the output"),
    (r"bernoulli|training_dropout|random", "random output: the values cannot match the case's draw"),
]


def reason_for(case: backend.Case, message: str) -> str:
    for pattern, text in REASONS:
        m = re.search(pattern, f"{case.name} {message}")
        if m:
            return text.format(*m.groups())
    if "bf16" in case.name or "fp16" in case.name:
        return "16-bit float rounding of the decomposed function differs from the expected float32-based values"
    return message.splitlines()[0][:160]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--markdown", help="write the table to this Markdown file")
    parser.add_argument("--write-xfail", help="write the expected-failure list (cases 'ours' fails) here")
    parser.add_argument("--op", help="only cases of this op")
    args = parser.parse_args(argv)
    cases = [c for c in backend.list_cases() if c.plain and (args.op is None or c.op == args.op)]
    start = time.perf_counter()
    results = {c.name: run_case(c, MODES) for c in tqdm(cases, desc="cases", disable=None, file=sys.stderr)}
    text = table(cases, results, MODES)
    print(text)
    print(f"\n{len(cases)} plain-tensor cases in {time.perf_counter() - start:.0f} s")
    if args.markdown:
        Path(args.markdown).write_text(text + "\n", encoding="utf-8")
    if args.write_xfail:
        lines = ["# ONNX backend node cases expected to fail through import + the reference executor.",
                 "# One line per case: '<case>: <reason>'. Regenerate with bench/onnx_coverage/run.py --write-xfail."]
        for case in cases:
            problem = results[case.name]["ours"]
            if problem is not None:
                lines.append(f"{case.name}: {reason_for(case, problem)}")
        Path(args.write_xfail).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
