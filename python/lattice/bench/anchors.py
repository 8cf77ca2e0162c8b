"""The anchor numbers to beat, transcribed from shared/BENCHMARKS.md ("Anchor numbers").

Source: shared/BENCHMARKS.md as of 2026-11-30 — GPU: TorchSparse 2.1.0 on an NVIDIA H200, fp16,
maps cached unless noted; CPU: MinkowskiEngine 0.5.4 (OpenMP + OpenBLAS) on the 2-core CPU machine
kind, fp32. All times in milliseconds. Update this file when BENCHMARKS.md changes; the anchors
were measured on the inputs of shared/bench/workloads.py, so a ratio is only reported for a case
whose workload came from there (``source == 'shared'``).

Column keys: ``subm3_hot``, ``subm3_cold`` (map + conv), ``subm3_fwd_bwd``, ``k2s2_cold``.
"""
from __future__ import annotations

from typing import Optional

_COLS = ("subm3_hot", "subm3_cold", "subm3_fwd_bwd", "k2s2_cold")


def _rows(table: list[tuple]) -> dict[tuple[str, int], dict[str, float]]:
    out = {}
    for row in table:
        wl, c, *vals = row
        out[(wl, c)] = dict(zip(_COLS, vals[:4]))
        if len(vals) > 4:
            out[(wl, c)]["gflops_hot"] = vals[4]
    return out


GPU = {
    "engine": "TorchSparse 2.1.0 (TorchSparse++ default config)",
    "device": "NVIDIA H200",
    "dtype": "float16",
    "ceilings": {"gemm_flops": 723e12, "copy_bytes_per_s": 4089e9},
    "conv": _rows([
        # workload, C, subm3 hot, cold map+conv, fwd+bwd, k2 s2 cold
        ("kitti", 32, 0.105, 0.219, 0.523, 0.431),
        ("kitti", 64, 0.166, 0.273, 0.585, 0.437),
        ("kitti", 128, 0.454, 0.560, 1.065, 0.430),
        ("lidar", 32, 0.102, 0.217, 0.458, 0.532),
        ("lidar", 64, 0.186, 0.353, 0.633, 0.574),
        ("lidar", 128, 0.446, 0.610, 1.053, 0.573),
        ("lidar_x2", 64, 0.257, 0.446, 0.851, 0.508),
        ("lidar_x2", 128, 0.735, 0.875, 1.704, 0.434),
        ("plane", 64, 0.284, 0.451, 1.040, 0.507),
        ("plane", 128, 0.927, 1.132, 2.659, 0.697),
        ("grid", 64, 0.282, 0.487, 0.988, 0.544),
        ("grid", 128, 0.969, 1.202, 2.219, 0.697),
        ("dense64", 64, 0.402, 0.601, 1.770, 0.545),
        ("dense64", 128, 1.402, 1.608, 5.366, 0.615),
        ("isolated", 64, 0.272, 0.460, 0.972, 0.572),
        ("isolated", 128, 0.943, 1.073, 2.010, 0.831),
    ]),
    # Dense cuDNN conv3d (fp16, channels-last) on the 64^3 block: the practical limit for dense64.
    "dense_cudnn": {("dense64", 64): 0.144, ("dense64", 128): 0.326},
    # MinkUNet42, fp16 autocast, fresh SparseTensor per call (maps rebuilt); (workload, batch).
    "networks": {
        ("kitti", 1): {"inference": 16.2, "train_step": 31.2},
        ("lidar", 1): {"inference": 15.75, "train_step": 31.4},
        ("lidar_x2", 2): {"inference": 23.1, "train_step": 39.2},
    },
}

CPU = {
    "engine": "MinkowskiEngine 0.5.4 (OpenMP + OpenBLAS)",
    "device": "CPU machine kind, 2 cores",
    "dtype": "float32",
    "ceilings": {"gemm_flops": 240e9},
    "conv": _rows([
        # workload, C, subm3 hot, cold, fwd+bwd, k2 s2 cold, GFLOP/s hot
        ("kitti", 32, 30.3, 80.0, 77.6, 35.5, 19),
        ("kitti", 64, 49.8, 127.6, 128.5, 71.6, 47),
        ("lidar", 64, 61.2, 112.3, 175.8, 40.7, 51),
        ("grid", 64, 132.9, 247.7, 345.1, 90.8, 44),
        ("dense64", 32, 767.0, 1144.0, 1789.0, 65.4, 18),
        ("dense64", 64, 1245.0, 1513.0, 3078.0, 87.6, 45),
    ]),
    "networks": {
        ("kitti", 1): {"inference": 3440.0, "train_step": 9980.0},
    },
}


def table_for(device: str, dtype: str) -> Optional[dict]:
    """The anchor table measured on this device kind and dtype, or None."""
    if device == "cpu" and dtype == "float32":
        return CPU
    if device == "cuda" and dtype == "float16":
        return GPU
    return None


def conv_anchor(device: str, dtype: str, workload: str, channels: int) -> Optional[dict[str, float]]:
    """Anchor columns for a (workload, C) conv row, or None when no row matches."""
    t = table_for(device, dtype)
    if t is None:
        return None
    return t["conv"].get((workload, channels))


def network_anchor(device: str, dtype: str, workload: str, batch: int) -> Optional[dict[str, float]]:
    t = table_for(device, dtype)
    if t is None:
        return None
    return t["networks"].get((workload, batch))


def describe(device: str, dtype: str) -> Optional[str]:
    t = table_for(device, dtype)
    return None if t is None else f"{t['engine']} on {t['device']}, {t['dtype']}"
