"""lattice.SparseTensor: coordinates, features and the identity that caches relations."""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
import torch

from ._core import as_tensor, as_triple, core, from_core, to_core
from ._device import DeviceLike, as_device, check_device, same_device

Stride = Union[int, Sequence[int]]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _never_compiling() -> bool:
    return False


# True while dynamo traces (torch >= 2.0); torch 1.13 has no torch.compile
_compiler = getattr(torch, "compiler", None)
_is_compiling = getattr(_compiler, "is_compiling", None) or getattr(getattr(torch, "_dynamo", None), "is_compiling",
                                                                    None) or _never_compiling


def _int_list(value: Any, what: str, op: str) -> list[int]:
    """A sequence (list, tuple, 1-D array or tensor) of ints -> list[int]; anything else raises."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.ndim != 1 or value.dtype in (torch.bool, np.bool_) or (
            value.dtype.is_floating_point if isinstance(value, torch.Tensor) else value.dtype.kind not in "iu"
        ):
            raise TypeError(f"[{op}] {what}: expected a 1-D sequence of ints, got {value.dtype} with {value.ndim} dims")
        return [int(v) for v in value.tolist()]
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"[{op}] {what}: expected a sequence of ints, got {type(value).__name__}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"[{op}] {what}: expected a sequence of ints, got an element of type {type(v).__name__}")
        out.append(int(v))
    return out


def _order_hint(feats: Any) -> str:
    """The argument-order hint for a float ``coords``: TorchSparse and MinkowskiEngine take
    ``SparseTensor(feats, coords)``, lattice ``SparseTensor(coords, feats)``."""
    f = feats if isinstance(feats, (torch.Tensor, np.ndarray)) else None
    swapped = f is not None and f.ndim == 2 and f.shape[1] == 4 and (
        not f.dtype.is_floating_point if isinstance(f, torch.Tensor) else f.dtype.kind in "iu")
    return ("; the argument order is SparseTensor(coords, feats)"
            + (" and feats is an (N, 4) integer array: the arguments look swapped (TorchSparse and MinkowskiEngine "
               "write SparseTensor(feats, coords))" if swapped else
               " (TorchSparse and MinkowskiEngine write SparseTensor(feats, coords))"))


class SparseTensor:
    """A sparse voxel tensor: ``coords`` (N, 4) int32 rows ``(batch, x, y, z)`` and ``feats`` (N, C).

    Coordinates are logical lattice indices at ``stride`` (``physical = logical * stride``);
    negative x, y, z are valid. Rows must be unique and batch ids >= 0 (docs/input_rules.md):
    ``validate=True`` checks both now; otherwise duplicates raise ``ValueError`` at the first op
    that builds a coordinate index or would be silently wrong with them (``dense``, global pooling,
    ``sparse_collate``), and a negative batch id at the first op that reads batch ids (global
    pooling, ``dense``), with the same message. Ops that treat the batch as one more key column
    (convolution, local pooling, algebra) accept any int32 batch id without validation.

    The tensor's coordinate identity (``key``) is what relations are cached under: tensors made by
    feature-only ops (``replace_feats``, nn.BatchNorm, nn.ReLU, ...) share it, ops that change rows
    get a new one. Equal coordinate values in different arrays are different identities.

    Args:
        coords: (N, 4) integer tensor or numpy array (int32, or int64 within the int32 range).
            The tensor keeps its own copy: writing into ``coords`` afterwards does not change it.
        feats: (N, C) float tensor or numpy array (float16, bfloat16, float32; float64 for tests).
        stride: tensor stride, an int or 3 ints (default 1).
        batch_counts: optional rows per batch (sums to N; empty batches allowed).
        validate: check unique rows and batch ids >= 0 now.
    """

    __slots__ = ("_coords", "_feats", "_cs")

    def __init__(
        self,
        coords: Any,
        feats: Any,
        stride: Stride = 1,
        batch_counts: Optional[Sequence[int]] = None,
        *,
        validate: bool = False,
        _coordinate_set: Any = None,
    ) -> None:
        op = "SparseTensor"
        if _coordinate_set is not None:
            self._cs = _coordinate_set
            self._coords = coords
        else:
            c = given = as_tensor(coords, "coords", op)
            if c.dtype.is_floating_point or c.dtype.is_complex or c.dtype == torch.bool:
                raise TypeError(f"[{op}] coords: expected an integer tensor (int32), got {c.dtype}"
                                + _order_hint(feats))
            if c.dim() != 2 or c.shape[1] != 4:
                raise ValueError(f"[{op}] coords: expected shape (N, 4) (batch, x, y, z), got {tuple(c.shape)}")
            if c.dtype != torch.int32:
                if c.numel() and (int(c.min()) < _INT32_MIN or int(c.max()) > _INT32_MAX):
                    raise ValueError(
                        f"[{op}] coords: expected values within int32 [-2147483648, 2147483647], "
                        f"got range [{int(c.min())}, {int(c.max())}]"
                    )
                c = c.to(torch.int32)
            c = c.contiguous()
            if c.numel() and c.data_ptr() == given.data_ptr():
                # Still the caller's memory (an int32 tensor or numpy array): keep a copy. The
                # coordinate index and relations are built once and cached on this set, so a
                # later write into the caller's array would leave them describing other rows
                # (a silent wrong answer); one memcpy of N x 16 bytes prevents it.
                c = c.clone()
            s = as_triple(stride, "stride", op)
            counts = None if batch_counts is None else _int_list(batch_counts, "batch_counts", op)
            # features live on the device of the coordinates; checked before the core sees either
            check_device(op, "feats", as_tensor(feats, "feats", op), c.device)
            self._cs = _coordinate_set_of(c, s, counts, validate)
            self._coords = c
        f = as_tensor(feats, "feats", op)
        if not f.dtype.is_floating_point:
            raise TypeError(f"[{op}] feats: expected a float tensor (float16, bfloat16, float32, float64), got {f.dtype}")
        n = self._coords.shape[0]  # the coordinate set's size (read from the tensor: traceable by torch.compile)
        if f.dim() != 2 or f.shape[0] != n:
            raise ValueError(f"[{op}] feats: expected shape (N={n}, C), got {tuple(f.shape)}")
        check_device(op, "feats", f, self._coords.device)
        self._feats = f

    # -- construction helpers -------------------------------------------------------------------
    @classmethod
    def _from_core(cls, coordinate_set: Any, feats: torch.Tensor) -> "SparseTensor":
        coords = from_core(coordinate_set.coords())
        return cls(coords, feats, _coordinate_set=coordinate_set)

    @classmethod
    def _of(cls, coordinate_set: Any, coords: torch.Tensor, feats: torch.Tensor) -> "SparseTensor":
        """A tensor from parts already known to fit (no checks): ``feats`` a float (N, C) tensor on
        the device of ``coords``, N the rows of ``coordinate_set``. For the ops' own outputs."""
        t = cls.__new__(cls)
        t._cs = coordinate_set
        t._coords = coords
        t._feats = feats
        return t

    def replace_feats(self, feats: torch.Tensor) -> "SparseTensor":
        """Same coordinates and identity, new features (N, C')."""
        # The coordinates are unchanged, so only the new features are checked: a float (N, C)
        # torch tensor on this tensor's device takes the short way; anything else goes through the
        # constructor's checks, which raise the errors. torch.compile traces this method: while it
        # does, the constructor (traced as before) builds the tensor.
        if isinstance(feats, torch.Tensor) and feats.dtype.is_floating_point and feats.dim() == 2 and \
                feats.shape[0] == self._coords.shape[0] and feats.device == self._coords.device and \
                not _is_compiling():
            t = SparseTensor.__new__(SparseTensor)
            t._cs = self._cs
            t._coords = self._coords
            t._feats = feats
            return t
        return SparseTensor(self._coords, feats, _coordinate_set=self._cs)

    # -- properties -------------------------------------------------------------------------------
    @property
    def coords(self) -> torch.Tensor:
        """(N, 4) int32 ``(batch, x, y, z)`` at this tensor's stride."""
        return self._coords

    @property
    def feats(self) -> torch.Tensor:
        """(N, C) features; row i belongs to ``coords[i]``."""
        return self._feats

    @property
    def F(self) -> torch.Tensor:  # noqa: N802 - MinkowskiEngine / TorchSparse spelling
        return self._feats

    @property
    def C(self) -> torch.Tensor:  # noqa: N802
        return self._coords

    @property
    def stride(self) -> tuple[int, int, int]:
        return tuple(self._cs.stride)

    @property
    def batch_counts(self) -> Optional[list[int]]:
        return self._cs.batch_counts

    @property
    def key(self) -> int:
        """Coordinate identity: equal keys mean the same coordinate set (and shared relations)."""
        return self._cs.key

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self._feats.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self._feats.dtype

    @property
    def device(self) -> torch.device:
        return self._feats.device

    def __len__(self) -> int:
        return int(self._coords.shape[0])

    def validate(self) -> "SparseTensor":
        """Raises ValueError when a batch id is negative or coordinate rows repeat (the checks of
        ``validate=True``, same messages); returns self."""
        batch = self._coords[:, 0]
        if batch.numel() and int(batch.min()) < 0:
            r = int((batch < 0).nonzero()[0, 0])
            raise ValueError(f"[SparseTensor] coords: expected batch ids >= 0, got batch id {int(batch[r])} at row {r}")
        self._cs.validate("SparseTensor")
        return self

    def to(self, *args: Any, dtype: Optional[torch.dtype] = None, device: Optional[DeviceLike] = None,
           non_blocking: bool = False) -> "SparseTensor":
        """``x.to(dtype)``, ``x.to(device)``, ``x.to(device, dtype)`` (positional or keyword).

        A dtype change casts the features and keeps the coordinates and identity. A device change
        copies coordinates and features to that device: the result is a new coordinate identity
        (relations are cached per device and are rebuilt there on first use); the features keep
        their autograd history (``torch.Tensor.to``). Same device and dtype returns an equal tensor
        with the same identity.
        """
        op = "SparseTensor.to"
        for a in args:
            if isinstance(a, torch.dtype):
                if dtype is not None:
                    raise TypeError(f"[{op}] dtype: expected one dtype, got {dtype} and {a}")
                dtype = a
            elif isinstance(a, (str, int, torch.device)) and not isinstance(a, bool):
                if device is not None:
                    raise TypeError(f"[{op}] device: expected one device, got {device!r} and {a!r}")
                device = a
            else:
                raise TypeError(f"[{op}] args: expected a torch.dtype and/or a device, got {type(a).__name__}")
        feats = self._feats if dtype is None else self._feats.to(dtype)
        if device is None or same_device(as_device(device, op), self._coords.device):
            return self.replace_feats(feats)
        d = as_device(device, op)
        return SparseTensor(self._coords.to(d, non_blocking=non_blocking), feats.to(d, non_blocking=non_blocking),
                            self.stride, self.batch_counts)

    def cuda(self, device: Optional[DeviceLike] = None, non_blocking: bool = False) -> "SparseTensor":
        """This tensor on a CUDA device (default: the current one); see :meth:`to`."""
        return self.to(device=torch.device("cuda") if device is None else as_device(device, "SparseTensor.cuda"),
                       non_blocking=non_blocking)

    def cpu(self) -> "SparseTensor":
        """This tensor on the CPU; see :meth:`to`."""
        return self.to(device="cpu")

    def detach(self) -> "SparseTensor":
        return self.replace_feats(self._feats.detach())

    # -- algebra operators (lattice.ops.sparse_add / sparse_sub / sparse_mul) ---------------------
    # Between SparseTensors: aligned by coordinates with each op's default join (+ and -: outer,
    # *: inner), strides must match. With a number or a tensor broadcasting to feats (N, C): acts on
    # the features and keeps the identity.
    def __add__(self, other: Any) -> "SparseTensor":
        from .ops.algebra import operator

        return operator("add", self, other)

    def __radd__(self, other: Any) -> "SparseTensor":
        from .ops.algebra import operator

        return operator("add", self, other)

    def __sub__(self, other: Any) -> "SparseTensor":
        from .ops.algebra import operator

        return operator("sub", self, other)

    def __rsub__(self, other: Any) -> "SparseTensor":
        from .ops.algebra import operator

        return operator("rsub", self, other)

    def __mul__(self, other: Any) -> "SparseTensor":
        from .ops.algebra import operator

        return operator("mul", self, other)

    def __rmul__(self, other: Any) -> "SparseTensor":
        from .ops.algebra import operator

        return operator("mul", self, other)

    def __neg__(self) -> "SparseTensor":
        return self.replace_feats(-self._feats)

    # -- dense grids (lattice.ops.dense / from_dense) ---------------------------------------------
    def dense(self, shape: Optional[Stride] = None, origin: Stride = 0, *,
              max_bytes: Optional[int] = None) -> torch.Tensor:
        """The dense (B, C, X, Y, Z) grid of this tensor; see :func:`lattice.ops.dense` (no fixed
        size limit: a grid larger than ``max_bytes``, default the memory available on the device,
        raises ValueError saying how much it would take)."""
        from .ops.coords import dense

        return dense(self, shape, origin, max_bytes=max_bytes)

    @classmethod
    def from_dense(cls, grid: torch.Tensor, *, origin: Stride = 0, stride: Stride = 1) -> "SparseTensor":
        """The sites of a dense (B, C, X, Y, Z) grid with any non-zero channel; see
        :func:`lattice.ops.from_dense`."""
        from .ops.coords import from_dense

        return from_dense(grid, origin=origin, stride=stride)

    def __reduce__(self) -> tuple:
        """Pickling (DataLoader workers, torch.save): coordinates, features, stride and
        batch_counts. The unpickled tensor is a new coordinate identity (its relations are rebuilt
        on first use)."""
        return (_rebuild_sparse_tensor, (self._coords, self._feats, self.stride, self.batch_counts))

    def __repr__(self) -> str:
        return (
            f"SparseTensor(N={len(self)}, C={self._feats.shape[1]}, stride={self.stride}, "
            f"dtype={self._feats.dtype}, device={self._feats.device}, key={self.key})"
        )


def _coordinate_set_of(coords: torch.Tensor, stride: tuple[int, int, int], counts: Optional[list[int]],
                       validate: bool) -> Any:
    """The core coordinate set of (N, 4) int32 contiguous ``coords`` (the one core call of
    SparseTensor construction; lattice._compile keeps it out of torch.compile graphs)."""
    return core.CoordinateSet.create(to_core(coords), stride, counts, validate)


def _rebuild_sparse_tensor(coords: torch.Tensor, feats: torch.Tensor, stride: Any, batch_counts: Any) -> SparseTensor:
    return SparseTensor(coords, feats, stride, batch_counts)
