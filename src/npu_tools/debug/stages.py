"""The pipeline's stages as runners over a :class:`~npu_tools.debug.subject.Subject`, in the order data flows.

Every stage is executable, so every stage can be compared with the trusted source:

======================= ===========================================================================================
stage                   what runs
======================= ===========================================================================================
extracted               the frontend's IR, by the reference executor (``IRExecutor``)
normalize:cleanup       ``normalize`` stopped after the clean-up stage (``NormalizeOptions(stop_after=...)``)
normalize:canonicalize  ... after canonicalization (cumulative: clean-up, then canonicalization)
normalize:fuse          ... after fusion into the NPU op set
normalize:late_fuse     ... after late fusion (the whole of ``normalize``)
kernel_fusion           ``npu_compiler.passes.kernel_fusion`` rules on the late-fused IR, by the reference executor
compiled:cpu            that IR compiled for the CPU target (host fallback on), run by ``npu_runtime.Executor``
compiled:webgpu         the same for the WebGPU target, only where an adapter exists
partitioned             ``npu_compiler.partition`` of that IR, run by ``npu_runtime.DAGExecutor``
======================= ===========================================================================================

A stage gives its outputs in graph-output order and, when asked, every intermediate value by IR tensor name
in logical layout (a program's dispatches are observed one by one, as ``Executor(validate=True)`` does, and
NHWC tensors are read back in logical order), so that two stages can be compared node by node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from npu_compiler.passes import pipeline
from torch_ir.errors import TorchIRError
from torch_ir.executor import IRExecutor
from torch_ir.ir import NPU_IR, OpNode
from torch_ir.ops.values import dtype_from_name

from .subject import Subject

NORMALIZE_PREFIX = "normalize:"
STAGE_NAMES: tuple[str, ...] = (
    "extracted", "normalize:cleanup", "normalize:canonicalize", "normalize:fuse", "normalize:late_fuse",
    "kernel_fusion", "compiled:cpu", "compiled:webgpu", "partitioned",
)
#: Stages that are an IR run by the reference executor (the rest are programs or a partitioned DAG).
IR_STAGES: tuple[str, ...] = STAGE_NAMES[:6]
#: Stages whose IR is made by rewrite rules, so that a fault in them can be bisected down to one application.
REWRITE_STAGES: tuple[str, ...] = STAGE_NAMES[1:6]


class StageError(TorchIRError, ValueError):
    """A stage name that does not exist, or a stage that cannot run the subject."""


def check_stages(stages: Sequence[str] | None) -> list[str]:
    """The stages to run, in pipeline order; ``None`` means all of them. Unknown names are refused."""
    if stages is None:
        return list(STAGE_NAMES)
    wanted = list(stages)
    unknown = [s for s in wanted if s not in STAGE_NAMES]
    if unknown:
        raise StageError(f"unknown stage(s) {unknown}; the stages are, in order: {', '.join(STAGE_NAMES)}")
    return [s for s in STAGE_NAMES if s in wanted]


def webgpu_problem() -> str | None:
    """Why the compiled:webgpu stage cannot run here (None when an adapter exists)."""
    try:
        from npu_runtime.backends.webgpu.gpu import adapter_problem
    except ImportError as e:  # the webgpu extra (wgpu) is not installed
        return f"wgpu is not installed ({e})"
    return adapter_problem()


@dataclass
class StageResult:
    """One stage's run: its outputs in graph-output order, or why it did not run."""

    name: str
    outputs: list[torch.Tensor] = field(default_factory=list)
    seconds: float = 0.0
    skipped: str | None = None


@dataclass
class DispatchTrace:
    """A compiled program's run observed dispatch by dispatch: outputs by tensor name, in logical layout."""

    program: Any  # npu_program CompiledProgram
    outputs: list[torch.Tensor]
    values: dict[str, torch.Tensor]
    #: per dispatch, the names of its outputs (program order)
    dispatch_outputs: list[list[str]]


class Pipeline:
    """The stages of one subject, built lazily and cached: IRs by stage (and by rule-application count), the
    compiled programs, and the values each stage computes.

    Example::

        pipe = Pipeline(subject)
        outs = pipe.run("normalize:fuse").outputs
        ir = pipe.ir("normalize:fuse", applications=12)   # stopped after the fuse stage's 12th rule application
    """

    def __init__(self, subject: Subject) -> None:
        self.subject = subject
        self._irs: dict[tuple[str, int | None], NPU_IR] = {}
        self._logs: dict[str, list[tuple[str, str]]] = {}
        self._raw: dict[str, NPU_IR] = {}  # each normalize stage's output before annotation: the next one's input
        self._programs: dict[str, Any] = {}
        self._traces: dict[str, DispatchTrace] = {}

    # -- the IR of each stage -----------------------------------------------------------------------

    def ir(self, stage: str, applications: int | None = None) -> NPU_IR:
        """The IR after ``stage`` (cumulative); for a rewrite stage, stopped after ``applications`` rule
        applications of that stage (None: all). Program stages answer with the IR they are compiled from."""
        if stage not in IR_STAGES:
            return self.ir("kernel_fusion")
        key = (stage, applications)
        if key not in self._irs:
            self._irs[key] = self._build_ir(stage, applications)
        return self._irs[key]

    def _build_ir(self, stage: str, applications: int | None) -> NPU_IR:
        if stage == "extracted":
            return self.subject.ir
        if stage == "kernel_fusion":
            from npu_compiler.passes import kernel_fusion as fusion
            from torch_ir.rewrite import rewrite

            # read at call time: a test may replace the rule list, and the bisection must see what compile sees
            result = rewrite(self.ir("normalize:late_fuse"), fusion.KERNEL_FUSION_RULES, limit=applications)
            if applications is None:
                self._logs[stage] = list(result.log)
            return result.ir
        return self._normalize_stage(stage.removeprefix(NORMALIZE_PREFIX), applications)

    def _normalize_stage(self, name: str, applications: int | None) -> NPU_IR:
        """``normalize(ir, NormalizeOptions(stop_after=(name, applications)))``, made from the previous stage's IR.

        ``normalize`` rewrites each stage's input from scratch, so probing n applications of a late stage would
        redo every earlier stage per probe (minutes on a 24-layer model). Its own steps (``run_stage`` for each
        stage, then ``finish``) are taken here from the cached input of the stage instead.
        """
        raw, result = pipeline.run_stage(self._stage_input(name), name, limit=applications)
        if applications is None:
            self._raw[name] = raw
            self._logs[NORMALIZE_PREFIX + name] = list(result.log)
        return pipeline.finish(raw)

    def _stage_input(self, name: str) -> NPU_IR:
        """What normalize's stage ``name`` rewrites: the extracted IR, or the previous stage's raw output."""
        names = [stage for stage, _ in pipeline.STAGES]
        index = names.index(name)
        if index == 0:
            return self.subject.ir
        before = names[index - 1]
        if before not in self._raw:
            self.ir(NORMALIZE_PREFIX + before)
        return self._raw[before]

    def log(self, stage: str) -> list[tuple[str, str]]:
        """(rule, root node) of every rule application of a rewrite stage, in order."""
        if stage not in REWRITE_STAGES:
            raise StageError(f"stage {stage!r} applies no rewrite rules; those that do: {', '.join(REWRITE_STAGES)}")
        self.ir(stage)
        return self._logs[stage]

    def previous(self, stage: str) -> str:
        """The stage whose IR a stage starts from (its good reference when it diverges)."""
        if stage in ("compiled:cpu", "compiled:webgpu", "partitioned"):
            return "kernel_fusion"
        index = IR_STAGES.index(stage)
        if index == 0:
            raise StageError("the extracted IR has no previous stage: its reference is the trusted source")
        return IR_STAGES[index - 1]

    # -- running ------------------------------------------------------------------------------------

    def run(self, stage: str) -> StageResult:
        """Run one stage on the subject's inputs."""
        if stage == "compiled:webgpu":
            problem = webgpu_problem()
            if problem is not None:
                return StageResult(stage, skipped=f"no WebGPU adapter: {problem.splitlines()[0]}")
        started = time.perf_counter()
        if stage in IR_STAGES:
            outputs = self.run_ir(self.ir(stage))
        elif stage.startswith("compiled:"):
            outputs = self.trace_program(stage.removeprefix("compiled:")).outputs
        elif stage == "partitioned":
            outputs = self.run_partitioned()[0]
        else:
            raise StageError(f"unknown stage {stage!r}; the stages are {', '.join(STAGE_NAMES)}")
        return StageResult(stage, outputs, time.perf_counter() - started)

    def run_ir(self, ir: NPU_IR) -> list[torch.Tensor]:
        """``ir``'s outputs on the subject's inputs and weights, by the reference executor."""
        return IRExecutor(ir, self.subject.weights, strict_weights=False).run(_inputs(self.subject))

    def ir_values(self, ir: NPU_IR, on_node: Callable[[OpNode, list[torch.Tensor]], None] | None = None,
                  ) -> dict[str, torch.Tensor]:
        """Every value ``ir`` computes on the subject's inputs, by tensor name (inputs included)."""
        values: dict[str, torch.Tensor] = {t.name: v for t, v in zip(ir.graph_inputs, _inputs(self.subject))}

        def keep(node: OpNode, outs: list[torch.Tensor]) -> None:
            for meta, value in zip(node.outputs, outs):
                values[meta.name] = value
            if on_node is not None:
                on_node(node, outs)

        IRExecutor(ir, self.subject.weights, strict_weights=False).run_traced(_inputs(self.subject), keep)
        return values

    # -- compiled programs --------------------------------------------------------------------------

    def program(self, backend: str) -> Any:
        """The kernel-fused IR compiled for ``backend``'s target: no normalization or fusion of its own (those
        are stages of their own), IR tensor names kept, nodes without a kernel as host dispatches."""
        if backend not in self._programs:
            from npu_compiler import CompileOptions
            from npu_compiler import compile as compile_ir

            options = CompileOptions(normalize=False, fuse=False, public_output_names=False)
            self._programs[backend] = compile_ir(self.ir("kernel_fusion"), target=backend, options=options,
                                                 fallback="cpu")
        return self._programs[backend]

    def executor(self, backend: str) -> Any:
        """A fresh ``Executor`` of the backend's program with the subject's weights bound."""
        from npu_runtime import Device, Executor, load_weights

        program = self.program(backend)
        device = Device(backend)
        executor = Executor(program, device)
        executor.bind(load_weights(dict(self.subject.weights), program, device))
        return executor

    def trace_program(self, backend: str) -> DispatchTrace:
        """Run the program once, reading back every dispatch's outputs right after it ran."""
        from npu_runtime.backends.base import host_tensor

        if backend in self._traces:
            return self._traces[backend]
        executor = self.executor(backend)
        program, specs, device = executor.program, executor.specs, executor.device.backend
        values: dict[str, torch.Tensor] = {}
        names: list[list[str]] = []

        def observe(index: int, step: Any) -> None:
            run, ins, outs = step
            run(ins, outs)
            device.synchronize()
            dispatch = program.dispatches[index]
            names.append(list(dispatch.outputs))
            for name, handle in zip(dispatch.outputs, outs):
                values[name] = host_tensor(device, handle, specs[name])

        executor.copy_in(_program_inputs(self.subject, program))
        executor.run_steps(observe)
        outputs = [_to_dtype(torch.from_numpy(np.ascontiguousarray(buf.to_numpy())), buf.spec.dtype)
                   for buf in (executor.copy_out()[s.name] for s in program.output_specs)]
        trace = DispatchTrace(program, outputs, values, names)
        self._traces[backend] = trace
        return trace

    def dispatch_check(self, backend: str, index: int) -> tuple[list[torch.Tensor], list[torch.Tensor],
                                                                list[torch.Tensor]]:
        """Dispatch ``index`` on its actual inputs: (inputs as it read them, its outputs, its op's reference
        implementation's outputs on those same inputs). Inputs are read before the kernel runs, since an
        in-place kernel overwrites one."""
        from npu_runtime.backends.base import host_tensor
        from npu_runtime.reference import bind_reference

        executor = self.executor(backend)
        program, specs, device = executor.program, executor.specs, executor.device.backend
        dispatch = program.dispatches[index]
        seen: dict[str, list[torch.Tensor]] = {}

        def observe(i: int, step: Any) -> None:
            run, ins, outs = step
            if i == index:
                device.synchronize()
                seen["inputs"] = [host_tensor(device, h, specs[n]) for h, n in zip(ins, dispatch.inputs)]
            run(ins, outs)
            if i == index:
                device.synchronize()
                seen["outputs"] = [host_tensor(device, h, specs[n]) for h, n in zip(outs, dispatch.outputs)]

        executor.copy_in(_program_inputs(self.subject, program))
        executor.run_steps(observe)
        with torch.no_grad():
            expected = bind_reference(dispatch, specs, torch.device("cpu"))(seen["inputs"], {})
        return seen["inputs"], seen["outputs"], list(expected)

    # -- the partitioned DAG ------------------------------------------------------------------------

    def run_partitioned(self) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], Any]:
        """The kernel-fused IR partitioned for the CPU target and run by ``DAGExecutor``: (outputs, every value
        that crosses a partition boundary by name, the plan)."""
        from npu_compiler import is_op_supported, partition
        from npu_runtime import DAGExecutor

        plan = partition(self.ir("kernel_fusion"), is_op_supported, normalize=False, public_output_names=False)
        dag = DAGExecutor(plan, "cpu")
        dag.load_weights(dict(self.subject.weights))
        env = {t.name: v for t, v in zip(plan.ir.graph_inputs, _inputs(self.subject))}
        for stage in dag.stages:  # DAGExecutor.execute's loop, keeping every partition's outputs
            stage.run(env)
        outputs = [_to_dtype(env[t.name], t.dtype) for t in plan.ir.graph_outputs]
        return outputs, env, plan


def _to_dtype(t: torch.Tensor, dtype: str) -> torch.Tensor:
    want = dtype_from_name(dtype)
    return t if t.dtype == want else t.to(want)


def _inputs(subject: Subject) -> list[torch.Tensor]:
    # each run gets its own copies: an IR that writes an input in place must not change the next stage's input
    return [t.clone() for t in subject.inputs]


def _program_inputs(subject: Subject, program: Any) -> dict[str, Any]:
    return {spec.name: value.clone() for spec, value in zip(program.input_specs, subject.inputs)}


__all__ = ["IR_STAGES", "REWRITE_STAGES", "STAGE_NAMES", "DispatchTrace", "Pipeline", "StageError", "StageResult",
           "check_stages", "webgpu_problem"]
