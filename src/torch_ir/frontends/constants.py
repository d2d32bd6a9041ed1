"""Values of small tensors a model makes on the meta device, which the meta device itself drops.

Two recorders. ``ConstantRecorder``, during export: ``torch.tensor([0.5, 2.0], device=x.device)`` in
``forward`` becomes a lifted constant of the exported program; the recorder watches tensor construction
from Python data and keeps a CPU copy of each meta tensor made that way, so the constant's value can
still be written into the IR. ``build_on_meta``, while the user builds the model: it keeps the values of
small tensors made in ``__init__`` (non-persistent buffers, tensor attributes), so that extraction can
record how to rebuild them (see :func:`build_on_meta`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.export import ExportedProgram
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils.weak import WeakIdKeyDictionary

_FROM_DATA = (torch.tensor, torch.as_tensor, torch.asarray)


class ConstantRecorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self._made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(meta tensor) -> (it, CPU value)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _FROM_DATA and isinstance(out, torch.Tensor) and out.device.type == "meta" and args:
            data = args[0]
            if not isinstance(data, torch.Tensor):  # Python data: the value is known here and only here
                with unset_fake_temporarily():  # a real CPU tensor, not one of export's fake ones
                    self._made[id(out)] = (out, torch.tensor(data, dtype=out.dtype))
        return out

    def fill(self, ep: ExportedProgram) -> None:
        """Swap each recorded meta constant of ``ep`` for its CPU value (same object identity)."""
        for name, value in list(ep.constants.items()):
            made = self._made.get(id(value))
            if made is not None and made[0] is value:
                ep.constants[name] = made[1]


# -- values of small tensors made while a model is built on the meta device -----------------------------

#: Largest tensor whose value is recorded while a model is built (elements); bigger ones stay shape-only.
SHADOW_LIMIT = 1 << 20
#: Most bytes of recorded values one ``build_on_meta`` block keeps; past it, nothing more is recorded.
SHADOW_BUDGET = 256 << 20

# meta tensor -> (its value on the CPU, the tensor's version counter when its block closed). The version is
# None while a build_on_meta block is open: there every op on the tensor is followed, so the value stays in step.
_SHADOWS: WeakIdKeyDictionary = WeakIdKeyDictionary()
_active = 0  # open build_on_meta blocks
# Ops whose result is not a function of their inputs: random draws, and uninitialized memory.
_NONDETERMINISTIC = ("rand", "normal", "uniform", "bernoulli", "dropout", "multinomial", "poisson",
                     "exponential", "geometric", "cauchy", "random_", "empty", "rrelu", "gumbel")
# Reads of a tensor's value into Python (``math.log(stride[i])``, ``if mask.any():``).
_READS = {torch.Tensor.item, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__bool__,
          torch.Tensor.__index__, torch.Tensor.tolist, torch.Tensor.__complex__}


def known_value(t: Any) -> torch.Tensor | None:
    """The value of a meta tensor made inside :func:`build_on_meta` (a CPU tensor), or None.

    None for any tensor that was not made there, was bigger than ``SHADOW_LIMIT`` elements, came from a
    random draw or uninitialized memory, or was written after the block closed (its version counter moved).
    """
    if not isinstance(t, torch.Tensor) or t.device.type != "meta":
        return None
    entry = _SHADOWS.get(t)
    if entry is None:
        return None
    value, version = entry
    if version is not None and t._version != version:
        return None  # written outside the block, where nothing kept the value in step
    return value


def remember_value(t: torch.Tensor, value: torch.Tensor) -> None:
    """Record ``value`` (a CPU tensor) as the value of the meta tensor ``t``, as if ``build_on_meta`` had."""
    if t.device.type == "meta" and value.numel() <= SHADOW_LIMIT:
        _SHADOWS[t] = (value.detach().cpu(), t._version)


def _forget(tensors: Any) -> None:
    for t in tensors:
        for x in (t, getattr(t, "_base", None)):
            if isinstance(x, torch.Tensor):
                _SHADOWS.pop(x, None)


def _mutates(func: Any, kwargs: dict) -> bool:
    name = getattr(func, "__name__", "")
    return (name.endswith("_") and not name.startswith("__")) or name in ("__setitem__", "__set__") \
        or name.startswith("__i") and name.endswith("__") and name not in ("__index__", "__int__", "__invert__") \
        or "out" in kwargs


class _BuildRecorder(TorchFunctionMode):
    """Keeps a CPU copy of every small deterministic meta tensor, op by op (see :func:`build_on_meta`)."""

    def __init__(self) -> None:
        super().__init__()
        self.spent = 0  # bytes of values recorded by this block

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if any(isinstance(t, FakeTensor) for t in pytree.tree_leaves((args, kwargs))):
            return func(*args, **kwargs)  # a trace (torch.export) inside the block: its tensors are not the model's
        if func in _READS and args and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
            value = known_value(args[0])
            if value is not None:  # the value is known: answer as the CPU build would
                with torch._C.DisableTorchFunction():
                    return func(value, *args[1:], **kwargs)
        out = func(*args, **kwargs)
        try:
            self._follow(func, args, kwargs, out)
        except Exception:  # noqa: BLE001 - recording is best effort; a value it cannot follow is unknown
            _forget(t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
        return out

    def _follow(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        metas = [x for x in leaves if isinstance(x, torch.Tensor) and x.device.type == "meta"]
        outs = [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor) and x.device.type == "meta"]
        mutating = _mutates(func, kwargs)
        if not outs and not mutating:
            return
        if mutating:
            target = kwargs["out"] if "out" in kwargs else (args[0] if args else None)
            if not (isinstance(target, torch.Tensor) and target.device.type == "meta"):
                return  # it wrote a real tensor, which keeps its own value: running it again would write twice
        name = getattr(func, "__name__", "")
        unknown = any(n in name for n in _NONDETERMINISTIC) or any(known_value(x) is None for x in metas)
        nbytes = sum(o.numel() * o.element_size() for o in outs)
        if unknown or any(o.numel() > SHADOW_LIMIT for o in outs) or self.spent + nbytes > SHADOW_BUDGET:
            _forget(outs + (metas if mutating else []))
            return
        mapped = [known_value(x) if isinstance(x, torch.Tensor) and x.device.type == "meta" else _on_cpu(x)
                  for x in leaves]
        call_args, call_kwargs = pytree.tree_unflatten(mapped, spec)
        with torch._C.DisableTorchFunction():
            result = func(*call_args, **call_kwargs)
        results = pytree.tree_leaves(result)
        out_leaves = pytree.tree_leaves(out)
        if len(results) != len(out_leaves):
            _forget(outs + (metas if mutating else []))
            return
        for o, r in zip(out_leaves, results):
            if not (isinstance(o, torch.Tensor) and o.device.type == "meta"):
                continue
            if isinstance(r, torch.Tensor) and r.device.type == "cpu" and r.shape == o.shape and r.dtype == o.dtype:
                _SHADOWS[o] = (r, None)
                self.spent += r.numel() * r.element_size()
            else:
                _forget([o])
        for x in metas if mutating else ():
            entry = _SHADOWS.get(x)
            if entry is not None:
                _SHADOWS[x] = (entry[0], None)


def _seal() -> None:
    """Note the version counter of each value the closing block kept in step: a later write voids it."""
    for t, (value, version) in list(_SHADOWS.items()):
        if version is None:
            _SHADOWS[t] = (value, t._version)


def _on_cpu(x: Any) -> Any:
    if isinstance(x, torch.device) and x.type == "meta":
        return torch.device("cpu")
    if isinstance(x, str) and x == "meta":
        return "cpu"
    return x


@contextlib.contextmanager
def build_on_meta() -> Iterator[None]:
    """``with torch.device("meta")`` that also remembers the values of small tensors made in ``__init__``.

    Example::

        with torch_ir.build_on_meta():
            model = BertModel(config)       # no memory for the weights, as under torch.device("meta")
        ir = torch_ir.extract_ir(model.eval(), (), example_kwargs={"input_ids": ids})
        torch_ir.IRExecutor(ir, real_model.state_dict())   # position_ids is rebuilt from the IR's recipe

    A model built on the meta device has shapes and no values. Most values are weights, loaded later; a few
    are fixed by the code that builds the model and never saved: non-persistent buffers (BERT's
    ``position_ids = torch.arange(n).expand(1, -1)``, rotary ``inv_freq``), plain tensor attributes (a
    detection head's ``stride``). Inside this block every op whose inputs are known and whose result is
    small (at most ``SHADOW_LIMIT`` elements) is also run on the CPU, so those values stay known:

    * extraction records how to rebuild non-persistent buffers (``NPU_IR.non_persistent_buffers``) and the
      values of lifted constants, and folds ``.item()`` reads of them (a stride used as a fill value);
    * ``__init__`` code that reads such a value into Python (``math.log(640 / stride[i])``, which fails on
      the meta device) gets the number the CPU build would get.

    Values of random draws (``uniform_``, ``randn``) and of uninitialized memory (``empty``) are never
    known; a value written by an op that cannot be followed is forgotten, as is one written after the
    block. Parameters and persistent buffers are recorded too but never used as values: their values come
    from a checkpoint.
    """
    global _active
    recorder = _BuildRecorder()
    with torch.device("meta"), recorder:
        _active += 1
        try:
            yield
        finally:
            _active -= 1
            if not _active:
                _seal()
