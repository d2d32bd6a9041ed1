"""Turn what a user names (a zoo model, a factory, an ONNX file, a tinygrad factory, an IR) into a :class:`Subject`.

    subject = load_subject("resnet")                          # a zoo name: eager PyTorch is trusted
    subject = load_subject("my_pkg.models:tiny_llama")        # a torch factory: (model, args[, kwargs])
    subject = load_subject("model.onnx")                      # onnxruntime is trusted
    subject = load_subject("tinygrad:my_pkg.tg:make_mlp")     # a tinygrad factory: (model, example_inputs)
    subject = load_subject("model.json", weights="model.safetensors")   # the IR's own execution is trusted
    subject = load_subject("my_pkg.models:tiny", weights="tiny.safetensors")   # loaded into the factory's model
    subject = load_subject("./minilm")                        # a Hugging Face directory: its own weights

A ``module:factory`` spec means PyTorch unless it starts with ``tinygrad:`` (or ``frontend="tinygrad"`` is
given): both kinds of factory look alike from outside, and importing the module to guess would run its code
twice. Built models are taken by ``subject_from_torch``, ``subject_from_onnx``, ``subject_from_tinygrad`` and
``subject_from_ir``, which ``load_subject`` dispatches to.

Inputs are seeded random ones unless given: floats from a normal distribution, integer indices below the
size of the table they index (an embedding's vocabulary) and otherwise the example's values where the
source has examples (positions, masks), else small non-negative ints. A spec or factory runs its code:
trusted specs only (see ``torch_ir.factory_spec``).

Weights are the source's own (a zoo model's seeded or pretrained ones, whatever a factory made or loaded itself,
an ONNX file's initializers) unless given: a state dict given for a zoo name or a PyTorch factory is loaded
into the model (``load_weights_into``), so eager PyTorch and the IR both run on it; an ONNX file or a tinygrad
factory takes none. ``Subject.weights_used`` says which weights were used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .source_forms import (
    ACCEPTED,
    ACCEPTED_CLI,
    FRONTENDS,
    NO_WEIGHTS,
    TINYGRAD_PREFIX,
    WEIGHTS_TAKEN_BY,
    SubjectError,
    shown,
    source_form,
)
from .subject import Subject
from .subject_ir import subject_from_ir
from .subject_onnx import subject_from_onnx
from .subject_tinygrad import subject_from_tinygrad, tinygrad_factory
from .subject_torch import subject_from_spec, subject_from_torch


def load_subject(source: str | os.PathLike | Any, *, inputs: Sequence[Any] | None = None,
                 weights: Any = None, seed: int = 0,
                 input_shapes: Mapping[str, Sequence[int]] | None = None,
                 frontend: str | None = None) -> Subject:
    """The :class:`Subject` of ``source``: its extracted IR, weights, inputs and trusted runner.

    Example::

        subject = load_subject("model.onnx", seed=1)
        (y,) = subject.run_trusted()                 # onnxruntime's output

    ``inputs`` (one per IR graph input) replace the seeded random ones; ``input_shapes`` binds the symbolic
    dimensions of an ONNX model's or an IR's inputs (``{"input": [1, 3, 224, 224]}``). ``weights`` (a
    ``.safetensors``/``.pt`` path or a state dict) are the weights of an IR, or are loaded into the model of a zoo
    name or a PyTorch factory (``load_weights_into``); an ONNX model or a tinygrad factory takes none
    (:class:`SubjectError`). A weights file is read before anything else, so a missing one is told first.
    ``frontend`` ("torch", "onnx", "tinygrad", "ir") overrides what the source's form says. Raises
    :class:`SubjectError` for a source of no known form.
    """
    form = source_form(source, frontend)
    if weights is not None and form in NO_WEIGHTS:
        raise SubjectError(f"cannot take weights= for {shown(source)}: {NO_WEIGHTS[form]}; weights are taken for "
                           f"{WEIGHTS_TAKEN_BY}")
    if form == "ir":
        return subject_from_ir(source, weights, inputs, seed=seed, input_shapes=input_shapes)
    if form == "onnx":
        onnx_source = source if type(source).__name__ == "ModelProto" else Path(source)
        return subject_from_onnx(onnx_source, inputs=inputs, seed=seed, input_shapes=input_shapes)
    text = os.fspath(source)
    if form == "tinygrad":
        spec = text.removeprefix(TINYGRAD_PREFIX)
        model, examples = tinygrad_factory(spec)
        return subject_from_tinygrad(model, inputs if inputs is not None else examples, name=spec.partition(":")[2],
                                     seed=seed, randomize=inputs is None)
    return subject_from_spec(text, inputs=inputs, seed=seed, weights=weights)


__all__ = ["ACCEPTED", "ACCEPTED_CLI", "FRONTENDS", "NO_WEIGHTS", "TINYGRAD_PREFIX", "WEIGHTS_TAKEN_BY", "SubjectError",
           "load_subject", "source_form", "subject_from_ir", "subject_from_onnx", "subject_from_tinygrad",
           "subject_from_torch"]
