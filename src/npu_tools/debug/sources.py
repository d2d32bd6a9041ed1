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

import torch
from torch.utils import _pytree as pytree

from torch_ir.errors import ExtractionError, InputMismatchError, TorchIRError, WeightsMismatchError
from torch_ir.executor import IRExecutor
from torch_ir.frontends.hf_model import is_hf_model_path
from torch_ir.inputs import random_inputs
from torch_ir.ir import NPU_IR, OpNode, load_ir

from .subject import Subject, WeightsUsed

TINYGRAD_PREFIX = "tinygrad:"
FRONTENDS = ("torch", "onnx", "tinygrad", "ir")
_FORMS = ("a zoo name (`torch-ir zoo --list`), 'package.module:factory' (PyTorch), a Hugging Face model "
          "directory or its config.json, 'tinygrad:package.module:factory', a path to an .onnx file, a path to an "
          "IR .json file")
ACCEPTED = f"{_FORMS} (with weights=), or an NPU_IR object (with weights=)"
ACCEPTED_CLI = f"{_FORMS} (with --weights)"  # the same, in the command line's words


def _bad_source(text: str) -> SubjectError:
    """A refused source, the accepted forms listed in Python's words and (``.cli``) the command line's."""
    return SubjectError(text.replace("{accepted}", ACCEPTED), cli=text.replace("{accepted}", ACCEPTED_CLI))
# the forms of source that bring their own weights and have no PyTorch model to load a state dict into
NO_WEIGHTS = {"onnx": "an ONNX model holds its own weights (its initializers)",
              "tinygrad": "a tinygrad factory makes its own weights"}
WEIGHTS_TAKEN_BY = "a zoo name, a module:factory (PyTorch), a Hugging Face model or an IR .json"


class SubjectError(TorchIRError, ValueError):
    """What was given to bisect is none of the forms a subject can be made from, or does not fit them."""


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
        raise SubjectError(f"cannot take weights= for {_shown(source)}: {NO_WEIGHTS[form]}; weights are taken for "
                           f"{WEIGHTS_TAKEN_BY}")
    if form == "ir":
        return subject_from_ir(source, weights, inputs, seed=seed, input_shapes=input_shapes)
    if form == "onnx":
        onnx_source = source if type(source).__name__ == "ModelProto" else Path(source)
        return subject_from_onnx(onnx_source, inputs=inputs, seed=seed, input_shapes=input_shapes)
    text = os.fspath(source)
    if form == "tinygrad":
        spec = text.removeprefix(TINYGRAD_PREFIX)
        model, examples = _tinygrad_factory(spec)
        return subject_from_tinygrad(model, inputs if inputs is not None else examples, name=spec.partition(":")[2],
                                     seed=seed, randomize=inputs is None)
    return _torch_spec(text, inputs=inputs, seed=seed, weights=weights)


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
        raise _bad_source(f"cannot bisect a {type(source).__name__}: give {{accepted}}")
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
        raise _bad_source(f"cannot bisect the file {text!r}: files are told apart by their suffix (.onnx, .json) "
                          f"and it has {suffix or 'none'}; give {{accepted}}")
    return "torch"


def _shown(source: Any) -> str:
    return repr(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else f"a {type(source).__name__}"


# -- PyTorch ---------------------------------------------------------------------------------------

def _torch_spec(spec: str, *, inputs: Sequence[Any] | None, seed: int, weights: Any = None) -> Subject:
    from npu_tools.zoo.runner import resolve_spec
    from torch_ir.weights import load_state_dict, load_weights_into

    # given weights are read first: a missing or unreadable file is told before the factory runs
    state = load_state_dict(weights) if weights is not None else None
    try:
        resolved = resolve_spec(spec)
    except ExtractionError:
        raise
    except TorchIRError as e:  # an unknown zoo name: say every form, not only the two of a spec
        raise _bad_source(f"cannot bisect {spec!r}: {e}; the source may be {{accepted}}") from None
    model = resolved.build("cpu")  # seeded by the build itself (the zoo entry's seed, 0 for a factory)
    if state is not None:
        load_weights_into(model, state, _weights_where(weights))
    used = _given_weights(weights) if weights is not None else _own_weights(spec, resolved)
    return _torch_subject(_extract_spec(resolved, model), model, resolved.args, resolved.kwargs, name=resolved.name,
                          inputs=inputs, seed=seed, weights_used=used)


def _extract_spec(resolved: Any, model: torch.nn.Module) -> NPU_IR:
    """The IR of a spec's model, extracted from a second build on meta as every command extracts it; for a factory
    that cannot run under the meta device (``from_pretrained`` loads real tensors and refuses it), from meta copies
    of ``model``'s tensors instead, so such a factory can be the trusted source. (A factory that fails everywhere
    already failed building ``model``, with its whole error.)"""
    try:
        meta_model = resolved.build("meta")
    except ExtractionError:
        return _extract_on_meta_copies(model, resolved.args, resolved.kwargs, resolved.name, resolved.dynamic_shapes)
    return resolved.extract(meta_model)


def _own_weights(spec: str, resolved: Any) -> WeightsUsed:
    """The weights a zoo model, a factory or a Hugging Face model is built with when none are given."""
    if resolved.weights is not None:  # a Hugging Face model: its checkpoint's, or seeded ones for a config alone
        return WeightsUsed.own(resolved.weights)
    if ":" in spec:  # the factory runs after torch.manual_seed(0): random weights it draws are seeded
        return WeightsUsed.own("the factory's own weights")
    from npu_tools.zoo import get_model

    entry = get_model(spec)
    return WeightsUsed.own("the zoo model's pretrained weights") if entry.real_weights \
        else WeightsUsed.seeded(entry.seed)


def _given_weights(weights: Any) -> WeightsUsed:
    if isinstance(weights, (str, os.PathLike)):
        return WeightsUsed.file(weights)
    return WeightsUsed("given", f"the weights given to bisect (a {type(weights).__name__})")


def _weights_where(weights: Any) -> str:
    """How a message names given weights: the file, or what was passed in Python."""
    if isinstance(weights, (str, os.PathLike)):
        return f"weights file {os.fspath(weights)!r}"
    return f"the weights given (a {type(weights).__name__})"


def subject_from_torch(model: torch.nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any] | None = None, *,
                       name: str | None = None, inputs: Sequence[Any] | None = None, seed: int = 0,
                       dynamic_shapes: Any = None) -> Subject:
    """A subject from a built PyTorch model (real weights) and its example inputs.

    Example::

        subject = subject_from_torch(MyNet().eval(), (torch.randn(2, 8),), name="mynet")

    The IR is extracted as the zoo does, on meta copies of the weights (``extract_ir`` never computes);
    eager PyTorch on the real weights is trusted, and the re-exported graph gives the values of every
    IR tensor (``trusted_values``).
    """
    name = name or type(model).__name__
    model = model.eval()
    kwargs = dict(kwargs or {})
    ir = _extract_on_meta_copies(model, tuple(args), kwargs, name, dynamic_shapes)
    return _torch_subject(ir, model, tuple(args), kwargs, name=name, inputs=inputs, seed=seed,
                          weights_used=WeightsUsed.own("the model's own weights"))


def _extract_on_meta_copies(model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any], name: str,
                            dynamic_shapes: Any) -> NPU_IR:
    from torch_ir.frontends import extract_ir
    from torch_ir.frontends.meta_model import on_meta

    with on_meta(model, remember=True):  # the conditions of a meta extraction, without a second model
        return extract_ir(model, tuple(args), model_name=name, example_kwargs=dict(kwargs),
                          dynamic_shapes=dynamic_shapes)


def _torch_subject(ir: NPU_IR, model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any], *, name: str,
                   inputs: Sequence[Any] | None, seed: int, weights_used: WeightsUsed) -> Subject:
    from torch_ir.verify.verifier import in_ir_order, run_eager
    from torch_ir.weights import module_state

    kwargs = in_ir_order(ir, kwargs)
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    if len(slots) != len(ir.graph_inputs):
        raise SubjectError(f"model {name!r}: {len(slots)} example tensors but the IR has {len(ir.graph_inputs)} "
                           "graph inputs; pass the inputs the model was extracted with")
    examples = [leaves[i] for i in slots]
    values = _given(ir, inputs, name) if inputs is not None else random_inputs(ir, seed, examples=examples)
    for i, value in zip(slots, values):
        leaves[i] = value
    args, kwargs = pytree.tree_unflatten(leaves, spec)

    def run_trusted() -> list[torch.Tensor]:
        return run_eager(model, args, kwargs)

    def trusted_values() -> dict[str, torch.Tensor]:
        return _torch_values(ir, model, args, kwargs)

    return Subject(name=name, ir=ir, weights=module_state(model), inputs=list(values), trusted="eager PyTorch",
                   run_trusted=run_trusted, trusted_values=trusted_values, frontend="torch.export",
                   weights_used=weights_used)


def _torch_values(ir: NPU_IR, model: torch.nn.Module, args: tuple,
                  kwargs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Every IR tensor's value in the re-exported graph, by name; only the names that line up.

    The re-export whose names are the IR's is used (see ``verify/reference.py``). When neither lines up
    whole, the one with the later first misaligned node is used up to that node: after an extra node every
    later FX name shifts, so a same-named value further on may be another op's and is left out.
    """
    from torch_ir.verify.reference import EXPORT_MODES, aligned_prefix, export_reference, run_reference

    best: tuple[int, Any] | None = None
    for mode in EXPORT_MODES:
        try:
            ep = export_reference(ir, model, args, kwargs, mode)
        except Exception:  # noqa: BLE001 - a failed re-export leaves the other mode, or no intermediates
            continue
        good = aligned_prefix(ir, ep)
        if best is None or good > best[0]:
            best = (good, ep)
        if good == len(ir.nodes):
            break
    if best is None or best[0] == 0:
        return {}
    good, ep = best
    values = run_reference(ep, model, args, kwargs)
    names = {t.name: t for t in [*ir.graph_inputs, *ir.weights, *ir.constants]}
    names.update({t.name: t for node in ir.nodes[:good] for t in node.outputs})
    return {n: v for n, v in values.items() if n in names and list(v.shape) == _dims(names[n].shape, v)}


def _dims(shape: Sequence[Any], value: torch.Tensor) -> list[int]:
    """The IR shape with symbolic dimensions taken from the value (they are checked elsewhere)."""
    return [d if isinstance(d, int) else value.shape[i] for i, d in enumerate(shape)] if len(shape) == value.dim() \
        else list(shape)


# -- ONNX --------------------------------------------------------------------------------------------

def subject_from_onnx(model: str | os.PathLike | Any, *, inputs: Sequence[Any] | None = None, seed: int = 0,
                      input_shapes: Mapping[str, Sequence[int]] | None = None,
                      name: str | None = None) -> Subject:
    """A subject from an ONNX model (a path or a ``ModelProto``); onnxruntime is trusted.

    Example::

        subject = subject_from_onnx("model.onnx", input_shapes={"input": [1, 3, 32, 32]})

    IR tensors made from ONNX values keep their ONNX names, so ``trusted_values`` asks onnxruntime for
    every one of them at once (each made an extra graph output).
    """
    import onnx

    from torch_ir.frontends.onnx import load_model
    from torch_ir.frontends.onnx.importer import Importer
    from torch_ir.frontends.onnx.verify import check_onnx_sizes, run_onnxruntime

    loaded = load_model(model, input_shapes)
    check_onnx_sizes(loaded)  # onnxruntime allocates what the file asks: sizes are checked first
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model))
    name = name or loaded.model.graph.name or (Path(model).stem if not isinstance(model, onnx.ModelProto) else None) \
        or "onnx_model"
    ir, weights = Importer(loaded, name).run()
    shapes = {k: list(v) for k, v in (input_shapes or {}).items()}
    values = _given(ir, inputs, name) if inputs is not None else random_inputs(ir, seed, shapes=shapes)
    outputs = [t.name for t in ir.graph_outputs]

    def run_trusted() -> list[torch.Tensor]:
        return run_onnxruntime(proto, ir, values, outputs)

    def trusted_values() -> dict[str, torch.Tensor]:
        onnx_names = {o for n in proto.graph.node for o in n.output if o}
        named = [t.name for n in ir.nodes for t in n.outputs if t.name in onnx_names]
        found = dict(zip(named, run_onnxruntime(proto, ir, values, named)))
        found.update({t.name: v for t, v in zip(ir.graph_inputs, values)})
        return found

    return Subject(name=name, ir=ir, weights=weights, inputs=values, trusted="onnxruntime",
                   run_trusted=run_trusted, trusted_values=trusted_values, frontend="onnx",
                   weights_used=WeightsUsed.own("the ONNX model's own weights (its initializers)"))


# -- tinygrad ----------------------------------------------------------------------------------------

def _tinygrad_factory(spec: str) -> tuple[Any, list[Any]]:
    from npu_tools.commands.import_tinygrad import default_device, load_factory

    default_device()
    return load_factory(spec)


def subject_from_tinygrad(model: Any, inputs: Sequence[Any], *, name: str | None = None, seed: int = 0,
                          randomize: bool = True) -> Subject:
    """A subject from a tinygrad model (any callable) and its example inputs; tinygrad is trusted.

    Example::

        subject = subject_from_tinygrad(MLP(), [Tensor.empty(2, 16)], name="mlp")

    With ``randomize`` the inputs are seeded random values of the examples' shapes and dtypes (integer
    examples are kept: tinygrad's ``Embedding`` compares with an arange, so nothing in the IR says their
    range); otherwise the given inputs are used as they are. The model is imported on those values, so
    the UOps the IR tensors came from compute exactly the trusted values: ``trusted_values`` realizes them.
    """
    from npu_tools.commands.import_tinygrad import default_device

    default_device()
    import numpy as np
    from tinygrad.tensor import Tensor

    name = name or getattr(model, "__name__", None) or type(model).__name__
    examples = [_to_torch(x) for x in inputs]
    values = _random_like(examples, seed) if randomize else examples
    tensors = [Tensor(np.ascontiguousarray(v.numpy())) for v in values]
    ir, weights, origins = _import_tinygrad_traced(model, tensors, name)
    missing = [t.name for t in ir.graph_outputs if t.name not in origins]
    if missing:  # an input returned as it is: the IR copies it, and no UOp of the model computes it
        raise SubjectError(f"tinygrad model {name!r}: outputs {missing} are computed by no UOp of the model (an "
                           "input returned as it is); return a computed tensor")
    outputs = [origins[t.name] for t in ir.graph_outputs]

    def run_trusted() -> list[torch.Tensor]:
        return [_to_torch(Tensor(u)) for u in outputs]

    def trusted_values() -> dict[str, torch.Tensor]:
        found: dict[str, torch.Tensor] = dict(zip((t.name for t in ir.graph_inputs), values))
        metas = {t.name: t for node in ir.nodes for t in node.outputs if t.name in origins}
        wanted = {n: Tensor(origins[n]) for n in metas}
        try:
            Tensor.realize(*wanted.values())  # one schedule for all: tinygrad compiles once, not once a tensor
        except Exception:  # noqa: BLE001 - a UOp that is no tensor value spoils the batch: each alone below
            pass
        for tensor_name, tensor in wanted.items():
            try:
                value = _to_torch(tensor)
            except Exception:  # noqa: BLE001 - best effort: a UOp that is no tensor value is left out
                continue
            if list(value.shape) == list(metas[tensor_name].shape):
                found[tensor_name] = value
        return found

    return Subject(name=name, ir=ir, weights={k: torch.from_numpy(v) for k, v in weights.items()}, inputs=values,
                   trusted="tinygrad", run_trusted=run_trusted, trusted_values=trusted_values, frontend="tinygrad",
                   weights_used=WeightsUsed.own("the factory's own weights"))


def _import_tinygrad_traced(model: Any, inputs: list[Any], name: str) -> tuple[NPU_IR, dict[str, Any], dict[str, Any]]:
    """What ``import_tinygrad`` returns (the simplified IR, weights) and IR tensor name -> the UOp it came from.

    ``import_tinygrad_traced`` gives the UOp of every tensor of the literal translation; the simplifying rules
    keep the names of the tensors they leave, so the map holds for every name still in the simplified IR
    (a value is used only where its shape is the IR's, see ``subject_from_tinygrad``).
    """
    from torch_ir.frontends.tinygrad.importer import import_tinygrad_traced
    from torch_ir.frontends.tinygrad.rules import simplify_ir
    from torch_ir.ir import check_integrity

    literal, weights, uops = import_tinygrad_traced(model, inputs, model_name=name)
    ir = simplify_ir(literal)
    check_integrity(ir, source=f"tinygrad import of {name!r}")
    live = {t.name for t in ir.tensors()}
    origins = {n: u for n, u in uops.items() if n in live}
    # an output that is an input, a weight or a constant as it is gets a clone node (made from no UOp): its
    # value is its source's; an input's own UOp is the buffer the model was called on
    sources = {n.outputs[0].name: n.inputs[0].name for n in literal.nodes if n.op_type == "aten.clone.default"}
    for meta in ir.graph_outputs:
        source = sources.get(meta.name)
        if meta.name not in origins and source in uops:
            origins[meta.name] = uops[source]
    return ir, weights, origins


def _to_torch(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if hasattr(x, "numpy"):  # a tinygrad Tensor: realizes it
        x = x.numpy()
    import numpy as np

    return torch.from_numpy(np.array(x, copy=True))


def _random_like(examples: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(x.shape, generator=g).to(x.dtype) if x.is_floating_point() else x.clone() for x in examples]


# -- an IR -------------------------------------------------------------------------------------------

def subject_from_ir(ir: NPU_IR | str | os.PathLike, weights: Any = None, inputs: Sequence[Any] | None = None, *,
                    seed: int = 0, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Subject:
    """A subject from an IR (object or JSON path) and its weights; the IR's own reference execution is trusted.

    Example::

        subject = subject_from_ir("model.json", "model.safetensors")

    Without a source model nothing outside the IR can be trusted: the stages after extraction (normalize,
    compile, the backends) are compared with ``IRExecutor`` on the IR as given. ``weights`` defaults to the
    file the IR names (``metadata["weights_file"]``) or the ``.safetensors`` beside a JSON path.
    """
    from torch_ir.weights import load_state_dict

    # given weights are read first: a missing or unreadable file is told before the IR is read
    state = load_state_dict(weights) if weights is not None else None
    path = None
    if not isinstance(ir, NPU_IR):
        path = Path(ir)
        ir = load_ir(path)
    used = _given_weights(weights) if weights is not None else WeightsUsed("none", "none (the IR has no weights)")
    if state is None:
        beside = _weights_beside(ir, path)
        state = load_state_dict(beside) if beside is not None else {}
        used = WeightsUsed.file(beside) if beside is not None else used
    shapes = {k: list(v) for k, v in (input_shapes or {}).items()}
    values = _given(ir, inputs, ir.model_name) if inputs is not None else random_inputs(ir, seed, shapes=shapes)
    executor = IRExecutor(ir, state)  # binds the weights now: a mismatch is told before any bisection

    def run_trusted() -> list[torch.Tensor]:
        return executor.run(values)

    def trusted_values() -> dict[str, torch.Tensor]:
        found = dict(zip((t.name for t in ir.graph_inputs), values))

        def keep(node: OpNode, outs: list[torch.Tensor]) -> None:
            found.update({meta.name: v for meta, v in zip(node.outputs, outs)})

        executor.run_traced(values, keep)
        return found

    return Subject(name=ir.model_name, ir=ir, weights=state, inputs=values, trusted="the IR's reference execution",
                   run_trusted=run_trusted, trusted_values=trusted_values, frontend=None, weights_used=used)


def _weights_beside(ir: NPU_IR, path: Path | None) -> Path | None:
    if not ir.weights:
        return None
    named = ir.metadata.get("weights_file")
    candidates = [path.parent / Path(named).name] if path is not None and isinstance(named, str) else []
    if path is not None:
        candidates.append(path.with_suffix(".safetensors"))
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        where = f"IR {str(path)!r}" if path is not None else f"IR {ir.model_name!r}"
        text = f"{where} has {len(ir.weights)} weights and no weights were given" \
            + (f" (none of {[str(c) for c in candidates]} exists)" if candidates else "")
        raise WeightsMismatchError(text + "; pass weights= (a .safetensors file or a state dict)",
                                   cli=text + "; give --weights FILE (a .safetensors or .pt file)")
    return found


# -- inputs ------------------------------------------------------------------------------------------

def _given(ir: NPU_IR, inputs: Sequence[Any] | Mapping[str, Any], name: str) -> list[torch.Tensor]:
    """The caller's inputs as torch tensors, one per graph input (a mapping: by graph input name)."""
    from torch_ir.weights import as_tensor

    if isinstance(inputs, Mapping):
        names = [t.name for t in ir.graph_inputs]
        stray, missing = sorted(set(inputs) - set(names)), [n for n in names if n not in inputs]
        if stray or missing:
            raise InputMismatchError(f"{name!r} takes the inputs {', '.join(names)}; the inputs given "
                                     + (f"name {stray} " if stray else "") + (f"lack {missing}" if missing else ""))
        inputs = [inputs[n] for n in names]

    values = [as_tensor(x, f"input {i} of {name!r}", InputMismatchError) for i, x in enumerate(inputs)]
    if len(values) != len(ir.graph_inputs):
        raise InputMismatchError(f"{name!r} takes {len(ir.graph_inputs)} inputs "
                                 f"({', '.join(t.name for t in ir.graph_inputs)}); {len(values)} were given")
    return values


__all__ = ["ACCEPTED", "NO_WEIGHTS", "TINYGRAD_PREFIX", "WEIGHTS_TAKEN_BY", "SubjectError", "load_subject",
           "source_form", "subject_from_ir", "subject_from_onnx", "subject_from_tinygrad",
           "subject_from_torch"]
