"""The main job on a model of the zoo (or any model spec): extract -> save -> reload -> execute -> verify.

Used by ``torch-ir demo``, ``torch-ir zoo`` (the report runner of seed 002) and the model tests, so
every path through the pipeline is the same code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from npu_tools.lm_gguf import gguf_model_parts, is_gguf_path
from torch_ir.errors import TorchIRError
from torch_ir.factory_spec import call_factory, check_torch_factory_result, load_factory
from torch_ir.fileio import atomic_write, check_output_path
from torch_ir.frontends import extract_ir
from torch_ir.frontends.constants import build_on_meta
from torch_ir.frontends.hf_model import is_hf_model_path, open_hf_model
from torch_ir.ir import NPU_IR, load_ir
from torch_ir.naming import safe_stem
from torch_ir.report import ir_statistics, markdown_report, to_mermaid
from torch_ir.verify import verify_ir
from torch_ir.weights import module_state

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
    #: Which weights ``build("cpu")`` gives, when the spec says (a Hugging Face model: its checkpoint's, or seeded
    #: random ones for a config alone); None: the zoo entry's or the factory's own.
    weights: str | None = None

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
    """A zoo name (``resnet``), ``package.module:factory``, a local Hugging Face model: a checkpoint directory
    (``./minilm``, weights optional) or its ``config.json`` alone (weight-free), or a GGUF file (llama, qwen2,
    mistral: ``npu_tools.lm_gguf.gguf_model_parts``).

    The one place a command's model argument is resolved: every command that takes a model takes all these forms.
    A Hugging Face model is opened by ``torch_ir.frontends.hf_model.open_hf_model`` (the config checked, nothing run
    from it), built with ``build_on_meta`` for extraction and with its weights (seeded random ones when it has
    none) for reference runs; its example inputs are seeded token ids sized by the config (``input_ids``, plus an
    ``attention_mask`` for an encoder).
    A factory returns ``(model, example_args)`` or ``(model, example_args, example_kwargs)``; it is
    called once under ``build_on_meta()`` (``torch.device('meta')`` that keeps the values of small tensors
    made in ``__init__``) for extraction and once, seeded, for real weights.
    A spec imports its module and calls the factory, so it runs that code: only use specs you trust.
    Whatever the factory does wrong (returns something else, raises, calls ``exit()``) becomes an
    ``ExtractionError`` naming the spec; an attribute that is not callable is refused before any call.
    """
    if is_hf_model_path(spec):
        return _hf_spec(spec)
    if is_gguf_path(spec):
        name, build, kwargs, weights = gguf_model_parts(spec)
        return ModelSpec(name, build, (), kwargs, weights=weights)
    if ":" not in spec:
        try:
            entry = get_model(spec)
        except KeyError as e:
            if Path(spec).is_dir():  # a directory that is no zoo name: opening it says what it lacks
                return _hf_spec(spec)
            raise TorchIRError(f"{e.args[0]}; or give package.module:factory, or a Hugging Face model directory "
                               "or its config.json") from None
        args, kwargs = entry.example_inputs()
        return ModelSpec(entry.name, entry.build, tuple(args), dict(kwargs), getattr(entry, "dynamic_shapes", None))
    factory = load_factory(spec)  # imports the module: code runs from here on (trusted specs only)
    name = spec.partition(":")[2]

    def call(device: str) -> tuple[torch.nn.Module, tuple, dict]:
        torch.manual_seed(0)
        # on meta, build_on_meta keeps the values of small tensors made in __init__ (see its docstring)
        with build_on_meta() if device == "meta" else torch.device(device):
            made = call_factory(factory, spec)
        return check_torch_factory_result(made, spec)

    _, args, kwargs = call("cpu")
    return ModelSpec(name, lambda device: call(device)[0].eval(), args, kwargs)


def _hf_spec(path: str) -> ModelSpec:
    model = open_hf_model(path)
    return ModelSpec(model.name, model.build, (), model.example_kwargs(), weights=model.weights_text)


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
    stem = safe_stem(spec.name)  # a module:factory spec may hold ':' and '.'
    if output_dir is not None:
        path = output_dir / f"{stem}.json"
        for name, what in ((path, "IR file"), (output_dir / f"{stem}.md", "report file"),
                           (output_dir / f"{stem}.mmd", "Mermaid file")):
            check_output_path(name, what)
        timed("save", lambda: ir.save(path))
        ir = timed("load", lambda: load_ir(path))
        files.append(path)
    real = timed("build real", lambda: spec.build("cpu"))
    ok, report = timed("verify", lambda: verify_ir(ir, module_state(real), real, spec.args, test_kwargs=spec.kwargs))
    if output_dir is not None:
        md = output_dir / f"{stem}.md"
        atomic_write(md, markdown_report(ir, ir_statistics(ir), report), what="report file")
        mmd = output_dir / f"{stem}.mmd"
        atomic_write(mmd, to_mermaid(ir), what="Mermaid file")
        files += [md, mmd]
    return RunResult(spec.name, ok, ir, report, timings, files)
