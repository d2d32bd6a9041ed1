"""Values of tensors a model makes inside ``forward`` while it is traced on the meta device.

``torch.tensor([0.5, 2.0], device=x.device)`` in ``forward`` becomes a lifted constant of the
exported program; on the meta device its data would be lost. The recorder watches tensor
construction from Python data during export and keeps a CPU copy of each meta tensor made that
way, so the constant's value can still be written into the IR.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.export import ExportedProgram
from torch.overrides import TorchFunctionMode

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
