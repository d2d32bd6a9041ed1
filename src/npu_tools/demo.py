"""``torch-ir demo``: the whole pipeline on a built-in model, with one short report.

extract on the meta device -> save and reload the IR -> verify against PyTorch eager -> normalize into
NPU ops -> compile into a program of kernel dispatches -> run the program with the model's weights and
compare with eager -> profile it. Each stage prints one line; the files it writes are listed at the end.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torch_ir.fileio import atomic_write
from torch_ir.ir import load_ir
from torch_ir.naming import safe_stem
from torch_ir.report import ir_statistics, markdown_report, to_mermaid
from torch_ir.report.stats import human_bytes as _human
from torch_ir.verify import verify_ir
from torch_ir.weights import module_state, save_weights

from .zoo.runner import ModelSpec

# timed runs of the profile step, after its warm-up (until stable): enough for a p10-p90
PROFILE_RUNS = 20


@dataclass
class DemoResult:
    ok: bool
    lines: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)


#: ``stage(label, fn)``: runs ``fn`` as the stage ``label``, returning its value and the seconds it took.
_Stage = Callable[[str, Callable[[], Any]], tuple[Any, float]]


def run_demo(spec: ModelSpec, out: Path, step: Callable[[str], None] = lambda label: None, *,
             threads: int | None = None) -> DemoResult:
    """The pipeline on ``spec``; ``step(label)`` is called as each stage starts (a progress bar); the profile
    runs at ``threads`` PyTorch threads (None: PyTorch's count)."""
    from npu_runtime import Device, Executor, load_weights

    result, stem = DemoResult(ok=True), safe_stem(spec.name)

    def stage(label: str, fn: Callable[[], Any]) -> tuple[Any, float]:
        step(label)
        start = time.perf_counter()
        value = fn()
        return value, time.perf_counter() - start

    ir = _extract(spec, out / f"{stem}.json", stage, result)
    real = spec.build("cpu")
    state = module_state(real)
    _verify(spec, ir, real, state, out / stem, stage, result)
    program = _normalize_and_compile(spec, ir, stage, result)
    program_path, weights_path = out / f"{stem}.npubin", out / f"{stem}.safetensors"
    program.save(program_path)
    save_weights(state, weights_path)
    result.files += [program_path, weights_path]

    device = Device()
    executor = Executor(program, device)
    weights = load_weights(weights_path, program, device)
    example = _leaves((spec.args, spec.kwargs))  # the graph inputs, in the order export flattens them
    inputs = {s.name: np.asarray(a.detach()) for s, a in zip(program.input_specs, example)}
    outputs, t = stage("run", lambda: executor.run(inputs, weights=weights))
    _compare_with_eager(spec, real, program, outputs, t, result)

    profile, t = stage("profile", lambda: executor.profile(inputs, weights, runs=PROFILE_RUNS, threads=threads))
    result.lines += _profile_lines(profile, t)
    return result


def _extract(spec: ModelSpec, path: Path, stage: _Stage, result: DemoResult) -> Any:
    """Stage 1: the IR extracted on the meta device, saved to ``path`` and read back."""
    ir, t = stage("extract", lambda: spec.extract(spec.build("meta")))
    ir.save(path)
    ir = load_ir(path)
    result.files.append(path)
    result.lines.append(_row("1. extract on meta", f"{len(ir.nodes)} nodes, {len(ir.weights)} weights "
                             f"({_human(_weight_bytes(ir))} declared, none allocated); saved and reloaded", t))
    return ir


def _verify(spec: ModelSpec, ir: Any, real: torch.nn.Module, state: Any, base: Path, stage: _Stage,
            result: DemoResult) -> None:
    """Stage 2: the IR against eager PyTorch on the real weights; the report and the Mermaid graph beside
    ``base`` (``<base>.md``, ``<base>.mmd``)."""
    (ok, report), t = stage("verify", lambda: verify_ir(ir, state, real, spec.args, test_kwargs=spec.kwargs))
    result.ok &= ok
    worst = max((o.max_abs for o in report.outputs), default=0.0)
    result.lines.append(_row("2. verify against eager", f"{'PASSED' if ok else 'FAILED'}, max abs error {worst:.2g}",
                             t))
    md, mmd = base.with_name(f"{base.name}.md"), base.with_name(f"{base.name}.mmd")
    atomic_write(md, markdown_report(ir, ir_statistics(ir), report), what="report file")
    atomic_write(mmd, to_mermaid(ir), what="Mermaid file")
    result.files += [md, mmd]


def _normalize_and_compile(spec: ModelSpec, ir: Any, stage: _Stage, result: DemoResult) -> Any:
    """Stages 3 and 4: the IR normalized into NPU ops, then compiled into a program."""
    import npu_compiler
    from npu_compiler.passes import normalize

    # programs are planned for static shapes: a model exported with dynamic dims compiles at its example's
    static = ir if all(t.is_static for t in ir.graph_inputs) else \
        dataclasses.replace(spec, dynamic_shapes=None).extract(spec.build("meta"))
    npu_ir, t = stage("normalize", lambda: normalize(static))
    ops = ", ".join(f"{op} {n}" for op, n in npu_ir.op_histogram().items())
    note = "" if static is ir else " (at the example's static shapes)"
    result.lines.append(_row("3. normalize", f"{len(static.nodes)} -> {len(npu_ir.nodes)} nodes{note}: {ops}", t))

    program, t = stage("compile", lambda: npu_compiler.compile(npu_ir, options=npu_compiler.CompileOptions(
        normalize=False)))
    kernels = ", ".join(f"{k} {n}" for k, n in program.kernel_histogram().items())
    memory = program.memory
    result.lines.append(_row("4. compile", f"{program.dispatch_count} dispatches ({kernels}); arena "
                             f"{_human(memory.arena_bytes)} vs {_human(memory.no_reuse_bytes)} without reuse", t))
    return program


def _compare_with_eager(spec: ModelSpec, real: torch.nn.Module, program: Any, outputs: Any, seconds: float,
                        result: DemoResult) -> None:
    """Stage 5's row: the program's outputs against eager PyTorch's."""
    with torch.no_grad():
        expected = real(*spec.args, **spec.kwargs)
    expected = [expected] if isinstance(expected, torch.Tensor) else [e for e in _leaves(expected)]
    errors = [float(np.abs(outputs[s.name].to_numpy() - e.numpy()).max()) for s, e in zip(program.output_specs,
                                                                                          expected)]
    rtol_ok = all(err <= 1e-4 * max(1.0, float(e.abs().max())) for err, e in zip(errors, expected))
    result.ok &= rtol_ok and len(errors) == len(expected)
    result.lines.append(_row("5. run the program", f"{'equal to eager' if rtol_ok else 'DIFFERENT from eager'} "
                             f"(max abs error {max(errors, default=0.0):.2g})", seconds))


def _profile_lines(profile: Any, seconds: float) -> list[str]:
    """The profile's row (median and p10-p90 of a run after a warm-up until stable, the top kernels), and
    under it the profile's warning when the spread says another process was using the CPU."""
    top = ", ".join(f"{k} {share:.0%}" for k, _, _, share in profile.by_kernel()[:3])
    threads = f"{profile.threads} thread{'s' if profile.threads != 1 else ''}"
    lines = [_row("6. profile", f"{profile.spread.text()} a run; {threads}, {profile.runs} runs after "
                  f"{profile.warmup.text()}; time by kernel: {top}; runtime overhead "
                  f"{profile.host_us_per_dispatch:.2f} µs/dispatch", seconds)]
    if profile.noisy:
        lines.append(f"{'':<26} {profile.noisy}")
    return lines


def _row(stage: str, text: str, seconds: float) -> str:
    return f"{stage:<26} {text}  [{seconds * 1000:.0f} ms]"


def _weight_bytes(ir: Any) -> int:
    from torch_ir.dtypes import nbytes

    return sum(nbytes(w.numel() or 0, w.dtype) for w in ir.weights)


def _leaves(value: Any) -> list[torch.Tensor]:
    from torch.utils import _pytree as pytree

    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]
