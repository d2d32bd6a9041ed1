"""The main job on a model of the zoo (or any model spec): extract -> save -> reload -> execute -> verify.

Used by ``torch-ir demo``, ``torch-ir zoo`` (the report runner of seed 002) and the model tests, so
every path through the pipeline is the same code.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import TorchIRError
from ..frontends import extract_ir
from ..ir import NPU_IR, load_ir
from ..report import ir_statistics, markdown_report, to_mermaid
from ..verify import verify_ir
from ..weights import module_state
from . import get_model

Progress = Callable[[str], None]


@dataclass
class ModelSpec:
    """A model built twice (meta for extraction, seeded real weights for checking) and its inputs."""

    name: str
    build: Callable[[str], torch.nn.Module]  # device -> model in eval mode
    args: tuple
    kwargs: dict = field(default_factory=dict)
    dynamic_shapes: Any = None

    def extract(self, model: torch.nn.Module, model_name: str | None = None) -> NPU_IR:
        """``extract_ir`` of ``model`` (built by ``self.build("meta")``) on this spec's example inputs."""
        return extract_ir(model, self.args, model_name=model_name or self.name, example_kwargs=self.kwargs,
                          dynamic_shapes=self.dynamic_shapes)


@dataclass
class RunResult:
    name: str
    ok: bool
    ir: NPU_IR
    report: Any  # VerificationReport
    timings: dict[str, float]
    files: list[Path] = field(default_factory=list)


def resolve_spec(spec: str) -> ModelSpec:
    """A zoo name (``resnet``) or ``package.module:factory``.

    A factory returns ``(model, example_args)`` or ``(model, example_args, example_kwargs)``; it is
    called once under ``torch.device('meta')`` for extraction and once, seeded, for real weights.
    """
    if ":" not in spec:
        try:
            entry = get_model(spec)
        except KeyError as e:
            raise TorchIRError(f"{e.args[0]}; or give package.module:factory") from None
        args, kwargs = entry.example_inputs()
        return ModelSpec(entry.name, entry.build, tuple(args), dict(kwargs), getattr(entry, "dynamic_shapes", None))
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise TorchIRError(f"cannot load model factory {spec!r}: {e}; expected 'package.module:function'") from None

    def call(device: str) -> tuple:
        torch.manual_seed(0)
        with torch.device(device):
            made = factory()
        if not isinstance(made, tuple) or len(made) not in (2, 3) or not isinstance(made[0], torch.nn.Module):
            raise TorchIRError(f"factory {spec!r} must return (model, example_args[, example_kwargs])")
        return made

    model, args, *rest = call("cpu")
    return ModelSpec(attr, lambda device: call(device)[0].eval(), tuple(args), dict(rest[0]) if rest else {})


def run_model(spec: ModelSpec, output_dir: Path | None = None, progress: Progress | None = None) -> RunResult:
    """Extract on meta, save, reload, execute with seeded real weights and verify against eager."""
    step = progress or (lambda _msg: None)
    timings: dict[str, float] = {}
    files: list[Path] = []

    def timed(label: str, fn: Callable[[], Any]) -> Any:
        step(label)
        start = time.perf_counter()
        value = fn()
        timings[label] = time.perf_counter() - start
        return value

    meta_model = timed("build on meta", lambda: spec.build("meta"))
    ir = timed("extract", lambda: spec.extract(meta_model))
    if output_dir is not None:
        path = output_dir / f"{spec.name}.json"
        timed("save", lambda: ir.save(path))
        ir = timed("load", lambda: load_ir(path))
        files.append(path)
    real = timed("build real", lambda: spec.build("cpu"))
    ok, report = timed("verify", lambda: verify_ir(ir, module_state(real), real, spec.args, test_kwargs=spec.kwargs))
    if output_dir is not None:
        md = output_dir / f"{spec.name}.md"
        md.write_text(markdown_report(ir, ir_statistics(ir), report), encoding="utf-8")
        mmd = output_dir / f"{spec.name}.mmd"
        mmd.write_text(to_mermaid(ir), encoding="utf-8")
        files += [md, mmd]
    return RunResult(spec.name, ok, ir, report, timings, files)
