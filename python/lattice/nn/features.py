"""Feature-only modules: rows and coordinate identity unchanged."""
from __future__ import annotations

from typing import Any

import torch

from ..tensor import SparseTensor


def _check(op: str, x: Any) -> SparseTensor:
    if not isinstance(x, SparseTensor):
        raise TypeError(f"[{op}] input: expected a lattice.SparseTensor, got {type(x).__name__}")
    return x


class BatchNorm(torch.nn.BatchNorm1d):
    """Batch normalisation over rows of ``feats`` (N, C): batch statistics in training, running
    statistics in eval, exactly ``torch.nn.BatchNorm1d`` on the feature matrix."""

    def forward(self, x: SparseTensor) -> SparseTensor:  # type: ignore[override]
        _check("BatchNorm", x)
        return x.replace_feats(super().forward(x.feats))


class ReLU(torch.nn.Module):
    """max(feats, 0)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace  # accepted for API parity; the caller's features are never modified

    def forward(self, x: SparseTensor) -> SparseTensor:
        _check("ReLU", x)
        return x.replace_feats(torch.relu(x.feats))


class Linear(torch.nn.Linear):
    """``feats @ W^T + b`` per row (``torch.nn.Linear`` on the feature matrix)."""

    def forward(self, x: SparseTensor) -> SparseTensor:  # type: ignore[override]
        _check("Linear", x)
        return x.replace_feats(super().forward(x.feats))
