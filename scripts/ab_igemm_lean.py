"""In-process A/B of implicit_gemm_sm80's lean stage copies (LATTICE_IGEMM_LEAN=1) against
the general path (=0), alternating; f16 subm3, relations cached. Per-call GPU time of 40 queued
calls between CUDA events (GPU-bound: kernels 30-1500 us, host ~15 us per call), and whether both
paths give the same bits (forward output and input gradient). On the GPU machine, inside
scripts/device_session.sh (LATTICE_EXTENSION_DIR and LATTICE_SHARED_DIR set there):

    EXTRA="python3 scripts/ab_igemm_lean.py" ... bash scripts/device_session.sh

WL picks the workloads (default kitti,lidar_x2,dense64). docs/performance.md, "implicit_gemm_sm80,
lean stage copies", has the prediction this measures."""
import os, hashlib, json
import numpy as np, torch
import lattice
from lattice import nn as lnn
from lattice.bench import workloads
dev = torch.device("cuda")
def digest(t): return hashlib.sha1(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:12]
def timed(fn, n=40):
    fn(); torch.cuda.synchronize()
    best = []
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n): fn()
        e.record(); torch.cuda.synchronize(); best.append(s.elapsed_time(e) * 1000.0 / n)
    return min(best)
for wl in os.environ.get("WL", "kitti,lidar_x2,dense64").split(","):
    coords = torch.from_numpy(np.array(workloads.coords(wl))).int().to(dev)
    n = coords.shape[0]
    for C in (64, 128):
        torch.manual_seed(0)
        feats = torch.randn(n, C, device=dev, dtype=torch.float16)
        conv = lnn.SubmConv3d(C, C, 3, bias=False).to(dev).half().eval()
        for p in conv.parameters(): p.requires_grad_(False)
        x = lattice.SparseTensor(coords, feats)
        xg = lattice.SparseTensor(coords, feats.clone().requires_grad_(True))
        g = torch.randn(n, C, device=dev, dtype=torch.float16)
        def fwd():
            with torch.no_grad(): return conv(x).feats
        def fb():
            y = conv(xg).feats
            (dx,) = torch.autograd.grad(y, xg.feats, g)
            return dx
        res = {"1": {"fwd": [], "fwd+dgrad": []}, "0": {"fwd": [], "fwd+dgrad": []}}
        hashes = {}
        for r in range(3):
            for mode in ("1", "0") if r % 2 == 0 else ("0", "1"):
                os.environ["LATTICE_IGEMM_LEAN"] = mode
                res[mode]["fwd"].append(timed(fwd)); res[mode]["fwd+dgrad"].append(timed(fb))
                hashes.setdefault(mode, (digest(fwd()), digest(fb())))
        os.environ.pop("LATTICE_IGEMM_LEAN", None)
        row = {"case": f"{wl}/C{C}", "n": n,
               "lean_fwd_us": round(min(res["1"]["fwd"]), 1), "general_fwd_us": round(min(res["0"]["fwd"]), 1),
               "lean_fb_us": round(min(res["1"]["fwd+dgrad"]), 1), "general_fb_us": round(min(res["0"]["fwd+dgrad"]), 1),
               "bitwise_equal": hashes["1"] == hashes["0"], "all": res}
        print(json.dumps(row), flush=True)
