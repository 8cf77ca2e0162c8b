"""CUDA batch norm route vs the CPU parallel route, bit for bit, and its time against torch's.

Part 1: for shapes covering every pack width (C % 8, 4, 2, 1), partial 32-row blocks, a
misaligned feature pointer, f16 / bf16 / f32 / f64, training and eval, with and without ReLU:
y, dx, dweight, dbias, running mean / var of the CUDA route against the CPU parallel route on the
same inputs (mismatching element counts; 0 expected).
Part 2: fwd+bwd per call (CUDA events, median of 40) for the MinkUNet42 shapes, lattice vs
torch.nn.functional.batch_norm + relu, and the per-kernel GPU time from torch.profiler.
Exits 1 when any case mismatches. Needs a CUDA device (scripts/device_session.sh runs it):

    LATTICE_EXTENSION_DIR=build-device/py PYTHONPATH=python python3 scripts/gpu_batch_norm_check.py
"""
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from gpu_host_time import event_ms  # scripts/ is this script's sys.path[0]
from lattice.ops.fused_bn import batch_norm_feats

dev = "cuda"
torch.manual_seed(0)


def run(x, w, b, rm, rv, training, relu, route, dy):
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    b = b.detach().clone().requires_grad_(True)
    rm, rv = rm.clone(), rv.clone()
    y = batch_norm_feats(x, rm, rv, w, b, training, 0.1, 1e-5, relu, route=route)
    y.backward(dy)
    return [t.detach().cpu() for t in (y, x.grad, w.grad, b.grad, rm, rv)]


def bits_equal(a, b):
    if a.dtype in (torch.float16, torch.bfloat16):
        return int((a.view(torch.int16) != b.view(torch.int16)).sum())
    if a.dtype == torch.float32:
        return int((a.view(torch.int32) != b.view(torch.int32)).sum())
    return int((a.view(torch.int64) != b.view(torch.int64)).sum())


shapes = [(94444, 32), (47000, 64), (20000, 128), (5000, 256), (3, 5), (33, 3), (100, 2), (70, 6),
          (1000, 96), (257, 12), (65, 40), (2, 256)]
bad = 0
cases = 0
for (n, c) in shapes:
    for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        pdt = torch.float64 if dt == torch.float64 else torch.float32
        for misaligned in (False, True):
            if misaligned and n > 5000:
                continue
            buf = (torch.randn(n * c + 1, dtype=torch.float32) * 3 + 1).to(dt)
            x = buf[1:].view(n, c) if misaligned else buf[:-1].view(n, c)
            w = torch.rand(c, dtype=pdt) + 0.5
            bb = torch.randn(c, dtype=pdt)
            rm = torch.randn(c, dtype=pdt)
            rv = torch.rand(c, dtype=pdt) + 0.5
            dy = torch.randn(n, c, dtype=torch.float32).to(dt)
            for training in (True, False):
                for relu in (False, True):
                    cpu = run(x, w, bb, rm, rv, training, relu, "parallel", dy)
                    if misaligned:
                        bufc = buf.to(dev)
                        xg = bufc[1:].view(n, c)
                    else:
                        xg = x.to(dev)
                    gpu = run(xg, w.to(dev), bb.to(dev), rm.to(dev), rv.to(dev), training, relu, "cuda", dy.to(dev))
                    mism = [bits_equal(a, g) for a, g in zip(cpu, gpu)]
                    cases += 1
                    if any(mism):
                        bad += 1
                        print("MISMATCH", (n, c), dt, "misaligned" if misaligned else "", "train" if training else "eval",
                              "relu" if relu else "", "y dx dw db rm rv:", mism)
print(f"bitwise CUDA vs CPU parallel: {cases} cases, {bad} with mismatches")

# Part 2: timing
net_shapes = [(94444, 32), (47000, 64), (20000, 128), (5000, 256), (94444, 96)]


def timed(fn):
    """us per call: the side-by-side script's CUDA-event timer (scripts/gpu_host_time.py)."""
    return event_ms(fn, warm=5, reps=40) * 1000.0


print("fwd+bwd per call, us (CUDA events; host-limited for small shapes): shape dtype lattice torch ratio")
for (n, c) in net_shapes:
    for dt in (torch.float16, torch.float32):
        x = torch.randn(n, c, device=dev, dtype=dt, requires_grad=True)
        w = torch.ones(c, device=dev, requires_grad=True)
        b = torch.zeros(c, device=dev, requires_grad=True)
        rm = torch.zeros(c, device=dev)
        rv = torch.ones(c, device=dev)
        dy = torch.randn(n, c, device=dev, dtype=dt)

        def lat():
            batch_norm_feats(x, rm, rv, w, b, True, 0.1, 1e-5, True).backward(dy)

        def tor():
            F.relu(F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5)).backward(dy)

        tl, tt = timed(lat), timed(tor)
        print(f"  ({n},{c}) {str(dt)[6:]} {tl:8.1f} {tt:8.1f} {tl / tt:5.2f}")

print("GPU kernel time per fwd+bwd (profiler, 20 calls averaged), f16:")
for (n, c) in net_shapes:
    x = torch.randn(n, c, device=dev, dtype=torch.float16, requires_grad=True)
    w = torch.ones(c, device=dev, requires_grad=True)
    b = torch.zeros(c, device=dev, requires_grad=True)
    rm = torch.zeros(c, device=dev)
    rv = torch.ones(c, device=dev)
    dy = torch.randn(n, c, device=dev, dtype=torch.float16)
    for name, fn in (("lattice", lambda: batch_norm_feats(x, rm, rv, w, b, True, 0.1, 1e-5, True).backward(dy)),
                     ("torch", lambda: F.relu(F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5)).backward(dy))):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        agg = {}
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                t = getattr(ev, "device_time", None)
                if t is None:
                    t = ev.cuda_time
                k = ev.name
                for junk in ("void ", "lattice::backend::cuda::", "(anonymous namespace)::", "at::native::", "lattice::", "c10::"):
                    k = k.replace(junk, "")
                k = k[:44]
                agg[k] = agg.get(k, 0.0) + t / 20
        rows = sorted(((t, k) for k, t in agg.items()), reverse=True)
        print(f"  ({n},{c}) {name}: total {sum(t for t, _ in rows):.1f}us: " + "; ".join(f"{k} {t:.1f}" for t, k in rows[:8]))
sys.exit(1 if bad else 0)
