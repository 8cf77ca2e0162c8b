"""Same-run ceilings: what this device reaches on a large dense GEMM and on a large memory copy.

Every result reports its achieved FLOP/s and bytes/s as a percentage of these two numbers, measured
in the same process, so results taken under different machine load stay comparable as ratios
(BENCHMARKS.md: "compare as ratios measured in one run").

* GEMM: ``torch.matmul`` of two n x n matrices of the benchmark dtype; FLOP = 2 n^3. When the
  dtype has no matmul on this device (float16 on CPU with older torch), float32 is used and the
  result says so (``gemm_dtype``).
* Copy: ``dst.copy_(src)`` of a large buffer; bytes = 2 x size (read + write).

The ceiling is the best (minimum-time) repeat: it estimates what the hardware can reach, whereas
the cases report medians.
"""
from __future__ import annotations

from typing import Any

import torch

from .timing import measure

# (gemm n, copy MiB) per device and scale; "small" keeps the smoke preset within seconds.
_SIZES = {
    ("cpu", "small"): (1024, 32),
    ("cpu", "large"): (2048, 256),
    ("cuda", "small"): (4096, 256),
    ("cuda", "large"): (8192, 2048),
}


def _gemm(n: int, dtype: torch.dtype, device: str, repeats: int) -> tuple[float, torch.dtype]:
    gen = torch.Generator(device="cpu").manual_seed(0)
    used = dtype
    try:
        a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
        torch.matmul(a[:8, :8], b[:8, :8])
    except RuntimeError:
        used = torch.float32
        a = torch.randn(n, n, generator=gen).to(device=device, dtype=used)
        b = torch.randn(n, n, generator=gen).to(device=device, dtype=used)
    t = measure(lambda _: torch.matmul(a, b), device=device, repeats=repeats, warmup=1)
    return 2.0 * n**3 / (t.min_ms * 1e-3), used


def _copy(mib: int, device: str, repeats: int) -> float:
    n = mib * (1 << 20) // 4
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    t = measure(lambda _: dst.copy_(src), device=device, repeats=repeats, warmup=1)
    return 2.0 * src.numel() * src.element_size() / (t.min_ms * 1e-3)


def measure_ceilings(device: str, dtype: torch.dtype, scale: str = "large", repeats: int = 5) -> dict[str, Any]:
    """{'gemm_flops': FLOP/s, 'gemm_dtype', 'gemm_n', 'copy_bytes_per_s', 'copy_mib', ...}."""
    n, mib = _SIZES[(device, scale)]
    flops, used = _gemm(n, dtype, device, repeats)
    bw = _copy(mib, device, repeats)
    return {
        "gemm_flops": flops,
        "gemm_dtype": str(used).replace("torch.", ""),
        "gemm_n": n,
        "copy_bytes_per_s": bw,
        "copy_mib": mib,
        "device": device,
        "statistic": "best of repeats",
        "torch_threads": torch.get_num_threads(),
    }
