"""The reference executor: a short loop over the nodes with an environment dict.

Each node is bound to its implementation once, at construction (``ops.registry.bind_kernel``), so
every unsupported op is reported before anything runs; values are freed after their last use;
a failure names the node. ``run_traced`` hands every node's outputs to a callback, which is how the
verifier compares intermediate values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from ..errors import ExecutionError, InputMismatchError, UnsupportedOpError
from ..ir import NPU_IR, OpNode, TensorMeta
from ..ops.registry import bind_kernel, unsupported_message
from ..ops.values import decode_value, dtype_name
from ..weights import WeightsSource, match_weights

Inputs = Sequence[torch.Tensor] | Mapping[str, torch.Tensor]
NodeCallback = Callable[[OpNode, list[torch.Tensor]], None]


class IRExecutor:
    """Run an IR with real weights on the CPU (or any torch device).

    Example::

        executor = IRExecutor(ir, model.state_dict())
        (logits,) = executor.run([x])
    """

    def __init__(self, ir: NPU_IR, weights: WeightsSource | None = None, *, device: str | torch.device = "cpu",
                 strict_weights: bool = True):
        self.ir = ir
        self.device = torch.device(device)
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
        """Execute the graph; returns the outputs in graph-output order. Buffer mutations are applied."""
        return self.run_traced(inputs, None)

    def run_traced(self, inputs: Inputs, on_node: NodeCallback | None) -> list[torch.Tensor]:
        env, symbols = self._bind_inputs(inputs)
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
                for meta, value in zip(node.outputs, outs):
                    env[meta.name] = value
                if on_node is not None:
                    on_node(node, outs)
                for name in dead:
                    del env[name]
        for buffer, value in self.ir.mutations.items():
            self.state[buffer] = env[value]
        return [env[t.name] for t in self.ir.graph_outputs]

    def _bind_inputs(self, inputs: Inputs) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
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
            _check_input(self.ir, meta, value, symbols)
            env[meta.name] = value.to(self.device)
        for name, spec in self.ir.symbols.items():
            if "expr" in spec:  # a symbol defined by other symbols (aten.item of a shape)
                symbols[name] = decode_value(spec["expr"], symbols)
        return env, symbols


def _check_input(ir: NPU_IR, meta: TensorMeta, value: object, symbols: dict[str, int]) -> None:
    where = f"input {meta.name!r} of IR {ir.model_name!r}"
    if not isinstance(value, torch.Tensor):
        raise InputMismatchError(f"{where} must be a torch.Tensor, got {type(value).__name__}")
    if dtype_name(value.dtype) != meta.dtype:
        raise InputMismatchError(f"{where} must have dtype {meta.dtype}, got {dtype_name(value.dtype)}")
    if value.dim() != len(meta.shape):
        raise InputMismatchError(
            f"{where} must have shape {meta.shape} (rank {len(meta.shape)}), got {list(value.shape)}")
    for axis, (want, got) in enumerate(zip(meta.shape, value.shape)):
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

