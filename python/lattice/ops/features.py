"""Feature-only helpers needed by the foundation (the full set is its own issue)."""
from __future__ import annotations

from typing import Sequence

import torch

from ..tensor import SparseTensor


def cat(tensors: Sequence[SparseTensor]) -> SparseTensor:
    """Concatenates features of tensors that share one coordinate identity (same ``key``).

    This is the U-Net skip concatenation: a transposed conv onto the skip's coordinates returns
    the skip's identity, so its features line up row by row. Tensors with different identities
    raise ValueError (align them first).
    """
    if not tensors:
        raise ValueError("[cat] tensors: expected at least one SparseTensor, got an empty sequence")
    for i, t in enumerate(tensors):
        if not isinstance(t, SparseTensor):
            raise TypeError(f"[cat] tensors[{i}]: expected a lattice.SparseTensor, got {type(t).__name__}")
    first = tensors[0]
    for i, t in enumerate(tensors[1:], start=1):
        if t.key != first.key:
            raise ValueError(
                f"[cat] tensors[{i}]: expected the coordinate identity of tensors[0] (key {first.key}), "
                f"got key {t.key}"
            )
    return first.replace_feats(torch.cat([t.feats for t in tensors], dim=1))
