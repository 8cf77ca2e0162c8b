"""lattice.convert: kernel-offset permutations and weight layouts against a dense conv3d ground
truth, and the state_dict converters for the lattice.models networks.

Ground truth: on a fully occupied box a submanifold conv equals ``torch.nn.functional.conv3d``
with padding (K-1)/2, a k2 s2 conv equals a stride-2 conv3d, a k2 s2 transposed conv equals
``conv_transpose3d``, and spconv's strided conv (window ``s*o - p + k``) equals conv3d with padding
p. The dense weights are placed from each library's *documented* kernel enumeration, written out
below as plain loops (independent of lattice.convert's index arithmetic):

* TorchSparse 2.x (``torchsparse/nn/utils/kernel.py``): odd kernel volume
  ``[(x, y, z) for z for y for x]`` (x fastest), even volume ``[(x, y, z) for x for y for z]``;
  kernel (K, C_in, C_out);
* MinkowskiEngine 0.5 (``kernel_region.hpp``, axis 0 fastest): x fastest; kernel (K, C_in, C_out);
* spconv 2.x: weight (C_out, K0, K1, K2, C_in), kernel axes in index-column order (OpenPCDet:
  z, y, x); 2.x native (K0, K1, K2, C_out, C_in); 1.x (K0, K1, K2, C_in, C_out).

Real-library fixtures (outputs of TorchSparse / MinkowskiEngine networks) are not part of this
file: neither library is installed here.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lattice
from lattice import convert, models
from lattice import nn as lnn


def ts_rows(k):
    if (k[0] * k[1] * k[2]) % 2:
        return [(x, y, z) for z in range(k[2]) for y in range(k[1]) for x in range(k[0])]
    return [(x, y, z) for x in range(k[0]) for y in range(k[1]) for z in range(k[2])]


def me_rows(k):
    return [(x, y, z) for z in range(k[2]) for y in range(k[1]) for x in range(k[0])]


def place(kernel, k, rows):
    """(K, C_in, C_out) with row r at kernel index rows[r] -> torch conv weight (C_out, C_in, Kx, Ky, Kz)."""
    kernel = kernel.reshape(len(rows), kernel.shape[-2], kernel.shape[-1])
    w = torch.zeros(kernel.shape[2], kernel.shape[1], *k, dtype=kernel.dtype)
    for r, (x, y, z) in enumerate(rows):
        w[:, :, x, y, z] = kernel[r].t()
    return w


def box(shape, c, seed=0, stride=1):
    """Every site of a box, one batch; features float64."""
    g = torch.Generator().manual_seed(seed)
    xyz = torch.cartesian_prod(*[torch.arange(n) for n in shape])
    coords = torch.cat([torch.zeros(len(xyz), 1, dtype=torch.long), xyz], 1).int()
    x = lattice.SparseTensor(coords, torch.randn(len(xyz), c, generator=g, dtype=torch.float64), stride=stride)
    return x, lattice.ops.dense(x, shape)


def at(dense, coords):
    o = coords[:, 1:].long()
    return dense[0][:, o[:, 0], o[:, 1], o[:, 2]].t()


LIBS = {"torchsparse": (ts_rows, convert.weight_from_torchsparse), "minkowski": (me_rows, convert.weight_from_minkowski)}


@pytest.mark.parametrize("lib", list(LIBS))
@pytest.mark.parametrize("k", [(3, 3, 3), (3, 1, 5), (1, 3, 1), (5, 3, 1)])
def test_submanifold_kernel_order_against_dense_conv3d(lib, k):
    rows, conv = LIBS[lib]
    x, d = box((6, 5, 4), 3)
    kernel = torch.randn(k[0] * k[1] * k[2], 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ref = F.conv3d(d, place(kernel, k, rows(k)), padding=tuple((v - 1) // 2 for v in k))
    y = lattice.ops.subm_conv3d(x, conv(kernel, k))
    torch.testing.assert_close(y.feats, at(ref, y.coords), rtol=1e-12, atol=1e-12)
    # a naive copy (no permutation) is wrong whenever the orders differ: the test can fail
    if len(set(k) - {1}) and rows(k) != convert.kernel_offsets(k, "lattice"):
        naive = kernel.permute(2, 0, 1).reshape(2, *k, 3)
        assert not torch.allclose(lattice.ops.subm_conv3d(x, naive).feats, y.feats)


@pytest.mark.parametrize("lib", list(LIBS))
@pytest.mark.parametrize("k", [(2, 2, 2), (2, 1, 2)])
def test_strided_and_transposed_kernel_order_against_dense(lib, k):
    rows, conv = LIBS[lib]
    kernel = torch.randn(k[0] * k[1] * k[2], 3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    s = tuple(2 if v == 2 else 1 for v in k)
    x, d = box((6, 4, 4), 3)
    y = lattice.ops.conv3d(x, conv(kernel, k), stride=s)
    ref = F.conv3d(d, place(kernel, k, rows(k)), stride=s)
    torch.testing.assert_close(y.feats, at(ref, y.coords), rtol=1e-12, atol=1e-12)
    xc, dc = box((3, 2, 2), 3, seed=4, stride=s)
    yt = lattice.ops.conv_transpose3d(xc, conv(kernel, k), stride=s)
    wt = place(kernel, k, rows(k)).transpose(0, 1)  # conv_transpose3d weight: (C_in, C_out, Kx, Ky, Kz)
    ref_t = F.conv_transpose3d(dc, wt, stride=s)
    torch.testing.assert_close(yt.feats, at(ref_t, yt.coords), rtol=1e-12, atol=1e-12)


def spconv_weight(w_dense_zyx_kernel, layout):
    """From (C_out, K0, K1, K2, C_in) to the given spconv layout."""
    if layout == "v2":
        return w_dense_zyx_kernel
    if layout == "v2_native":
        return w_dense_zyx_kernel.permute(1, 2, 3, 0, 4)
    return w_dense_zyx_kernel.permute(1, 2, 3, 4, 0)


@pytest.mark.parametrize("layout", convert.SPCONV_LAYOUTS)
@pytest.mark.parametrize("k_zyx", [(3, 3, 3), (5, 1, 3), (3, 1, 1)])
def test_spconv_layouts_against_dense_conv3d(layout, k_zyx):
    """spconv's weight with kernel axes (z, y, x): subm (padding K//2) and a k s2 conv with padding
    1 through WindowConv3d (spconv's window), both against conv3d on the dense box."""
    g = torch.Generator().manual_seed(3)
    w_src = torch.randn(2, *k_zyx, 3, dtype=torch.float64, generator=g)  # (C_out, Kz, Ky, Kx, C_in)
    k = tuple(reversed(k_zyx))
    w_torch = w_src.permute(0, 4, 3, 2, 1)  # (C_out, C_in, Kx, Ky, Kz): w_torch[o, i, x, y, z] = w_src[o, z, y, x, i]
    lw = convert.weight_from_spconv(spconv_weight(w_src, layout), layout, axes="zyx")
    x, d = box((6, 5, 4), 3)
    y = lattice.ops.subm_conv3d(x, lw)
    ref = F.conv3d(d, w_torch, padding=tuple((v - 1) // 2 for v in k))
    torch.testing.assert_close(y.feats, at(ref, y.coords), rtol=1e-12, atol=1e-12)
    down = models.WindowConv3d(3, 2, k, stride=2, padding=1).double()
    with torch.no_grad():
        down.weight.copy_(lw)
    yd = down(x, (6, 5, 4))
    ref_d = F.conv3d(d, w_torch, stride=2, padding=1)
    assert tuple(ref_d.shape[2:]) == down.output_shape((6, 5, 4))
    torch.testing.assert_close(yd.feats, at(ref_d, yd.coords), rtol=1e-12, atol=1e-12)


def test_kernel_major_round_trip_and_errors():
    w = torch.randn(4, 3, 1, 5, 2)
    for order in ("lattice", "torchsparse", "minkowski"):
        km = convert.weight_to_kernel_major(w, order)
        assert km.shape == (15, 2, 4)
        assert torch.equal(convert.weight_from_kernel_major(km, (3, 1, 5), order), w)
    with pytest.raises(ValueError, match=r"\[weight_from_kernel_major\] kernel: expected shape \(K=27, C_in, C_out\)"):
        convert.weight_from_torchsparse(torch.zeros(8, 2, 2), 3)
    with pytest.raises(ValueError, match=r"\[weight_from_spconv\] layout: expected one of"):
        convert.weight_from_spconv(torch.zeros(2, 3, 3, 3, 2), "v3")


# ---- state dicts: source key layouts written from each library's network definition ------------


def _bn(sd, prefix, c, g, flat=True):
    p = prefix if flat else prefix + ".bn"
    sd[p + ".weight"] = torch.rand(c, generator=g) + 0.5
    sd[p + ".bias"] = torch.randn(c, generator=g)
    sd[p + ".running_mean"] = torch.randn(c, generator=g)
    sd[p + ".running_var"] = torch.rand(c, generator=g) + 0.5
    sd[p + ".num_batches_tracked"] = torch.tensor(7)


def _kernel(sd, key, k, ci, co, g, rows):
    vol = k[0] * k[1] * k[2]
    sd[key] = torch.randn(vol, ci, co, generator=g) if vol > 1 else torch.randn(ci, co, generator=g)
    return (key, k, rows)


def spvnas_minkunet_state_dict(cr=0.25, in_ch=4, classes=5, seed=0):
    """The key layout of SPVNAS's core/models/semantic_kitti/minkunet.py (stem Sequential of
    conv/bn/relu, stage{i} = [BasicConvolutionBlock.net, ResidualBlock.net/downsample x 2],
    up{i} = [BasicDeconvolutionBlock.net, Sequential(ResidualBlock x 2)], classifier.0, and the
    unused point_transforms Linear + BatchNorm1d branch after it)."""
    g = torch.Generator().manual_seed(seed)
    cs = [int(cr * c) for c in (32, 32, 64, 128, 256, 256, 128, 96, 96)]
    sd, convs = {}, []
    convs.append(_kernel(sd, "stem.0.kernel", (3, 3, 3), in_ch, cs[0], g, ts_rows)); _bn(sd, "stem.1", cs[0], g)
    convs.append(_kernel(sd, "stem.3.kernel", (3, 3, 3), cs[0], cs[0], g, ts_rows)); _bn(sd, "stem.4", cs[0], g)

    def res(prefix, ci, co):
        convs.append(_kernel(sd, f"{prefix}.net.0.kernel", (3, 3, 3), ci, co, g, ts_rows)); _bn(sd, f"{prefix}.net.1", co, g)
        convs.append(_kernel(sd, f"{prefix}.net.3.kernel", (3, 3, 3), co, co, g, ts_rows)); _bn(sd, f"{prefix}.net.4", co, g)
        if ci != co:
            convs.append(_kernel(sd, f"{prefix}.downsample.0.kernel", (1, 1, 1), ci, co, g, ts_rows))
            _bn(sd, f"{prefix}.downsample.1", co, g)

    for i in range(4):
        convs.append(_kernel(sd, f"stage{i + 1}.0.net.0.kernel", (2, 2, 2), cs[i], cs[i], g, ts_rows))
        _bn(sd, f"stage{i + 1}.0.net.1", cs[i], g)
        res(f"stage{i + 1}.1", cs[i], cs[i + 1])
        res(f"stage{i + 1}.2", cs[i + 1], cs[i + 1])
    for i in range(4):
        convs.append(_kernel(sd, f"up{i + 1}.0.net.0.kernel", (2, 2, 2), cs[4 + i], cs[5 + i], g, ts_rows))
        _bn(sd, f"up{i + 1}.0.net.1", cs[5 + i], g)
        res(f"up{i + 1}.1.0", cs[5 + i] + cs[3 - i], cs[5 + i])
        res(f"up{i + 1}.1.1", cs[5 + i], cs[5 + i])
    sd["classifier.0.weight"] = torch.randn(classes, cs[8], generator=g)
    sd["classifier.0.bias"] = torch.randn(classes, generator=g)
    for j, (ci, co) in enumerate(((cs[0], cs[4]), (cs[4], cs[6]), (cs[6], cs[8]))):  # registered, never run
        sd[f"point_transforms.{j}.0.weight"] = torch.randn(co, ci, generator=g)
        sd[f"point_transforms.{j}.0.bias"] = torch.randn(co, generator=g)
        _bn(sd, f"point_transforms.{j}.1", co, g)
    return sd, convs


def me_minkunet18_state_dict(cr=0.25, in_ch=4, classes=5, seed=0, planes=(32, 32, 64, 128, 256, 256, 128, 96, 96)):
    """The key layout of MinkowskiEngine's examples/minkunet.py MinkUNet18 (conv0p1s1 k5, bn0,
    conv{i}p..s2 / bn{i} / block{i}, convtr{j}p..s2 / bntr{j} / block{j+1}, final 1x1 with bias;
    BasicBlock conv1/norm1/conv2/norm2/downsample; MinkowskiBatchNorm keys under .bn)."""
    g = torch.Generator().manual_seed(seed)
    cs = [int(cr * c) for c in planes]
    sd, convs = {}, []
    convs.append(_kernel(sd, "conv0p1s1.kernel", (5, 5, 5), in_ch, cs[0], g, me_rows)); _bn(sd, "bn0", cs[0], g, False)

    def layer(prefix, ci, co, n):
        for b in range(n):
            cin = ci if b == 0 else co
            convs.append(_kernel(sd, f"{prefix}.{b}.conv1.kernel", (3, 3, 3), cin, co, g, me_rows))
            _bn(sd, f"{prefix}.{b}.norm1", co, g, False)
            convs.append(_kernel(sd, f"{prefix}.{b}.conv2.kernel", (3, 3, 3), co, co, g, me_rows))
            _bn(sd, f"{prefix}.{b}.norm2", co, g, False)
            if cin != co:
                convs.append(_kernel(sd, f"{prefix}.{b}.downsample.0.kernel", (1, 1, 1), cin, co, g, me_rows))
                _bn(sd, f"{prefix}.{b}.downsample.1", co, g, False)

    names = ["conv1p1s2", "conv2p2s2", "conv3p4s2", "conv4p8s2"]
    for i in range(4):
        convs.append(_kernel(sd, f"{names[i]}.kernel", (2, 2, 2), cs[i], cs[i], g, me_rows))
        _bn(sd, f"bn{i + 1}", cs[i], g, False)
        layer(f"block{i + 1}", cs[i], cs[i + 1], 2)
    tr = ["convtr4p16s2", "convtr5p8s2", "convtr6p4s2", "convtr7p2s2"]
    for i in range(4):
        convs.append(_kernel(sd, f"{tr[i]}.kernel", (2, 2, 2), cs[4 + i], cs[5 + i], g, me_rows))
        _bn(sd, f"bntr{4 + i}", cs[5 + i], g, False)
        layer(f"block{5 + i}", cs[5 + i] + cs[3 - i], cs[5 + i], 2)
    sd["final.kernel"] = torch.randn(cs[8], classes, generator=g)
    sd["final.bias"] = torch.randn(1, classes, generator=g)
    return sd, convs


def _check_converted(model, sd, convs, converted):
    model.load_state_dict(converted)  # strict: every key present, shapes right
    lattice_convs = [m for m in model.modules() if isinstance(m, (lnn.Conv3d, lnn.SubmConv3d, lnn.ConvTranspose3d))]
    assert len(lattice_convs) == len(convs)
    for m, (key, k, rows) in zip(lattice_convs, convs):
        expect = place(sd[key], k, rows(k)).permute(0, 2, 3, 4, 1)  # (C_out, Kx, Ky, Kz, C_in)
        assert torch.equal(m.weight.detach(), expect), key
    bns = [m for m in model.modules() if isinstance(m, lnn.BatchNorm)]
    assert all(int(b.bn.num_batches_tracked) == 7 for b in bns)


def test_from_torchsparse_spvnas_minkunet():
    sd, convs = spvnas_minkunet_state_dict()
    model = models.MinkUNet42(num_classes=5, cr=0.25)
    out = convert.from_torchsparse(sd, model)
    _check_converted(model, sd, convs, out)
    assert torch.equal(model.classifier.weight.detach(), sd["classifier.0.weight"])
    assert torch.equal(model.stem[0].bn.bn.running_mean, sd["stem.1.running_mean"])


def test_from_minkowski_minkunet18():
    sd, convs = me_minkunet18_state_dict()
    model = models.MinkUNet18(num_classes=5, cr=0.25)
    out = convert.from_minkowski(sd, model)
    _check_converted(model, sd, convs, out)
    assert torch.equal(model.classifier.weight.detach(), sd["final.kernel"].t())
    assert torch.equal(model.classifier.bias.detach(), sd["final.bias"].flatten())
    assert torch.equal(model.stem[0].bn.bn.weight.detach(), sd["bn0.bn.weight"])


def test_from_minkowski_minkunet18a_channels():
    """ME's MinkUNet18A (decoder planes 128, 128, 96, 96) through MinkUNet18(channels=...)."""
    planes = (32, 32, 64, 128, 256, 128, 128, 96, 96)
    sd, convs = me_minkunet18_state_dict(planes=planes)
    model = models.MinkUNet18(num_classes=5, cr=0.25, channels=planes)
    _check_converted(model, sd, convs, convert.from_minkowski(sd, model))


def test_from_spconv_voxel_backbone8x():
    """OpenPCDet VoxelBackBone8x keys (conv_input.0/.1, convN.M.0/.1, conv_out.0/.1), spconv 2.x
    weights (C_out, Kz, Ky, Kx, C_in); conv_out's (3, 1, 1) becomes lattice's (1, 1, 3)."""
    g = torch.Generator().manual_seed(0)
    layers = [("conv_input", 4, 16, (3, 3, 3))] + [("conv1.0", 16, 16, (3, 3, 3))]
    for n, (ci, co) in ((2, (16, 32)), (3, (32, 64)), (4, (64, 64))):
        layers += [(f"conv{n}.0", ci, co, (3, 3, 3)), (f"conv{n}.1", co, co, (3, 3, 3)), (f"conv{n}.2", co, co, (3, 3, 3))]
    layers.append(("conv_out", 64, 128, (3, 1, 1)))
    sd = {}
    for name, ci, co, k in layers:
        sd[f"{name}.0.weight"] = torch.randn(co, *k, ci, generator=g)
        _bn(sd, f"{name}.1", co, g)
    model = models.VoxelBackBone8x(4)
    model.load_state_dict(convert.from_spconv(sd, model))
    assert torch.equal(model.conv_out.conv.weight.detach(), sd["conv_out.0.weight"].permute(0, 3, 2, 1, 4))
    assert model.conv_out.conv.weight.shape == (128, 1, 1, 3, 64)
    assert torch.equal(model.conv2[0].conv.weight.detach(), sd["conv2.0.0.weight"].permute(0, 3, 2, 1, 4))


def test_converter_errors_name_the_layers():
    sd, _ = spvnas_minkunet_state_dict()
    with pytest.raises(ValueError, match=r"\[from_torchsparse\] state_dict: expected \d+ layers .* for MinkUNet18, got"):
        convert.from_torchsparse(sd, models.MinkUNet18(num_classes=5, cr=0.25))  # one k5 stem conv, not two
    wrong = models.MinkUNet42(num_classes=5, cr=0.5)
    with pytest.raises(ValueError, match=r"\[from_torchsparse\] 'stem.0' -> 'stem.0.conv': expected weight \(16, 3, 3, 3, 4\)"):
        convert.from_torchsparse(sd, wrong)
    with pytest.raises(TypeError, match=r"\[from_minkowski\] model: expected the lattice target network"):
        convert.from_minkowski(sd, "MinkUNet18")


def test_from_torchsparse_sparse_resnet21d():
    """torchsparse.backbones.SparseResNet21D keys ("<stage>.0.0.kernel" SparseConvBlock, then
    "<stage>.<b>.main.{0,1,3,4}" SparseResBlocks); the (1, 3, 1) stage has an odd volume (x fastest)."""
    g = torch.Generator().manual_seed(0)
    sd, convs = {}, []
    c_in = 4
    for i, (n, c, k, _s) in enumerate(((3, 16, 3, 1), (3, 32, 3, 2), (3, 64, 3, 2), (3, 128, 3, 2), (1, 128, (1, 3, 1), 2))):
        k = (k, k, k) if isinstance(k, int) else k
        c = c // 4
        convs.append(_kernel(sd, f"{i}.0.0.kernel", k, c_in, c, g, ts_rows)); _bn(sd, f"{i}.0.1", c, g)
        for b in range(1, n):
            convs.append(_kernel(sd, f"{i}.{b}.main.0.kernel", k, c, c, g, ts_rows)); _bn(sd, f"{i}.{b}.main.1", c, g)
            convs.append(_kernel(sd, f"{i}.{b}.main.3.kernel", k, c, c, g, ts_rows)); _bn(sd, f"{i}.{b}.main.4", c, g)
        c_in = c
    model = models.SparseResNet21D(width_multiplier=0.25)
    _check_converted(model, sd, convs, convert.from_torchsparse(sd, model))
