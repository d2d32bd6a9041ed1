"""The reference executor: a short loop over the nodes with an environment dict.

Each node is bound to its implementation once, at construction (``ops.registry.bind_kernel``), so
every unsupported op is reported before anything runs; values are freed after their last use;
a failure names the node. ``run_traced`` hands every node's outputs to a callback, which is how the
verifier compares intermediate values. With ``check_shapes`` (or ``TORCH_IR_CHECK_SHAPES=1``) every
node's outputs are checked against the shapes and dtypes the IR declares for them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..errors import ExecutionError, InputMismatchError, TorchIRError, UnsupportedOpError
from ..ir import NPU_IR, OpNode, TensorMeta
from ..ops.registry import bind_kernel, unsupported_message
from ..ops.symbolic import eval_sym
from ..ops.values import decode_value, dtype_name
from ..quant.spec import stored
from ..weights import WeightsSource, as_tensor, match_weights

Inputs = Sequence[Any] | Mapping[str, Any]  # torch tensors, numpy arrays, anything with __array__/__dlpack__
NodeCallback = Callable[[OpNode, list[torch.Tensor]], None]
CHECK_SHAPES_ENV = "TORCH_IR_CHECK_SHAPES"


class IRExecutor:
    """Run an IR with real weights on the CPU (or any torch device).

    Example::

        executor = IRExecutor(ir, model)               # or model.state_dict(), a file, an ExportedProgram
        (logits,) = executor.run([x])                  # x: a torch tensor, a numpy array, ...

    ``weights`` is anything ``torch_ir.load_state_dict`` takes (values may be numpy arrays or other
    array-likes). Non-persistent buffers missing from it are rebuilt from the IR's recipes where it has one.
    ``check_shapes=True`` checks every node's actual outputs against the IR's declared shapes and dtypes
    (symbolic dimensions resolved with the symbols bound from the inputs) and raises ``ExecutionError``
    naming the node, op, output and both shapes at the first difference; ``None`` (the default) reads the
    environment variable ``TORCH_IR_CHECK_SHAPES`` (``1`` turns it on). A debugging aid: it costs a little
    per node.
    """

    def __init__(self, ir: NPU_IR, weights: WeightsSource | None = None, *, device: str | torch.device = "cpu",
                 strict_weights: bool = True, check_shapes: bool | None = None):
        self.ir = ir
        self.device = torch.device(device)
        self.check_shapes = _env_flag(CHECK_SHAPES_ENV) if check_shapes is None else bool(check_shapes)
        self.kernels = self._bind_all(ir)
        self.state = {k: v.to(self.device) for k, v in match_weights(ir, weights, strict=strict_weights).items()}
        keep = {t.name for t in ir.graph_outputs} | set(ir.mutations.values())
        self.dead_after = _dead_after(ir, keep)

    def _bind_all(self, ir: NPU_IR) -> list:
        kernels, unsupported = [], []
        for node in ir.nodes:
            try:
                kernels.append(bind_kernel(node, self.device))
            except UnsupportedOpError:
                unsupported.append(node)
        if unsupported:
            raise UnsupportedOpError(f"IR {ir.model_name!r}: " + unsupported_message(unsupported))
        return kernels

    def run(self, inputs: Inputs) -> list[torch.Tensor]:
        """Execute the graph; returns the outputs in graph-output order. Buffer mutations are applied,
        and an input the model writes in place (``ir.mutations`` keyed by a graph input) is written back
        into the caller's tensor, as eager does."""
        return self.run_traced(inputs, None)

    def run_traced(self, inputs: Inputs, on_node: NodeCallback | None) -> list[torch.Tensor]:
        given: dict[str, torch.Tensor] = {}  # the caller's tensors of the inputs the graph writes in place
        env, symbols = self._bind_inputs(inputs, given)
        env.update(self.state)
        with torch.no_grad():
            for node, kernel, dead in zip(self.ir.nodes, self.kernels, self.dead_after):
                try:
                    outs = kernel([env[t.name] for t in node.inputs], symbols)
                except Exception as e:  # noqa: BLE001 - re-raised with the node that failed
                    raise ExecutionError(
                        f"while executing node {node.name} ({node.op_type}) of IR {self.ir.model_name!r}:\n"
                        f"  {node}\n  {type(e).__name__}: {e}"
                    ) from e
                if len(outs) != len(node.outputs):
                    raise ExecutionError(
                        f"while executing node {node.name} ({node.op_type}): the implementation returned "
                        f"{len(outs)} tensors, the IR declares {len(node.outputs)} outputs\n  {node}"
                    )
                if self.check_shapes:
                    _check_outputs(self.ir, node, outs, symbols)
                for meta, value in zip(node.outputs, outs):
                    env[meta.name] = value
                if on_node is not None:
                    on_node(node, outs)
                for name in dead:
                    del env[name]
        for target, value in self.ir.mutations.items():
            if target in given:
                with torch.no_grad():
                    given[target].copy_(env[value])  # an input written in place: into the caller's tensor
            else:
                self.state[target] = env[value]
        return [env[t.name] for t in self.ir.graph_outputs]

    def _bind_inputs(self, inputs: Inputs, given: dict[str, torch.Tensor] | None = None,
                     ) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
        metas = self.ir.graph_inputs
        if isinstance(inputs, Mapping):
            names = [m.name for m in metas]
            missing = [n for n in names if n not in inputs]
            extra = [n for n in inputs if n not in names]
            if missing or extra:
                raise InputMismatchError(
                    f"IR {self.ir.model_name!r} takes inputs {names}; missing {missing}, unexpected {extra}"
                )
            values = [inputs[n] for n in names]
        else:
            values = list(inputs)
            if len(values) != len(metas):
                raise InputMismatchError(
                    f"IR {self.ir.model_name!r} takes {len(metas)} inputs "
                    f"({', '.join(str(m) for m in metas)}), got {len(values)}"
                )
        symbols: dict[str, int] = {}
        env = {}
        for meta, value in zip(metas, values):
            value = as_tensor(value, f"input {meta.name!r} of IR {self.ir.model_name!r}", InputMismatchError)
            _check_input(self.ir, meta, value, symbols)
            if given is not None and meta.name in self.ir.mutations:
                given[meta.name] = value
            env[meta.name] = value.to(self.device)
        for name, spec in self.ir.symbols.items():
            if "expr" in spec:  # a symbol defined by other symbols (aten.item of a shape)
                symbols[name] = decode_value(spec["expr"], symbols)
        return env, symbols


def _check_input(ir: NPU_IR, meta: TensorMeta, value: object, symbols: dict[str, int]) -> None:
    where = f"input {meta.name!r} of IR {ir.model_name!r}"
    if not isinstance(value, torch.Tensor):
        raise InputMismatchError(f"{where} must be a torch.Tensor, got {type(value).__name__}")
    dtype, shape = stored(meta.dtype, meta.shape)  # 4-bit codes travel packed, two per byte
    if dtype_name(value.dtype) != dtype:
        raise InputMismatchError(f"{where} must have dtype {dtype}, got {dtype_name(value.dtype)}")
    if value.dim() != len(shape):
        raise InputMismatchError(
            f"{where} must have shape {shape} (rank {len(shape)}), got {list(value.shape)}")
    for axis, (want, got) in enumerate(zip(shape, value.shape)):
        if isinstance(want, str) and want.isidentifier():
            symbol, want = want, symbols.setdefault(want, got)
            lo, hi = ir.symbols.get(symbol, {}).get("min"), ir.symbols.get(symbol, {}).get("max")
            if (lo is not None and got < lo) or (hi is not None and got > hi):
                raise InputMismatchError(
                    f"{where}: dim {axis} = {got} is outside the range [{lo}, {hi}] of symbol {symbol}")
        elif isinstance(want, str):
            continue  # an expression of symbols; checked by the ops that use it
        if got != want:
            raise InputMismatchError(
                f"{where} must have shape {meta.shape}, got {list(value.shape)} (dim {axis}: {got} != {want})"
            )


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _check_outputs(ir: NPU_IR, node: OpNode, outs: Sequence[torch.Tensor], symbols: Mapping[str, int]) -> None:
    """Each output's dtype and shape as the IR declares them; symbolic dims are evaluated with ``symbols``."""
    for index, (meta, value) in enumerate(zip(node.outputs, outs)):
        if not isinstance(value, torch.Tensor):
            raise ExecutionError(f"check_shapes: node {node.name} ({node.op_type}) output {index} ({meta.name!r}) "
                                 f"is {type(value).__name__}, not a tensor\n  {node}")
        want_dtype, want_shape = stored(meta.dtype, meta.shape)
        declared = [_resolve_dim(d, symbols) for d in want_shape]
        actual = list(value.shape)
        shape_ok = len(declared) == len(actual) and all(d is None or d == a for d, a in zip(declared, actual))
        dtype = dtype_name(value.dtype)
        if shape_ok and dtype == want_dtype:
            continue
        shown = [d if d is not None else s for d, s in zip(declared, meta.shape)]
        symbolic = f" (IR: {meta.shape})" if any(isinstance(d, str) for d in meta.shape) else ""
        raise ExecutionError(
            f"check_shapes: node {node.name} ({node.op_type}) output {index} ({meta.name!r}): the IR declares "
            f"{meta.dtype}{shown}{symbolic}, the kernel returned {dtype}{actual}\n  {node}\n"
            "The IR's declared shapes are what compilers plan memory with: a difference means the extraction "
            "recorded a shape the op does not produce (report it), or the IR was edited by hand.")


def _resolve_dim(dim: int | str, symbols: Mapping[str, int]) -> int | None:
    """A declared dimension's value; None when it uses a symbol nothing bound (left unchecked)."""
    if isinstance(dim, int):
        return dim
    try:
        return eval_sym(dim, symbols)
    except TorchIRError:
        return None


def _dead_after(ir: NPU_IR, keep: set[str]) -> list[list[str]]:
    """For each node, the values whose last use it is (so they can be freed right after)."""
    last: dict[str, int] = {}
    for i, node in enumerate(ir.nodes):
        for t in node.inputs:
            last[t.name] = i
        for t in node.outputs:
            last.setdefault(t.name, i)  # an output nobody reads dies where it is born
    weights = {w.name for w in ir.weights} | {c.name for c in ir.constants}
    dead: list[list[str]] = [[] for _ in ir.nodes]
    for name, i in last.items():
        if name not in keep and name not in weights:
            dead[i].append(name)
    return dead

