"""``torch.autocast`` on lattice's convolutions and packed-weight ops (python/lattice/_autocast.py).

What is proved here, on the CPU (bfloat16, the dtype CPU autocast uses); the CUDA float16 / bfloat16
cases, GradScaler and its inf/NaN skipping are at the end and run where a GPU exists:

* every conv op inside ``torch.autocast`` returns the autocast dtype, the same dtype torch's own
  ``conv3d`` returns in the same region, and bitwise the result of calling the op on features,
  weight and bias cast to that dtype by hand (so autocast is exactly "cast, then the 16-bit op");
* gradients reach float32 parameters as float32 and equal the hand-cast run's gradients cast up;
* float64 arguments and calls outside a region are left alone;
* a small U-Net (BatchNorm, ReLU, residual add, concatenation, strided and transposed convs)
  trains under autocast: every output is bfloat16, the loss goes down, and the first step's
  gradients agree with the float32 step's within a bfloat16 tolerance.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lattice
from lattice import SparseTensor, ops
from conftest import random_coords

CPU_AMP = torch.bfloat16


def _tensor(rng: np.random.Generator, n: int = 300, c: int = 8, dtype=torch.float32) -> SparseTensor:
    coords = torch.from_numpy(random_coords(rng, n, batches=2, extent=6))
    feats = torch.from_numpy(rng.standard_normal((coords.shape[0], c))).to(dtype)
    return SparseTensor(coords, feats)


def _weight(rng: np.random.Generator, c_in: int, c_out: int, k: int = 3, dtype=torch.float32) -> torch.Tensor:
    w = torch.from_numpy(rng.standard_normal((c_out, k, k, k, c_in)) / np.sqrt(c_in * k ** 3)).to(dtype)
    return w.requires_grad_(True)


def _coarse(x: SparseTensor) -> SparseTensor:
    """The same rows read as a stride-2 tensor (coordinates doubled), for the transposed ops."""
    c = x.coords.clone()
    c[:, 1:] *= 2
    return SparseTensor(c, x.feats, 2)


CONV_CALLS = {
    "subm_conv3d": lambda x, w, b: ops.subm_conv3d(x, w, b),
    "conv3d_s2": lambda x, w, b: ops.conv3d(x, w, b, stride=2),
    "conv3d_pad": lambda x, w, b: ops.conv3d(x, w, b, stride=2, padding=1),
    "conv_transpose3d": lambda x, w, b: ops.conv_transpose3d(_coarse(x), w, b, stride=2),
    "generative_conv_transpose3d": lambda x, w, b: ops.generative_conv_transpose3d(_coarse(x), w, b, stride=2),
}


@pytest.mark.parametrize("name", sorted(CONV_CALLS))
def test_conv_under_cpu_autocast_is_cast_then_op(name: str, rng: np.random.Generator) -> None:
    call = CONV_CALLS[name]
    x = _tensor(rng)
    x.feats.requires_grad_(True)
    w = _weight(rng, 8, 5)
    b = torch.from_numpy(rng.standard_normal(5)).float().requires_grad_(True)
    with torch.autocast("cpu", dtype=CPU_AMP):
        y = call(x, w, b)
    assert y.feats.dtype == CPU_AMP
    (y.feats.float() * torch.linspace(-1, 1, y.feats.numel()).reshape(y.feats.shape)).sum().backward()
    assert w.grad.dtype == torch.float32 and b.grad.dtype == torch.float32 and x.feats.grad.dtype == torch.float32

    # the same call on hand-cast leaves, outside any autocast region
    xf = x.feats.detach().to(CPU_AMP).requires_grad_(True)
    x16 = x.replace_feats(xf)
    w16 = w.detach().to(CPU_AMP).requires_grad_(True)
    b16 = b.detach().to(CPU_AMP).requires_grad_(True)
    y16 = call(x16, w16, b16)
    assert y16.feats.dtype == CPU_AMP
    assert torch.equal(y.feats, y16.feats), f"{name}: autocast result differs from the hand-cast bf16 op"
    (y16.feats.float() * torch.linspace(-1, 1, y16.feats.numel()).reshape(y16.feats.shape)).sum().backward()
    assert torch.equal(w.grad, w16.grad.float())
    assert torch.equal(b.grad, b16.grad.float())
    assert torch.equal(x.feats.grad, xf.grad.float())


def test_output_dtype_matches_torch_conv3d_under_autocast(rng: np.random.Generator) -> None:
    """lattice's conv returns what torch's dense conv3d returns in the same region."""
    x = _tensor(rng)
    w = _weight(rng, 8, 4)
    dense_in = torch.zeros(1, 8, 4, 4, 4)
    dense_w = torch.zeros(4, 8, 3, 3, 3)
    with torch.autocast("cpu", dtype=CPU_AMP):
        want = torch.nn.functional.conv3d(dense_in, dense_w).dtype
        got = ops.subm_conv3d(x, w).feats.dtype
    assert got == want == CPU_AMP


def test_float64_and_outside_region_unchanged(rng: np.random.Generator) -> None:
    x64 = _tensor(rng, dtype=torch.float64)
    w64 = _weight(rng, 8, 4, dtype=torch.float64)
    with torch.autocast("cpu", dtype=CPU_AMP):
        assert ops.subm_conv3d(x64, w64).feats.dtype == torch.float64  # torch leaves float64 alone too
    x = _tensor(rng)
    w = _weight(rng, 8, 4)
    assert ops.subm_conv3d(x, w).feats.dtype == torch.float32
    with torch.autocast("cpu", dtype=CPU_AMP, enabled=False):
        assert ops.subm_conv3d(x, w).feats.dtype == torch.float32
    # the caller's tensors are not modified by the cast
    assert x.feats.dtype == torch.float32 and w.dtype == torch.float32


def test_cuda_autocast_does_not_touch_cpu_tensors(rng: np.random.Generator) -> None:
    """An autocast region of another device type leaves CPU calls in float32 (torch's rule)."""
    x = _tensor(rng)
    w = _weight(rng, 8, 4)
    if not hasattr(torch, "autocast"):
        pytest.fail("torch.autocast missing")
    with torch.autocast("cuda", dtype=torch.float16, enabled=torch.cuda.is_available()):
        assert ops.subm_conv3d(x, w).feats.dtype == torch.float32


def test_quantized_linear_and_conv_under_autocast(rng: np.random.Generator) -> None:
    """Packed-weight ops take their activations in the autocast dtype (inference)."""
    x = _tensor(rng, c=32)
    w = torch.from_numpy(rng.standard_normal((16, 3, 3, 3, 32)) * 0.1).float()
    q = lattice.quantize_weight(w, bits=8, group_size=32)
    with torch.no_grad(), torch.autocast("cpu", dtype=CPU_AMP):
        y = ops.subm_conv3d(x, q)
    want = ops.subm_conv3d(x.replace_feats(x.feats.to(CPU_AMP)), q)
    assert y.feats.dtype == CPU_AMP and torch.equal(y.feats, want.feats)
    wl = torch.from_numpy(rng.standard_normal((16, 32)) * 0.1).float()
    ql = lattice.quantize_weight(wl, bits=4, group_size=32)
    with torch.no_grad(), torch.autocast("cpu", dtype=CPU_AMP):
        yl = ops.linear(x, ql)
    wantl = ops.linear(x.replace_feats(x.feats.to(CPU_AMP)), ql)
    assert yl.feats.dtype == CPU_AMP and torch.equal(yl.feats, wantl.feats)


class _TinyUNet(torch.nn.Module):
    """stem subm3 -> BN/ReLU -> k2 s2 down -> residual subm3 -> transposed up onto the stem -> cat -> head."""

    def __init__(self, c_in: int = 4, c: int = 16, classes: int = 3) -> None:
        super().__init__()
        nn = lattice.nn
        self.stem = nn.SubmConv3d(c_in, c, 3)
        self.bn0 = nn.BatchNorm(c)
        self.down = nn.Conv3d(c, 2 * c, 2, stride=2)
        self.bn1 = nn.BatchNorm(2 * c)
        self.res = nn.SubmConv3d(2 * c, 2 * c, 3)
        self.up = nn.ConvTranspose3d(2 * c, c, 2, stride=2)
        self.head = nn.SubmConv3d(2 * c, classes, 1)
        self.relu = nn.ReLU()

    def forward(self, x: SparseTensor) -> tuple[SparseTensor, list[torch.dtype]]:
        s = self.relu(self.bn0(self.stem(x)))
        d = self.relu(self.bn1(self.down(s)))
        d = d + self.res(d)  # residual add (sparse algebra on one identity)
        u = self.up(d, coordinates=s)
        cat = ops.cat([u, s])
        out = self.head(cat)
        return out, [s.feats.dtype, d.feats.dtype, u.feats.dtype, cat.feats.dtype, out.feats.dtype]


def _scene(seed: int) -> tuple[SparseTensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    coords = torch.from_numpy(random_coords(rng, 600, batches=2, extent=8))
    feats = torch.from_numpy(rng.standard_normal((coords.shape[0], 4))).float()
    labels = (coords[:, 1] > 0).long() + (coords[:, 3] > 2).long()
    return SparseTensor(coords, feats), labels


def test_training_loop_under_cpu_autocast() -> None:
    torch.manual_seed(0)
    model = _TinyUNet()
    ref = _TinyUNet()
    ref.load_state_dict(model.state_dict())
    x, labels = _scene(1)

    # first step: gradients under autocast vs float32
    with torch.autocast("cpu", dtype=CPU_AMP):
        out, dtypes = model(x)
        loss = torch.nn.functional.cross_entropy(out.feats.float(), labels)
    assert dtypes == [CPU_AMP] * 5, dtypes
    loss.backward()
    out32, dtypes32 = ref(x)
    assert dtypes32 == [torch.float32] * 5
    torch.nn.functional.cross_entropy(out32.feats, labels).backward()
    for (name, p), p32 in zip(model.named_parameters(), ref.parameters()):
        assert p.grad is not None and p.grad.dtype == torch.float32, name
        # bfloat16 keeps 8 significant bits (relative step 2^-8); through two BatchNorms and five
        # convs the gradient's relative (Frobenius) error stays within a few percent; 0.1 leaves room
        # and still fails for a wrong layer (error ~1) or a dropped cast path
        err = (p.grad - p32.grad).norm() / p32.grad.norm().clamp_min(1e-6)
        assert err < 0.1, f"{name}: bf16-autocast grad differs from fp32 by {float(err):.3f} (relative norm)"

    # a short training loop goes down
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    losses = []
    for _ in range(15):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=CPU_AMP):
            out, _ = model(x)
            loss = torch.nn.functional.cross_entropy(out.feats.float(), labels)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.7 * losses[0], losses


# ---- CUDA (float16 / bfloat16, GradScaler) -----------------------------------------------------

def _gpu_present() -> bool:
    if not torch.cuda.is_available():
        return False
    cuda = lattice.device_caps().get("cuda", {})
    return bool(cuda.get("built", False)) if isinstance(cuda, dict) else True


needs_gpu = pytest.mark.skipif(not _gpu_present(), reason="no GPU")


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_autocast_conv_is_cast_then_op(dtype: torch.dtype, rng: np.random.Generator) -> None:
    x = _tensor(rng, n=2000, c=16).to("cuda")
    w = _weight(rng, 16, 32).detach().cuda().requires_grad_(True)
    with torch.autocast("cuda", dtype=dtype):
        y = ops.subm_conv3d(x, w)
        want_dtype = torch.nn.functional.conv3d(torch.zeros(1, 16, 3, 3, 3, device="cuda"),
                                                torch.zeros(32, 16, 3, 3, 3, device="cuda")).dtype
    assert y.feats.dtype == dtype == want_dtype
    y16 = ops.subm_conv3d(x.replace_feats(x.feats.to(dtype)), w.detach().to(dtype))
    assert torch.equal(y.feats, y16.feats)
    y.feats.float().square().sum().backward()
    assert w.grad.dtype == torch.float32 and torch.isfinite(w.grad).all()


@needs_gpu
def test_cuda_gradscaler_trains_and_skips_inf() -> None:
    torch.manual_seed(0)
    model = _TinyUNet().cuda()
    x, labels = _scene(2)
    x, labels = x.to("cuda"), labels.cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.cuda.amp.GradScaler()
    losses = []
    for _ in range(10):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            out, dtypes = model(x)
            loss = torch.nn.functional.cross_entropy(out.feats.float(), labels)
        assert dtypes == [torch.float16] * 5
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss))
    assert losses[-1] < losses[0], losses
    # an inf in the input: the step is skipped (parameters unchanged) and the scale drops
    before = [p.detach().clone() for p in model.parameters()]
    scale = scaler.get_scale()
    bad = x.replace_feats(x.feats.clone())
    bad.feats[0, 0] = float("inf")
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        out, _ = model(bad)
        loss = torch.nn.functional.cross_entropy(out.feats.float(), labels)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() < scale
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p.detach(), q)
