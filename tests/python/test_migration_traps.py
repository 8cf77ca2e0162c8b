"""Migration traps (issue 13): what a TorchSparse / MinkowskiEngine user writes first gives an
error that names the cause and the lattice spelling."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lattice
from lattice import nn as lnn


def test_conv3d_transposed_flag_points_to_conv_transpose3d():
    with pytest.raises(TypeError, match=r"^\[Conv3d\] transposed: expected False .*lattice\.nn\.ConvTranspose3d"
                                        r"\(in_channels, out_channels, kernel_size, stride\).*coordinates=skip"):
        lnn.Conv3d(8, 4, 2, stride=2, transposed=True)
    with pytest.raises(TypeError, match=r"^\[Conv3d\] generative: .*lattice\.nn\.GenerativeConvTranspose3d"):
        lnn.Conv3d(8, 4, 2, stride=2, transposed=True, generative=True)
    assert isinstance(lnn.Conv3d(8, 4, 2, stride=2, transposed=False), lnn.Conv3d)


def test_swapped_sparse_tensor_arguments_name_the_order():
    coords = torch.tensor([[0, 1, 2, 3], [0, 4, 5, 6]], dtype=torch.int32)
    feats = torch.randn(2, 5)
    with pytest.raises(TypeError, match=r"^\[SparseTensor\] coords: expected an integer tensor \(int32\), got "
                                        r"torch.float32; the argument order is SparseTensor\(coords, feats\) and feats "
                                        r"is an \(N, 4\) integer array: the arguments look swapped"):
        lattice.SparseTensor(feats, coords)
    with pytest.raises(TypeError, match=r"look swapped"):  # numpy inputs too
        lattice.SparseTensor(feats.numpy(), coords.numpy())
    # a float coords without an integer (N, 4) second argument still names the order
    with pytest.raises(TypeError, match=r"the argument order is SparseTensor\(coords, feats\) \(TorchSparse"):
        lattice.SparseTensor(torch.zeros(2, 4), torch.zeros(2, 4))


def _unet_level():
    g = torch.Generator().manual_seed(0)
    c = torch.unique(torch.randint(0, 12, (300, 3), generator=g), dim=0)
    skip = lattice.SparseTensor(torch.cat([torch.zeros(len(c), 1, dtype=torch.long), c], 1).int(),
                                torch.randn(len(c), 4, generator=g))
    down = lnn.Conv3d(4, 8, 2, stride=2)(skip)
    return skip, down, lnn.ConvTranspose3d(8, 4, 2, stride=2)


def test_cat_after_transposed_conv_without_coordinates_names_the_cause():
    """The U-Net trap: the transposed conv generates its own rows (here more than the skip has),
    and the concatenation's error says so and what to pass."""
    skip, down, up = _unet_level()
    y = up(down)
    assert len(y) != len(skip)
    with pytest.raises(ValueError, match=r"^\[cat\] tensors\[1\]: expected the coordinate identity of tensors\[0\] "
                                        rf"\(key {y.key}\), got key {skip.key} \({len(y)} vs {len(skip)} rows\); "
                                        r"tensors\[0\] comes from conv_transpose3d \(nn.ConvTranspose3d\) called "
                                        rf"without coordinates=, which generated its own {len(y)} rows from "
                                        rf"{len(down)} inputs .*pass the skip tensor as coordinates="):
        lattice.ops.cat([y, skip])
    with pytest.raises(ValueError, match=r"tensors\[1\] comes from conv_transpose3d"):  # either side
        lattice.ops.cat([skip, y])
    fixed = lattice.ops.cat([up(down, skip), skip])  # the documented fix
    assert fixed.key == skip.key and fixed.feats.shape == (len(skip), 8)


def test_cat_of_unrelated_supports_has_no_transposed_hint():
    skip, down, _ = _unet_level()
    other = lattice.SparseTensor(skip.coords.clone(), skip.feats)
    with pytest.raises(ValueError, match=r"got key \d+ \(\d+ vs \d+ rows\)$"):
        lattice.ops.cat([skip, other])
