"""The forms a bisect source can take (a zoo name, a ``module:factory``, a Hugging Face model, a tinygrad factory,
an ONNX file, an IR), told apart from the form alone, and the error that refuses the rest."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from torch_ir.errors import TorchIRError
from torch_ir.frontends.hf_model import is_hf_model_path
from torch_ir.ir import NPU_IR

TINYGRAD_PREFIX = "tinygrad:"
FRONTENDS = ("torch", "onnx", "tinygrad", "ir")
_FORMS = ("a zoo name (`torch-ir zoo --list`), 'package.module:factory' (PyTorch), a Hugging Face model "
          "directory or its config.json, 'tinygrad:package.module:factory', a path to an .onnx file, a path to an "
          "IR .json file")
ACCEPTED = f"{_FORMS} (with weights=), or an NPU_IR object (with weights=)"
ACCEPTED_CLI = f"{_FORMS} (with --weights)"  # the same, in the command line's words


def bad_source(text: str) -> SubjectError:
    """A refused source, the accepted forms listed in Python's words and (``.cli``) the command line's."""
    return SubjectError(text.replace("{accepted}", ACCEPTED), cli=text.replace("{accepted}", ACCEPTED_CLI))


# the forms of source that bring their own weights and have no PyTorch model to load a state dict into
NO_WEIGHTS = {"onnx": "an ONNX model holds its own weights (its initializers)",
              "tinygrad": "a tinygrad factory makes its own weights"}
WEIGHTS_TAKEN_BY = "a zoo name, a module:factory (PyTorch), a Hugging Face model or an IR .json"


class SubjectError(TorchIRError, ValueError):
    """What was given to bisect is none of the forms a subject can be made from, or does not fit them."""


def source_form(source: str | os.PathLike | Any, frontend: str | None = None) -> str:
    """Which frontend ``source`` goes to: "torch" (a zoo name or ``module:factory``), "onnx", "tinygrad" or "ir".

    Told from the source's form alone (nothing is imported or read), so the command line can refuse a flag that
    does not fit the source before any work. Raises :class:`SubjectError` for a source of no known form.
    """
    if frontend is not None and frontend not in FRONTENDS:
        raise SubjectError(f"load_subject(frontend={frontend!r}): unknown frontend; use one of "
                           f"{', '.join(map(repr, FRONTENDS))} or None (the source's form decides)")
    if isinstance(source, NPU_IR):
        return "ir"
    if isinstance(source, torch.nn.Module):
        raise SubjectError(f"load_subject got a {type(source).__name__} module without its example inputs; "
                           "call subject_from_torch(model, args) instead")
    if type(source).__name__ == "ModelProto":  # onnx's class; onnx is not imported for other sources
        return "onnx"
    if not isinstance(source, (str, os.PathLike)):
        raise bad_source(f"cannot bisect a {type(source).__name__}: give {{accepted}}")
    text = os.fspath(source)
    if text.startswith(TINYGRAD_PREFIX) or frontend == "tinygrad":
        return "tinygrad"
    path = Path(text)
    if frontend is None and (is_hf_model_path(text) or path.is_dir()):  # a config.json is a model, not an IR
        return "torch"
    suffix = path.suffix.lower()
    if frontend == "onnx" or suffix == ".onnx":
        return "onnx"
    if frontend == "ir" or suffix == ".json":
        return "ir"
    if path.exists():  # checked before a spec: "pkg.mod:f" has the "suffix" ".mod:f", a file never a colon
        raise bad_source(f"cannot bisect the file {text!r}: files are told apart by their suffix (.onnx, .json) "
                          f"and it has {suffix or 'none'}; give {{accepted}}")
    return "torch"


def shown(source: Any) -> str:
    return repr(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else f"a {type(source).__name__}"
