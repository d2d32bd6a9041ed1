"""PyTorch OpInfo export coverage: every op ``torch.export`` can export, run from the IR next to eager.

    .venv/bin/python bench/opinfo_coverage/run.py                     # all of op_db, 3 samples per op
    .venv/bin/python bench/opinfo_coverage/run.py --ops add,nn.functional.conv2d --samples 5
    .venv/bin/python bench/opinfo_coverage/run.py --json results.json --jobs 2

For every OpInfo of ``torch.testing._internal.common_methods_invocations.op_db`` that supports
float32 on the CPU, the first N of its float32 CPU samples are each wrapped in a tiny module whose
inputs are the sample's tensors (the other arguments are constants of the module). A sample counts
when ``torch.export.export`` exports that module on the CPU (the denominator); it then goes through

1. **extract**: ``torch_ir.extract_ir`` on meta copies of the inputs (weight-free, as users extract),
2. **save-load**: ``ir.save`` and ``torch_ir.load_ir`` (the strict-JSON round trip),
3. **execute**: ``torch_ir.IRExecutor(ir, {}).run`` on the real inputs,
4. **mismatch**: the outputs against eager at ``torch_ir.verify.default_tolerance`` of each output's
   dtype (integers and booleans exact; NaN equal to NaN), then the inputs after the run (an op that
   writes an input in place must leave the same value in it as eager).

An op whose eager output differs between two runs with different seeds (random ops) or that
returns uninitialized memory (``empty*``) is compared by shape and dtype only. An op is exportable
when at least one of its samples exports, and passes when every exported sample passes; the report
gives the totals, then the failures grouped by stage and error class with the ops in each.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import re
import signal
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch_ir  # noqa: E402
from torch_ir.verify import default_tolerance  # noqa: E402

#: Where an exported sample can fail; "timeout" counts as a failure, wherever the time ran out.
STAGES = ("extract", "save-load", "execute", "mismatch", "timeout")
#: Ops returning uninitialized memory: their values are not comparable, whatever the seed.
UNINITIALIZED = re.compile(r"(^|\.)(new_)?empty")


@dataclass
class SampleResult:
    """One sample of one op: ``stage`` is None when it passed, ``"export"`` when torch.export refused it."""

    index: int
    stage: str | None
    error: str = ""
    values_compared: bool = True


@dataclass
class OpResult:
    op: str
    samples: list[SampleResult] = field(default_factory=list)
    error: str = ""  # the samples could not be made at all

    @property
    def exported(self) -> list[SampleResult]:
        return [s for s in self.samples if s.stage != "export"]

    @property
    def exportable(self) -> bool:
        return bool(self.exported)

    @property
    def passed(self) -> bool:
        return self.exportable and all(s.stage is None for s in self.exported)

    @property
    def first_failure(self) -> SampleResult | None:
        return next((s for s in self.exported if s.stage is not None), None)


# -- one sample -----------------------------------------------------------------------------------

class OpModule(torch.nn.Module):
    """``fn(sample.input, *sample.args, **sample.kwargs)`` with the sample's tensors as the inputs."""

    def __init__(self, fn: Callable[..., Any], sample: Any):
        super().__init__()
        self.fn = fn
        leaves, self.spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
        self.leaves = leaves
        self.positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def tensors(self) -> list[torch.Tensor]:
        return [self.leaves[i] for i in self.positions]

    def forward(self, *tensors: torch.Tensor) -> Any:
        leaves = list(self.leaves)
        for i, t in zip(self.positions, tensors):
            leaves[i] = t
        inp, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.fn(inp, *args, **kwargs)


def first_line(e: BaseException) -> str:
    """The exception's type and first line; and the next line when the first ends in ':' (it
    introduces what went wrong: "weights do not match IR 'x':" then "missing (1): lifted_tensor_0")."""
    lines = [line.strip() for line in str(e).strip().splitlines()]
    text = lines[0] if lines else ""
    if text.endswith(":") and len(lines) > 1:
        text += " " + lines[1]
    return f"{type(e).__name__}: {text}"[:300]


def _clones(tensors: list[torch.Tensor], device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """Fresh copies for every use: some ops write into their inputs."""
    return tuple(t.detach().clone().to(device) for t in tensors)


def _eager(module: OpModule, seed: int, inputs: tuple[torch.Tensor, ...] | None = None) -> list[Any]:
    """The op's outputs under ``seed``, on ``inputs`` (fresh copies of the sample's tensors by default)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        return pytree.tree_leaves(module(*(_clones(module.tensors()) if inputs is None else inputs)))


def _same(a: list[Any], b: list[Any]) -> bool:
    """Bitwise equal (NaN equal to NaN): does the op give the same values twice?"""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if not isinstance(x, torch.Tensor):
            if x != y:
                return False
            continue
        try:
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)
        except AssertionError:
            return False
    return True


def compare(actual: list[torch.Tensor], expected: list[Any], values: bool) -> str | None:
    """None when the IR's outputs equal eager's; else what differs (the first difference)."""
    bad = [type(x).__name__ for x in expected if not isinstance(x, torch.Tensor)]
    if bad:
        return f"eager returns non-tensor outputs {bad}; the IR's outputs are tensors"
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, eager has {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        if a.shape != e.shape or a.dtype != e.dtype:
            return f"output {i}: {a.dtype}{list(a.shape)}, eager {e.dtype}{list(e.shape)}"
        if values:
            rtol, atol = default_tolerance(e.dtype)
            try:
                torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True, check_device=False)
            except AssertionError as err:
                return f"output {i}: " + " ".join(str(err).split())[:200]
    return None


def is_random(fn: Callable[..., Any], samples: list[Any], name: str) -> bool:
    """Whether the op's values cannot be compared: uninitialized memory, or different values under
    different seeds in any sample (one sample is not enough: bernoulli of a 1-element tensor with
    p near 0 draws the same 0 under most seeds)."""
    if UNINITIALIZED.search(name):
        return True
    for sample in samples:
        module = OpModule(fn, sample)
        try:
            first = _eager(module, seed=0)
            if any(not _same(first, _eager(module, seed=seed)) for seed in (1, 2, 3)):
                return True
        except Exception:  # noqa: BLE001 - a sample eager refuses says nothing about randomness
            continue
    return False


def draws_random_numbers(ep: torch.export.ExportedProgram, tensors: list[torch.Tensor]) -> bool:
    """Whether the exported graph gives different values under different seeds.

    The seeds of ``is_random`` do not find every random op: some OpInfos seed the generator inside
    the op (``wrapper_set_seed``), so eager repeats itself while the graph, which has no seed op,
    does not. Only graphs with an op tagged ``nondeterministic_seeded`` are run, and they are run
    rather than trusted: the tag is on the schema, so dropout with p=0 or training=False has it too.
    """
    if not any(isinstance(n.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in n.target.tags
               for n in ep.graph.nodes):
        return False
    graph = ep.module()

    def run(seed: int) -> list[Any]:
        torch.manual_seed(seed)
        with torch.no_grad():
            return pytree.tree_leaves(graph(*_clones(tensors)))

    first = run(0)
    return any(not _same(first, run(seed)) for seed in (1, 2, 3))


def run_sample(fn: Callable[..., Any], sample: Any, index: int, name: str, workdir: Path,
               values: bool = True) -> SampleResult:
    """Export on the CPU; if that works, extract, save and load, execute and compare (``values``:
    compare values too, not only shapes and dtypes)."""
    module = OpModule(fn, sample).eval()
    tensors = module.tensors()
    try:
        with torch.no_grad():
            ep = torch.export.export(module, _clones(tensors), strict=False)
    except Exception as e:  # noqa: BLE001 - a refusal of any kind: not exportable, not our failure
        return SampleResult(index, "export", first_line(e))
    values = values and not draws_random_numbers(ep, tensors)
    eager_inputs = _clones(tensors)
    try:
        expected = _eager(module, seed=0, inputs=eager_inputs)
    except Exception as e:  # noqa: BLE001
        return SampleResult(index, "export", f"eager failed after export: {first_line(e)}")
    stage = "extract"
    try:
        ir = torch_ir.extract_ir(module, _clones(tensors, "meta"), model_name=name.replace(".", "_"))
        stage = "save-load"
        path = workdir / f"{index}.json"
        ir.save(str(path))
        ir = torch_ir.load_ir(str(path))
        stage = "execute"
        ir_inputs = _clones(tensors)
        actual = torch_ir.IRExecutor(ir, {}).run(list(ir_inputs))
    except Exception as e:  # noqa: BLE001 - every failure is one row of the report
        return SampleResult(index, stage, first_line(e), values)
    problem = compare(actual, expected, values)
    if problem is None:  # inputs the op writes in place (batch norm's running statistics): written back alike
        problem = compare(list(ir_inputs), list(eager_inputs), values)
        problem = problem and f"inputs after the run: {problem}"
    return SampleResult(index, None if problem is None else "mismatch", problem or "", values)


# -- one op ---------------------------------------------------------------------------------------

def op_name(info: Any) -> str:
    return info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")


class SampleTimeoutError(Exception):
    """A sample that took longer than ``--timeout`` (an export that hangs must not stop the run)."""


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Raise SampleTimeoutError after ``seconds`` (SIGALRM; a no-op where there is none, or for 0)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise SampleTimeoutError(f"no result in {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def first_samples(info: Any, n: int) -> list[Any]:
    """The first ``n`` float32 CPU samples. The generator is closed and collected here: left open, it
    (or a generator it delegates to, held in a reference cycle) is finalized whenever the garbage
    collector gets to it, possibly inside a later export's tracer, where its ``torch.no_grad`` exit
    is traced and fails."""
    gen = info.sample_inputs("cpu", torch.float32, requires_grad=False)
    try:
        return list(islice(gen, n))
    finally:
        close = getattr(gen, "close", None)
        if close is not None:
            close()
        del gen
        gc.collect()


def run_op(info: Any, n_samples: int, timeout: int = 60) -> OpResult:
    """Every one of the op's first ``n_samples`` samples, each under a ``timeout`` in seconds."""
    with warnings.catch_warnings():  # deprecations of the ops themselves, once per sample: noise here
        warnings.simplefilter("ignore")
        return _run_op(info, n_samples, timeout)


def _run_op(info: Any, n_samples: int, timeout: int) -> OpResult:
    name = op_name(info)
    result = OpResult(name)
    try:
        samples = first_samples(info, n_samples)
        values = not is_random(info.op, samples, name)
    except Exception as e:  # noqa: BLE001
        result.error = f"sample_inputs: {first_line(e)}"
        return result
    with tempfile.TemporaryDirectory() as tmp:
        for i, sample in enumerate(samples):
            try:
                with time_limit(timeout):
                    result.samples.append(run_sample(info.op, sample, i, name, Path(tmp), values))
            except SampleTimeoutError as e:  # whether it would have exported is unknown: a failure, not skipped
                result.samples.append(SampleResult(i, "timeout", f"SampleTimeoutError: {e}"))
    return result


def select_ops(names: list[str] | None = None) -> list[Any]:
    """The OpInfos that support float32 on the CPU, optionally only those named: ``name.variant``, or
    ``name`` for all its variants."""
    from torch.testing._internal.common_methods_invocations import op_db

    gc.freeze()  # op_db's many objects leave the collector's view: first_samples' collections stay cheap
    infos = [o for o in op_db if torch.float32 in o.supported_dtypes("cpu")]
    if names is None:
        return infos
    wanted = set(names)
    chosen = [o for o in infos if op_name(o) in wanted or o.name in wanted]
    missing = wanted - {op_name(o) for o in chosen} - {o.name for o in chosen}
    if missing:
        raise SystemExit(f"no float32 CPU OpInfo named {sorted(missing)}")
    return chosen


def quiet() -> None:
    """torch.export logs every refusal at WARNING; the report says it once."""
    for logger in ("torch.export", "torch._export", "torch._dynamo", "torch.fx", "torch._subclasses"):
        logging.getLogger(logger).setLevel(logging.ERROR)


# -- the report -----------------------------------------------------------------------------------

#: error pattern -> class name: the failure classes seen so far, named by their cause.
CLASSES = [
    (r"not a JSON value|non-finite|Out of range float values", "non-finite lifted constant breaks strict JSON"),
    (r"USER_INPUT_MUTATION", "in-place update of a user input refused (USER_INPUT_MUTATION)"),
    (r"missing \(\d+\): lifted_tensor", "constant made inside the op has no value on meta: a weight nobody has"),
    (r"with Meta tensors|DispatchKey\.\w*Meta", "op has no Meta kernel: extraction on the meta device fails"),
    (r"must be on CPU, got meta", "op needs a CPU tensor argument: extraction moved it to meta"),
    (r"reads a tensor value .*into Python", "scalar read of an input (.item()) refused"),
    (r"is not a tensor|non-tensor outputs", "non-tensor output (int, torch.Size) refused"),
    (r"returns a list of tensors inside its outputs", "op returns (Tensor, Tensor[]): nested outputs refused"),
    (r"inputs after the run", "input written in place differs from eager's"),
]


def error_class(sample: SampleResult) -> str:
    for pattern, label in CLASSES:
        if re.search(pattern, sample.error):
            return f"{sample.stage}: {label}"
    # unknown: the first line with the sample-specific numbers and names blanked, so alike errors group
    text = re.sub(r"\d+", "N", sample.error)
    text = re.sub(r"'[^']*'", "'…'", text)
    return f"{sample.stage}: {text[:140]}"


def report(results: list[OpResult], n_samples: int, seconds: float) -> str:
    exportable = [r for r in results if r.exportable]
    passed = [r for r in exportable if r.passed]
    samples = [s for r in exportable for s in r.exported]
    shape_only = [f"{r.op} ({sum(not s.values_compared for s in r.exported)}/{len(r.exported)})"
                  for r in exportable if any(not s.values_compared for s in r.exported)]
    pct = 100 * len(passed) / max(len(exportable), 1)
    lines = [
        f"{len(results)} float32 CPU OpInfos, first {n_samples} samples each, in {seconds:.0f} s",
        "",
        "| | ops | samples |",
        "|---|---:|---:|",
        f"| exportable (torch.export on the CPU) | {len(exportable)} | {len(samples)} |",
        f"| **pass** (extract, save-load, execute, equal to eager) | **{len(passed)} ({pct:.1f}%)** "
        f"| {sum(s.stage is None for s in samples)} |",
    ]
    for stage in STAGES:
        ops = [r for r in exportable if r.first_failure is not None and r.first_failure.stage == stage]
        label = "timed out" if stage == "timeout" else f"fail at {stage}"
        lines.append(f"| {label} | {len(ops)} | {sum(s.stage == stage for s in samples)} |")
    lines.append(f"| not exportable | {len(results) - len(exportable)} | |")
    lines += ["", "Compared by shape and dtype only (random or uninitialized outputs; samples of the exported): "
              + (", ".join(shape_only) or "none")]
    lines += ["", "## Failures by class (each failing op by its first failing sample)", "",
              "| class | ops | which |", "|---|---:|---|"]
    for label, ops in sorted(_failure_classes(exportable).items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(f"| {label.replace('|', '/')} | {len(ops)} | {', '.join(ops)} |")
    return "\n".join(lines)


def _failure_classes(results: list[OpResult]) -> dict[str, list[str]]:
    """class -> ops, by each failing op's first failing sample."""
    classes: dict[str, list[str]] = defaultdict(list)
    for r in results:
        if r.first_failure is not None:
            classes[error_class(r.first_failure)].append(r.op)
    return classes


def _progress(i: int, total: int, result: OpResult, start: float) -> None:
    status = "pass" if result.passed else "not exportable" if not result.exportable else result.first_failure.stage
    print(f"[{i}/{total} {time.perf_counter() - start:.0f}s] {result.op}: {status}", file=sys.stderr, flush=True)


def run_all(infos: list[Any], n_samples: int, timeout: int, progress: bool = True) -> list[OpResult]:
    quiet()
    start, results = time.perf_counter(), []
    for i, info in enumerate(infos, 1):
        results.append(run_op(info, n_samples, timeout))
        if progress:
            _progress(i, len(infos), results[-1], start)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", help="comma-separated OpInfo names (name or name.variant); default: all")
    parser.add_argument("--samples", type=int, default=3, help="first N float32 CPU samples per op (default 3)")
    parser.add_argument("--timeout", type=int, default=60, help="seconds per sample before it counts as failed")
    parser.add_argument("--json", help="write every sample's result to this file")
    args = parser.parse_args(argv)
    infos = select_ops(args.ops.split(",") if args.ops else None)
    start = time.perf_counter()
    results = run_all(infos, args.samples, args.timeout)
    print(report(results, args.samples, time.perf_counter() - start))
    if args.json:
        data = [{**asdict(r), "exportable": r.exportable, "passed": r.passed} for r in results]
        Path(args.json).write_text(json.dumps(data, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
