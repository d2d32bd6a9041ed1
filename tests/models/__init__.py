"""The test models: the whole built-in zoo (``npu_tools.zoo``), plus models extraction must reject.

The zoo lives in the package so that the CLI and the README can build its models by name; this
module re-exports it and adds the bad models, which only the tests need.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from npu_tools.zoo import ZooEntry, build_pair, categories, get_model, list_models

__all__ = [
    "BAD_MODELS", "DataDependentBranch", "NonTensorOutput", "NumpyRoundTrip", "ZooEntry", "build_pair",
    "categories", "get_model", "list_models",
]


class DataDependentBranch(nn.Module):
    """Branches on a tensor's value, which a shape-only trace cannot follow."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.fc(x)
        return -x


class NumpyRoundTrip(nn.Module):
    """Leaves torch for numpy in forward(): non-strict export still needs real data for that."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.tanh(x.numpy()))


class NonTensorOutput(nn.Module):
    """Returns a Python number next to a tensor; the IR's outputs are tensors only."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x * 2, x.shape[0]


#: model class -> a phrase the ExtractionError must contain (it says what is wrong, not only that it failed).
BAD_MODELS: dict[type[nn.Module], str] = {
    DataDependentBranch: "data-dependent control flow",
    NumpyRoundTrip: ".numpy()",
    NonTensorOutput: "is not a tensor",
}
